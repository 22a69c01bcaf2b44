//! A write into a fresh object-store folder (moto's S3 server) SIGKILLed
//! in its commit, after it copied its parts to their final names and
//! before it wrote their manifest: a reader finds no files (an error),
//! never some of them, and the next write into the folder leaves its own
//! parts alone. Before, the copies were read as the whole dataset.
//! (One test: it points this process's object store client at its server.)

mod common;

#[test]
fn a_first_write_killed_in_its_commit_is_never_read_in_part() {
    let test = "a_first_write_killed_in_its_commit_is_never_read_in_part";
    let Some(s3) = streambatch_bench::S3Server::start_for_test(test) else {
        return;
    };
    s3.make_bucket("commits");
    let dir = tempfile::tempdir().unwrap();
    streambatch_bench::make_images(&dir.path().join("images"), 6, 10, 5).unwrap();
    let text = "[node]\ncpus = 2\ngpus = 0\n\n[source]\nread_parquet = \"images\"\n\n\
                [sink]\nwrite_parquet = \"s3://commits/fresh/\"\n";
    std::fs::write(dir.path().join("write.toml"), text).unwrap();
    let run = |faults: &str| common::run_pipeline(dir.path(), "write.toml", faults, &s3.env());
    let mut job = run("commit.pause=20000");
    // Killed once every part has its final name, before the manifest.
    common::kill_when(&mut job, "a commit", || {
        let keys = s3.keys("commits", "fresh/");
        keys.iter().filter(|k| k.starts_with("fresh/part-")).count() == 6
    });

    let ctx = streambatch::Context::with_config(streambatch::NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        ..Default::default()
    })
    .unwrap();
    let read = ctx.read_parquet("s3://commits/fresh/").map(|ds| ds.count());
    assert!(
        !matches!(read, Ok(Ok(_))),
        "a killed first write was read: {:?}",
        read.map(|r| r.map_err(|e| e.to_string()))
    );

    // The next write commits; only its parts are left, and they are read.
    assert!(run("").wait().unwrap().success());
    let count = ctx
        .read_parquet("s3://commits/fresh/")
        .unwrap()
        .count()
        .unwrap();
    assert_eq!(count, 60);
    let parts: Vec<String> = s3
        .keys("commits", "fresh/")
        .into_iter()
        .filter(|k| k.starts_with("fresh/part-"))
        .collect();
    assert_eq!(
        parts.len(),
        6,
        "the killed write's copies were not removed: {parts:?}"
    );
}
