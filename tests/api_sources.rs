//! Each source against a direct computation on the same data.

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use common::{ctx, people, sorted_i64, write_parquet_file};
use streambatch::{col, lit};

#[test]
fn range_yields_each_integer_once() {
    let batches = ctx().range(10_007, 13).collect().unwrap();
    assert_eq!(sorted_i64(&batches, "id"), (0..10_007).collect::<Vec<_>>());
}

#[test]
fn from_batches_returns_the_given_rows() {
    let input = vec![people(0..5), people(5..9), people(9..20)];
    let out = ctx().from_batches(input.clone()).collect().unwrap();
    let mut names: Vec<String> = out
        .iter()
        .flat_map(|b| {
            b.column(1)
                .as_string::<i32>()
                .iter()
                .map(|s| s.unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    names.sort();
    let mut expected: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
    expected.sort();
    assert_eq!(names, expected);
    assert_eq!(sorted_i64(&out, "id"), (0..20).collect::<Vec<_>>());
}

fn measurements(ids: std::ops::Range<i64>) -> RecordBatch {
    let x: Vec<f64> = ids.clone().map(|i| i as f64 * 0.5).collect();
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef,
        ),
        ("x", Arc::new(Float64Array::from(x)) as ArrayRef),
        (
            "tag",
            Arc::new(StringArray::from_iter_values(
                ids.map(|i| format!("t{}", i % 3)),
            )),
        ),
    ])
    .unwrap()
}

/// A bare Parquet source is counted from its files' footers, with no job;
/// behind an operator, the job runs and counts its outputs.
#[test]
fn a_parquet_source_is_counted_from_its_footers() {
    let dir = tempfile::tempdir().unwrap();
    for f in 0..3 {
        write_parquet_file(
            &dir.path().join(format!("m-{f}.parquet")),
            &measurements(f * 100..f * 100 + 10 + f),
        );
    }
    let ctx = ctx();
    let ds = ctx.read_parquet(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(ds.count().unwrap(), 33);
    assert!(ds.stats().is_none(), "a job ran");
    assert_eq!(
        ds.collect()
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        33
    );
    let projected = ctx
        .read_parquet_columns(dir.path().to_str().unwrap(), &["id"])
        .unwrap();
    assert_eq!(projected.count().unwrap(), 33);
    let filtered = ds.filter(col("id").lt(lit(105)));
    assert_eq!(filtered.count().unwrap(), 15);
    assert!(filtered.stats().is_some(), "no job ran");
    // A file gone since it was planned is named.
    std::fs::remove_file(dir.path().join("m-1.parquet")).unwrap();
    let err = ds.count().unwrap_err().to_string();
    assert!(err.contains("m-1.parquet"), "{err}");
}

#[test]
fn read_parquet_reads_many_files_by_glob_and_directory_with_projection() {
    let dir = tempfile::tempdir().unwrap();
    for f in 0..5 {
        write_parquet_file(
            &dir.path().join(format!("m-{f}.parquet")),
            &measurements(f * 100..(f + 1) * 100),
        );
    }
    let ctx = ctx();
    let by_glob = ctx
        .read_parquet(&format!("{}/m-*.parquet", dir.path().display()))
        .unwrap()
        .collect()
        .unwrap();
    let by_dir = ctx
        .read_parquet(dir.path().to_str().unwrap())
        .unwrap()
        .collect()
        .unwrap();
    for out in [&by_glob, &by_dir] {
        assert_eq!(sorted_i64(out, "id"), (0..500).collect::<Vec<_>>());
        let x_sum: f64 = out
            .iter()
            .map(|b| {
                b.column_by_name("x")
                    .unwrap()
                    .as_primitive::<Float64Type>()
                    .values()
                    .iter()
                    .sum::<f64>()
            })
            .sum();
        assert_eq!(x_sum, (0..500).map(|i| i as f64 * 0.5).sum::<f64>());
    }
    // Projection, in the order asked.
    let ds = ctx
        .read_parquet_columns(dir.path().to_str().unwrap(), &["x", "id"])
        .unwrap();
    let out = ds.collect().unwrap();
    let names: Vec<_> = out[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["x", "id"]);
    for b in &out {
        let ids = b.column(1).as_primitive::<Int64Type>();
        let xs = b.column(0).as_primitive::<Float64Type>();
        for (i, x) in ids.values().iter().zip(xs.values()) {
            assert_eq!(*x, *i as f64 * 0.5);
        }
    }
}

#[test]
fn read_csv_reads_values_and_infers_types() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = Vec::new();
    for f in 0..3 {
        let mut text = String::from("id,score,label\n");
        for i in f * 10..(f + 1) * 10 {
            text.push_str(&format!("{i},{}.25,l{}\n", i * 2, i % 4));
            expected.push((i, i as f64 * 2.0 + 0.25, format!("l{}", i % 4)));
        }
        std::fs::write(dir.path().join(format!("part{f}.csv")), text).unwrap();
    }
    let rows = ctx()
        .read_csv(dir.path().to_str().unwrap())
        .unwrap()
        .iter_rows()
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let mut got: Vec<(i64, f64, String)> = rows
        .iter()
        .map(|r| {
            (
                r.int("id").unwrap(),
                r.float("score").unwrap(),
                r.str("label").unwrap().to_string(),
            )
        })
        .collect();
    got.sort_by_key(|r| r.0);
    assert_eq!(got, expected);
}

