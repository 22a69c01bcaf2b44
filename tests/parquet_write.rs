//! Parquet writes with options: every codec and its level, row groups of a
//! set size, one file or part files, a schema-only file for an empty
//! result, and nothing left behind by a failed write. Each file is read
//! back with streambatch and its metadata with the `parquet` crate.

mod common;

use std::mem::discriminant;
use std::path::Path;

use common::{ctx, people, sorted_i64, visible_files};
use parquet::file::reader::{FileReader, SerializedFileReader};
use streambatch::parquet::basic::Compression;
use streambatch::prelude::*;

/// The codec of every column chunk of `path`, and its row groups' rows.
fn codecs_and_groups(path: &Path) -> (Vec<Compression>, Vec<i64>) {
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let meta = reader.metadata();
    let codecs = meta
        .row_groups()
        .iter()
        .flat_map(|g| g.columns().iter().map(|c| c.compression()))
        .collect();
    let rows = meta.row_groups().iter().map(|g| g.num_rows()).collect();
    (codecs, rows)
}

fn names_of(batches: &[RecordBatch]) -> Vec<String> {
    let mut names: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            let column = b.column_by_name("name").unwrap();
            let names = column
                .as_any()
                .downcast_ref::<streambatch::arrow::array::StringArray>();
            let names = names.unwrap().iter().map(|n| n.unwrap().to_string());
            names.collect::<Vec<_>>()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_codec_writes_what_it_names_and_reads_back_equal() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    let input = ctx.from_batches(vec![people(0..500), people(500..1200)]);
    for codec in [
        "uncompressed",
        "snappy",
        "lz4",
        "lz4_raw",
        "gzip(9)",
        "brotli(5)",
        "zstd(7)",
    ] {
        let options = ParquetWriteOptions::default().with_codec(codec).unwrap();
        assert_eq!(options.codec_name(), codec);
        let out = dir.path().join(codec);
        let written = input.write_parquet_with(&out, &options).unwrap();
        assert!(!written.is_empty(), "{codec}");
        for file in &written {
            let (codecs, _) = codecs_and_groups(file);
            assert!(!codecs.is_empty(), "{codec}: no column chunks");
            // The metadata names the codec, not its level.
            let same = |c: &Compression| discriminant(c) == discriminant(&options.compression);
            assert!(codecs.iter().all(same), "{codec}: {codecs:?}");
        }
        let back = ctx
            .read_parquet(out.to_str().unwrap())
            .unwrap()
            .collect()
            .unwrap();
        assert_eq!(
            sorted_i64(&back, "id"),
            (0..1200).collect::<Vec<_>>(),
            "{codec}"
        );
        let mut want: Vec<String> = (0..1200).map(|i| format!("n{i}")).collect();
        want.sort();
        assert_eq!(names_of(&back), want, "{codec}");
    }
}

#[test]
fn one_file_holds_every_row_in_row_groups_of_the_set_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("people.parquet");
    let ctx = ctx();
    let options = ParquetWriteOptions {
        max_row_group_rows: 100,
        ..ParquetWriteOptions::default()
            .with_codec("zstd(3)")
            .unwrap()
    };
    // Four partitions of 250 rows, streamed into one file.
    let ds = ctx.range(1000, 4).with_column("twice", col("id") * lit(2));
    assert_eq!(ds.write_parquet_file_with(&path, &options).unwrap(), path);
    assert_eq!(visible_files(dir.path()), vec!["people.parquet"]);
    let (codecs, groups) = codecs_and_groups(&path);
    assert!(
        codecs
            .iter()
            .all(|c| discriminant(c) == discriminant(&options.compression))
    );
    assert!(groups.iter().all(|rows| *rows <= 100), "{groups:?}");
    assert_eq!(groups.iter().sum::<i64>(), 1000);
    let back = ctx
        .read_parquet(path.to_str().unwrap())
        .unwrap()
        .collect()
        .unwrap();
    assert_eq!(sorted_i64(&back, "id"), (0..1000).collect::<Vec<_>>());
    assert_eq!(
        sorted_i64(&back, "twice"),
        (0..1000).map(|i| i * 2).collect::<Vec<_>>()
    );

    // Written again, the file is replaced whole.
    ctx.range(10, 1).write_parquet_file(&path).unwrap();
    assert_eq!(
        ctx.read_parquet(path.to_str().unwrap())
            .unwrap()
            .count()
            .unwrap(),
        10
    );
    assert_eq!(visible_files(dir.path()), vec!["people.parquet"]);
}

