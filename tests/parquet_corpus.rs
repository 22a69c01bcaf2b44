//! The Parquet corpus of `tools/corpus/parquet_corpus.py` (pyarrow): every
//! physical and logical type, nested lists, structs and maps, nulls, every
//! codec x dictionary on/off x data page v1/v2, several row groups, INT96,
//! decimals stored as integers, the DELTA and BYTE_STREAM_SPLIT encodings
//! and an empty file. streambatch must read each with the values pyarrow
//! reads (`*.expected.arrow`), and a round trip through `write_parquet`
//! must keep them.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use common::ctx;
use streambatch::prelude::*;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/parquet")
}

/// The corpus files of one group (`all_types`, `int96`, ...), sorted.
fn files_of(group: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(&format!("{group}.")) && name.ends_with(".parquet")
        })
        .collect();
    files.sort();
    files
}

/// What pyarrow read from the group's files, as one batch.
fn expected(group: &str) -> RecordBatch {
    let path = corpus().join(format!("{group}.expected.arrow"));
    let reader = arrow_ipc::reader::FileReader::try_new(File::open(&path).unwrap(), None).unwrap();
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    arrow_select::concat::concat_batches(&schema, &batches).unwrap()
}

/// A column as values: a dictionary's keys looked up, since each row
/// group (and each reader) builds dictionaries of its own.
fn values_of(column: &ArrayRef) -> ArrayRef {
    match column.data_type() {
        DataType::Dictionary(_, value) => arrow_cast::cast(column, value).unwrap(),
        _ => column.clone(),
    }
}

/// Checks `batches` hold `expected`'s columns, names, types and values,
/// naming the first column and row that differ.
fn assert_same(what: &str, schema: &SchemaRef, batches: &[RecordBatch], expected: &RecordBatch) {
    let got = arrow_select::concat::concat_batches(schema, batches).unwrap();
    assert_eq!(got.num_rows(), expected.num_rows(), "{what}: rows");
    assert_eq!(got.num_columns(), expected.num_columns(), "{what}: columns");
    for (field, want_field) in got.schema().fields().iter().zip(expected.schema().fields()) {
        let name = want_field.name();
        assert_eq!(field.name(), name, "{what}: column order");
        // Names of nested fields aside: Parquet calls a list's items
        // `element`, Arrow `item`.
        assert!(
            field.data_type().equals_datatype(want_field.data_type()),
            "{what}: `{name}` is {}, pyarrow's is {}",
            field.data_type(),
            want_field.data_type()
        );
        let got = values_of(got.column_by_name(name).unwrap());
        let want = values_of(expected.column_by_name(name).unwrap());
        let want = arrow_cast::cast(&want, got.data_type()).unwrap();
        if got.to_data() != want.to_data() {
            let row = (0..want.len())
                .find(|&i| got.slice(i, 1).to_data() != want.slice(i, 1).to_data())
                .unwrap_or(0);
            panic!(
                "{what}: `{name}` differs first at row {row}: got {:?}, pyarrow {:?}",
                got.slice(row, 1),
                want.slice(row, 1)
            );
        }
    }
}

/// Reads `path` with streambatch: its schema and batches, in file order
/// (one file is one task).
fn read(ctx: &Context, path: &Path) -> (SchemaRef, Vec<RecordBatch>) {
    let ds = ctx.read_parquet(path.to_str().unwrap()).unwrap();
    let schema = ds.schema().unwrap();
    (schema, ds.collect().unwrap())
}

/// Reads every file of `group`, compares with pyarrow, writes the rows
/// back with `write_parquet_file` and compares again.
fn check_group(group: &str, least_files: usize) {
    let ctx = ctx();
    let expected = expected(group);
    let files = files_of(group);
    assert!(files.len() >= least_files, "{group}: {files:?}");
    let out = tempfile::tempdir().unwrap();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let (schema, batches) = read(&ctx, file);
        assert_same(&name, &schema, &batches, &expected);

        let copy = out.path().join(&name);
        ctx.read_parquet(file.to_str().unwrap())
            .unwrap()
            .write_parquet_file(&copy)
            .unwrap();
        let (schema, batches) = read(&ctx, &copy);
        assert_same(
            &format!("{name} written back"),
            &schema,
            &batches,
            &expected,
        );
    }
}