#[test]
fn read_binary_files_gives_path_and_bytes_per_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = Vec::new();
    for f in 0..20u8 {
        let path = dir.path().join(format!("blob-{f:02}.bin"));
        let bytes: Vec<u8> = (0..f as usize * 7)
            .map(|i| (i as u8).wrapping_mul(f))
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        expected.push((path.display().to_string(), bytes));
    }
    let rows = ctx()
        .read_binary_files(dir.path().to_str().unwrap())
        .unwrap()
        .iter_rows()
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let mut got: Vec<(String, Vec<u8>)> = rows
        .iter()
        .map(|r| {
            (
                r.str("path").unwrap().to_string(),
                r.bytes("bytes").unwrap().to_vec(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(got, expected);
}

/// Files as Spark, DuckDB and pyarrow write them: every codec the Parquet
/// format names (LZO aside, which the `parquet` crate cannot read).
#[test]
fn read_parquet_reads_every_codec() {
    use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
    use parquet::file::properties::WriterProperties;

    let codecs = [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::GZIP(GzipLevel::default()),
        Compression::LZ4,
        Compression::LZ4_RAW,
        Compression::ZSTD(ZstdLevel::default()),
        Compression::BROTLI(BrotliLevel::default()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let batch = people(0..1_000);
    for codec in codecs {
        let path = dir
            .path()
            .join(format!("{codec:?}.parquet").replace(['(', ')'], "_"));
        let props = WriterProperties::builder().set_compression(codec).build();
        let file = std::fs::File::create(&path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props))
            .unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        w.write(&batch).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        w.close().unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        let out = ctx()
            .read_parquet(path.to_str().unwrap())
            .unwrap()
            .collect()
            .unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        assert_eq!(
            sorted_i64(&out, "id"),
            (0..1_000).collect::<Vec<_>>(),
            "{codec:?}"
        );
    }
}

#[test]
fn read_text_gives_one_row_per_line_without_its_ending() {
    let dir = tempfile::tempdir().unwrap();
    // Unix and Windows endings, an empty line, no final newline, and a
    // file long enough for several batches.
    std::fs::write(dir.path().join("a.txt"), "alpha\r\n\nbeta\ngamma").unwrap();
    let long: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(dir.path().join("b.txt"), &long).unwrap();
    std::fs::write(dir.path().join("c.log"), "not matched\n").unwrap();
    let ctx = ctx();
    let pattern = dir.path().join("*.txt");
    let ds = ctx.read_text(pattern.to_str().unwrap()).unwrap();
    assert_eq!(
        ds.input_files(),
        vec![dir.path().join("a.txt"), dir.path().join("b.txt")]
    );
    let mut lines: Vec<String> = ds
        .iter_rows()
        .unwrap()
        .map(|r| r.unwrap().str("text").unwrap().to_string())
        .collect();
    let mut want: Vec<String> = ["alpha", "", "beta", "gamma"]
        .into_iter()
        .map(String::from)
        .chain((0..20_000).map(|i| format!("line {i}")))
        .collect();
    lines.sort();
    want.sort();
    assert_eq!(lines, want);
    assert!(ctx.range(10, 2).input_files().is_empty());
}

#[test]
fn a_text_line_that_is_not_utf8_is_named_with_its_file_and_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.txt");
    std::fs::write(&path, b"fine\nalso fine\n\xff\xfe\n").unwrap();
    let err = ctx()
        .read_text(path.to_str().unwrap())
        .unwrap()
        .count()
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad.txt") && err.contains("line 3"), "{err}");
}

#[test]
fn read_json_merges_the_files_schemas_and_reads_every_object() {
    use arrow_array::Array;
    let dir = tempfile::tempdir().unwrap();
    // The second file adds a field; nested objects and lists; a null.
    std::fs::write(
        dir.path().join("a.json"),
        "{\"id\": 1, \"name\": \"ann\", \"tags\": [\"x\", \"y\"]}\n\
         {\"id\": 2, \"name\": null, \"tags\": []}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.json"),
        "{\"id\": 3, \"name\": \"bo\", \"tags\": [\"z\"], \"place\": {\"city\": \"Oslo\"}}\n",
    )
    .unwrap();
    let ctx = ctx();
    let ds = ctx.read_json(dir.path().to_str().unwrap()).unwrap();
    let schema = ds.schema().unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "name", "tags", "place"]);
    let batches = ds.collect().unwrap();
    assert_eq!(sorted_i64(&batches, "id"), vec![1, 2, 3]);
    let mut seen = Vec::new();
    for b in &batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let names = b.column(1).as_string::<i32>();
        let tags = b.column(2).as_list::<i32>();
        let place = b.column(3).as_struct();
        for i in 0..b.num_rows() {
            let tags = tags.value(i);
            let tags: Vec<String> = tags
                .as_string::<i32>()
                .iter()
                .map(|t| t.unwrap().to_string())
                .collect();
            let city = place.column(0).as_string::<i32>();
            let city = (!place.is_null(i)).then(|| city.value(i).to_string());
            let name = (!names.is_null(i)).then(|| names.value(i).to_string());
            seen.push((ids.value(i), name, tags, city));
        }
    }
    seen.sort();
    let s = |v: &str| v.to_string();
    assert_eq!(
        seen,
        vec![
            (1, Some(s("ann")), vec![s("x"), s("y")], None),
            (2, None, vec![], None),
            (3, Some(s("bo")), vec![s("z")], Some(s("Oslo"))),
        ]
    );
}

