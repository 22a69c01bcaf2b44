//! A proptest-driven fuzzer for the decoders of what nodes send each other
//! inside actor messages (`wire`, `wire::plan`): any bytes give a value or
//! an error, never a panic; valid archives, mutated, reach deep into the
//! validator. 20,000 inputs per run of the suite; the long run:
//! `STREAMBATCH_FUZZ_CASES=1000000 cargo test -p streambatch-sched wire::fuzz`.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use streambatch_net::{Locality, frame};

use crate::wire::plan::PlanSpec;
use crate::wire::{
    Happened, InputSpec, JobKey, JobOrder, JobStart, KeyRangeSpec, Members, NodeEvent, NodeInfo,
    Order, PartSpec, Pulled, SampleSpec, StoreView,
};

fn cases() -> u32 {
    std::env::var("STREAMBATCH_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn key() -> JobKey {
    JobKey {
        cluster: "0badcafe".into(),
        driver: "driver".into(),
        job: 7,
    }
}

/// A valid archive of each payload type.
fn seeds() -> Vec<Vec<u8>> {
    let info = NodeInfo {
        name: "worker-1".into(),
        cpus: 8.0,
        gpus: 0.0,
        store_capacity: 300 << 20,
        locality: Locality {
            host: "boot".into(),
            store_dir: "/tmp/s".into(),
        },
        addr: "127.0.0.1:7401".into(),
    };
    let plan = {
        use std::sync::Arc;
        let stage = streambatch_plan::Stage {
            name: "range".into(),
            kind: streambatch_plan::StageKind::Source {
                splits: vec![streambatch_plan::SourceSplit::Range { start: 0, end: 10 }],
                ops: Vec::new(),
            },
            options: streambatch_core::Resources::cpu(1.0).into(),
            op_names: vec!["range".into()],
            counters: vec![Arc::default()],
            cut: None,
        };
        let plan = streambatch_plan::ExecPlan {
            stages: vec![stage],
        };
        PlanSpec::of(&plan).expect("a range travels")
    };
    let join_start = JobStart {
        key: key(),
        plan: join_plan(),
        target_bytes: 64 << 20,
        reserve: vec![1, 0, 1],
        nodes: vec![("a".into(), "127.0.0.1:1".into())],
    };
    vec![
        frame::encode(&info).to_vec(),
        frame::encode(&Members { nodes: vec![info] }).to_vec(),
        frame::encode(&JobStart {
            key: key(),
            plan,
            target_bytes: 64 << 20,
            reserve: vec![1, 2],
            nodes: vec![("a".into(), "127.0.0.1:1".into())],
        })
        .to_vec(),
        frame::encode(&Order {
            key: key(),
            order: JobOrder::Run {
                task: 3,
                stage: 1,
                input: InputSpec::Parts(vec![
                    PartSpec::range("a".into(), 9, 0, 5),
                    PartSpec {
                        holder: "b".into(),
                        id: 10,
                        want: streambatch_net::Want::Group(3),
                    },
                ]),
                keep_from: 0,
                keep_again: vec![1],
                may_spill: false,
                range: Some(KeyRangeSpec {
                    lo: Some(vec![1, 2]),
                    hi: None,
                }),
                rows: Some(17),
            },
        })
        .to_vec(),
        frame::encode(&NodeEvent {
            node: "a".into(),
            job: 7,
            happened: Happened::Paused {
                task: 1,
                pending_bytes: 10,
                store_full_at: Some(3),
            },
            store: StoreView::default(),
            pulled: Pulled::default(),
        })
        .to_vec(),
        frame::encode(&NodeEvent {
            node: "a".into(),
            job: 7,
            happened: Happened::Output {
                task: 2,
                seq: 0,
                id: 4,
                rows: 3,
                bytes: 24,
                groups: vec![0, 1, 3],
                sample: Some(SampleSpec {
                    bytes: vec![1, 5, 1, 7, 1, 9],
                    ends: vec![2, 4, 6],
                }),
            },
            store: StoreView::default(),
            pulled: Pulled::default(),
        })
        .to_vec(),
        frame::encode(&Order {
            key: key(),
            order: JobOrder::Adopt {
                holder: "a".into(),
                id: 9,
                rows: 5,
                stage: 0,
                with_cut: true,
            },
        })
        .to_vec(),
        frame::encode(&NodeEvent {
            node: "b".into(),
            job: 7,
            happened: Happened::Adopted {
                holder: "a".into(),
                from: 9,
                id: 2,
                rows: 5,
                bytes: 40,
                cut: Some(0x5eed),
            },
            store: StoreView::default(),
            pulled: Pulled::default(),
        })
        .to_vec(),
        frame::encode(&join_start).to_vec(),
    ]
}

/// A join's plan as it travels: its two inputs (each with a broadcast
/// join) read side by side, cut by the join's keys, and the reducers.
fn join_plan() -> PlanSpec {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};
    use streambatch_core::Resources;
    use streambatch_plan::{
        Broadcast, Cut, ExecPlan, Join, JoinHow, OpKind, OpSpec, Reduce, Side, SourceSplit, Stage,
        StageKind,
    };

    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let join = |how| Join::new(how, &["id"], &["id"], schema.clone(), schema.clone()).unwrap();
    let ids: arrow_array::ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![1, 2, 3]));
    let right = arrow_array::RecordBatch::try_new(schema.clone(), vec![ids]).unwrap();
    let op = |name: &str, kind| OpSpec {
        name: name.into(),
        kind,
        options: Resources::cpu(1.0).into(),
    };
    let broadcast = Broadcast::new(join(JoinHow::Semi), &[right]).unwrap();
    let semi = op(
        "join[semi, broadcast]",
        OpKind::BroadcastJoin(Arc::new(broadcast)),
    );
    let side = |tag| Arc::new(Side::new(vec![(1, semi.clone())], Some(tag)).unwrap());
    let split = |start, tag| SourceSplit::Side {
        inner: Arc::new(SourceSplit::Range {
            start,
            end: start + 10,
        }),
        side: side(tag),
    };
    let stage = |name: &str, kind, ops: usize| Stage {
        name: name.into(),
        kind,
        options: Resources::cpu(1.0).into(),
        op_names: vec![name.into(); ops],
        counters: (0..ops).map(|_| Arc::default()).collect(),
        cut: None,
    };
    let source = StageKind::Source {
        splits: vec![split(0, 0), split(10, 1)],
        ops: Vec::new(),
    };
    let reduce = op("join", OpKind::Reduce(Reduce::Join(join(JoinHow::Full))));
    let keys = vec!["id".to_string()];
    let plan = ExecPlan {
        stages: vec![
            Stage {
                cut: Some((
                    Cut::Join {
                        left: keys.clone(),
                        right: keys,
                    },
                    2,
                )),
                ..stage("join[full](range, range)", source, 1)
            },
            stage("exchange(2)", StageKind::Exchange(2), 0),
            stage(
                "join",
                StageKind::Map {
                    ops: vec![(3, reduce)],
                },
                1,
            ),
        ],
    };
    PlanSpec::of(&plan).expect("a join travels")
}

