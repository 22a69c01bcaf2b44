//! An exchange's ends as they travel in a plan: the map side's cut and
//! the reducers' operator.

use arrow_schema::SortOptions;
use rkyv::{Archive, Deserialize, Serialize};
use streambatch_plan::{Agg, AggKind, Cut, Error, Join, JoinHow, Reduce, Step};

use super::ipc::{schema_bytes, schema_of};

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) enum CutSpec {
    Hash {
        keys: Vec<String>,
    },
    Random {
        seed: u64,
    },
    Range {
        keys: Vec<String>,
        descending: bool,
        nulls_first: bool,
    },
    Join {
        left: Vec<String>,
        right: Vec<String>,
    },
}

impl CutSpec {
    pub(crate) fn of(cut: &Cut) -> Result<Self, Error> {
        Ok(match cut {
            Cut::Hash { keys } => Self::Hash { keys: keys.clone() },
            Cut::Random { seed } => Self::Random { seed: *seed },
            Cut::Join { left, right } => Self::Join {
                left: left.clone(),
                right: right.clone(),
            },
            Cut::Range { keys, order } => Self::Range {
                keys: keys.clone(),
                descending: order.descending,
                nulls_first: order.nulls_first,
            },
        })
    }

    pub(crate) fn cut(&self) -> Result<Cut, Error> {
        Ok(match self {
            Self::Hash { keys } => Cut::Hash { keys: keys.clone() },
            Self::Random { seed } => Cut::Random { seed: *seed },
            Self::Join { left, right } => Cut::Join {
                left: left.clone(),
                right: right.clone(),
            },
            Self::Range {
                keys,
                descending,
                nulls_first,
            } => Cut::Range {
                keys: keys.clone(),
                order: SortOptions {
                    descending: *descending,
                    nulls_first: *nulls_first,
                },
            },
        })
    }
}

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) enum ReduceSpec {
    Shuffle {
        seed: u64,
    },
    Distinct,
    Unique {
        column: String,
    },
    Sort {
        keys: Vec<String>,
        descending: bool,
        nulls_first: bool,
    },
    Groups {
        keys: Vec<String>,
    },
    Aggregate {
        keys: Vec<String>,
        /// Each aggregate's kind (its position in `AGG_KINDS`) and column.
        aggs: Vec<(u8, Option<String>)>,
        partial: bool,
    },
    /// A join: its kind by name, its keys, and its inputs' schemas as
    /// Arrow IPC streams with no batches.
    Join {
        how: String,
        left_on: Vec<String>,
        right_on: Vec<String>,
        left: Vec<u8>,
        right: Vec<u8>,
    },
}

/// The aggregates' kinds in the order their wire number gives.
const AGG_KINDS: [AggKind; 7] = [
    AggKind::Count,
    AggKind::Sum,
    AggKind::Min,
    AggKind::Max,
    AggKind::Mean,
    AggKind::Std,
    AggKind::CountDistinct,
];

impl ReduceSpec {
    pub(crate) fn of(reduce: &Reduce) -> Result<Self, Error> {
        Ok(match reduce {
            Reduce::Shuffle { seed } => Self::Shuffle { seed: *seed },
            Reduce::Distinct => Self::Distinct,
            Reduce::Unique { column } => Self::Unique {
                column: column.clone(),
            },
            Reduce::Sort { keys, order } => Self::Sort {
                keys: keys.clone(),
                descending: order.descending,
                nulls_first: order.nulls_first,
            },
            Reduce::Groups { keys } => Self::Groups { keys: keys.clone() },
            Reduce::Aggregate { keys, aggs, step } => Self::Aggregate {
                keys: keys.clone(),
                aggs: aggs
                    .iter()
                    .map(|a| {
                        let kind = AGG_KINDS.iter().position(|k| *k == a.kind);
                        (kind.expect("every kind listed") as u8, a.column.clone())
                    })
                    .collect(),
                partial: *step == Step::Partial,
            },
            Reduce::Join(join) => Self::Join {
                how: join.how.name().to_string(),
                left_on: join.left_on.clone(),
                right_on: join.right_on.clone(),
                left: schema_bytes(&join.left)?,
                right: schema_bytes(&join.right)?,
            },
        })
    }

    pub(crate) fn reduce(&self) -> Result<Reduce, Error> {
        Ok(match self {
            Self::Shuffle { seed } => Reduce::Shuffle { seed: *seed },
            Self::Distinct => Reduce::Distinct,
            Self::Unique { column } => Reduce::Unique {
                column: column.clone(),
            },
            Self::Sort {
                keys,
                descending,
                nulls_first,
            } => Reduce::Sort {
                keys: keys.clone(),
                order: SortOptions {
                    descending: *descending,
                    nulls_first: *nulls_first,
                },
            },
            Self::Groups { keys } => Reduce::Groups { keys: keys.clone() },
            Self::Aggregate {
                keys,
                aggs,
                partial,
            } => Reduce::Aggregate {
                keys: keys.clone(),
                aggs: aggs
                    .iter()
                    .map(|(kind, column)| {
                        let kind = AGG_KINDS.get(*kind as usize).copied().ok_or_else(|| {
                            Error::Invalid(format!("unknown aggregate kind {kind}"))
                        })?;
                        Ok(Agg {
                            kind,
                            column: column.clone(),
                        })
                    })
                    .collect::<Result<_, Error>>()?,
                step: if *partial { Step::Partial } else { Step::Final },
            },
            // Rebuilt through `Join::new`, which checks the keys against
            // the schemas.
            Self::Join {
                how,
                left_on,
                right_on,
                left,
                right,
            } => {
                let l: Vec<&str> = left_on.iter().map(String::as_str).collect();
                let r: Vec<&str> = right_on.iter().map(String::as_str).collect();
                Reduce::Join(Join::new(
                    JoinHow::parse(how)?,
                    &l,
                    &r,
                    schema_of(left)?,
                    schema_of(right)?,
                )?)
            }
        })
    }
}
