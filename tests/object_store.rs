//! Files read from an S3-compatible store: moto's server, started here on
//! 127.0.0.1 from a Python that has it (`SB_PYTHON`, else `python3`;
//! `.ci/run` installs it). Parquet from a prefix, a glob, columns with a
//! filter that prunes row groups, a file over plain HTTP, and the errors
//! for a missing object and bucket and a denied key; every other file
//! format, read as from a local directory.

mod common;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use common::ctx;
use streambatch::prelude::*;
use streambatch::{Context, Dataset};
use streambatch_bench::{S3Server, Throttle};

/// Four Parquet files of 25,000 rows (ids 0..100,000 in order, a name each),
/// row groups of 5,000 rows, as local files.
fn parquet_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    (0..4)
        .map(|f| {
            let ids: Vec<i64> = (f * 25_000..(f + 1) * 25_000).collect();
            let names: Vec<String> = ids.iter().map(|i| format!("n{i}")).collect();
            let batch = RecordBatch::try_from_iter([
                ("id", std::sync::Arc::new(Int64Array::from(ids)) as _),
                ("name", std::sync::Arc::new(StringArray::from(names)) as _),
            ])
            .unwrap();
            let path = dir.join(format!("part-{f}.parquet"));
            let props = parquet::file::properties::WriterProperties::builder()
                .set_max_row_group_row_count(Some(5_000))
                .build();
            let file = std::fs::File::create(&path).unwrap();
            let mut writer =
                parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
            writer.write(&batch).unwrap();
            writer.close().unwrap();
            path
        })
        .collect()
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let id = b.column_by_name("id").unwrap();
            id.as_primitive::<Int64Type>().values().to_vec()
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// One test, one server: the client reads its endpoint from the
/// environment, which tests running side by side would share.
#[test]
fn files_read_from_an_s3_compatible_store() {
    let Some(s3) = S3Server::start_for_test("files_read_from_an_s3_compatible_store") else {
        return;
    };
    s3.make_bucket("data");
    let dir = tempfile::tempdir().unwrap();
    let files = parquet_files(dir.path());
    for path in &files {
        let name = path.file_name().unwrap().to_str().unwrap();
        s3.put(
            "data",
            &format!("events/{name}"),
            &std::fs::read(path).unwrap(),
        );
    }
    // Hidden and marker objects are not data, nor a folder below.
    s3.put("data", "events/_SUCCESS", &[]);
    s3.put("data", "events/_temporary/0/part-9.parquet", b"partial");
    s3.put("data", "events/old/part-0.parquet", b"not this folder's");
    let ctx = ctx();
    let all = ctx.read_parquet("s3://data/events/").unwrap();
    let (gets, ahead) = (
        streambatch::object_gets(),
        streambatch::object_reads_ahead(),
    );
    assert_eq!(
        ids(&all.collect().unwrap()),
        (0..100_000).collect::<Vec<_>>()
    );
    // As the task over a file starts, the next files' first row groups
    // are fetched: the tasks over files 1 to 3 find theirs fetched, and no
    // row group is fetched twice (20, a request each; the footers were
    // fetched when the dataset was made).
    assert_eq!(streambatch::object_reads_ahead() - ahead, 3);
    assert_eq!(streambatch::object_gets() - gets, 20);
    let two = ctx
        .read_parquet("s3://data/events/part-[12].parquet")
        .unwrap();
    assert_eq!(
        ids(&two.collect().unwrap()),
        (25_000..75_000).collect::<Vec<_>>()
    );
    let one = ctx.read_parquet("s3://data/events/part-3.parquet").unwrap();
    assert_eq!(
        ids(&one.collect().unwrap()),
        (75_000..100_000).collect::<Vec<_>>()
    );
    // Only the id column, and only row groups that may hold ids >= 96,000:
    // one row group's one column of the four files' 20, and the footers (each
    // fetched with the last 16 KiB of its file).
    let pruned = ctx
        .read_parquet_columns("s3://data/events/", &["id"])
        .unwrap()
        .filter(col("id").gt_eq(lit(96_000i64)));
    let (before, gets_before) = (streambatch::object_bytes_read(), streambatch::object_gets());
    let out = pruned.collect().unwrap();
    let read = streambatch::object_bytes_read() - before;
    // The footers were read when the dataset was made, and are kept: the
    // run fetches the one row group's one column, in one request.
    assert_eq!(streambatch::object_gets() - gets_before, 1);
    let whole: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert!(read > 0 && read * 8 < whole, "read {read} of {whole} bytes");
    assert!(out.iter().all(|b| b.num_columns() == 1));
    assert_eq!(ids(&out), (96_000..100_000).collect::<Vec<_>>());
    // Missing: the URL named.
    let missing = ctx
        .read_parquet("s3://data/nothing/")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(missing.contains("s3://data/nothing/"), "{missing}");
    let bucket = ctx
        .read_parquet("s3://no-such-bucket/x.parquet")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(bucket.contains("s3://no-such-bucket/x.parquet"), "{bucket}");
    // The same file over plain HTTP (range requests, no listing), read
    // twice, the second time with the store kept for that server.
    let bytes = std::fs::read(&files[2]).unwrap();
    s3.put_public("data", "public/part-2.parquet", &bytes);
    let http = format!("http://127.0.0.1:{}/data/public/part-2.parquet", s3.port);
    for _ in 0..2 {
        let ds = ctx.read_parquet(&http).unwrap();
        assert_eq!(
            ids(&ds.collect().unwrap()),
            (50_000..75_000).collect::<Vec<_>>()
        );
    }
    every_format_reads_from_s3_as_from_a_local_directory(&s3);
    throttled_requests_are_retried(&s3, &files);
    a_denied_key_is_named_in_the_error(&s3, &files);
}