fn inputs() -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds();
    let mutated = (
        0..seeds.len(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        any::<prop::sample::Index>(),
    )
        .prop_map(move |(seed, flips, cut)| {
            let mut bytes = seeds[seed].clone();
            for (at, value) in flips {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            bytes.truncate(cut.index(bytes.len() + 1).max(bytes.len() / 2));
            bytes
        });
    prop_oneof![prop::collection::vec(any::<u8>(), 0..256), mutated]
}

#[test]
fn payload_decoders_never_panic() {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&inputs(), |bytes| {
            let _ = frame::decode::<NodeInfo>(&bytes);
            let _ = frame::decode::<Members>(&bytes);
            // A plan that decodes is rebuilt (its schemas and broadcast
            // rows decoded from IPC bytes).
            if let Ok(start) = frame::decode::<JobStart>(&bytes) {
                let _ = start.plan.build(&streambatch_plan::Registry::default());
            }
            let _ = frame::decode::<Order>(&bytes);
            let _ = frame::decode::<NodeEvent>(&bytes);
            Ok(())
        })
        .unwrap();
}

#[test]
fn valid_payloads_round_trip() {
    for seed in seeds() {
        // Each seed decodes as the type it was made from (and that one's
        // validation is what the fuzzer above mutates against).
        let any = frame::decode::<NodeInfo>(&seed).is_ok()
            || frame::decode::<Members>(&seed).is_ok()
            || frame::decode::<JobStart>(&seed).is_ok()
            || frame::decode::<Order>(&seed).is_ok()
            || frame::decode::<NodeEvent>(&seed).is_ok();
        assert!(any);
    }
    let start = frame::decode::<JobStart>(&seeds()[2]).unwrap();
    assert_eq!(start.key, key());
    assert_eq!(start.plan.recipe_names(), Vec::<String>::new());
    // The join's plan, its schemas and broadcast rows included, rebuilds.
    let join = frame::decode::<JobStart>(seeds().last().unwrap()).unwrap();
    let plan = join
        .plan
        .build(&streambatch_plan::Registry::default())
        .unwrap();
    assert_eq!(plan.stages.len(), 3);
}
