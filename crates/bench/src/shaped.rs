//! W1's operators as registered operators, so that W1-shaped jobs run on a
//! cluster (W5): every stock `streambatch node` rebuilds them by name from
//! [`registry`]. Their parameters are little-endian `u64`s: the time a call
//! takes in milliseconds, then the bytes of each row it makes.

use std::time::Duration;

use arrow_array::RecordBatch;
use streambatch::{BatchFn, BatchUdf, Dataset, Registry, Resources, Result, UdfError};

use crate::{Rows, check_rows, filled_rows, taking};

/// The stock operators, W1's (`w1.produce`, `w1.consume`,
/// `w1.inference`) and W6b's (`w6b.decode`).
///
/// ```
/// let registry = streambatch_bench::registry();
/// assert!(registry.contains("w1.produce") && registry.contains("preprocess"));
/// ```
pub fn registry() -> Registry {
    let mut registry = streambatch::registry();
    registry.register("w1.produce", |params| {
        let (ms, row_bytes) = two(params)?;
        Ok(Produce { ms, row_bytes })
    });
    registry.register("w1.consume", |params| {
        let (ms, row_bytes) = two(params)?;
        Ok(move |b: RecordBatch| {
            taking(Duration::from_millis(ms), || {
                filled_rows(b.column(0), row_bytes as usize, Rows::Output)
            })
        })
    });
    registry.register("w1.inference", |params| {
        let (ms, row_bytes) = two(params)?;
        Ok(
            move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                // The check of every byte is part of the call's time.
                taking(Duration::from_millis(ms), || {
                    check_rows(&b, row_bytes as usize)
                })?;
                Ok(b.project(&[0])?)
            },
        )
    });
    // W6b's decode: a call takes `ms` per row and makes each row's bytes.
    registry.register("w6b.decode", |params| {
        let (ms, row_bytes) = two(params)?;
        Ok(move |b: RecordBatch| {
            let total = Duration::from_millis(ms * b.num_rows() as u64);
            taking(total, || {
                filled_rows(b.column(0), row_bytes as usize, Rows::Output)
            })
        })
    });
    registry
}

/// W1's producer: a call takes `ms` and yields each row of its batch in a
/// buffer of its own, as a producer of rows makes them.
#[derive(Clone, Copy)]
struct Produce {
    ms: u64,
    row_bytes: u64,
}

impl BatchUdf for Produce {
    fn instantiate(&self) -> std::result::Result<Box<dyn BatchFn>, UdfError> {
        Ok(Box::new(*self))
    }
}

impl BatchFn for Produce {
    fn call(&mut self, b: RecordBatch) -> std::result::Result<RecordBatch, UdfError> {
        taking(Duration::from_millis(self.ms), || {
            filled_rows(b.column(0), self.row_bytes as usize, Rows::Heap)
        })
    }

    fn call_many(&mut self, b: RecordBatch) -> std::result::Result<Vec<RecordBatch>, UdfError> {
        let ids = b.column(0);
        taking(Duration::from_millis(self.ms), || {
            (0..ids.len())
                .map(|i| filled_rows(&ids.slice(i, 1), self.row_bytes as usize, Rows::Heap))
                .collect()
        })
    }
}

fn two(params: &[u8]) -> std::result::Result<(u64, u64), UdfError> {
    let word = |at: usize| -> std::result::Result<u64, UdfError> {
        let bytes = params
            .get(at..at + 8)
            .ok_or_else(|| format!("expected 16 bytes of parameters, got {}", params.len()))?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    };
    Ok((word(0)?, word(8)?))
}

pub(crate) fn params(ms: u64, row_bytes: u64) -> Vec<u8> {
    [ms.to_le_bytes(), row_bytes.to_le_bytes()].concat()
}

/// The shape of a W1-style job.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Rows.
    pub rows: u64,
    /// Source partitions.
    pub partitions: usize,
    /// Bytes of each row made by `produce` and `consume`.
    pub row_bytes: u64,
    /// Milliseconds per `produce` call (5 rows), `consume` and `inference`
    /// call (1 row).
    pub millis: (u64, u64, u64),
}

impl Shape {
    /// W1 at `rows` rows (800 is W1 itself).
    pub fn w1(rows: u64) -> Self {
        Self {
            rows,
            partitions: (rows / 5) as usize,
            row_bytes: crate::W1_ROW_BYTES as u64,
            millis: (500, 50, 50),
        }
    }
}

/// W1's pipeline of registered operators over `source`: produce (1 CPU,
/// batches of 5 rows) -> consume (1 CPU, 1 row) -> inference (1 GPU, 1 row;
/// checks every byte of each row against its id's (a row that does not
/// hold them fails the job), outputs `id`).
pub fn w1_pipeline(source: Dataset, registry: &Registry, shape: Shape) -> Result<Dataset> {
    let (produce, consume, inference) = shape.millis;
    let b = shape.row_bytes;
    Ok(source
        .map_batches(
            registry.udf("w1.produce", &params(produce, b))?,
            Resources::cpu(1.0).batch_rows(5),
        )
        .named("produce")
        .map_batches(
            registry.udf("w1.consume", &params(consume, b))?,
            Resources::cpu(1.0).batch_rows(1),
        )
        .named("consume")
        .map_batches(
            registry.udf("w1.inference", &params(inference, b))?,
            Resources::gpu(1.0).batch_rows(1),
        )
        .named("inference"))
}
