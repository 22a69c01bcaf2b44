//! The hash join itself, what a join's tasks run: a reducer's left rows
//! joined with its right rows ([`Join::run`]), or a left batch joined with
//! a broadcast right input ([`Broadcast`]). The plan around it (both inputs
//! read side by side and exchanged, or the right input broadcast) is
//! `join.rs`'s.
//!
//! Keys follow SQL: a row with a null key matches nothing (it is kept,
//! unmatched, by the outer joins and the anti join). Keys are compared as
//! `arrow-row` encodes them, so the two sides' key columns must have the
//! same types (checked when the join is built).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow_row::Rows;
use arrow_schema::{Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::exchange::archive::SchemaAsIpc;
use crate::exchange::cut::{column_indices, key_rows};

/// The schema metadata key under which a join's inputs are marked: "0"
/// for the left's batches, "1" for the right's.
pub const SIDE_TAG: &str = "streambatch.join_side";

/// Which rows a join keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum JoinHow {
    /// Each pair of a left and a right row with equal keys.
    Inner,
    /// The inner pairs, and each unmatched left row with nulls for the right.
    Left,
    /// The inner pairs, and each unmatched right row with nulls for the left.
    Right,
    /// The inner pairs and both sides' unmatched rows.
    Full,
    /// Each left row that has a match, once, with the left's columns.
    Semi,
    /// Each left row that has no match, with the left's columns.
    Anti,
}

impl JoinHow {
    /// The name in plans and TOML: `inner`, `left`, `right`, `full`,
    /// `semi`, `anti`.
    pub fn name(self) -> &'static str {
        match self {
            JoinHow::Inner => "inner",
            JoinHow::Left => "left",
            JoinHow::Right => "right",
            JoinHow::Full => "full",
            JoinHow::Semi => "semi",
            JoinHow::Anti => "anti",
        }
    }

    /// Every kind of join.
    pub const ALL: [JoinHow; 6] = [
        JoinHow::Inner,
        JoinHow::Left,
        JoinHow::Right,
        JoinHow::Full,
        JoinHow::Semi,
        JoinHow::Anti,
    ];

    /// The join named `name` (see [`name`](Self::name)).
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|how| how.name() == name)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "no join `{name}`: inner, left, right, full, semi or anti"
                ))
            })
    }

    fn keeps_left_unmatched(self) -> bool {
        matches!(self, JoinHow::Left | JoinHow::Full)
    }

    pub(crate) fn keeps_right_unmatched(self) -> bool {
        matches!(self, JoinHow::Right | JoinHow::Full)
    }
}

/// A join's reducer: its destination's left rows joined with its right
/// rows. Its output has the left's columns, then the right's; a right key
/// column named as its left key is left out (the left's holds the key,
/// the right's where only the right matched), and a right column named as
/// a left one is renamed `<name>_right`. Semi and anti joins keep the
/// left's columns only.
///
/// It travels in a plan as rkyv archives it; one that arrives is rebuilt
/// through [`Join::checked`], as [`Join::new`] builds one.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Join {
    /// Which rows it keeps.
    pub how: JoinHow,
    /// The left's key columns.
    pub left_on: Vec<String>,
    /// The right's, as many, of the same types.
    pub right_on: Vec<String>,
    /// The left input's schema.
    #[rkyv(with = SchemaAsIpc)]
    pub left: SchemaRef,
    /// The right input's schema.
    #[rkyv(with = SchemaAsIpc)]
    pub right: SchemaRef,
}

/// Output rows per batch: a key shared by many rows on both sides makes
/// their product, emitted in parts.
const OUTPUT_ROWS: usize = 64 * 1024;

impl Join {
    /// A join of inputs of schemas `left` and `right`, checked: each key
    /// column exists on its side, the two sides' keys have equal types, and
    /// the output's column names are distinct.
    pub fn new(
        how: JoinHow,
        left_on: &[&str],
        right_on: &[&str],
        left: SchemaRef,
        right: SchemaRef,
    ) -> Result<Self> {
        Self {
            how,
            left_on: left_on.iter().map(|s| s.to_string()).collect(),
            right_on: right_on.iter().map(|s| s.to_string()).collect(),
            left,
            right,
        }
        .checked()
    }

