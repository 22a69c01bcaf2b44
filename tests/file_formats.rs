//! Round trips through the other file formats: CSV, newline-delimited JSON
//! and Arrow IPC written by streambatch and read back by it, with the same
//! values; each writes `part-*` files all or nothing and a file for an
//! empty result.

mod common;

use common::{ctx, people, sorted_i64, visible_files};
use streambatch::arrow::array::RecordBatch;
use streambatch::arrow::array::cast::AsArray;
use streambatch::prelude::*;

/// The (id, name) pairs of `batches`, sorted.
fn pairs(batches: &[RecordBatch]) -> Vec<(i64, String)> {
    let mut pairs: Vec<(i64, String)> = batches
        .iter()
        .flat_map(|b| {
            let ids = b.column_by_name("id").unwrap();
            let ids = ids.as_primitive::<streambatch::arrow::array::types::Int64Type>();
            let names = b.column_by_name("name").unwrap();
            let names = names.as_string::<i32>();
            (0..b.num_rows())
                .map(|i| (ids.value(i), names.value(i).to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    pairs.sort();
    pairs
}

#[test]
fn csv_json_and_ipc_round_trip_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    let input = ctx.from_batches(vec![people(0..400), people(400..1000)]);
    let want: Vec<(i64, String)> = (0..1000).map(|i| (i, format!("n{i}"))).collect();

    type Write = fn(&Dataset, &std::path::Path) -> streambatch::Result<Vec<std::path::PathBuf>>;
    type Read = fn(&Context, &str) -> streambatch::Result<Dataset>;
    let formats: [(&str, Write, Read); 3] = [
        ("csv", |d, p| d.write_csv(p), |c, p| c.read_csv(p)),
        ("json", |d, p| d.write_json(p), |c, p| c.read_json(p)),
        ("arrow", |d, p| d.write_ipc(p), |c, p| c.read_ipc(p)),
    ];
    for (extension, write, read) in formats {
        let out = dir.path().join(extension);
        let written = write(&input, &out).unwrap();
        assert_eq!(written.len(), 2, "{extension}: a file per task");
        for name in visible_files(&out) {
            assert!(
                name.starts_with("part-") && name.ends_with(&format!(".{extension}")),
                "{extension}: {name}"
            );
        }
        let back = read(&ctx, out.to_str().unwrap()).unwrap();
        assert_eq!(back.input_files().len(), 2);
        assert_eq!(pairs(&back.collect().unwrap()), want, "{extension}");

        // Written again, the earlier parts are replaced.
        write(&ctx.from_batches(vec![people(0..5)]), &out).unwrap();
        let again = read(&ctx, out.to_str().unwrap())
            .unwrap()
            .collect()
            .unwrap();
        assert_eq!(sorted_i64(&again, "id"), vec![0, 1, 2, 3, 4], "{extension}");
    }
}

#[test]
fn an_empty_result_leaves_one_file_a_reader_opens() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    let none = ctx
        .from_batches(vec![people(0..10)])
        .filter(col("id").lt(lit(0)));

    // CSV: the header alone; IPC: the schema alone.
    let csv = none.write_csv(dir.path().join("csv")).unwrap();
    assert_eq!(csv.len(), 1);
    assert_eq!(std::fs::read_to_string(&csv[0]).unwrap().trim(), "id,name");
    let ipc = none.write_ipc(dir.path().join("ipc")).unwrap();
    let read = ctx.read_ipc(ipc[0].to_str().unwrap()).unwrap();
    let schema = read.schema().unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "name"]);
    assert_eq!(read.count().unwrap(), 0);
    // JSON: an empty file (no objects).
    let json = none.write_json(dir.path().join("json")).unwrap();
    assert_eq!(std::fs::read(&json[0]).unwrap().len(), 0);
}

#[test]
fn ipc_files_whose_schemas_disagree_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx();
    ctx.from_batches(vec![people(0..3)])
        .write_ipc(dir.path().join("a"))
        .unwrap();
    ctx.range(3, 1).write_ipc(dir.path().join("b")).unwrap();
    let both = dir.path().join("*/part-*.arrow");
    let err = ctx.read_ipc(both.to_str().unwrap()).err().unwrap();
    let text = err.to_string();
    assert!(
        text.contains("a/part-") && text.contains("b/part-"),
        "{text}"
    );
}
