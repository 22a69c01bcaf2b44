//! Group-by aggregation in two steps, either side of an exchange: each map
//! task aggregates its own rows into partial states (so a group crosses
//! the exchange once per map task, whatever its rows: a hot key is cheap),
//! and each reducer merges the states of its groups and finishes them.
//!
//! Groups are found by their keys: one integer or string key as itself,
//! short string keys (one or several, 16 bytes in all) packed into one
//! integer (`packed_keys.rs`: hashed and compared in a few
//! instructions), others by their `arrow-row` encoding; nulls are a key
//! like any other. Partial states are plain Arrow columns, one or more
//! per aggregate, named `__p{i}_{what}`:
//! - count: `c` (rows);
//! - sum: `s` (Int64 over integers, else Float64) and `c` (values);
//! - min, max: `v`, the input's type;
//! - mean: `s` (Float64) and `c`;
//! - std: `c`, `m` (mean) and `m2` (sum of squared deviations), merged by
//!   Chan's formula; the sample deviation (n - 1), null below 2 values;
//! - count distinct: `d`, the distinct values of the map task's group,
//!   each as its `arrow-row` bytes.
//!
//! Nulls are skipped by every aggregate but count; a group whose values
//! are all null gets null (a count distinct, 0). An integer sum that
//! overflows 64 bits is an error, as is a value that does not fit the
//! type an aggregate casts it to.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, ListBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, Field, Schema, SortOptions};

use crate::error::{Error, Result};
use crate::exchange::cut::{column_indices, key_rows};
use crate::exchange::group::packed_keys::packed_keys;

/// What an aggregate computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum AggKind {
    /// Rows in the group.
    Count,
    /// Sum of the values.
    Sum,
    /// Least value.
    Min,
    /// Greatest value.
    Max,
    /// Mean of the values.
    Mean,
    /// Sample standard deviation of the values.
    Std,
    /// Distinct values.
    CountDistinct,
}

/// One aggregate of a [`Dataset::groupby`](crate::dataset::Dataset::groupby): its
/// output column is named as Ray Data names it (`sum(x)`, `count()`).
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Agg {
    /// What it computes.
    pub kind: AggKind,
    /// Its input column (none for count).
    pub column: Option<String>,
}

impl Agg {
    /// Rows per group.
    pub fn count() -> Self {
        Self {
            kind: AggKind::Count,
            column: None,
        }
    }
    /// Sum of `column` per group.
    pub fn sum(column: &str) -> Self {
        Self::of(AggKind::Sum, column)
    }
    /// Least value of `column` per group.
    pub fn min(column: &str) -> Self {
        Self::of(AggKind::Min, column)
    }
    /// Greatest value of `column` per group.
    pub fn max(column: &str) -> Self {
        Self::of(AggKind::Max, column)
    }
    /// Mean of `column` per group.
    pub fn mean(column: &str) -> Self {
        Self::of(AggKind::Mean, column)
    }
    /// Sample standard deviation of `column` per group.
    pub fn std(column: &str) -> Self {
        Self::of(AggKind::Std, column)
    }
    /// Distinct values of `column` per group (nulls not counted).
    pub fn count_distinct(column: &str) -> Self {
        Self::of(AggKind::CountDistinct, column)
    }

    fn of(kind: AggKind, column: &str) -> Self {
        Self {
            kind,
            column: Some(column.to_string()),
        }
    }

    /// The aggregate its [name](Agg::name) describes (`sum(x)`,
    /// `count()`), as pipeline files give them.
    ///
    /// ```
    /// use streambatch_plan::Agg;
    /// assert_eq!(Agg::parse("mean(price)").unwrap(), Agg::mean("price"));
    /// assert_eq!(Agg::parse("count()").unwrap(), Agg::count());
    /// assert!(Agg::parse("median(x)").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            Error::Invalid(format!(
                "aggregate `{text}`: expected count(), sum(c), min(c), max(c), mean(c), std(c) or count_distinct(c)"
            ))
        };
        let (kind, rest) = text.trim().split_once('(').ok_or_else(bad)?;
        let column = rest.strip_suffix(')').ok_or_else(bad)?.trim();
        let kind = match kind.trim() {
            "count" if column.is_empty() => return Ok(Self::count()),
            "sum" => AggKind::Sum,
            "min" => AggKind::Min,
            "max" => AggKind::Max,
            "mean" => AggKind::Mean,
            "std" => AggKind::Std,
            "count_distinct" => AggKind::CountDistinct,
            _ => return Err(bad()),
        };
        if column.is_empty() {
            return Err(bad());
        }
        Ok(Self::of(kind, column))
    }

    /// The output column's name.
    pub fn name(&self) -> String {
        let what = match self.kind {
            AggKind::Count => "count",
            AggKind::Sum => "sum",
            AggKind::Min => "min",
            AggKind::Max => "max",
            AggKind::Mean => "mean",
            AggKind::Std => "std",
            AggKind::CountDistinct => "count_distinct",
        };
        format!("{what}({})", self.column.as_deref().unwrap_or(""))
    }
}

