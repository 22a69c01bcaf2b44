//! Writes to an S3-compatible store (moto's server, started here as in
//! `object_store.rs`): every format's round trip, a write replacing an
//! earlier one, a part file uploaded in parts, the manifest that readers
//! honour, failed writes leaving the bucket as it was, with no upload
//! left pending, and a resumed write of objects refusing a changed one.

mod common;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use common::{ctx, sorted_i64};
use streambatch::prelude::*;
use streambatch::{Context, Dataset, FileFormat};
use streambatch_bench::{Fault, FaultProxy, S3Server};

/// `n` rows in `partitions` partitions: `id`, and a 100-byte `payload`.
fn table(ctx: &Context, n: u64, partitions: usize) -> Dataset {
    ctx.range(n, partitions).map_batches(
        |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
            let ids = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
            let payload: StringArray = ids.iter().map(|i| Some(format!("p{:0>99}", i?))).collect();
            let columns = [
                ("id", b.column(0).clone()),
                ("payload", std::sync::Arc::new(payload) as ArrayRef),
            ];
            Ok(RecordBatch::try_from_iter(columns)?)
        },
        Resources::cpu(1.0),
    )
}

/// The same table, its task failing once it reaches `fail_at`.
fn failing(ctx: &Context, n: u64, partitions: usize, fail_at: i64) -> Dataset {
    table(ctx, n, partitions).map_batches(
        move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
            let ids = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
            match ids.value(0) >= fail_at {
                true => Err(UdfError::from("a bad row")),
                false => Ok(b),
            }
        },
        Resources::cpu(1.0),
    )
}

/// One test, one server: the client reads its endpoint from the
/// environment, which tests running side by side would share.
#[test]
fn files_written_to_an_s3_compatible_store() {
    let Some(s3) = S3Server::start_for_test("files_written_to_an_s3_compatible_store") else {
        return;
    };
    s3.make_bucket("out");
    let ctx = ctx();
    every_format_round_trips(&s3, &ctx);
    a_write_replaces_the_last_and_readers_follow_the_manifest(&s3, &ctx);
    a_large_part_is_uploaded_in_parts(&s3, &ctx);
    failed_writes_leave_the_bucket_as_it_was(&s3, &ctx);
    a_toml_pipeline_reads_and_writes_urls(&ctx);
    a_resumed_write_checks_its_input_objects(&s3, &ctx);
    two_writes_into_one_folder_at_once_fail_the_later(&ctx);
    // Last: it points the client at a proxy (for a bucket not used yet,
    // whose store is made on its first use).
    a_commit_that_failed_after_it_landed_is_committed(&s3, &ctx);
    let missing = table(&ctx, 10, 1)
        .write_parquet("s3://no-such-bucket/out/")
        .unwrap_err()
        .to_string();
    assert!(missing.contains("s3://no-such-bucket/out"), "{missing}");
}

fn every_format_round_trips(s3: &S3Server, ctx: &Context) {
    let data = table(ctx, 3_000, 3);
    let expected = sorted_i64(&data.collect().unwrap(), "id");
    type Write = fn(&Dataset, &str) -> Vec<std::path::PathBuf>;
    type Read = fn(&Context, &str) -> Dataset;
    let formats: [(&str, &str, Write, Read); 4] = [
        (
            "parquet",
            "parquet",
            |d, p| d.write_parquet(p).unwrap(),
            |c, p| c.read_parquet(p).unwrap(),
        ),
        (
            "csv",
            "csv",
            |d, p| d.write_csv(p).unwrap(),
            |c, p| c.read_csv(p).unwrap(),
        ),
        (
            "json",
            "json",
            |d, p| d.write_json(p).unwrap(),
            |c, p| c.read_json(p).unwrap(),
        ),
        (
            "ipc",
            "arrow",
            |d, p| d.write_ipc(p).unwrap(),
            |c, p| c.read_ipc(p).unwrap(),
        ),
    ];
    for (folder, extension, write, read) in formats {
        let url = format!("s3://out/{folder}/");
        let written = write(&data, &url);
        assert_eq!(written.len(), 3, "{folder}: a file per task");
        let back = read(ctx, &url).collect().unwrap();
        assert_eq!(sorted_i64(&back, "id"), expected, "{folder}");
        let payload = back[0]
            .column_by_name("payload")
            .unwrap()
            .as_string::<i32>();
        assert_eq!(payload.value(0).len(), 100, "{folder}");
        // The parts and the manifest; no staging left.
        let keys = s3.keys("out", &format!("{folder}/"));
        let manifest = format!("{folder}/_streambatch-manifest.{extension}.json");
        assert_eq!(keys.len(), 4, "{keys:?}");
        assert!(keys.contains(&manifest), "{keys:?}");
        for path in &written {
            let key = path.to_str().unwrap().strip_prefix("s3://out/").unwrap();
            assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
        }
    }
}