    /// The join, checked as [`Join::new`] checks one (a join that arrived
    /// from a peer is hostile until it is).
    pub fn checked(self) -> Result<Self> {
        let (left_on, right_on, left, right) =
            (&self.left_on, &self.right_on, &self.left, &self.right);
        if left_on.is_empty() || left_on.len() != right_on.len() {
            return Err(Error::Invalid(format!(
                "join: {} left keys and {} right keys; give one or more of each, as many",
                left_on.len(),
                right_on.len()
            )));
        }
        for (l, r) in left_on.iter().zip(right_on) {
            let field = |schema: &Schema, name: &str, side: &str| {
                schema.field_with_name(name).cloned().map_err(|_| {
                    Error::Invalid(format!(
                        "join: no key column `{name}` in the {side} input's columns {:?}",
                        schema
                            .fields()
                            .iter()
                            .map(|f| f.name().as_str())
                            .collect::<Vec<_>>()
                    ))
                })
            };
            let (lf, rf) = (field(left, l, "left")?, field(right, r, "right")?);
            if lf.data_type() != rf.data_type() {
                return Err(Error::Invalid(format!(
                    "join: the key `{l}` is {} on the left and `{r}` is {} on the right; \
                     cast one to the other's type first",
                    lf.data_type(),
                    rf.data_type()
                )));
            }
        }
        let schema = self.schema();
        let mut names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::Invalid(format!(
                "join: two output columns are named `{}`; rename one side's first",
                w[0]
            )));
        }
        Ok(self)
    }

    /// The right's columns in the output, by position: all but the keys
    /// named as their left key.
    fn right_kept(&self) -> Vec<usize> {
        (0..self.right.fields().len())
            .filter(|&i| {
                let name = self.right.field(i).name();
                !self
                    .left_on
                    .iter()
                    .zip(&self.right_on)
                    .any(|(l, r)| r == name && l == name)
            })
            .collect()
    }

    /// The output's schema: every column nullable (an input's batches may
    /// differ in their columns' nullability, and outer joins add nulls).
    pub fn schema(&self) -> SchemaRef {
        let nullable = |f: &Field| f.clone().with_nullable(true);
        let mut fields: Vec<Field> = self.left.fields().iter().map(|f| nullable(f)).collect();
        if !matches!(self.how, JoinHow::Semi | JoinHow::Anti) {
            for i in self.right_kept() {
                let f = nullable(self.right.field(i));
                fields.push(match self.left.field_with_name(f.name()) {
                    Ok(_) => f.clone().with_name(format!("{}_right", f.name())),
                    Err(_) => f,
                });
            }
        }
        Arc::new(Schema::new(fields))
    }

    /// The right's key column that a left key column `name` is coalesced
    /// with (the right key of the same name), if any.
    fn coalesced(&self, name: &str) -> Option<usize> {
        self.left_on
            .iter()
            .zip(&self.right_on)
            .find(|(l, r)| *l == name && *r == name)
            .and_then(|(_, r)| self.right.index_of(r).ok())
    }

    /// Joins one destination's rows, `batches`: each a batch of one side,
    /// tagged as the map side tagged it. The output comes as it is made,
    /// in batches of at most 64 Ki rows (a key on many rows of both sides
    /// makes their product, never held whole).
    pub fn run(&self, batches: &[RecordBatch]) -> Result<Probe> {
        let (left, right) = self.sides(batches)?;
        let table = Arc::new(Table::build(JoinKeys::of(&right, &self.right_on)?));
        Probe::new(Arc::new(self.clone()), left, right, table, true)
    }

    /// `batches` of the `side` input, checked against the schema it was
    /// planned with (nullability aside), as one batch.
    fn conform(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        side: &str,
    ) -> Result<RecordBatch> {
        let columns = |s: &Schema| -> Vec<(String, arrow_schema::DataType)> {
            s.fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect()
        };
        let schema = Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        for b in batches {
            if columns(&b.schema()) != columns(&schema) {
                return Err(Error::Invalid(format!(
                    "join: the {side} input's rows have the columns {:?}, not those it was \
                     planned with ({:?})",
                    b.schema().fields(),
                    schema.fields()
                )));
            }
        }
        arrow_select::concat::concat_batches(&schema, batches).map_err(|e| Error::arrow("join", e))
    }

    /// The left and the right rows of `batches`, each concatenated.
    fn sides(&self, batches: &[RecordBatch]) -> Result<(RecordBatch, RecordBatch)> {
        let mut sides: [Vec<RecordBatch>; 2] = [Vec::new(), Vec::new()];
        for batch in batches {
            let tag = batch.schema().metadata().get(SIDE_TAG).cloned();
            match tag.as_deref() {
                Some("0") => sides[0].push(batch.clone()),
                Some("1") => sides[1].push(batch.clone()),
                _ => {
                    return Err(Error::Invalid(
                        "join: a reducer got rows that are not marked as either input's".into(),
                    ));
                }
            }
        }
        let [l, r] = sides;
        Ok((
            self.conform(&self.left, &l, "left")?,
            self.conform(&self.right, &r, "right")?,
        ))
    }

    /// The output rows pairing `left` rows `li` with `right` rows `ri`
    /// (null: none).
    fn output(
        &self,
        left: &RecordBatch,
        right: &RecordBatch,
        li: UInt32Array,
        ri: UInt32Array,
    ) -> Result<RecordBatch> {
        let take = |c: &ArrayRef, at: &UInt32Array| {
            arrow_select::take::take(c.as_ref(), at, None).map_err(|e| Error::arrow("join", e))
        };
        let mut columns = Vec::new();
        for (i, field) in self.left.fields().iter().enumerate() {
            let mut column = take(left.column(i), &li)?;
            if let (Some(r), true) = (
                self.coalesced(field.name()),
                self.how.keeps_right_unmatched(),
            ) {
                let from_left =
                    BooleanArray::from_iter((0..li.len()).map(|k| Some(li.is_valid(k))));
                let right_key = take(right.column(r), &ri)?;
                column = arrow_select::zip::zip(&from_left, &column, &right_key)
                    .map_err(|e| Error::arrow("join", e))?;
            }
            columns.push(column);
        }
        if !matches!(self.how, JoinHow::Semi | JoinHow::Anti) {
            for j in self.right_kept() {
                columns.push(take(right.column(j), &ri)?);
            }
        }
        RecordBatch::try_new(self.schema(), columns).map_err(|e| Error::arrow("join", e))
    }
}