/// Rows of a batch sorted into groups by their keys.
struct Groups {
    /// Each row's group.
    of: Vec<usize>,
    /// Each group's first row.
    first: Vec<u32>,
}

fn groups(batch: &RecordBatch, keys: &[usize]) -> Result<Groups> {
    if keys.is_empty() {
        // One group, even of no rows: a count of them is 0, as in SQL.
        return Ok(Groups {
            of: vec![0; batch.num_rows()],
            first: vec![0],
        });
    }
    // One integer or string key: its values themselves, not encoded rows.
    if let [key] = keys {
        let column = batch.column(*key);
        if let Some(v) = column.as_primitive_opt::<Int64Type>() {
            return Ok(grouped(v.iter()));
        }
        if let Some(v) = column.as_primitive_opt::<arrow_array::types::Int32Type>() {
            return Ok(grouped(v.iter()));
        }
    }
    // Short strings, one key or several: packed into an integer.
    if let Some(packed) = packed_keys(batch, keys) {
        return Ok(grouped(packed.into_iter()));
    }
    if let [key] = keys
        && let Some(v) = batch.column(*key).as_string_opt::<i32>()
    {
        return Ok(grouped(v.iter()));
    }
    let rows = key_rows(batch, keys, &[])?;
    Ok(grouped((0..batch.num_rows()).map(|row| rows.row(row))))
}

/// Rows grouped by their `keys` (one per row), each group numbered as it
/// first comes.
fn grouped<K: std::hash::Hash + Eq>(keys: impl Iterator<Item = K>) -> Groups {
    let mut index: HashMap<K, usize, foldhash::fast::RandomState> = HashMap::default();
    let mut first = Vec::new();
    let of = keys
        .enumerate()
        .map(|(row, key)| {
            *index.entry(key).or_insert_with(|| {
                first.push(row as u32);
                first.len() - 1
            })
        })
        .collect();
    Groups { of, first }
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| Error::Invalid(format!("groupby: no column `{name}`")))
}

/// `array` as type `to`; a value that does not fit is an error, not a null.
fn cast(array: &ArrayRef, to: &DataType, what: &str) -> Result<ArrayRef> {
    let options = arrow_cast::CastOptions {
        safe: false,
        ..Default::default()
    };
    arrow_cast::cast_with_options(array, to, &options).map_err(|e| Error::arrow(what, e))
}

/// What a sum adds: integers checked for overflow.
trait Summable: Copy + Default {
    fn plus(self, other: Self) -> Option<Self>;
}

impl Summable for i64 {
    fn plus(self, other: Self) -> Option<Self> {
        self.checked_add(other)
    }
}

impl Summable for f64 {
    fn plus(self, other: Self) -> Option<Self> {
        Some(self + other)
    }
}

/// Per group, the sum of `values` (skipping nulls) and how many there were.
fn sums<T: Summable>(
    g: &Groups,
    values: impl Iterator<Item = Option<T>>,
    counts: &mut [i64],
) -> Result<Vec<T>> {
    let mut out = vec![T::default(); g.first.len()];
    for (row, v) in values.enumerate() {
        if let Some(v) = v {
            let group = g.of[row];
            out[group] = out[group]
                .plus(v)
                .ok_or_else(|| Error::Invalid("groupby: a sum overflows 64-bit integers".into()))?;
            counts[group] += 1;
        }
    }
    Ok(out)
}