/// A resumable write of objects, into a local folder and into a bucket's:
/// stopped by a failed task, it shows nothing new and resumes where it
/// was; an input object replaced since is refused, named.
fn a_resumed_write_checks_its_input_objects(s3: &S3Server, ctx: &Context) {
    let local = tempfile::tempdir().unwrap();
    // 100 ids from `from`, as the Parquet object `f` of the input.
    let put = |f: u64, from: i64| {
        let ids = ctx.range(100, 1).map_batches(
            move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let ids = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
                let shifted: arrow_array::Int64Array =
                    ids.iter().map(|i| Some(i? + from)).collect();
                Ok(RecordBatch::try_from_iter([(
                    "id",
                    std::sync::Arc::new(shifted) as ArrayRef,
                )])?)
            },
            Resources::cpu(1.0),
        );
        let url = format!("s3://out/resume-in/part-{f}.parquet");
        ids.write_parquet_file(url).unwrap();
    };
    for f in 0..4 {
        put(f, f as i64 * 100);
    }
    let resume = ParquetWriteOptions {
        resume: true,
        ..Default::default()
    };
    // The file of ids 200.. fails its task while `stop` is set: two of the
    // four splits' waves are done when the write stops.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let plan = |stop: std::sync::Arc<std::sync::atomic::AtomicBool>| {
        ctx.read_parquet("s3://out/resume-in/")
            .unwrap()
            .map_batches(
                move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                    let ids = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
                    let stopped = stop.load(std::sync::atomic::Ordering::SeqCst);
                    match stopped && ids.value(0) == 200 {
                        true => Err(UdfError::from("stopped")),
                        false => Ok(b),
                    }
                },
                Resources::cpu(1.0),
            )
    };
    // Into a local folder, into a bucket's (over an earlier write; its
    // name written with an escape in a URL), and into one whose input
    // changes below.
    let (out, changed) = (local.path().join("out"), local.path().join("changed"));
    let bucket = std::path::PathBuf::from("s3://out/resumed run/");
    table(ctx, 10, 2).write_parquet(&bucket).unwrap();
    for dir in [&out, &bucket, &changed] {
        assert!(plan(stop.clone()).write_parquet_with(dir, &resume).is_err());
    }
    // Stopped, the bucket's folder shows the earlier write only.
    let keys = s3.keys("out", "resumed run/");
    assert!(
        keys.iter()
            .any(|k| k.starts_with("resumed run/.streambatch-resume/wave-0001/")),
        "{keys:?}"
    );
    assert_eq!(
        ctx.read_parquet("s3://out/resumed run/")
            .unwrap()
            .count()
            .unwrap(),
        10
    );
    stop.store(false, std::sync::atomic::Ordering::SeqCst);
    for dir in [&out, &bucket] {
        let resumed =
            plan(stop.clone()).write_resumable(dir, FileFormat::Parquet(Default::default()));
        let resumed = resumed.unwrap();
        assert_eq!((resumed.splits_run, resumed.splits), (2, 4));
        let back = ctx.read_parquet(dir.to_str().unwrap()).unwrap();
        assert_eq!(
            sorted_i64(&back.collect().unwrap(), "id"),
            (0..400).collect::<Vec<_>>()
        );
    }
    // The bucket's folder: the four parts (one per split) and the
    // manifest; the journal and the earlier write gone.
    let keys = s3.keys("out", "resumed run/");
    assert_eq!(keys.len(), 5, "{keys:?}");
    assert!(
        keys.iter().all(|k| k.starts_with("resumed run/part-0")
            || *k == "resumed run/_streambatch-manifest.parquet.json"),
        "{keys:?}"
    );
    // The last object replaced (the same size: its version tells).
    put(3, 1_000);
    let refused = plan(stop)
        .write_parquet_with(&changed, &resume)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("cannot resume") && refused.contains("s3://out/resume-in/part-3.parquet"),
        "{refused}"
    );
}