/// One side's key columns, and which rows have a null key (matching
/// nothing): one integer column as its values, as `i64` (the common key,
/// hashed and compared as a number), any other keys as `arrow-row` bytes.
/// The two sides' key types are equal, so both take the same form.
struct JoinKeys {
    values: KeyValues,
    null: Vec<bool>,
}

enum KeyValues {
    Ints(arrow_array::Int64Array),
    Rows(Rows),
}

/// One row's key, as its side holds it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key<'a> {
    Int(i64),
    Bytes(&'a [u8]),
}

impl JoinKeys {
    fn of(batch: &RecordBatch, keys: &[String]) -> Result<Self> {
        // Rows are u32 indices, u32::MAX ending a chain.
        if batch.num_rows() >= u32::MAX as usize {
            return Err(Error::Invalid(format!(
                "join: {} rows on one side of one reducer; join more partitions",
                batch.num_rows()
            )));
        }
        let at = column_indices(batch, keys)?;
        let mut null = vec![false; batch.num_rows()];
        for &k in &at {
            // Logical nulls: a null-typed column, or a dictionary's null
            // values, hold nulls without a null buffer.
            if let Some(nulls) = batch.column(k).logical_nulls() {
                for (row, null) in null.iter_mut().enumerate() {
                    *null |= nulls.is_null(row);
                }
            }
        }
        use arrow_schema::DataType::*;
        let values = match at.as_slice() {
            [k] if matches!(
                batch.column(*k).data_type(),
                Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32
            ) =>
            {
                let ints = arrow_cast::cast(batch.column(*k), &Int64)
                    .map_err(|e| Error::arrow("join", e))?;
                KeyValues::Ints(
                    ints.as_any()
                        .downcast_ref::<arrow_array::Int64Array>()
                        .expect("cast to Int64")
                        .clone(),
                )
            }
            _ => KeyValues::Rows(key_rows(batch, &at, &[])?),
        };
        Ok(Self { values, null })
    }

