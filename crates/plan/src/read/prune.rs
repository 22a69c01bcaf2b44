//! Row-group pruning: which row groups of a Parquet file a `filter` right
//! after `read_parquet` can match, judged from each row group's statistics
//! (min, max, null and NaN counts), so that the others are never read.
//!
//! The judgement is conservative: a row group is skipped only when its
//! statistics prove that no row satisfies the predicate; anything unknown
//! (no statistics, a nested or dictionary column, an expression of more
//! than a column and a constant, min and max from a writer that predates
//! the format's column orders, whose byte order was signed) keeps it. The
//! filter still runs on the rows read.

use std::sync::Arc;

use arrow_arith::boolean::{and_kleene, or_kleene};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::basic::ColumnOrder;
use parquet::file::metadata::RowGroupMetaData;
use parquet::schema::types::SchemaDescriptor;

use crate::udf::expr::{BinaryOp, Expr, Literal};

/// The file's statistics, per row group, as the pruner reads them.
pub(crate) struct RowGroupStats<'a> {
    /// The file's Arrow schema.
    pub arrow: &'a Schema,
    /// The file's Parquet schema.
    pub parquet: &'a SchemaDescriptor,
    /// Its row groups.
    pub groups: &'a [RowGroupMetaData],
    /// The order its min and max follow, per leaf column (`None`: a writer
    /// from before the format had them).
    pub orders: Option<&'a [ColumnOrder]>,
}

impl RowGroupStats<'_> {
    /// The row groups `predicate` may match, in file order.
    pub(crate) fn may_match(&self, predicate: &Expr) -> Vec<usize> {
        match self.judge(predicate) {
            None => (0..self.groups.len()).collect(),
            Some(mask) => (0..mask.len())
                .filter(|&i| !mask.is_valid(i) || mask.value(i))
                .collect(),
        }
    }

    /// Per row group: false where no row can satisfy `e`; true or null
    /// where one may. `None` when nothing is known.
    fn judge(&self, e: &Expr) -> Option<BooleanArray> {
        match e {
            Expr::Binary(l, BinaryOp::And, r) => match (self.judge(l), self.judge(r)) {
                (Some(a), Some(b)) => and_kleene(&a, &b).ok(),
                (one, None) | (None, one) => one,
            },
            Expr::Binary(l, BinaryOp::Or, r) => or_kleene(&self.judge(l)?, &self.judge(r)?).ok(),
            Expr::Binary(l, op, r) => match (&**l, &**r) {
                (Expr::Column(c), Expr::Literal(v)) => self.compare(c, *op, v),
                (Expr::Literal(v), Expr::Column(c)) => self.compare(c, flipped(*op)?, v),
                _ => None,
            },
            Expr::IsNull(inner) => self.nulls(inner, |nulls, _| nulls > 0),
            Expr::Not(inner) => match &**inner {
                Expr::IsNull(inner) => self.nulls(inner, |nulls, rows| nulls < rows),
                _ => None,
            },
            _ => None,
        }
    }

    /// `test(null count, rows)` per row group of the column `e`; null
    /// where a row group does not give its null count.
    fn nulls(&self, e: &Expr, test: impl Fn(u64, u64) -> bool) -> Option<BooleanArray> {
        let Expr::Column(c) = e else {
            return None;
        };
        let nulls = self.converter(c)?.row_group_null_counts(self.groups).ok()?;
        let rows = self.groups.iter().map(|g| g.num_rows() as u64);
        Some(
            nulls
                .iter()
                .zip(rows)
                .map(|(n, rows)| n.map(|n| test(n, rows)))
                .collect(),
        )
    }

    /// Where `column op value` may hold: the bound that decides it (the
    /// max for `>`, the min for `<`, both for `=`) compared with `value`
    /// by the expression evaluator itself, so that types coerce as the
    /// filter's do.
    fn compare(&self, column: &str, op: BinaryOp, value: &Literal) -> Option<BooleanArray> {
        let converter = self.converter(column)?;
        // A dictionary column's bounds are its values, which coerce against
        // the constant otherwise than the column itself does.
        if matches!(
            converter.arrow_field().data_type(),
            DataType::Dictionary(..)
        ) {
            return None;
        }
        let order = self.orders?.get(converter.parquet_column_index()?)?;
        if !matches!(
            order,
            ColumnOrder::TYPE_DEFINED_ORDER(_) | ColumnOrder::IEEE_754_TOTAL_ORDER
        ) {
            return None;
        }
        let mins = converter.row_group_mins(self.groups).ok()?;
        let maxes = converter.row_group_maxes(self.groups).ok()?;
        let float = is_float(converter.arrow_field().data_type());
        // The format lets a min of +0 stand for -0 and a max of -0 for +0,
        // which the filter's order tells apart: widen them.
        let (mins, maxes) = match float {
            true => (widen_zero(&mins, true)?, widen_zero(&maxes, false)?),
            false => (mins, maxes),
        };
        let test = |bound: &ArrayRef, op| holds(column, bound, op, value);
        let mask = match op {
            BinaryOp::Lt | BinaryOp::LtEq => test(&mins, op)?,
            BinaryOp::Gt | BinaryOp::GtEq => test(&maxes, op)?,
            BinaryOp::Eq => and_kleene(
                &test(&mins, BinaryOp::LtEq)?,
                &test(&maxes, BinaryOp::GtEq)?,
            )
            .ok()?,
            // Only a row group all of `value` fails `!=`.
            BinaryOp::NotEq => {
                let all_equal =
                    and_kleene(&test(&mins, BinaryOp::Eq)?, &test(&maxes, BinaryOp::Eq)?).ok()?;
                arrow_arith::boolean::not(&all_equal).ok()?
            }
            _ => return None,
        };
        if !float {
            return Some(mask);
        }
        // Whether NaN is inside min and max depends on the writer, and it
        // compares outside every number: a row group with NaNs, or that
        // does not count them (pyarrow does not), may match.
        let nans = converter.row_group_nan_counts(self.groups).ok()?;
        let no_nans: BooleanArray = nans.iter().map(|n| Some(n == Some(0))).collect();
        let with_nans = arrow_arith::boolean::not(&no_nans).ok()?;
        or_kleene(&mask, &with_nans).ok()
    }

    fn converter(&self, column: &str) -> Option<StatisticsConverter<'_>> {
        let converter = StatisticsConverter::try_new(column, self.arrow, self.parquet).ok()?;
        // A null count the writer left out is unknown, not zero.
        Some(
            converter
                .with_missing_null_counts_as_zero(false)
                .with_column_orders(self.orders),
        )
    }
}