#[test]
fn every_type_codec_dictionary_and_page_version_reads_as_pyarrow_reads_it() {
    // 6 codecs x dictionary on/off x data page v1/v2.
    check_group("all_types", 24);
}

#[test]
fn delta_and_byte_stream_split_encodings_read_as_pyarrow_reads_them() {
    check_group("encodings", 1);
}

#[test]
fn int96_timestamps_read_as_nanoseconds() {
    check_group("int96", 1);
}

#[test]
fn decimals_stored_as_integers_read_as_decimals() {
    check_group("decimals_as_int", 1);
}

#[test]
fn an_empty_file_reads_as_its_schema_and_no_rows() {
    check_group("empty", 1);
}

#[test]
fn the_corpus_spans_several_row_groups_and_every_codec() {
    use parquet::basic::Compression;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let mut codecs = std::collections::BTreeSet::new();
    for file in files_of("all_types") {
        let reader = SerializedFileReader::new(File::open(&file).unwrap()).unwrap();
        let meta = reader.metadata();
        assert!(meta.num_row_groups() >= 3, "{file:?}");
        codecs.insert(format!("{:?}", meta.row_group(0).column(0).compression()));
    }
    let want: std::collections::BTreeSet<String> = [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::GZIP(Default::default()),
        Compression::BROTLI(Default::default()),
        Compression::LZ4_RAW,
        Compression::ZSTD(Default::default()),
    ]
    .iter()
    .map(|c| format!("{c:?}"))
    .collect();
    assert_eq!(codecs, want);
}

/// Writes at `path` a Parquet file of `rows` (< 64) rows in row groups of
/// 20 whose footer says it holds no rows, as an old writer wrote them
/// (pyarrow reads the rows). The footer's `num_rows` (FileMetaData field
/// 3, thrift compact header 0x16) follows the schema list, whose elements
/// have no i64 field; below 64 rows its zigzag value is one byte.
fn write_footer_without_rows(path: &Path, rows: i64) {
    let x: ArrayRef = std::sync::Arc::new(arrow_array::Int64Array::from_iter_values(0..rows));
    let batch = RecordBatch::try_from_iter([("x", x)]).unwrap();
    let properties = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(20))
        .build();
    let mut bytes = Vec::new();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let len = bytes.len();
    let footer_len = u32::from_le_bytes(bytes[len - 8..len - 4].try_into().unwrap()) as usize;
    let footer = len - 8 - footer_len;
    let at = footer
        + bytes[footer..len - 8]
            .windows(2)
            .position(|w| w == [0x16, (rows * 2) as u8])
            .expect("num_rows in the footer");
    bytes[at + 1] = 0;
    std::fs::write(path, bytes).unwrap();
    let meta = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(&File::open(path).unwrap())
        .unwrap();
    assert_eq!(meta.file_metadata().num_rows(), 0, "the footer was patched");
}

#[test]
fn a_file_whose_footer_counts_no_rows_reads_all_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old-writer.parquet");
    write_footer_without_rows(&path, 50);
    let ctx = ctx();
    let (_, batches) = read(&ctx, &path);
    let values: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let x = b
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>();
            x.unwrap().values().to_vec()
        })
        .collect();
    assert_eq!(values, (0..50).collect::<Vec<_>>());
    // Through row-group pruning too.
    let kept = ctx
        .read_parquet(path.to_str().unwrap())
        .unwrap()
        .filter(col("x").gt_eq(lit(10i64)))
        .collect()
        .unwrap();
    assert_eq!(kept.iter().map(|b| b.num_rows()).sum::<usize>(), 40);
}