/// Per group, the row of the least (or greatest) non-null value of
/// `values`, as `arrow-row` orders them.
fn extreme(g: &Groups, values: &ArrayRef, greatest: bool) -> Result<ArrayRef> {
    let converter = RowConverter::new(vec![SortField::new_with_options(
        values.data_type().clone(),
        SortOptions::default(),
    )])
    .map_err(|e| Error::arrow("groupby", e))?;
    let rows = converter
        .convert_columns(std::slice::from_ref(values))
        .map_err(|e| Error::arrow("groupby", e))?;
    let mut best: Vec<Option<u32>> = vec![None; g.first.len()];
    for row in 0..values.len() {
        if values.is_null(row) {
            continue;
        }
        let group = g.of[row];
        let better = match best[group] {
            None => true,
            Some(b) => {
                let ord = rows.row(row).cmp(&rows.row(b as usize));
                if greatest { ord.is_gt() } else { ord.is_lt() }
            }
        };
        if better {
            best[group] = Some(row as u32);
        }
    }
    arrow_select::take::take(values, &UInt32Array::from(best), None)
        .map_err(|e| Error::arrow("groupby", e))
}

fn nulls_where_empty(values: Vec<f64>, counts: &[i64]) -> ArrayRef {
    Arc::new(Float64Array::from_iter(
        values
            .into_iter()
            .zip(counts)
            .map(|(v, &c)| (c > 0).then_some(v)),
    ))
}

/// Each row's value of a count-distinct column as its `arrow-row` bytes.
fn distinct_values(values: &ArrayRef) -> Result<Vec<Option<Vec<u8>>>> {
    let converter = RowConverter::new(vec![SortField::new(values.data_type().clone())])
        .map_err(|e| Error::arrow("groupby", e))?;
    let rows = converter
        .convert_columns(std::slice::from_ref(values))
        .map_err(|e| Error::arrow("groupby", e))?;
    Ok((0..values.len())
        .map(|i| (!values.is_null(i)).then(|| rows.row(i).as_ref().to_vec()))
        .collect())
}

fn distinct_sets(
    g: &Groups,
    values: impl Iterator<Item = Option<Vec<u8>>>,
) -> Vec<HashSet<Vec<u8>>> {
    let mut sets = vec![HashSet::new(); g.first.len()];
    for (row, v) in values.enumerate() {
        if let Some(v) = v {
            sets[g.of[row]].insert(v);
        }
    }
    sets
}

/// Which step of the aggregation a reducer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Step {
    /// A map task's rows to partial states.
    Partial,
    /// Partial states merged and finished.
    Final,
}