fn a_write_replaces_the_last_and_readers_follow_the_manifest(s3: &S3Server, ctx: &Context) {
    let url = "s3://out/parquet/";
    let earlier = s3.keys("out", "parquet/");
    let written = table(ctx, 10, 2).write_parquet(url).unwrap();
    assert_eq!(ctx.read_parquet(url).unwrap().count().unwrap(), 10);
    let keys = s3.keys("out", "parquet/");
    assert_eq!(keys.len(), 3, "two parts and the manifest: {keys:?}");
    assert!(
        earlier
            .iter()
            .all(|k| k.contains("manifest") || !keys.contains(k))
    );
    // A part no manifest lists (another write's, being committed) is not
    // read; a reader that does not know manifests would read it.
    assert_eq!(written.len(), 2);
    let local = tempfile::tempdir().unwrap();
    let stray = local.path().join("stray.parquet");
    table(ctx, 7, 1).write_parquet_file(&stray).unwrap();
    let stray = std::fs::read(stray).unwrap();
    s3.put("out", "parquet/part-000009-other.parquet", &stray);
    assert_eq!(ctx.read_parquet(url).unwrap().count().unwrap(), 10);
    // By a glob, which does not match the manifest itself, the same:
    // before, the stray part was read beside the write's (17 rows).
    for glob in ["s3://out/parquet/*.parquet", "s3://out/parq*/part-*"] {
        assert_eq!(
            ctx.read_parquet(glob).unwrap().count().unwrap(),
            10,
            "{glob}"
        );
    }
    // One file, written in place: it appears whole when its upload ends.
    let one = table(ctx, 500, 2)
        .write_parquet_file("s3://out/one/all.parquet")
        .unwrap();
    assert_eq!(one.to_str(), Some("s3://out/one/all.parquet"));
    let back = ctx.read_parquet("s3://out/one/all.parquet").unwrap();
    assert_eq!(back.count().unwrap(), 500);
}

fn a_large_part_is_uploaded_in_parts(s3: &S3Server, ctx: &Context) {
    // One task, about 21 MB of CSV: three parts of a multipart upload.
    let data = table(ctx, 200_000, 1);
    let written = data.write_csv("s3://out/large/").unwrap();
    assert_eq!(written.len(), 1);
    let back = ctx.read_csv("s3://out/large/").unwrap().collect().unwrap();
    assert_eq!(sorted_i64(&back, "id"), (0..200_000).collect::<Vec<_>>());
    assert!(s3.pending_uploads("out").is_empty());
}

fn failed_writes_leave_the_bucket_as_it_was(s3: &S3Server, ctx: &Context) {
    let before = s3.keys("out", "");
    // Into a folder with an earlier write, and into a new one: the task
    // fails after uploading more than one part (about 15 MB of CSV).
    for url in ["s3://out/csv/", "s3://out/fresh/"] {
        let err = failing(ctx, 200_000, 1, 150_000)
            .write_csv(url)
            .unwrap_err();
        assert!(err.to_string().contains("a bad row"), "{err}");
        assert_eq!(s3.keys("out", ""), before, "{url}");
        assert_eq!(s3.pending_uploads("out"), Vec::<String>::new(), "{url}");
    }
    assert_eq!(
        ctx.read_csv("s3://out/csv/").unwrap().count().unwrap(),
        3_000
    );
}

/// A pipeline file's URLs are not paths relative to the file.
fn a_toml_pipeline_reads_and_writes_urls(ctx: &Context) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("copy.toml");
    let text = "[node]\ncpus = 2\ngpus = 0\n\n[source]\nread_parquet = \"s3://out/parquet/\"\n\n\
                [sink]\nwrite_parquet = \"s3://out/from-toml/\"\n";
    std::fs::write(&file, text).unwrap();
    let run = streambatch::pipeline::Pipeline::load(&file, None)
        .unwrap()
        .run()
        .unwrap();
    assert!(
        run.summary.contains("s3://out/from-toml/"),
        "{}",
        run.summary
    );
    let copied = ctx
        .read_parquet("s3://out/from-toml/")
        .unwrap()
        .collect()
        .unwrap();
    assert_eq!(sorted_i64(&copied, "id"), (0..10).collect::<Vec<_>>());
}

