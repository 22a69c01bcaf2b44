//! Jobs on real node processes (127.0.0.1): a W1-shaped job on 1, 2 and 4
//! worker nodes gives the output of the single-node run; tasks run on every
//! node; partitions made on one node are consumed on another, by shared
//! memory between nodes that share a store directory and over QUIC between
//! nodes that do not. Also W4's and the shipped TOML pipeline's output,
//! operators a node lacks, per-node backpressure and the file formats the
//! nodes write. Jobs that lose, gain or drain nodes are in
//! `cluster_faults.rs`.

mod common;

use common::{Cluster, NodeSpec, ids_of, tiny_w1_shape as shape};
use streambatch::{Context, Resources};
use streambatch_bench::{Shape, registry, w1_pipeline};

/// Rows out and the sum of their ids.
fn run(ctx: &Context) -> (streambatch::JobStats, u64, i64) {
    let ds = w1_pipeline(
        ctx.range(shape().rows, shape().partitions),
        &registry(),
        shape(),
    )
    .unwrap();
    let mut rows = 0;
    let mut sum = 0;
    for batch in ds.iter_batches().unwrap() {
        let batch = batch.unwrap();
        rows += batch.num_rows() as u64;
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        sum += ids.values().iter().sum::<i64>();
    }
    (ds.stats().unwrap(), rows, sum)
}

#[test]
fn a_w1_shaped_job_gives_the_single_node_output_on_1_2_and_4_nodes() {
    let local = Context::with_config(streambatch::NodeConfig {
        cpus: 4.0,
        gpus: Some(2.0),
        store_capacity: 256 << 20,
        ..Default::default()
    })
    .unwrap();
    let (_, rows, sum) = run(&local);
    assert_eq!((rows, sum), (40, (0..40).sum::<i64>()));

    for workers in [1, 2, 4] {
        // N CPU nodes feeding one GPU node, as in W5; the GPU node shares
        // its store directory with worker-1 only.
        let mut specs: Vec<NodeSpec> = (1..=workers)
            .map(|i| NodeSpec::cpu(&format!("worker-{i}"), 2))
            .collect();
        specs.push(NodeSpec::gpu("gpu", 2).sharing_store_with("worker-1"));
        let cluster = Cluster::start(&specs);
        let ctx = Context::connect(cluster.driver_config()).unwrap();
        let (stats, got_rows, got_sum) = run(&ctx);
        assert_eq!((got_rows, got_sum), (rows, sum), "{workers} workers");
        assert_eq!(stats.nodes.len(), workers + 1, "{stats}");
        for node in &stats.nodes {
            assert!(node.tasks > 0, "no task ran on {}: {stats}", node.name);
        }
        let gpu = stats.nodes.iter().find(|n| n.name == "gpu").unwrap();
        // The GPU stage ran on the GPU node only, the CPU stage elsewhere.
        assert_eq!(gpu.tasks, stats.operators[1].tasks, "{stats}");
        assert!(gpu.inputs_shared > 0, "none by shared memory: {stats}");
        if workers > 1 {
            assert!(
                gpu.inputs_quic > 0 && gpu.quic_bytes > 0,
                "none over QUIC: {stats}"
            );
        }
    }
}

#[test]
fn a_w4_shaped_job_writes_the_single_node_output_on_1_2_and_4_nodes() {
    for workers in [1, 2, 4] {
        let specs: Vec<NodeSpec> = (1..=workers)
            .map(|i| NodeSpec::cpu(&format!("worker-{i}"), 2))
            .collect();
        w4_shaped_on(&Cluster::start(&specs), 2 * workers);
    }
}