    fn key(&self, row: usize) -> Option<Key<'_>> {
        if self.null[row] {
            return None;
        }
        Some(match &self.values {
            KeyValues::Ints(ints) => Key::Int(ints.value(row)),
            KeyValues::Rows(rows) => Key::Bytes(rows.row(row).data()),
        })
    }
}

/// A broadcast join: the right input's rows, whole, joined with each batch
/// of the left in the left's own tasks (no exchange): for an inner, left,
/// semi or anti join whose right input is small
/// (`NodeConfig::broadcast_join_bytes`).
#[derive(Clone, Debug, PartialEq)]
pub struct Broadcast {
    /// The join.
    pub join: Join,
    /// The right input's rows.
    pub right: RecordBatch,
}

impl Broadcast {
    /// `join` with the right input's rows `right`, checked against the
    /// right's schema; refused for a right or full join (the right's
    /// unmatched rows are known only once every left row has probed).
    pub fn new(join: Join, right: &[RecordBatch]) -> Result<Self> {
        if join.how.keeps_right_unmatched() {
            return Err(Error::Invalid(format!(
                "join: a {} join cannot broadcast its right input",
                join.how.name()
            )));
        }
        let right = join.conform(&join.right, right, "right")?;
        Ok(Self { join, right })
    }

    /// `input`, batches of the left input, joined with the right's rows:
    /// the right's table is built once per task, on its first batch.
    pub(crate) fn stream(self: &Arc<Self>, input: crate::udf::BatchIter) -> crate::udf::BatchIter {
        let this = self.clone();
        let join = Arc::new(self.join.clone());
        let mut table: Option<Arc<Table>> = None;
        Box::new(input.flat_map(move |batch| -> crate::udf::BatchIter {
            let probe = || -> Result<Probe> {
                let left = this.join.conform(&this.join.left, &[batch?], "left")?;
                let table = match &table {
                    Some(table) => table.clone(),
                    None => {
                        let keys = JoinKeys::of(&this.right, &this.join.right_on)?;
                        table.insert(Arc::new(Table::build(keys))).clone()
                    }
                };
                Probe::new(join.clone(), left, this.right.clone(), table, false)
            };
            match probe() {
                Ok(probe) => Box::new(probe),
                Err(e) => Box::new(std::iter::once(Err(e))),
            }
        }))
    }
}

/// A join in progress: each left row in turn with its matches in the
/// right's table, then (where the join keeps them and the right is whole)
/// the right's unmatched rows, as output batches of at most
/// [`OUTPUT_ROWS`] rows, each made when asked for.
pub struct Probe {
    join: Arc<Join>,
    left: RecordBatch,
    right: RecordBatch,
    left_keys: JoinKeys,
    table: Arc<Table>,
    /// The right's unmatched rows are this probe's to emit.
    whole_right: bool,
    /// The next left row to probe.
    next_left: usize,
    /// A left row part-way through its matches: the row, the next place
    /// in its chain, and whether it has matched yet.
    chain: Option<(u32, u32, bool)>,
    right_matched: Vec<bool>,
    /// The next right row to check for a match, once the left is done.
    next_right: usize,
}

impl Probe {
    fn new(
        join: Arc<Join>,
        left: RecordBatch,
        right: RecordBatch,
        table: Arc<Table>,
        whole_right: bool,
    ) -> Result<Self> {
        let left_keys = JoinKeys::of(&left, &join.left_on)?;
        let right_matched = vec![false; right.num_rows()];
        Ok(Self {
            join,
            left,
            right,
            left_keys,
            table,
            whole_right,
            next_left: 0,
            chain: None,
            right_matched,
            next_right: 0,
        })
    }