/// A commit whose requests fail after it happened: the manifest's upload
/// lands but its client hears an error, and every delete of the earlier
/// parts and of the staging is refused. The write is committed (a warning,
/// not an error), its parts stay and are read; the next write, with the
/// store well again, leaves only its own parts. Before, the write failed
/// and deleted the parts the landed manifest listed.
fn a_commit_that_failed_after_it_landed_is_committed(s3: &S3Server, ctx: &Context) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let failing = Arc::new(AtomicBool::new(false));
    let faults = Arc::new(AtomicUsize::new(0));
    let (on, count) = (failing.clone(), faults.clone());
    let proxy = FaultProxy::start(s3, move |head| {
        let line = head.lines().next().unwrap_or("");
        let delete = line.starts_with("DELETE") || line.contains("?delete");
        let fault = match on.load(Ordering::SeqCst) {
            true if line.starts_with("PUT") && line.contains("_streambatch-manifest") => {
                Fault::FailAfter
            }
            true if delete => Fault::Refuse,
            _ => Fault::Forward,
        };
        if fault != Fault::Forward {
            count.fetch_add(1, Ordering::SeqCst);
        }
        fault
    });
    s3.make_bucket("faulty");
    // SAFETY: this test's one thread; the bucket's store is made, with
    // this endpoint, on its first use below.
    unsafe {
        std::env::set_var(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", proxy.port),
        )
    };
    let url = "s3://faulty/out/";
    table(ctx, 10, 2).write_parquet(url).unwrap();
    failing.store(true, Ordering::SeqCst);
    let written = table(ctx, 7, 1).write_parquet(url);
    failing.store(false, Ordering::SeqCst);
    // The manifest's upload, and the deletes of the earlier parts.
    assert!(faults.load(Ordering::SeqCst) >= 2, "the faults never hit");
    let written = written.expect("a write whose manifest landed is committed");
    assert_eq!(ctx.read_parquet(url).unwrap().count().unwrap(), 7);
    for path in &written {
        let key = path.to_str().unwrap().strip_prefix("s3://faulty/").unwrap();
        assert!(
            s3.keys("faulty", "out/").iter().any(|k| k == key),
            "{key} gone"
        );
    }
    let last = table(ctx, 5, 1).write_parquet(url).unwrap();
    assert_eq!(ctx.read_parquet(url).unwrap().count().unwrap(), 5);
    let parts: Vec<String> = s3
        .keys("faulty", "out/")
        .into_iter()
        .filter(|k| k.starts_with("out/part-"))
        .collect();
    assert_eq!(parts.len(), last.len(), "{parts:?}");
}

/// Two writes into one bucket folder at once, the second committing
/// later: its manifest's conditional put finds the first's, so it fails
/// with an error saying so and leaves nothing of itself, and the first's
/// output stays whole. Before, the later commit went through and its
/// removal of "earlier" parts could take the first's.
fn two_writes_into_one_folder_at_once_fail_the_later(ctx: &Context) {
    let url = "s3://out/race/";
    let slow = |n: u64, ms: u64| {
        ctx.range(n, 2).map_batches(
            move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(b)
            },
            Resources::cpu(1.0),
        )
    };
    // Both into a folder with an earlier write, then into a fresh one.
    table(ctx, 3, 1).write_parquet(url).unwrap();
    for url in [url, "s3://out/race-fresh/"] {
        let (first, second) = (slow(10, 300), slow(20, 1_200));
        let later = std::thread::spawn({
            let url = url.to_string();
            move || second.write_parquet(&url)
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        first.write_parquet(url).unwrap();
        let later = later.join().unwrap().unwrap_err().to_string();
        assert!(later.contains("another write committed into it"), "{later}");
        assert_eq!(ctx.read_parquet(url).unwrap().count().unwrap(), 10, "{url}");
    }
}
