//! A batch as it travels in a plan (a broadcast join's small side, a
//! sample): an Arrow IPC stream of one batch, and back, checked (bytes from
//! a peer are hostile: the IPC reader validates every array, and a panic of
//! arrow's on malformed input is an error). A schema travels as
//! `streambatch_plan::schema_bytes` writes it.

use streambatch_plan::Error;

/// One batch as an Arrow IPC stream; `what` names it in an error.
pub(super) fn batch_bytes(batch: &arrow_array::RecordBatch, what: &str) -> Result<Vec<u8>, Error> {
    let encode = || {
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema())?;
        writer.write(batch)?;
        writer.finish()?;
        writer.into_inner()
    };
    encode().map_err(|e| Error::Invalid(format!("cannot encode {what}: {e}")))
}

/// The one batch of an IPC stream made by [`batch_bytes`], checked (the
/// IPC reader validates every array); `what` names it in an error.
pub(super) fn batch_of(bytes: &[u8], what: &str) -> Result<arrow_array::RecordBatch, Error> {
    let bad = |e: &dyn std::fmt::Display| Error::Invalid(format!("{what} does not decode: {e}"));
    // arrow 60 still asserts on some malformed input (see
    // `streambatch_store::ipc::decode`): a panic is an error here too.
    let read = || {
        let mut reader =
            arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
        let schema = reader.schema();
        reader
            .next()
            .unwrap_or_else(|| Ok(arrow_array::RecordBatch::new_empty(schema)))
    };
    std::panic::catch_unwind(read)
        .map_err(|_| bad(&"arrow rejected it with a panic"))?
        .map_err(|e| bad(&e))
}