/// Last, since it turns on the server's access checks for good: a user
/// allowed `locked/open/` reads it, and a key outside it, read or
/// written, fails naming its URL and the refusal.
fn a_denied_key_is_named_in_the_error(s3: &S3Server, files: &[std::path::PathBuf]) {
    s3.make_bucket("locked");
    let bytes = std::fs::read(&files[0]).unwrap();
    s3.put("locked", "open/part-0.parquet", &bytes);
    s3.put("locked", "closed/part-0.parquet", &bytes);
    let (key, secret) = s3.lock_down("locked", "open/");
    // SAFETY: as above; the bucket's store is made, with these
    // credentials, on its first use below.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", s3.port));
        std::env::set_var("AWS_ACCESS_KEY_ID", &key);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", &secret);
    }
    let ctx = ctx();
    let open = ctx.read_parquet("s3://locked/open/part-0.parquet").unwrap();
    assert_eq!(
        ids(&open.collect().unwrap()),
        (0..25_000).collect::<Vec<_>>()
    );
    let denied = ctx
        .read_parquet("s3://locked/closed/part-0.parquet")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    let named = |e: &str, url: &str| e.contains(url) && e.contains("403 Forbidden");
    assert!(
        named(&denied, "s3://locked/closed/part-0.parquet"),
        "{denied}"
    );
    // Refused at its first part, in the staging folder: the upload's
    // error, not a panic of the writer.
    let written = open
        .write_parquet("s3://locked/closed/out/")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(named(&written, "s3://locked/closed/out/"), "{written}");
    keys_from_the_aws_profile_files(&key, &secret);
}

/// With no keys in the environment, the AWS profile `AWS_PROFILE` names
/// gives them from the shared credentials file (beside a config file, as
/// `aws configure` leaves them): the user allowed `locked/open/` reads it. (`s3a://` names
/// the same bucket through a store of its own, made with these settings.)
fn keys_from_the_aws_profile_files(key: &str, secret: &str) {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::write(
        &credentials,
        format!("[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n[reader]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"),
    )
    .unwrap();
    let config = dir.path().join("config");
    std::fs::write(&config, "[profile reader]\nregion = us-east-1\n").unwrap();
    // SAFETY: as above.
    unsafe {
        std::env::remove_var("AWS_ACCESS_KEY_ID");
        std::env::remove_var("AWS_SECRET_ACCESS_KEY");
        std::env::remove_var("AWS_REGION");
        std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", &credentials);
        std::env::set_var("AWS_CONFIG_FILE", &config);
        std::env::set_var("AWS_PROFILE", "reader");
    }
    let open = ctx()
        .read_parquet("s3a://locked/open/part-0.parquet")
        .unwrap();
    assert_eq!(
        ids(&open.collect().unwrap()),
        (0..25_000).collect::<Vec<_>>()
    );
    // A profile neither file has: named, before any request.
    unsafe { std::env::set_var("AWS_PROFILE", "nobody") };
    let unknown = ctx()
        .read_parquet("s3a://elsewhere/x.parquet")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("`nobody`"), "{unknown}");
}

/// A store that answers 503 (S3's "slow down") to its first requests: the
/// client retries with backoff, and the read gets every row.
fn throttled_requests_are_retried(s3: &S3Server, files: &[std::path::PathBuf]) {
    s3.make_bucket("slow");
    let bytes = std::fs::read(&files[0]).unwrap();
    s3.put("slow", "events/part-0.parquet", &bytes);
    let throttle = Throttle::start(s3, 3);
    // SAFETY: as above; the bucket's store is made, with this endpoint,
    // on its first use below.
    unsafe {
        std::env::set_var(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", throttle.port),
        )
    };
    let ds = ctx().read_parquet("s3://slow/events/").unwrap();
    assert_eq!(ids(&ds.collect().unwrap()), (0..25_000).collect::<Vec<_>>());
    let refused = throttle.refused.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(refused, 3, "every refused request was retried");
}

