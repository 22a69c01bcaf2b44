//! How an exchange's ends travel in a plan: [`Cut`](super::Cut) and
//! [`Reduce`](super::Reduce) derive rkyv's traits themselves, so that the
//! scheduler's wire carries them as they are (one description, not a copy
//! kept in step). Two of their fields are arrow's types, which rkyv does
//! not know: arrow's sort options, archived by [`SortOrder`], and a join
//! input's schema, archived as an Arrow IPC stream by [`SchemaAsIpc`].
//!
//! Bytes from a peer are hostile: a schema decodes through arrow's IPC
//! reader (a panic of arrow's is an error), and a join that arrives is
//! checked again against its schemas ([`Join::checked`](super::join::hash::Join::checked)).

use arrow_schema::{SchemaRef, SortOptions};
use rkyv::rancor::{Fallible, Source};
use rkyv::ser::{Allocator, Writer};
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::with::{ArchiveWith, DeserializeWith, SerializeWith};
use rkyv::{Archive, Deserialize, Place, Serialize};

use crate::error::Error;

/// arrow's [`SortOptions`] as rkyv archives it (`#[rkyv(with = SortOrder)]`).
#[derive(Archive, Serialize, Deserialize)]
#[rkyv(remote = SortOptions)]
pub struct SortOrder {
    /// Greatest first.
    pub descending: bool,
    /// Nulls before every value.
    pub nulls_first: bool,
}

impl From<SortOrder> for SortOptions {
    fn from(order: SortOrder) -> Self {
        SortOptions {
            descending: order.descending,
            nulls_first: order.nulls_first,
        }
    }
}

/// A schema archived as an Arrow IPC stream holding no batch
/// (`#[rkyv(with = SchemaAsIpc)]`).
pub struct SchemaAsIpc;

/// The encoded stream's length beside where its bytes were written.
pub struct SchemaResolver {
    len: usize,
    bytes: VecResolver,
}

impl ArchiveWith<SchemaRef> for SchemaAsIpc {
    type Archived = ArchivedVec<u8>;
    type Resolver = SchemaResolver;

    fn resolve_with(_: &SchemaRef, resolver: Self::Resolver, out: Place<Self::Archived>) {
        ArchivedVec::resolve_from_len(resolver.len, resolver.bytes, out);
    }
}

impl<S> SerializeWith<SchemaRef, S> for SchemaAsIpc
where
    S: Fallible + Allocator + Writer + ?Sized,
    S::Error: Source,
{
    fn serialize_with(schema: &SchemaRef, serializer: &mut S) -> Result<SchemaResolver, S::Error> {
        let bytes = schema_bytes(schema).map_err(S::Error::new)?;
        let resolver = ArchivedVec::<u8>::serialize_from_slice(&bytes, serializer)?;
        Ok(SchemaResolver {
            len: bytes.len(),
            bytes: resolver,
        })
    }
}

impl<D> DeserializeWith<ArchivedVec<u8>, SchemaRef, D> for SchemaAsIpc
where
    D: Fallible + ?Sized,
    D::Error: Source,
{
    fn deserialize_with(bytes: &ArchivedVec<u8>, _: &mut D) -> Result<SchemaRef, D::Error> {
        schema_of(bytes.as_slice()).map_err(D::Error::new)
    }
}

/// `schema` as an Arrow IPC stream holding no batch.
pub fn schema_bytes(schema: &SchemaRef) -> Result<Vec<u8>, Error> {
    let encode = || {
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), schema)?;
        writer.finish()?;
        writer.into_inner()
    };
    encode().map_err(|e| Error::Invalid(format!("cannot encode the schema {schema}: {e}")))
}

/// The schema of an IPC stream made by [`schema_bytes`], checked.
pub fn schema_of(bytes: &[u8]) -> Result<SchemaRef, Error> {
    let read = || {
        arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
            .map(|r| r.schema())
    };
    // arrow 60 still asserts on some malformed input: a panic is an error.
    std::panic::catch_unwind(read)
        .map_err(|_| Error::Invalid("a schema does not decode: arrow panicked".into()))?
        .map_err(|e| Error::Invalid(format!("a schema does not decode: {e}")))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::exchange::join::hash::{Join, JoinHow};
    use crate::exchange::{Cut, Reduce};

    use rkyv::rancor::Error as Failed;

    fn reduce_round_trip(reduce: &Reduce) -> Result<Reduce, Failed> {
        rkyv::from_bytes::<Reduce, Failed>(&rkyv::to_bytes::<Failed>(reduce)?)
    }

    fn schema(key: DataType) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", key, false),
            Field::new("v", DataType::Utf8, true),
        ]))
    }

    #[test]
    fn a_join_and_a_range_cut_travel_as_they_are() {
        let join = Join::new(
            JoinHow::Left,
            &["k"],
            &["k"],
            schema(DataType::Int64),
            schema(DataType::Int64),
        )
        .unwrap();
        let reduce = Reduce::Join(join);
        assert_eq!(reduce_round_trip(&reduce).unwrap(), reduce);
        let cut = Cut::Range {
            keys: vec!["k".into()],
            order: SortOptions {
                descending: true,
                nulls_first: false,
            },
        };
        let bytes = rkyv::to_bytes::<Failed>(&cut).unwrap();
        assert_eq!(rkyv::from_bytes::<Cut, Failed>(&bytes).unwrap(), cut);
    }

    #[test]
    fn a_join_that_arrives_is_checked_against_its_schemas() {
        // Archived as a peer could send it: keys of different types.
        let join = Join {
            how: JoinHow::Inner,
            left_on: vec!["k".into()],
            right_on: vec!["k".into()],
            left: schema(DataType::Int64),
            right: schema(DataType::Utf8),
        };
        let arrived = reduce_round_trip(&Reduce::Join(join)).unwrap();
        let err = arrived.checked().unwrap_err().to_string();
        assert!(err.contains("`k` is Int64 on the left"), "{err}");
    }

    #[test]
    fn a_schema_that_does_not_decode_is_refused() {
        assert!(schema_of(b"not an IPC stream").is_err());
        // Torn bytes in an archive are an error of the whole archive.
        let mut bytes = rkyv::to_bytes::<Failed>(&Reduce::Join(
            Join::new(
                JoinHow::Inner,
                &["k"],
                &["k"],
                schema(DataType::Int64),
                schema(DataType::Int64),
            )
            .unwrap(),
        ))
        .unwrap()
        .to_vec();
        bytes[8..40].fill(0xAB);
        assert!(rkyv::from_bytes::<Reduce, Failed>(&bytes).is_err());
    }
}