/// Runs W4's shape on one node and on `cluster` (whose stateful embedder may
/// have `pool` workers at once) and compares what they wrote.
fn w4_shaped_on(cluster: &Cluster, pool: usize) {
    let dir = cluster.dir.path();
    let images = dir.join("images");
    streambatch_bench::make_images(&images, 8, 25, 7).unwrap();
    let local = Context::with_config(streambatch::NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        store_capacity: 256 << 20,
        ..Default::default()
    })
    .unwrap();
    let remote = Context::connect(cluster.driver_config()).unwrap();
    let embed = |ctx: &Context, out: &std::path::Path, pool: usize| {
        let registry = streambatch::registry();
        let ds = ctx
            .read_parquet(images.to_str().unwrap())
            .unwrap()
            .map_batches(
                registry.udf("preprocess", b"").unwrap(),
                Resources::cpu(1.0),
            )
            .map_batches(
                registry.udf("cpu_embedder", &7u64.to_le_bytes()).unwrap(),
                Resources::cpu(1.0).batch_rows(16).pool(1, pool),
            );
        ds.write_parquet(out).unwrap();
        ds.stats().unwrap()
    };
    embed(&local, &dir.join("out-local"), 2);
    let stats = embed(&remote, &dir.join("out-cluster"), pool);
    for node in &stats.nodes {
        assert!(node.tasks > 0, "no task ran on {}: {stats}", node.name);
    }
    let read = |out: &str| {
        let mut rows: Vec<(i64, Vec<f32>)> = Vec::new();
        for b in local
            .read_parquet(dir.join(out).to_str().unwrap())
            .unwrap()
            .collect()
            .unwrap()
        {
            let ids = b
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .unwrap();
            let emb = b
                .column(1)
                .as_any()
                .downcast_ref::<arrow_array::FixedSizeListArray>()
                .unwrap();
            for i in 0..b.num_rows() {
                let v = emb.value(i);
                let v = v
                    .as_any()
                    .downcast_ref::<arrow_array::Float32Array>()
                    .unwrap();
                rows.push((ids.value(i), v.values().to_vec()));
            }
        }
        rows.sort_by_key(|(id, _)| *id);
        rows
    };
    let (a, b) = (read("out-local"), read("out-cluster"));
    assert_eq!(a.len(), 200);
    assert_eq!(
        a, b,
        "the cluster wrote other embeddings than the single node"
    );
    let check =
        streambatch_bench::check_embeddings(&local, &images, &dir.join("out-cluster"), 7).unwrap();
    assert!(check.all_match(), "{check:?}");
}

#[test]
fn an_operator_a_node_lacks_is_refused_at_submission() {
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let mut mine = streambatch::registry();
    mine.register("only_in_the_driver", |_| {
        Ok(|b: arrow_array::RecordBatch| Ok::<_, streambatch::UdfError>(b))
    });
    let op = mine.udf("only_in_the_driver", b"").unwrap();
    let err = ctx
        .range(10, 2)
        .map_batches(op, Resources::cpu(1.0))
        .count()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("worker-1") && err.contains("only_in_the_driver"),
        "{err}"
    );
    // A closure cannot travel at all: refused before any node is asked.
    let err = ctx
        .range(10, 2)
        .map_batches(
            |b: arrow_array::RecordBatch| Ok::<_, streambatch::UdfError>(b),
            Resources::cpu(1.0),
        )
        .count()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("map_batches") && err.contains("closure"),
        "{err}"
    );
    // A plan too large for one cluster message is refused before it is
    // sent (sent, it would close the session), and the cluster goes on.
    let heavy = mine.udf("only_in_the_driver", &vec![7u8; 2 << 20]).unwrap();
    let err = ctx
        .range(10, 2)
        .map_batches(heavy, Resources::cpu(1.0))
        .count()
        .unwrap_err()
        .to_string();
    assert!(err.contains("bytes on the wire"), "{err}");
    assert_eq!(ctx.range(10, 2).count().unwrap(), 10);
}

#[test]
fn the_shipped_toml_pipeline_runs_on_a_cluster_as_on_one_node() {
    if streambatch::GpuPool::global().is_empty() {
        streambatch_bench::skip_test(
            "the_shipped_toml_pipeline_runs_on_a_cluster_as_on_one_node",
            "no GPU adapter: install mesa-vulkan-drivers (lavapipe)",
        );
        return;
    }
    for workers in [1, 2, 4] {
        // CPU workers for reading and preprocessing, and a node with the
        // GPU slots (one per adapter, lavapipe included) for the kernel.
        let mut specs: Vec<NodeSpec> = (1..=workers)
            .map(|i| NodeSpec::cpu(&format!("worker-{i}"), 1))
            .collect();
        let gpu = NodeSpec::auto_gpu("gpu", 0).with_env("STREAMBATCH_GPU_SOFTWARE", "true");
        specs.push(gpu);
        toml_pipeline_on(&Cluster::start(&specs));
    }
}