/// Aggregates `batch` by `keys` (the step `step`), as described in the
/// module's documentation: the key columns, then the partial states or
/// the aggregates' outputs.
pub fn aggregate(
    batch: &RecordBatch,
    keys: &[String],
    aggs: &[Agg],
    step: Step,
) -> Result<RecordBatch> {
    let key_at = column_indices(batch, keys)?;
    let g = groups(batch, &key_at)?;
    let first = UInt32Array::from(g.first.clone());
    let mut fields: Vec<Field> = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for &k in &key_at {
        let f = batch.schema().field(k).clone();
        columns.push(
            arrow_select::take::take(batch.column(k), &first, None)
                .map_err(|e| Error::arrow("groupby", e))?,
        );
        fields.push(f);
    }
    let mut push = |name: String, array: ArrayRef| {
        fields.push(Field::new(name, array.data_type().clone(), true));
        columns.push(array);
    };
    let n = g.first.len();
    for (i, agg) in aggs.iter().enumerate() {
        let p = |what: &str| format!("__p{i}_{what}");
        let input = |what: &str| -> Result<&ArrayRef> {
            match step {
                Step::Partial => column(batch, agg.column.as_deref().unwrap_or_default()),
                Step::Final => column(batch, &p(what)),
            }
        };
        match (agg.kind, step) {
            (AggKind::Count, Step::Partial) => {
                let mut counts = vec![0i64; n];
                g.of.iter().for_each(|&group| counts[group] += 1);
                push(p("c"), Arc::new(Int64Array::from(counts)));
            }
            (AggKind::Count, Step::Final) => {
                let mut counts = vec![0i64; n];
                let c = input("c")?.as_primitive::<Int64Type>();
                let total = sums(&g, c.iter(), &mut counts)?;
                push(agg.name(), Arc::new(Int64Array::from(total)));
            }
            (AggKind::Sum, _) | (AggKind::Mean, _) => {
                let values = input("s")?;
                let mut counts = vec![0i64; n];
                let integer = values.data_type().is_integer() && agg.kind == AggKind::Sum;
                let summed: ArrayRef = if integer {
                    let v = cast(values, &DataType::Int64, "sum")?;
                    let s = sums(&g, v.as_primitive::<Int64Type>().iter(), &mut counts)?;
                    Arc::new(Int64Array::from_iter(
                        s.into_iter()
                            .zip(&counts)
                            .map(|(s, &c)| (c > 0).then_some(s)),
                    ))
                } else {
                    let v = cast(values, &DataType::Float64, "sum")?;
                    let s = sums(&g, v.as_primitive::<Float64Type>().iter(), &mut counts)?;
                    nulls_where_empty(s, &counts)
                };
                if step == Step::Final {
                    // The values counted: the sum of the partial counts.
                    let mut seen = vec![0i64; n];
                    counts = sums(
                        &g,
                        input("c")?.as_primitive::<Int64Type>().iter(),
                        &mut seen,
                    )?;
                }
                match (agg.kind, step) {
                    (_, Step::Partial) => {
                        push(p("s"), summed);
                        push(p("c"), Arc::new(Int64Array::from(counts)));
                    }
                    (AggKind::Sum, Step::Final) => push(agg.name(), summed),
                    _ => {
                        let s = cast(&summed, &DataType::Float64, "mean")?;
                        let mean = s
                            .as_primitive::<Float64Type>()
                            .iter()
                            .zip(&counts)
                            .map(|(s, &c)| (c > 0).then(|| s.unwrap_or(0.0) / c as f64));
                        push(agg.name(), Arc::new(Float64Array::from_iter(mean)));
                    }
                }
            }
            (AggKind::Min | AggKind::Max, _) => {
                let best = extreme(&g, input("v")?, agg.kind == AggKind::Max)?;
                let name = if step == Step::Partial {
                    p("v")
                } else {
                    agg.name()
                };
                push(name, best);
            }
            (AggKind::Std, Step::Partial) => {
                let v = cast(input("")?, &DataType::Float64, "std")?;
                let v = v.as_primitive::<Float64Type>();
                let (mut c, mut m, mut m2) = (vec![0i64; n], vec![0f64; n], vec![0f64; n]);
                for (row, x) in v.iter().enumerate() {
                    if let Some(x) = x {
                        let group = g.of[row];
                        c[group] += 1;
                        let delta = x - m[group];
                        m[group] += delta / c[group] as f64;
                        m2[group] += delta * (x - m[group]);
                    }
                }
                push(p("c"), Arc::new(Int64Array::from(c)));
                push(p("m"), Arc::new(Float64Array::from(m)));
                push(p("m2"), Arc::new(Float64Array::from(m2)));
            }
            (AggKind::Std, Step::Final) => {
                let pc = input("c")?.as_primitive::<Int64Type>().clone();
                let pm = input("m")?.as_primitive::<Float64Type>().clone();
                let pm2 = input("m2")?.as_primitive::<Float64Type>().clone();
                let (mut c, mut m, mut m2) = (vec![0i64; n], vec![0f64; n], vec![0f64; n]);
                for row in 0..batch.num_rows() {
                    let (cb, mb, m2b) = (pc.value(row), pm.value(row), pm2.value(row));
                    if cb == 0 {
                        continue;
                    }
                    let group = g.of[row];
                    let ca = c[group];
                    let total = ca + cb;
                    let delta = mb - m[group];
                    m[group] += delta * cb as f64 / total as f64;
                    m2[group] += m2b + delta * delta * ca as f64 * cb as f64 / total as f64;
                    c[group] = total;
                }
                let std = m2
                    .iter()
                    .zip(&c)
                    .map(|(m2, &c)| (c > 1).then(|| (m2 / (c - 1) as f64).sqrt()));
                push(agg.name(), Arc::new(Float64Array::from_iter(std)));
            }
            (AggKind::CountDistinct, Step::Partial) => {
                let sets = distinct_sets(&g, distinct_values(input("")?)?.into_iter());
                let mut list = ListBuilder::new(BinaryBuilder::new());
                for set in sets {
                    for v in set {
                        list.values().append_value(v);
                    }
                    list.append(true);
                }
                push(p("d"), Arc::new(list.finish()));
            }
            (AggKind::CountDistinct, Step::Final) => {
                let lists = input("d")?.as_list::<i32>();
                let mut sets = vec![HashSet::new(); n];
                for row in 0..batch.num_rows() {
                    let values = lists.value(row);
                    for v in values.as_binary::<i32>().iter().flatten() {
                        sets[g.of[row]].insert(v.to_vec());
                    }
                }
                let counts = sets.iter().map(|s| s.len() as i64);
                push(agg.name(), Arc::new(Int64Array::from_iter_values(counts)));
            }
        }
    }
    let schema = Arc::new(Schema::new(fields));
    RecordBatch::try_new(schema, columns).map_err(|e| Error::arrow("groupby", e))
}