#[test]
fn an_empty_result_writes_one_file_with_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    let none = ctx
        .from_batches(vec![people(0..50), people(50..100)])
        .filter(col("id").lt(lit(0)));

    let parts = none.write_parquet(dir.path().join("parts")).unwrap();
    assert_eq!(parts.len(), 1, "{parts:?}");
    assert_eq!(
        visible_files(&dir.path().join("parts")),
        vec!["part-000000.parquet"]
    );
    let file = dir.path().join("one.parquet");
    none.write_parquet_file(&file).unwrap();

    // No rows at all from the source: the schema comes from the plan.
    let nothing = ctx
        .range(0, 4)
        .write_parquet(dir.path().join("nothing"))
        .unwrap();
    assert_eq!(nothing.len(), 1, "{nothing:?}");
    let read = ctx.read_parquet(nothing[0].to_str().unwrap()).unwrap();
    assert_eq!(read.schema().unwrap().field(0).name(), "id");
    assert_eq!(read.count().unwrap(), 0);

    for path in [&parts[0], &file] {
        let read = ctx.read_parquet(path.to_str().unwrap()).unwrap();
        let schema = read.schema().unwrap();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "name"], "{}", path.display());
        assert_eq!(read.count().unwrap(), 0);
    }
}

#[test]
fn a_failed_write_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    let failing = ctx.range(100, 4).map_batches(
        |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
            let first = b
                .column(0)
                .as_any()
                .downcast_ref::<streambatch::arrow::array::Int64Array>();
            match first.unwrap().value(0) {
                50.. => Err(UdfError::from("the last two partitions are bad")),
                _ => Ok(b),
            }
        },
        Resources::cpu(1.0),
    );

    // Directories the write would have made are not made.
    let fresh = dir.path().join("fresh");
    let err = failing.write_parquet(fresh.join("nested")).unwrap_err();
    assert!(
        err.to_string().contains("the last two partitions are bad"),
        "{err}"
    );
    assert!(!fresh.exists(), "{:?}", visible_files(&fresh));

    // An earlier write's files stay as they were, with nothing beside them.
    let earlier = dir.path().join("earlier");
    let before = ctx.range(10, 2).write_parquet(&earlier).unwrap();
    failing.write_parquet(&earlier).unwrap_err();
    let names: Vec<String> = before
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    // `visible_files` lists hidden names too: no staging is left.
    assert_eq!(visible_files(&earlier), names);
    assert_eq!(
        ctx.read_parquet(earlier.to_str().unwrap())
            .unwrap()
            .count()
            .unwrap(),
        10
    );

    // One file: neither the file nor its staging copy appears.
    let file = dir.path().join("one.parquet");
    failing.write_parquet_file(&file).unwrap_err();
    // (`visible_files` lists hidden names too: no `.one.parquet.partial`.)
    assert_eq!(visible_files(dir.path()), vec!["earlier"]);
}

#[test]
fn a_codec_it_does_not_know_is_refused_naming_the_choices() {
    let err = ParquetWriteOptions::default()
        .with_codec("zip")
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`zip`") && text.contains("zstd(up to 22)"),
        "{text}"
    );
    for (bad, why) in [
        ("gzip(", "`codec(level)`"),
        ("lzo", "cannot write LZO"),
        ("zstd(99)", "`zstd(99)`"),
    ] {
        let err = ParquetWriteOptions::default().with_codec(bad).unwrap_err();
        assert!(err.to_string().contains(why), "{bad}: {err}");
    }
    let err = ParquetWriteOptions::default()
        .with_codec("zstd")
        .unwrap_err();
    assert!(
        err.to_string().contains("requires a compression level"),
        "{err}"
    );
}