/// `bound op value` per row group, through [`Expr::evaluate`].
fn holds(column: &str, bound: &ArrayRef, op: BinaryOp, value: &Literal) -> Option<BooleanArray> {
    let field = Field::new(column, bound.data_type().clone(), true);
    let batch =
        RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![bound.clone()]).ok()?;
    let e = Expr::Binary(
        Box::new(Expr::Column(column.to_string())),
        op,
        Box::new(Expr::Literal(value.clone())),
    );
    let result = e.evaluate(&batch).ok()?;
    result.as_any().downcast_ref::<BooleanArray>().cloned()
}

/// Float bounds with a zero made the widest zero: -0 for a min, +0 for a
/// max. `None` for a type it does not know (Float16), which then stays
/// unjudged.
fn widen_zero(bound: &ArrayRef, min: bool) -> Option<ArrayRef> {
    use arrow_array::types::{Float32Type, Float64Type};
    Some(match bound.data_type() {
        DataType::Float32 => widened::<Float32Type>(bound, min),
        DataType::Float64 => widened::<Float64Type>(bound, min),
        _ => return None,
    })
}

/// [`widen_zero`] for one float type.
fn widened<T: arrow_array::ArrowPrimitiveType>(bound: &ArrayRef, min: bool) -> ArrayRef {
    use arrow_array::ArrowNativeTypeOp;
    use arrow_array::cast::AsArray;
    // `is_zero` holds for both zeros; the negated zero of a float is -0.
    let zero = match min {
        true => T::Native::ZERO.neg_wrapping(),
        false => T::Native::ZERO,
    };
    Arc::new(
        bound
            .as_primitive::<T>()
            .unary::<_, T>(|v| if v.is_zero() { zero } else { v }),
    )
}

/// `a op b` as `b op' a`.
fn flipped(op: BinaryOp) -> Option<BinaryOp> {
    Some(match op {
        BinaryOp::Eq | BinaryOp::NotEq => op,
        BinaryOp::Lt => BinaryOp::Gt,
        BinaryOp::LtEq => BinaryOp::GtEq,
        BinaryOp::Gt => BinaryOp::Lt,
        BinaryOp::GtEq => BinaryOp::LtEq,
        _ => return None,
    })
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::udf::expr::{col, lit};
    use arrow_array::Int64Array;
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::properties::WriterProperties;

    /// Ids 0..4000 in four row groups of 1,000.
    fn file() -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..4_000));
        let batch = RecordBatch::try_from_iter([("id", ids)]).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1_000))
            .build();
        let mut w =
            ArrowWriter::try_new(file.reopen().unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        file
    }

    #[test]
    fn bounds_without_a_declared_column_order_are_not_trusted() {
        let file = file();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file.reopen().unwrap()).unwrap();
        let meta = builder.metadata();
        let orders = meta.file_metadata().column_orders().map(Vec::as_slice);
        assert!(orders.is_some(), "parquet-rs declares its column orders");
        let stats = |orders| RowGroupStats {
            arrow: builder.schema(),
            parquet: builder.parquet_schema(),
            groups: meta.row_groups(),
            orders,
        };
        let predicate = col("id").gt_eq(lit(3_500));
        assert_eq!(stats(orders).may_match(&predicate), vec![3]);
        // A legacy writer's (signed) bounds: every row group.
        assert_eq!(stats(None).may_match(&predicate), vec![0, 1, 2, 3]);
    }

    fn floats(array: ArrayRef) -> Vec<f64> {
        let array = array.as_any().downcast_ref::<arrow_array::Float64Array>();
        array.unwrap().values().to_vec()
    }

    #[test]
    fn a_zero_bound_is_widened_to_both_zeros() {
        let mins: ArrayRef = Arc::new(arrow_array::Float64Array::from(vec![0.0, -0.0, 1.5]));
        let widened = floats(widen_zero(&mins, true).unwrap());
        assert!(
            widened[..2]
                .iter()
                .all(|v| *v == 0.0 && v.is_sign_negative())
        );
        assert_eq!(widened[2], 1.5);
        let maxes = floats(widen_zero(&mins, false).unwrap());
        assert!(maxes[..2].iter().all(|v| *v == 0.0 && v.is_sign_positive()));
    }
}
