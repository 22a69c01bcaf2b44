//! A proptest-driven fuzzer for every decoder of bytes that come from the
//! network: the frame reader and each archive type a peer can send. Any
//! input must give a value or an error, never a panic, and a valid frame
//! must still decode after the fuzzer's mutations leave it intact.
//!
//! The suite runs 20,000 inputs per target; the documented long run is
//! `STREAMBATCH_FUZZ_CASES=1000000 cargo test -p streambatch-net --test fuzz_decoders`.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use streambatch_net::fetch::{
    FetchManyRequest, FetchReply, FetchRequest, Locality, PartRows, Want,
};
use streambatch_net::frame::{self, MAX_CONTROL_FRAME, read_frame};

fn cases() -> u32 {
    std::env::var("STREAMBATCH_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Valid frames of each type, to mutate.
fn seeds() -> Vec<Vec<u8>> {
    let here = Locality {
        host: "0f9c2a7e-boot".into(),
        store_dir: "/dev/shm/streambatch".into(),
    };
    vec![
        frame::encode(&FetchRequest {
            partition: 42,
            from: here.clone(),
            rows: None,
        })
        .to_vec(),
        frame::encode(&FetchRequest {
            partition: 42,
            from: here.clone(),
            rows: Some(streambatch_net::RowRange {
                offset: 1_000,
                len: 64,
            }),
        })
        .to_vec(),
        frame::encode(&FetchManyRequest {
            parts: vec![
                PartRows {
                    partition: 42,
                    want: Want::Whole,
                },
                PartRows {
                    partition: 43,
                    want: Want::Rows(streambatch_net::RowRange { offset: 7, len: 9 }),
                },
                PartRows {
                    partition: 44,
                    want: Want::Group(1_023),
                },
                PartRows {
                    partition: 45,
                    want: Want::WithCut,
                },
            ],
            from: here,
        })
        .to_vec(),
        frame::encode(&FetchReply::Bytes { len: 1 << 20 }).to_vec(),
        frame::encode(&FetchReply::Rows { len: 4096 }).to_vec(),
        frame::encode(&FetchReply::Group {
            offset: 1_000,
            len: 64,
        })
        .to_vec(),
        frame::encode(&FetchReply::Cut {
            starts: vec![0, 3, 3, 10],
        })
        .to_vec(),
        frame::encode(&FetchReply::Shared {
            name: "sb-local-1-0-0@64+1024".into(),
        })
        .to_vec(),
        frame::encode(&FetchReply::Missing {
            message: "gone".into(),
        })
        .to_vec(),
    ]
}

/// Arbitrary bytes, or a valid archive with a few bytes flipped, cut or
/// extended: mutations reach deeper into the validator than noise does.
fn inputs() -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds();
    let mutated = (
        0..seeds.len(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        any::<prop::sample::Index>(),
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(move |(seed, flips, cut, tail)| {
            let mut bytes = seeds[seed].clone();
            for (at, value) in flips {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            bytes.truncate(cut.index(bytes.len() + 1));
            bytes.extend(tail);
            bytes
        });
    prop_oneof![prop::collection::vec(any::<u8>(), 0..256), mutated]
}

fn decode_all(bytes: &[u8]) {
    let _ = frame::decode::<FetchRequest>(bytes);
    let _ = frame::decode::<FetchManyRequest>(bytes);
    let _ = frame::decode::<FetchReply>(bytes);
    let _ = frame::decode::<Locality>(bytes);
}

#[test]
fn archive_decoders_never_panic() {
    runner()
        .run(&inputs(), |bytes| {
            decode_all(&bytes);
            Ok(())
        })
        .unwrap();
}

#[test]
fn the_frame_reader_never_panics() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let framed = (inputs(), any::<u32>(), any::<bool>()).prop_map(|(body, len, honest)| {
        // Half the time an honest length prefix, half a random one.
        let len = if honest { body.len() as u32 } else { len };
        [len.to_le_bytes().as_slice(), &body].concat()
    });
    runner()
        .run(&framed, |bytes| {
            rt.block_on(async {
                let mut input = bytes.as_slice();
                let _ = read_frame::<FetchRequest, _>(&mut input, MAX_CONTROL_FRAME).await;
                let mut input = bytes.as_slice();
                let _ = read_frame::<FetchReply, _>(&mut input, MAX_CONTROL_FRAME).await;
            });
            Ok(())
        })
        .unwrap();
}

#[test]
fn valid_frames_round_trip() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let reply = FetchReply::Shared {
        name: "seg@0+10".into(),
    };
    let mut wire = Vec::new();
    rt.block_on(frame::write_frame(&mut wire, &reply)).unwrap();
    let mut input = wire.as_slice();
    let back = rt
        .block_on(read_frame::<FetchReply, _>(&mut input, MAX_CONTROL_FRAME))
        .unwrap();
    assert_eq!(back, Some(reply));
    // A frame over the limit is refused before its body is read.
    let mut input = wire.as_slice();
    let err = rt
        .block_on(read_frame::<FetchReply, _>(&mut input, 4))
        .unwrap_err();
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
}