/// Every row of `batches`, as text, sorted: two reads compare equal when
/// they hold the same rows whatever their order.
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut rows: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            let b = b.clone();
            (0..b.num_rows()).map(move |i| {
                let columns = (0..b.num_columns()).map(|c| {
                    let value = arrow_cast::display::ArrayFormatter::try_new(
                        b.column(c).as_ref(),
                        &Default::default(),
                    )
                    .unwrap();
                    value.value(i).to_string()
                });
                columns.collect::<Vec<_>>().join("|")
            })
        })
        .collect();
    rows.sort();
    rows
}

/// CSV, JSON, IPC, text, images and binary files written locally, stored
/// in `s3`, read from there and from disk: the same rows.
fn every_format_reads_from_s3_as_from_a_local_directory(s3: &S3Server) {
    s3.make_bucket("formats");
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    let table = ctx
        .range(3_000, 3)
        .with_column("twice", col("id") * lit(2i64));
    table.write_csv(dir.path().join("csv")).unwrap();
    table.write_json(dir.path().join("json")).unwrap();
    table.write_ipc(dir.path().join("ipc")).unwrap();
    let text = dir.path().join("text");
    std::fs::create_dir(&text).unwrap();
    std::fs::write(text.join("a.txt"), "one\ntwo\r\nthree").unwrap();
    let images = dir.path().join("images");
    std::fs::create_dir(&images).unwrap();
    image::RgbImage::from_fn(6, 4, |x, y| image::Rgb([x as u8 * 40, y as u8 * 60, 7]))
        .save(images.join("a.png"))
        .unwrap();
    for folder in ["csv", "json", "ipc", "text", "images"] {
        for entry in std::fs::read_dir(dir.path().join(folder)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            s3.put(
                "formats",
                &format!("{folder}/{name}"),
                &std::fs::read(&path).unwrap(),
            );
        }
    }
    let local = |folder: &str| dir.path().join(folder).display().to_string();
    let remote = |folder: &str| format!("s3://formats/{folder}/");
    type Read = fn(&Context, &str) -> Dataset;
    let readers: [(&str, Read); 5] = [
        ("csv", |c, p| c.read_csv(p).unwrap()),
        ("json", |c, p| c.read_json(p).unwrap()),
        ("ipc", |c, p| c.read_ipc(p).unwrap()),
        ("text", |c, p| c.read_text(p).unwrap()),
        ("images", |c, p| c.read_images(p, 2, 3).unwrap()),
    ];
    for (folder, read) in readers {
        let from_s3 = read(&ctx, &remote(folder)).collect().unwrap();
        let from_disk = read(&ctx, &local(folder)).collect().unwrap();
        // Rows name their file (text lines do not): compare without the path.
        let strip = |batches: Vec<RecordBatch>| -> Vec<RecordBatch> {
            batches
                .into_iter()
                .map(|b| match b.schema().index_of("path") {
                    Ok(at) => {
                        let keep: Vec<usize> = (0..b.num_columns()).filter(|&c| c != at).collect();
                        b.project(&keep).unwrap()
                    }
                    Err(_) => b,
                })
                .collect()
        };
        let (from_s3, from_disk) = (strip(from_s3), strip(from_disk));
        assert!(!rows(&from_disk).is_empty(), "{folder}");
        assert_eq!(rows(&from_s3), rows(&from_disk), "{folder}");
    }
    let binary = ctx
        .read_binary_files(&remote("text"))
        .unwrap()
        .collect()
        .unwrap();
    let bytes = binary[0]
        .column_by_name("bytes")
        .unwrap()
        .as_binary::<i32>();
    assert_eq!(bytes.value(0), b"one\ntwo\r\nthree");
    // A file across several of the reader's 8 MiB windows, and a key a
    // URL must encode.
    let large: Vec<u8> = (0..(9u32 << 20)).map(|i| (i % 251) as u8).collect();
    s3.put("formats", "large/a%23b.bin", &large);
    let read = ctx.read_binary_files(&remote("large")).unwrap();
    let read = read.collect().unwrap();
    let bytes = read[0].column_by_name("bytes").unwrap().as_binary::<i32>();
    assert!(
        bytes.value(0) == large.as_slice(),
        "{} bytes",
        bytes.value(0).len()
    );
}