fn toml_pipeline_on(cluster: &Cluster) {
    let dir = cluster.dir.path();
    streambatch_bench::make_images(&dir.join("images"), 4, 10, 42).unwrap();
    // The shipped pipeline, reading and writing in this test's directory.
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/pipelines");
    std::fs::copy(format!("{shipped}/embed.wgsl"), dir.join("embed.wgsl")).unwrap();
    let shipped_text = std::fs::read_to_string(format!("{shipped}/embed.toml")).unwrap();
    // Its source reads this test's images: the `read_parquet = ...` line.
    let sources = shipped_text
        .lines()
        .filter(|l| l.starts_with("read_parquet = "))
        .count();
    assert_eq!(sources, 1, "{shipped_text}");
    let text = shipped_text
        .lines()
        .map(|l| match l.starts_with("read_parquet = ") {
            true => "read_parquet = \"images\"",
            false => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
        .replace("../../out/embeddings-pipeline", "OUT");
    for (name, out) in [("local", "out-local"), ("cluster", "out-cluster")] {
        std::fs::write(dir.join(format!("{name}.toml")), text.replace("OUT", out)).unwrap();
    }
    let run =
        |args: &[&str]| String::from_utf8(common::streambatch(dir, args, &[]).stdout).unwrap();
    // On one node, `run` first says which adapter runs the kernel, and warns
    // where it is a software one; the Mesa driver says nothing of a missing
    // runtime directory (empty is as invalid to it as unset).
    let local = common::streambatch(dir, &["run", "local.toml"], &[("XDG_RUNTIME_DIR", "")]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&local.stdout),
        String::from_utf8_lossy(&local.stderr),
    );
    let pool = streambatch::GpuPool::global();
    let adapter = &pool.labels()[0];
    assert!(
        stdout.starts_with(&format!("kernel embed runs on {adapter}")),
        "{stdout}"
    );
    assert_eq!(
        stderr.contains("is a software adapter"),
        !pool.has_hardware(),
        "{stderr}"
    );
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
    let driver = cluster.driver_config();
    let stdout = run(&["run", "cluster.toml", "--cluster", driver.to_str().unwrap()]);
    // Every node ran tasks: the stats' node table has a row per node,
    // "NAME TASKS ...", between its "node tasks ..." header and the
    // closing "wall ..." line.
    let per_node: Vec<Vec<&str>> = stdout
        .lines()
        .skip_while(|l| !(l.starts_with("node ") && l.contains("tasks")))
        .skip(1)
        .take_while(|l| !l.starts_with("wall "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .collect();
    assert_eq!(per_node.len(), cluster.nodes.len(), "{stdout}");
    for row in per_node {
        assert_ne!(row[1], "0", "{row:?} ran no task\n{stdout}");
    }
    let local = Context::with_config(streambatch::NodeConfig {
        gpus: Some(0.0),
        ..Default::default()
    })
    .unwrap();
    let check = |out: &str| {
        streambatch_bench::check_embeddings(&local, &dir.join("images"), &dir.join(out), 42)
            .unwrap()
    };
    let (a, b) = (check("out-local"), check("out-cluster"));
    assert!(a.all_match() && b.all_match(), "{a:?} {b:?}");
    assert_eq!((a.rows, b.rows), (40, 40));
}

#[test]
fn backpressure_holds_per_node() {
    // 128 MiB of rows through a CPU node and a GPU node of 24 MiB stores
    // each: only backpressure (no spilling) keeps each store under its cap.
    let cluster = Cluster::start_with_store(
        &[NodeSpec::cpu("worker-1", 2), NodeSpec::gpu("gpu", 1)],
        "24MiB",
    );
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let shape = Shape {
        rows: 128,
        partitions: 16,
        row_bytes: 1 << 20,
        millis: (5, 1, 2),
    };
    let ds = w1_pipeline(ctx.range(shape.rows, shape.partitions), &registry(), shape).unwrap();
    assert_eq!(ds.count().unwrap(), 128);
    let stats = ds.stats().unwrap();
    for node in &stats.nodes {
        assert!(node.peak_store_bytes <= 24 << 20, "{stats}");
        assert_eq!(node.spilled_bytes, 0, "{stats}");
    }
    let worker = stats.nodes.iter().find(|n| n.name == "worker-1").unwrap();
    assert!(worker.peak_store_bytes > 0, "{stats}");
}

#[test]
fn text_files_read_on_a_cluster_write_parquet_with_its_options() {
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let dir = cluster.dir.path();
    let input = dir.join("text");
    std::fs::create_dir_all(&input).unwrap();
    for f in 0..6 {
        let lines: String = (0..500).map(|i| format!("file {f} line {i}\n")).collect();
        std::fs::write(input.join(format!("{f}.txt")), lines).unwrap();
    }
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let options = streambatch::ParquetWriteOptions {
        max_row_group_rows: 100,
        ..streambatch::ParquetWriteOptions::default()
            .with_codec("zstd(5)")
            .unwrap()
    };
    let out = dir.join("out");
    let files = ctx
        .read_text(input.to_str().unwrap())
        .unwrap()
        .write_parquet_with(&out, &options)
        .unwrap();
    let source = ctx.read_text(input.to_str().unwrap()).unwrap();
    assert_eq!(source.input_files().len(), 6);

    // The nodes wrote zstd in row groups of at most 100 rows (500-row
    // files: several groups each).
    assert_eq!(files.len(), 6, "{files:?}");
    for file in &files {
        let reader = streambatch::parquet::file::reader::SerializedFileReader::new(
            std::fs::File::open(file).unwrap(),
        )
        .unwrap();
        let meta = streambatch::parquet::file::reader::FileReader::metadata(&reader);
        assert!(meta.num_row_groups() >= 5, "{}", file.display());
        for group in meta.row_groups() {
            assert!(group.num_rows() <= 100, "{}", file.display());
            let codec = group.column(0).compression();
            assert!(
                matches!(codec, streambatch::parquet::basic::Compression::ZSTD(_)),
                "{codec:?}"
            );
        }
    }
    let local = Context::local().unwrap();
    let mut lines: Vec<String> = local
        .read_parquet(out.to_str().unwrap())
        .unwrap()
        .iter_rows()
        .unwrap()
        .map(|r| r.unwrap().str("text").unwrap().to_string())
        .collect();
    lines.sort();
    let mut want: Vec<String> = (0..6)
        .flat_map(|f| (0..500).map(move |i| format!("file {f} line {i}")))
        .collect();
    want.sort();
    assert_eq!(lines, want);

    // The other formats travel too: Arrow IPC written by the nodes, read
    // back by them.
    let ipc = dir.join("ipc");
    let text = ctx.read_text(input.to_str().unwrap()).unwrap();
    assert_eq!(text.write_ipc(&ipc).unwrap().len(), 6);
    assert_eq!(
        ctx.read_ipc(ipc.to_str().unwrap())
            .unwrap()
            .count()
            .unwrap(),
        3000
    );

    // CSV and JSON written by the nodes, read back by them with the schema
    // the driver inferred (it travels with each split).
    let formats: [(&str, Write, Read); 2] = [
        ("csv", |d, p| d.write_csv(p), |c, p| c.read_csv(p)),
        ("json", |d, p| d.write_json(p), |c, p| c.read_json(p)),
    ];
    for (format, write, read) in formats {
        let at = dir.join(format);
        let text = ctx.read_text(input.to_str().unwrap()).unwrap();
        assert_eq!(write(&text, &at).unwrap().len(), 6, "{format}");
        let mut back: Vec<String> = read(&ctx, at.to_str().unwrap())
            .unwrap()
            .iter_rows()
            .unwrap()
            .map(|r| r.unwrap().str("text").unwrap().to_string())
            .collect();
        back.sort();
        assert_eq!(back, want, "{format}");
    }
}

type Write =
    fn(&streambatch::Dataset, &std::path::Path) -> streambatch::Result<Vec<std::path::PathBuf>>;
type Read = fn(&Context, &str) -> streambatch::Result<streambatch::Dataset>;

/// `gpus = "auto"` on a machine whose only adapter is a software one
/// (lavapipe): the node counts no GPU slot and says why on its log, so the
/// cluster's main job (which embeds on the GPU only where a node has GPU
/// slots, see `crates/cli/src/infer.rs`) takes its CPU path; a node
/// that asks for software adapters gets its slot.
#[test]
fn auto_counts_no_software_adapter_so_the_main_job_embeds_on_the_cpu() {
    let pool = streambatch::GpuPool::global();
    if pool.has_hardware() || pool.software_labels().is_empty() {
        streambatch_bench::skip_test(
            "auto_counts_no_software_adapter_so_the_main_job_embeds_on_the_cpu",
            "needs lavapipe (mesa-vulkan-drivers) and no hardware GPU",
        );
        return;
    }
    let cluster = Cluster::start(&[
        NodeSpec::auto_gpu("worker-1", 1),
        NodeSpec::auto_gpu("worker-2", 1).with_env("STREAMBATCH_GPU_SOFTWARE", "true"),
    ]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    assert_eq!(
        ctx.gpu_devices(),
        [format!("worker-2: {} GPU slots", pool.len())],
        "only the node that asked counts its software adapter"
    );
    let log = std::fs::read_to_string(cluster.dir.path().join("worker-1.log")).unwrap();
    assert!(
        log.contains("counts no software adapter") && log.contains("gpu_software = true"),
        "{log}"
    );
}

#[test]
fn a_train_test_split_gives_the_single_node_sides_on_two_nodes() {
    let ids = |ctx: &Context| -> (Vec<i64>, Vec<i64>) {
        let (train, test) = ctx.range(10_000, 8).train_test_split(0.25, 7).unwrap();
        let sorted = |ds: streambatch::Dataset| {
            let mut ids: Vec<i64> = ds
                .collect()
                .unwrap()
                .iter()
                .flat_map(|b| ids_of(b).to_vec())
                .collect();
            ids.sort_unstable();
            ids
        };
        (sorted(train), sorted(test))
    };
    let local = ids(&Context::local().unwrap());
    assert_eq!(local.0.len() + local.1.len(), 10_000);
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    assert_eq!(ids(&ctx), local, "each side's rows as on one node");
}