#[test]
fn json_values_of_mixed_types_read_as_their_common_type() {
    let dir = tempfile::tempdir().unwrap();
    // A number and a string in one file: strings. Integers in one file,
    // floats in the other: floats.
    std::fs::write(
        dir.path().join("a.json"),
        "{\"v\": 1, \"n\": 1}\n{\"v\": \"x\", \"n\": 2}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("b.json"), "{\"v\": \"y\", \"n\": 2.5}\n").unwrap();
    let batches = ctx()
        .read_json(dir.path().to_str().unwrap())
        .unwrap()
        .collect()
        .unwrap();
    let mut got: Vec<(String, f64)> = Vec::new();
    for b in &batches {
        let v = b.column_by_name("v").unwrap().as_string::<i32>();
        let n = b.column_by_name("n").unwrap().as_primitive::<Float64Type>();
        got.extend((0..b.num_rows()).map(|i| (v.value(i).to_string(), n.value(i))));
    }
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, [(s("1"), 1.0), (s("x"), 2.0), (s("y"), 2.5)]);
}

fn s(v: &str) -> String {
    v.to_string()
}

#[test]
fn a_json_file_that_is_not_json_is_named_when_planned_or_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.json"), "{\"id\": 1}\n").unwrap();
    std::fs::write(dir.path().join("bad.json"), "{\"id\": 2}\n{\"id\": \n").unwrap();
    let err = ctx()
        .read_json(dir.path().to_str().unwrap())
        .and_then(|ds| ds.count())
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad.json"), "{err}");

    // Past the 1,000 objects the schema is inferred from: the read fails.
    let late = tempfile::tempdir().unwrap();
    let mut text: String = (0..1_500).map(|i| format!("{{\"id\": {i}}}\n")).collect();
    text.push_str("{\"id\": oops}\n");
    std::fs::write(late.path().join("late.json"), text).unwrap();
    let ds = ctx().read_json(late.path().to_str().unwrap()).unwrap();
    let err = ds.count().unwrap_err().to_string();
    assert!(err.contains("late.json"), "{err}");
}

/// Files of more than half the store, and one larger than the whole store,
/// among small ones, cut into pieces on a node with a small store: the
/// tasks holding large files take turns (the budget counts the files they
/// hold), and every byte arrives once.
#[test]
fn binary_files_larger_than_the_store_are_cut_without_a_stall() {
    let dir = tempfile::tempdir().unwrap();
    let mut want: Vec<(String, u64, u64)> = Vec::new();
    for f in 0..24usize {
        let size = match f {
            5 | 11 => 5 << 20,
            17 => 12 << 20,
            _ => 1000 + f * 997,
        };
        let bytes: Vec<u8> = (0..size).map(|i| (i % 253) as u8 ^ f as u8).collect();
        let path = dir.path().join(format!("blob-{f:02}.bin"));
        std::fs::write(&path, &bytes).unwrap();
        let sum = bytes.iter().map(|&b| b as u64).sum();
        want.push((path.display().to_string(), size as u64, sum));
    }
    let ctx = common::ctx_with(|c| {
        c.cpus = 2.0;
        c.store_capacity = 8 << 20;
    });
    let pieces = ctx
        .read_binary_files(dir.path().to_str().unwrap())
        .unwrap()
        .flat_map_batches(
            streambatch::ops::chunk_binary("bytes", 64 << 10),
            streambatch::Resources::cpu(1.0),
        );
    // A stall fails the test instead of hanging it.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut got: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for batch in pieces.iter_batches().unwrap() {
            let batch = batch.unwrap();
            let paths = batch.column_by_name("path").unwrap().as_string::<i32>();
            let data = batch.column_by_name("bytes").unwrap().as_binary::<i32>();
            for (path, piece) in paths.iter().zip(data.iter()) {
                let (len, sum) = got.entry(path.unwrap().to_string()).or_default();
                let piece = piece.unwrap();
                *len += piece.len() as u64;
                *sum += piece.iter().map(|&b| b as u64).sum::<u64>();
            }
        }
        let _ = done.send(got);
    });
    let got = match finished.recv_timeout(std::time::Duration::from_secs(120)) {
        Ok(got) => got,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("the job stalled"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the job's thread failed"),
    };
    let got: Vec<(String, u64, u64)> = got.into_iter().map(|(p, (l, s))| (p, l, s)).collect();
    assert_eq!(got, want);
}