#[test]
fn a_resumable_write_writes_every_row_and_refuses_plans_that_mix_splits() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    let resume = ParquetWriteOptions {
        resume: true,
        ..Default::default()
    };
    let out = dir.path().join("out");
    let files = ctx
        .range(1_000, 10)
        .write_parquet_with(&out, &resume)
        .unwrap();
    assert_eq!(files.len(), 10, "a part per split: {files:?}");
    let read = ctx.read_parquet(out.to_str().unwrap()).unwrap();
    assert_eq!(
        sorted_i64(&read.collect().unwrap(), "id"),
        (0..1_000).collect::<Vec<_>>()
    );
    // Nothing left: the journal goes with the commit.
    assert_eq!(visible_files(&out).len(), 10, "{:?}", visible_files(&out));
    // A result with no rows: one file with the schema.
    let none = ctx.range(100, 4).filter(col("id").lt(lit(0i64)));
    let empty = dir.path().join("empty");
    assert_eq!(none.write_parquet_with(&empty, &resume).unwrap().len(), 1);
    assert_eq!(
        ctx.read_parquet(empty.to_str().unwrap())
            .unwrap()
            .count()
            .unwrap(),
        0
    );
    // Rows that depend on which splits ran, or mix them: refused, named.
    for (plan, why) in [
        (ctx.range(100, 4).sort(&["id"], true), "all-to-all"),
        (ctx.range(100, 4).limit(5), "`limit`"),
    ] {
        let e = plan
            .write_parquet_with(dir.path().join("no"), &resume)
            .unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
}

/// A resumable write cut short (a task failed in a later wave) and started
/// again with a changed predicate: refused, naming the step and both
/// predicates, so that the output never mixes rows filtered two ways. With
/// the same plan it resumes. Before, steps were journalled by name alone
/// and the changed plan resumed.
#[test]
fn a_resumed_write_refuses_a_changed_step() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use streambatch::arrow::array::cast::AsArray;
    use streambatch::arrow::array::types::Int64Type;
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    let resume = ParquetWriteOptions {
        resume: true,
        ..Default::default()
    };
    let out = dir.path().join("out");
    let failing = Arc::new(AtomicBool::new(true));
    let plan = |below: i64| {
        let failing = failing.clone();
        ctx.range(1_000, 10)
            .filter(col("id").lt(lit(below)))
            .map_batches(
                move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                    let ids = b.column(0).as_primitive::<Int64Type>();
                    match failing.load(Ordering::SeqCst) && ids.iter().flatten().any(|i| i >= 500) {
                        true => Err(UdfError::from("cut short")),
                        false => Ok(b),
                    }
                },
                Resources::cpu(1.0),
            )
    };
    let cut = plan(900).write_parquet_with(&out, &resume).unwrap_err();
    assert!(cut.to_string().contains("cut short"), "{cut}");
    failing.store(false, Ordering::SeqCst);
    let changed = plan(800).write_parquet_with(&out, &resume).unwrap_err();
    let changed = changed.to_string();
    assert!(
        changed.contains("(id < 900)") && changed.contains("(id < 800)"),
        "{changed}"
    );
    // The same plan resumes: every row below 900 once.
    plan(900).write_parquet_with(&out, &resume).unwrap();
    let read = ctx.read_parquet(out.to_str().unwrap()).unwrap();
    assert_eq!(
        sorted_i64(&read.collect().unwrap(), "id"),
        (0..900).collect::<Vec<_>>()
    );
}

/// Two writes into one directory at once: the later is refused with an
/// error naming the other, and the earlier's output is whole. Before,
/// both ran, and the second's commit removed parts of the first's.
#[test]
fn a_second_writer_into_a_directory_is_refused_while_the_first_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let ctx = ctx();
    let slow = ctx.range(100, 4).map_batches(
        |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
            std::thread::sleep(std::time::Duration::from_millis(400));
            Ok(b)
        },
        Resources::cpu(1.0),
    );
    let first = {
        let (slow, out) = (slow.clone(), out.clone());
        std::thread::spawn(move || slow.write_parquet(&out))
    };
    // The first has made its staging directory.
    let started = std::time::Instant::now();
    while !std::fs::read_dir(&out).is_ok_and(|mut d| d.next().is_some()) {
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let second = ctx.range(7, 1).write_parquet(&out).unwrap_err().to_string();
    assert!(
        second.contains("another write into it is running"),
        "{second}"
    );
    assert_eq!(first.join().unwrap().unwrap().len(), 4);
    let read = ctx.read_parquet(out.to_str().unwrap()).unwrap();
    assert_eq!(
        sorted_i64(&read.collect().unwrap(), "id"),
        (0..100).collect::<Vec<_>>()
    );
}