    /// Up to [`OUTPUT_ROWS`] more pairs.
    fn fill(&mut self) -> Pairs {
        let mut pairs = Pairs::default();
        let how = self.join.how;
        loop {
            // A left row part-way through its chain first.
            if let Some((i, mut at, mut matched)) = self.chain.take() {
                let key = self.left_keys.key(i as usize).expect("a chain has a key");
                while let Some(j) = self.table.next_match(key, at) {
                    pairs.push(Some(i), Some(j));
                    self.right_matched[j as usize] = true;
                    matched = true;
                    at = self.table.next[j as usize];
                    if pairs.len() >= OUTPUT_ROWS {
                        self.chain = Some((i, at, matched));
                        return pairs;
                    }
                }
                if !matched && how.keeps_left_unmatched() {
                    pairs.push(Some(i), None);
                }
            }
            if pairs.len() >= OUTPUT_ROWS {
                return pairs;
            }
            if self.next_left < self.left.num_rows() {
                let i = self.next_left;
                self.next_left += 1;
                let key = self.left_keys.key(i);
                match (how, key) {
                    (JoinHow::Semi | JoinHow::Anti, _) => {
                        let matched =
                            key.and_then(|k| self.table.next_match(k, self.table.head(k)));
                        if matched.is_some() == (how == JoinHow::Semi) {
                            pairs.push(Some(i as u32), None);
                        }
                    }
                    (_, Some(k)) => self.chain = Some((i as u32, self.table.head(k), false)),
                    (_, None) => {
                        if how.keeps_left_unmatched() {
                            pairs.push(Some(i as u32), None);
                        }
                    }
                }
                continue;
            }
            if !(self.whole_right && how.keeps_right_unmatched()) {
                return pairs;
            }
            let Some(j) =
                (self.next_right..self.right.num_rows()).find(|&j| !self.right_matched[j])
            else {
                self.next_right = self.right.num_rows();
                return pairs;
            };
            pairs.push(None, Some(j as u32));
            self.next_right = j + 1;
        }
    }
}

impl Iterator for Probe {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        let pairs = self.fill();
        if pairs.len() == 0 {
            return None;
        }
        let (l, r) = pairs.arrays();
        Some(self.join.output(&self.left, &self.right, l, r))
    }
}

/// One side's rows by key: per hash of a key's bytes the first row, and
/// each row's next of the same hash (`u32::MAX` ends a chain, which holds
/// its rows in order); a probe compares the bytes.
struct Table {
    keys: JoinKeys,
    first: HashMap<u64, u32, foldhash::fast::RandomState>,
    next: Vec<u32>,
}

impl Table {
    fn build(keys: JoinKeys) -> Self {
        let rows = keys.null.len();
        let mut first: HashMap<u64, u32, foldhash::fast::RandomState> = HashMap::default();
        let mut next = vec![u32::MAX; rows];
        for j in (0..rows).rev() {
            if let Some(key) = keys.key(j)
                && let Some(after) = first.insert(hash(key), j as u32)
            {
                next[j] = after;
            }
        }
        Self { keys, first, next }
    }

    /// Where the chain of `key`'s hash starts (`u32::MAX`: nowhere).
    fn head(&self, key: Key<'_>) -> u32 {
        self.first.get(&hash(key)).copied().unwrap_or(u32::MAX)
    }

    /// The first row from `at` on along its chain whose key is `key`.
    fn next_match(&self, key: Key<'_>, mut at: u32) -> Option<u32> {
        while at != u32::MAX {
            if self.keys.key(at as usize) == Some(key) {
                return Some(at);
            }
            at = self.next[at as usize];
        }
        None
    }
}

fn hash(key: Key<'_>) -> u64 {
    use std::hash::BuildHasher;
    let state = foldhash::fast::FixedState::with_seed(0x6a6f_696e);
    match key {
        Key::Int(v) => state.hash_one(v),
        Key::Bytes(bytes) => state.hash_one(bytes),
    }
}

/// Output rows as pairs of a left and a right row (either may be none).
#[derive(Default)]
struct Pairs {
    left: Vec<Option<u32>>,
    right: Vec<Option<u32>>,
}

impl Pairs {
    fn push(&mut self, left: Option<u32>, right: Option<u32>) {
        self.left.push(left);
        self.right.push(right);
    }

    fn len(&self) -> usize {
        self.left.len()
    }

    /// The pairs as two index arrays (null: no row).
    fn arrays(self) -> (UInt32Array, UInt32Array) {
        (UInt32Array::from(self.left), UInt32Array::from(self.right))
    }
}
