//! Bad input ends the job with an error naming the file or operator, and a
//! failed write leaves no file behind.

mod common;

use common::{ctx, people, visible_files, write_parquet_file};
use streambatch::Error;
use streambatch::prelude::*;

#[test]
fn a_missing_path_names_the_path() {
    let err = ctx()
        .read_parquet("/nonexistent/streambatch/*.parquet")
        .err()
        .unwrap();
    assert!(matches!(err, Error::NoFiles { .. }));
    assert!(
        err.to_string()
            .contains("/nonexistent/streambatch/*.parquet"),
        "{err}"
    );
    let err = ctx().read_csv("/nonexistent/data.csv").err().unwrap();
    assert!(err.to_string().contains("/nonexistent/data.csv"), "{err}");
}

#[test]
fn a_corrupt_parquet_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet_file(&dir.path().join("a.parquet"), &people(0..10));
    std::fs::write(
        dir.path().join("b.parquet"),
        b"PAR1 this is not parquet at all",
    )
    .unwrap();
    let err = ctx()
        .read_parquet(dir.path().to_str().unwrap())
        .err()
        .unwrap();
    assert!(matches!(err, Error::BadFile { .. }), "{err:?}");
    assert!(err.to_string().contains("b.parquet"), "{err}");
}

#[test]
fn files_whose_schemas_disagree_are_named() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet_file(&dir.path().join("a.parquet"), &people(0..10));
    let other = RecordBatch::try_from_iter([(
        "id",
        std::sync::Arc::new(arrow_array::Float64Array::from(vec![1.0])) as _,
    )])
    .unwrap();
    write_parquet_file(&dir.path().join("b.parquet"), &other);
    let err = ctx()
        .read_parquet(dir.path().to_str().unwrap())
        .err()
        .unwrap();
    assert!(matches!(err, Error::SchemaMismatch { .. }), "{err:?}");
    assert!(
        err.to_string().contains("b.parquet") && err.to_string().contains("a.parquet"),
        "{err}"
    );
}

#[test]
fn a_udf_error_names_the_operator_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let err = ctx()
        .range(1000, 10)
        .map_batches(
            |b: RecordBatch| {
                let first = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow_array::Int64Array>()
                    .unwrap()
                    .value(0);
                if first >= 500 {
                    Err(format!("cannot handle id {first}"))
                } else {
                    Ok(b)
                }
            },
            Resources::cpu(1.0),
        )
        .named("picky")
        .write_parquet(&out)
        .unwrap_err();
    assert!(matches!(err, Error::Udf { .. }), "{err:?}");
    assert!(
        err.to_string().contains("picky") && err.to_string().contains("cannot handle id"),
        "{err}"
    );
    assert_eq!(
        visible_files(&out),
        Vec::<String>::new(),
        "the output holds no file"
    );
}

#[test]
fn a_panicking_udf_names_the_operator_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let err = ctx()
        .range(1000, 10)
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                if b.column(0)
                    .as_any()
                    .downcast_ref::<arrow_array::Int64Array>()
                    .unwrap()
                    .value(0)
                    == 700
                {
                    panic!("bad row")
                }
                Ok(b)
            },
            Resources::cpu(1.0),
        )
        .named("fragile")
        .write_parquet(&out)
        .unwrap_err();
    assert!(matches!(err, Error::Panicked { .. }), "{err:?}");
    assert!(
        err.to_string().contains("fragile") && err.to_string().contains("bad row"),
        "{err}"
    );
    assert_eq!(
        visible_files(&out),
        Vec::<String>::new(),
        "the output holds no file"
    );
}

#[test]
fn a_missing_column_in_an_expression_names_the_operator_and_column() {
    let err = ctx()
        .range(10, 1)
        .filter(col("nope").gt(lit(1)))
        .count()
        .unwrap_err();
    assert!(
        err.to_string().contains("filter") && err.to_string().contains("nope"),
        "{err}"
    );
}

/// A user function's own error type survives to the caller as the source.
#[test]
fn a_udf_error_keeps_its_type_as_the_source() {
    #[derive(Debug, PartialEq)]
    struct Unparseable(i64);
    impl std::fmt::Display for Unparseable {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot parse row {}", self.0)
        }
    }
    impl std::error::Error for Unparseable {}

    let err = ctx()
        .range(10, 2)
        .map_batches(
            |_: RecordBatch| Err::<RecordBatch, _>(Unparseable(7)),
            Resources::cpu(1.0),
        )
        .named("parse")
        .count()
        .unwrap_err();
    let source = std::error::Error::source(&err).expect("the UDF's error is the source");
    assert_eq!(source.downcast_ref::<Unparseable>(), Some(&Unparseable(7)));
    assert!(err.to_string().contains("parse"), "{err}");
}

/// A Snappy file of 20,000 `people` rows (`id`, `name`) in two row groups,
/// then `damage` done to its bytes; reading it (planning and running) fails
/// naming the file. Returns the error.
fn damaged_file_is_named(what: &str, damage: impl Fn(&mut Vec<u8>)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join(format!("{}.parquet", what.replace(' ', "-")));
    let options = ParquetWriteOptions {
        max_row_group_rows: 10_000,
        ..Default::default()
    };
    let ctx = ctx();
    ctx.from_batches(vec![people(0..20_000)])
        .write_parquet_file_with(&path, &options)
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    damage(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    // Read, not counted: a count of a bare Parquet source sums footers.
    let err = ctx
        .read_parquet(path.to_str().unwrap())
        .and_then(|ds| ds.collect())
        .expect_err(what);
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(err.to_string().contains(&name), "{what}: {err}");
    err.to_string()
}

#[test]
fn a_truncated_file_is_named() {
    damaged_file_is_named("truncated", |b| {
        b.truncate(b.len() / 2);
    });
}

#[test]
fn a_file_with_a_corrupt_footer_is_named() {
    damaged_file_is_named("corrupt footer", |b| {
        // The footer's length and magic stay; its metadata is garbage.
        let end = b.len() - 8;
        for byte in &mut b[end - 64..end] {
            *byte = 0xff;
        }
    });
}

#[test]
fn a_file_with_a_corrupt_page_is_named_with_its_column() {
    let err = damaged_file_is_named("corrupt page", |b| {
        // The first page header of the second column (`name`), found in
        // the file's metadata.
        let copy = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(copy.path(), &*b).unwrap();
        let file = std::fs::File::open(copy.path()).unwrap();
        let reader = parquet::file::reader::SerializedFileReader::new(file).unwrap();
        let meta = parquet::file::reader::FileReader::metadata(&reader);
        let name = meta.row_group(0).column(1);
        assert_eq!(name.column_path().string(), "name");
        let at = name
            .dictionary_page_offset()
            .unwrap_or(name.data_page_offset()) as usize;
        for byte in &mut b[at..at + 64] {
            *byte = 0xff;
        }
    });
    assert!(err.contains("column `name`"), "{err}");
}

#[test]
fn a_file_with_the_wrong_magic_is_named() {
    damaged_file_is_named("wrong magic", |b| {
        let end = b.len();
        b[end - 4..].copy_from_slice(b"PAR2");
    });
}
