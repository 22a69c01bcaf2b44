//! A physical plan as it travels to the nodes of a cluster: its stages with
//! each operator's recipe (see `streambatch_plan::Registry`), the source's
//! splits, and each stage's options. A node rebuilds the same stages from its
//! own registry, so stage and operator positions agree on every node.
//!
//! What cannot travel is refused before the job starts, naming it: an
//! operator given as a closure, a filter or projection expression.

use std::sync::Arc;

use rkyv::{Archive, Deserialize, Serialize};
use streambatch_core::{PoolSize, Resources, StageOptions};
use streambatch_plan::sink::{FileFormat, FileSink, ParquetWriteOptions};
use streambatch_plan::{
    Broadcast, Cut, Error, ExecPlan, Join, OpKind, OpSpec, Recipe, Reduce, Registry, RowSample,
    Side, SourceSplit, Stage, StageKind, schema_bytes, schema_of,
};

use super::ipc::{batch_bytes, batch_of};

/// A plan that can travel.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct PlanSpec {
    pub(crate) stages: Vec<StageSpec>,
}

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct StageSpec {
    name: String,
    kind: KindSpec,
    options: OptionsSpec,
    op_names: Vec<String>,
    /// An exchange's map side: its cut and destinations.
    cut: Option<(Cut, u64)>,
}

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) enum KindSpec {
    Source {
        splits: Vec<SplitSpec>,
        /// Per split, the side of a `train_test_split` it reads, if any.
        samples: Vec<Option<SampleSpec>>,
        /// Per split, the input of a union or join it reads (its place in
        /// `inputs`), if any.
        input_of: Vec<Option<u32>>,
        /// The inputs of a union or join: their operators and tags.
        inputs: Vec<UnionInputSpec>,
        ops: Vec<OpWire>,
    },
    Map {
        ops: Vec<OpWire>,
    },
    Limit(u64),
    Repartition(u64),
    Exchange(u64),
}

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct OpWire {
    index: u64,
    name: String,
    options: OptionsSpec,
    kind: OpKindSpec,
}

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) enum OpKindSpec {
    /// A registered operator: its name, parameters and the SHA-256s of
    /// the blobs it refers to (which the node pulls from the driver).
    Recipe {
        name: String,
        params: Vec<u8>,
        blobs: Vec<String>,
    },
    /// The staging directory, the format's extension and, for Parquet, the
    /// codec as `ParquetWriteOptions::codec_name` writes it and the rows per
    /// row group.
    WriteFiles {
        dir: String,
        format: String,
        codec: String,
        max_row_group_rows: u64,
    },
    /// Checked on arrival ([`Reduce::checked`]).
    Reduce(Reduce),
    /// A broadcast join: the join (checked on arrival) and the right
    /// input's rows as an Arrow IPC stream of one batch.
    BroadcastJoin { join: Join, right: Vec<u8> },
}

/// An input of a union or a join ([`streambatch_plan::Side`]).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct UnionInputSpec {
    ops: Vec<OpWire>,
    tag: Option<u8>,
}

/// A `RowSample`: which rows of its split a side keeps.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub(crate) struct SampleSpec {
    key: u64,
    seed: u64,
    test_fraction: f64,
    test: bool,
}

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) enum SplitSpec {
    Range {
        start: i64,
        end: i64,
    },
    Parquet {
        path: String,
        columns: Option<Vec<String>>,
    },
    BinaryFiles {
        paths: Vec<String>,
        largest: u64,
    },
    Images {
        paths: Vec<String>,
        height: u32,
        width: u32,
    },
    Text(String),
    Ipc(String),
    /// The schema as an Arrow IPC stream with no batches: every node reads
    /// the files with the one the driver inferred.
    Csv {
        path: String,
        schema: Vec<u8>,
    },
    Json {
        path: String,
        schema: Vec<u8>,
    },
}

#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct OptionsSpec {
    cpus: f64,
    gpus: f64,
    memory_bytes: u64,
    batch_rows: Option<u64>,
    pool: Option<(u64, u64)>,
    no_fuse: bool,
}

impl From<&StageOptions> for OptionsSpec {
    fn from(o: &StageOptions) -> Self {
        Self {
            cpus: o.resources.cpus,
            gpus: o.resources.gpus,
            memory_bytes: o.resources.memory_bytes,
            batch_rows: o.batch_rows.map(|r| r as u64),
            pool: o.pool.map(|p| (p.min as u64, p.max as u64)),
            no_fuse: o.no_fuse,
        }
    }
}

impl From<&OptionsSpec> for StageOptions {
    fn from(o: &OptionsSpec) -> Self {
        Self {
            resources: Resources {
                cpus: o.cpus,
                gpus: o.gpus,
                memory_bytes: o.memory_bytes,
            },
            batch_rows: o.batch_rows.map(|r| r as usize),
            pool: o.pool.map(|(min, max)| PoolSize {
                min: min as usize,
                max: max as usize,
            }),
            no_fuse: o.no_fuse,
        }
    }
}

impl PlanSpec {
    /// The travelling form of `plan`, or an error naming what cannot travel.
    pub(crate) fn of(plan: &ExecPlan) -> Result<Self, Error> {
        let stages = plan
            .stages
            .iter()
            .map(|stage| {
                let kind = match &stage.kind {
                    StageKind::Source { splits, ops } => {
                        let (input_of, inputs, splits) = input_specs(splits)?;
                        let (splits, samples) = splits
                            .iter()
                            .map(|s| sampled_spec(s))
                            .collect::<Result<Vec<_>, _>>()?
                            .into_iter()
                            .unzip();
                        KindSpec::Source {
                            splits,
                            samples,
                            input_of,
                            inputs,
                            ops: ops_spec(ops)?,
                        }
                    }
                    StageKind::Map { ops } => KindSpec::Map {
                        ops: ops_spec(ops)?,
                    },
                    StageKind::Limit(n) => KindSpec::Limit(*n as u64),
                    StageKind::Repartition(n) => KindSpec::Repartition(*n as u64),
                    StageKind::Exchange(n) => KindSpec::Exchange(*n as u64),
                };
                let cut = stage.cut.as_ref().map(|(cut, n)| (cut.clone(), *n as u64));
                Ok(StageSpec {
                    name: stage.name.clone(),
                    kind,
                    options: (&stage.options).into(),
                    op_names: stage.op_names.clone(),
                    cut,
                })
            })
            .collect::<Result<_, Error>>()?;
        Ok(Self { stages })
    }

    /// Each registered operator's name and blobs.
    fn recipes(&self) -> impl Iterator<Item = (&String, &Vec<String>)> {
        self.stages
            .iter()
            .flat_map(|s| match &s.kind {
                KindSpec::Source { ops, inputs, .. } => {
                    let of_inputs = inputs.iter().flat_map(|i| i.ops.iter());
                    ops.iter().chain(of_inputs).collect::<Vec<_>>()
                }
                KindSpec::Map { ops } => ops.iter().collect(),
                _ => Vec::new(),
            })
            .filter_map(|op| match &op.kind {
                OpKindSpec::Recipe { name, blobs, .. } => Some((name, blobs)),
                OpKindSpec::WriteFiles { .. }
                | OpKindSpec::Reduce(_)
                | OpKindSpec::BroadcastJoin { .. } => None,
            })
    }

    /// The recipes' names, to check against a node's registry.
    pub(crate) fn recipe_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.recipes().map(|(name, _)| name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// The SHA-256s of the blobs the recipes refer to, each once.
    pub(crate) fn blobs(&self) -> Vec<String> {
        let mut blobs: Vec<String> = self.recipes().flat_map(|(_, b)| b.clone()).collect();
        blobs.sort();
        blobs.dedup();
        blobs
    }

    /// Rebuilds the plan with operators from `registry`.
    pub(crate) fn build(&self, registry: &Registry) -> Result<ExecPlan, Error> {
        let stages = self
            .stages
            .iter()
            .map(|spec| {
                let kind = match &spec.kind {
                    KindSpec::Source {
                        splits,
                        samples,
                        input_of,
                        inputs,
                        ops,
                    } => StageKind::Source {
                        splits: with_inputs(
                            sampled_splits(splits, samples)?,
                            input_of,
                            inputs,
                            registry,
                        )?,
                        ops: ops_of(ops, registry)?,
                    },
                    KindSpec::Map { ops } => StageKind::Map {
                        ops: ops_of(ops, registry)?,
                    },
                    KindSpec::Limit(n) => StageKind::Limit(*n as usize),
                    KindSpec::Repartition(n) => StageKind::Repartition(*n as usize),
                    KindSpec::Exchange(n) => StageKind::Exchange(*n as usize),
                };
                check_op_names(spec, &kind)?;
                let cut = spec.cut.as_ref().map(|(cut, n)| (cut.clone(), *n as usize));
                Ok(Stage {
                    name: spec.name.clone(),
                    kind,
                    options: (&spec.options).into(),
                    op_names: spec.op_names.clone(),
                    counters: spec.op_names.iter().map(|_| Default::default()).collect(),
                    cut,
                })
            })
            .collect::<Result<_, Error>>()?;
        Ok(ExecPlan { stages })
    }
}

/// A stage names each operator it runs (its source first), as the plan
/// made it: counters and stats pair names with operators by position, so a
/// peer's plan whose names do not line up is refused, not run short.
fn check_op_names(spec: &StageSpec, kind: &StageKind) -> Result<(), Error> {
    let expected = match kind {
        StageKind::Source { ops, .. } => ops.len() + 1,
        StageKind::Map { ops } => ops.len(),
        StageKind::Limit(_) | StageKind::Repartition(_) | StageKind::Exchange(_) => 0,
    };
    if spec.op_names.len() != expected {
        return Err(Error::Invalid(format!(
            "stage `{}` names {} operators but runs {expected}",
            spec.name,
            spec.op_names.len()
        )));
    }
    Ok(())
}

fn cannot_travel(what: &str, why: &str) -> Error {
    Error::Invalid(format!(
        "{what} cannot run on a cluster: {why}; run it with Context::local(), or make it \
         from a Registry so that every node can rebuild it"
    ))
}

/// `splits` without their union or join inputs; per split, its input's
/// place among the inputs, each given once.
#[allow(clippy::type_complexity)]
fn input_specs(
    splits: &[SourceSplit],
) -> Result<(Vec<Option<u32>>, Vec<UnionInputSpec>, Vec<&SourceSplit>), Error> {
    let mut seen: Vec<&Arc<Side>> = Vec::new();
    let mut inputs = Vec::new();
    let mut input_of = Vec::new();
    let mut inner = Vec::new();
    for split in splits {
        let SourceSplit::Side { inner: read, side } = split else {
            input_of.push(None);
            inner.push(split);
            continue;
        };
        let at = match seen.iter().position(|s| Arc::ptr_eq(s, side)) {
            Some(at) => at,
            None => {
                seen.push(side);
                inputs.push(UnionInputSpec {
                    ops: ops_spec(&side.ops)?,
                    tag: side.tag,
                });
                seen.len() - 1
            }
        };
        input_of.push(Some(at as u32));
        inner.push(read.as_ref());
    }
    Ok((input_of, inputs, inner))
}

/// `splits` wrapped with the union or join inputs they read, checked.
fn with_inputs(
    splits: Vec<SourceSplit>,
    input_of: &[Option<u32>],
    inputs: &[UnionInputSpec],
    registry: &Registry,
) -> Result<Vec<SourceSplit>, Error> {
    if input_of.len() != splits.len() {
        return Err(Error::Invalid(format!(
            "a source of {} splits came with {} inputs",
            splits.len(),
            input_of.len()
        )));
    }
    let sides = inputs
        .iter()
        .map(|input| {
            let ops = ops_of(&input.ops, registry)?;
            Ok(Arc::new(Side::new(ops, input.tag)?))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    splits
        .into_iter()
        .zip(input_of)
        .map(|(split, at)| match at {
            None => Ok(split),
            Some(at) => {
                let side = sides.get(*at as usize).ok_or_else(|| {
                    Error::Invalid(format!(
                        "a split reads input {at} of a source of {} inputs",
                        sides.len()
                    ))
                })?;
                Ok(SourceSplit::Side {
                    inner: Arc::new(split),
                    side: side.clone(),
                })
            }
        })
        .collect()
}

/// A split as it travels, and the side of a `train_test_split` it reads.
fn sampled_spec(split: &SourceSplit) -> Result<(SplitSpec, Option<SampleSpec>), Error> {
    let SourceSplit::Sampled { inner, sample } = split else {
        return Ok((split_spec(split)?, None));
    };
    let spec = SampleSpec {
        key: sample.key,
        seed: sample.seed,
        test_fraction: sample.test_fraction,
        test: sample.test,
    };
    Ok((split_spec(inner)?, Some(spec)))
}

/// The splits a node reads, each with its side of a `train_test_split`.
fn sampled_splits(
    splits: &[SplitSpec],
    samples: &[Option<SampleSpec>],
) -> Result<Vec<SourceSplit>, Error> {
    if samples.len() != splits.len() {
        return Err(Error::Invalid(format!(
            "a source of {} splits came with {} samples",
            splits.len(),
            samples.len()
        )));
    }
    let sampled = |(spec, sample): (&SplitSpec, &Option<SampleSpec>)| {
        let split = split_of(spec)?;
        Ok(match sample {
            None => split,
            Some(s) if !(0.0..=1.0).contains(&s.test_fraction) => {
                return Err(Error::Invalid(format!(
                    "a train_test_split's test fraction {} is not within 0 and 1",
                    s.test_fraction
                )));
            }
            Some(s) => SourceSplit::Sampled {
                inner: Arc::new(split),
                sample: RowSample {
                    key: s.key,
                    seed: s.seed,
                    test_fraction: s.test_fraction,
                    test: s.test,
                },
            },
        })
    };
    splits.iter().zip(samples).map(sampled).collect()
}

fn split_spec(split: &SourceSplit) -> Result<SplitSpec, Error> {
    Ok(match split {
        SourceSplit::Sampled { .. } => {
            return Err(cannot_travel(
                "a train_test_split of a train_test_split",
                "a node reads one side of one split",
            ));
        }
        SourceSplit::Side { .. } => {
            return Err(cannot_travel(
                "a union inside a train_test_split's side",
                "a node reads a union's input, then its sample",
            ));
        }
        SourceSplit::Range { start, end } => SplitSpec::Range {
            start: *start,
            end: *end,
        },
        // A pruning predicate stays behind: the filter it comes from
        // cannot travel either (refused below), and pruning only saves reads.
        SourceSplit::Parquet { path, columns, .. } => SplitSpec::Parquet {
            path: absolute(path),
            columns: columns.as_ref().map(|c| c.to_vec()),
        },
        SourceSplit::BinaryFiles { paths, largest } => SplitSpec::BinaryFiles {
            paths: paths.iter().map(|p| absolute(p)).collect(),
            largest: *largest,
        },
        SourceSplit::Images { paths, size } => SplitSpec::Images {
            paths: paths.iter().map(|p| absolute(p)).collect(),
            height: size.height,
            width: size.width,
        },
        SourceSplit::Text(path) => SplitSpec::Text(absolute(path)),
        SourceSplit::Ipc(path) => SplitSpec::Ipc(absolute(path)),
        SourceSplit::Batch(_) => {
            return Err(cannot_travel(
                "the source `from_batches`",
                "its batches live in the driver",
            ));
        }
        SourceSplit::Csv { path, schema } => SplitSpec::Csv {
            path: absolute(path),
            schema: schema_bytes(schema)?,
        },
        SourceSplit::Json { path, schema } => SplitSpec::Json {
            path: absolute(path),
            schema: schema_bytes(schema)?,
        },
    })
}

/// A path as the driver means it: nodes run in other directories.
fn absolute(path: &std::path::Path) -> String {
    if let Some(url) = streambatch_plan::object_url(path) {
        return url.to_string();
    }
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

fn split_of(spec: &SplitSpec) -> Result<SourceSplit, Error> {
    Ok(match spec {
        SplitSpec::Range { start, end } => SourceSplit::Range {
            start: *start,
            end: *end,
        },
        SplitSpec::Parquet { path, columns } => SourceSplit::Parquet {
            path: path.into(),
            columns: columns.clone().map(Arc::new),
            prune: None,
        },
        SplitSpec::BinaryFiles { paths, largest } => SourceSplit::BinaryFiles {
            paths: Arc::new(paths.iter().map(Into::into).collect()),
            largest: *largest,
        },
        SplitSpec::Images {
            paths,
            height,
            width,
        } => SourceSplit::Images {
            paths: Arc::new(paths.iter().map(Into::into).collect()),
            size: streambatch_plan::ImageSize {
                height: *height,
                width: *width,
            },
        },
        SplitSpec::Text(path) => SourceSplit::Text(path.into()),
        SplitSpec::Ipc(path) => SourceSplit::Ipc(path.into()),
        SplitSpec::Csv { path, schema } => SourceSplit::Csv {
            path: path.into(),
            schema: schema_of(schema)?,
        },
        SplitSpec::Json { path, schema } => SourceSplit::Json {
            path: path.into(),
            schema: schema_of(schema)?,
        },
    })
}

fn ops_spec(ops: &[(usize, OpSpec)]) -> Result<Vec<OpWire>, Error> {
    ops.iter()
        .map(|(index, op)| {
            let what = || format!("the operator `{}`", op.name);
            let kind = match &op.kind {
                OpKind::MapBatches(udf) => {
                    let Recipe {
                        name,
                        params,
                        blobs,
                    } = udf
                        .recipe()
                        .ok_or_else(|| cannot_travel(&what(), "it is a closure"))?;
                    OpKindSpec::Recipe {
                        name,
                        params,
                        blobs,
                    }
                }
                OpKind::WriteFiles(sink) => {
                    let parquet = match sink.format {
                        FileFormat::Parquet(options) => options,
                        _ => ParquetWriteOptions::default(),
                    };
                    OpKindSpec::WriteFiles {
                        dir: absolute(&sink.dir),
                        format: sink.format.extension().to_string(),
                        codec: parquet.codec_name(),
                        max_row_group_rows: parquet.max_row_group_rows as u64,
                    }
                }
                OpKind::Reduce(reduce) => OpKindSpec::Reduce(reduce.clone()),
                OpKind::BroadcastJoin(b) => OpKindSpec::BroadcastJoin {
                    join: b.join.clone(),
                    right: batch_bytes(&b.right, "a broadcast join's right input")?,
                },
                OpKind::Map(_) | OpKind::FlatMap(_) | OpKind::FlatMapBatches(_) => {
                    return Err(cannot_travel(&what(), "it is a closure"));
                }
                OpKind::Filter(_) | OpKind::Select(_) | OpKind::WithColumn(..) => {
                    return Err(cannot_travel(&what(), "expressions do not travel yet"));
                }
            };
            Ok(OpWire {
                index: *index as u64,
                name: op.name.clone(),
                options: (&op.options).into(),
                kind,
            })
        })
        .collect()
}

fn ops_of(ops: &[OpWire], registry: &Registry) -> Result<Vec<(usize, OpSpec)>, Error> {
    ops.iter()
        .map(|op| {
            let kind = match &op.kind {
                OpKindSpec::Recipe {
                    name,
                    params,
                    blobs,
                } => {
                    let recipe = Recipe {
                        name: name.clone(),
                        params: params.clone(),
                        blobs: blobs.clone(),
                    };
                    OpKind::MapBatches(Arc::new(registry.rebuild(&recipe)?))
                }
                OpKindSpec::WriteFiles {
                    dir,
                    format,
                    codec,
                    max_row_group_rows,
                } => {
                    let parquet = ParquetWriteOptions {
                        max_row_group_rows: *max_row_group_rows as usize,
                        ..Default::default()
                    };
                    let format = FileFormat::of_extension(format, parquet.with_codec(codec)?)
                        .ok_or_else(|| Error::Invalid(format!("unknown file format `{format}`")))?;
                    OpKind::WriteFiles(FileSink {
                        dir: dir.into(),
                        format,
                    })
                }
                OpKindSpec::Reduce(reduce) => OpKind::Reduce(reduce.clone().checked()?),
                OpKindSpec::BroadcastJoin { join, right } => {
                    let right = batch_of(right, "a broadcast join's right input")?;
                    OpKind::BroadcastJoin(Arc::new(Broadcast::new(
                        join.clone().checked()?,
                        &[right],
                    )?))
                }
            };
            let spec = OpSpec {
                name: op.name.clone(),
                kind,
                options: (&op.options).into(),
            };
            Ok((op.index as usize, spec))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};
    use streambatch_plan::{
        ExecPlan, ImageSize, Registry, RowSample, Side, SourceSplit, Stage, StageKind,
    };

    use super::PlanSpec;

    /// A plan whose source has `splits`, through its travelling form and
    /// back: the splits a node rebuilds.
    fn travelled(splits: Vec<SourceSplit>) -> Vec<SourceSplit> {
        let stage = Stage {
            name: "source".into(),
            kind: StageKind::Source {
                splits,
                ops: Vec::new(),
            },
            options: streambatch_core::Resources::cpu(1.0).into(),
            op_names: vec!["source".into()],
            counters: vec![Arc::default()],
            cut: None,
        };
        let spec = PlanSpec::of(&ExecPlan {
            stages: vec![stage],
        })
        .unwrap();
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&spec).unwrap();
        let spec: PlanSpec = rkyv::from_bytes::<PlanSpec, rkyv::rancor::Error>(&bytes).unwrap();
        match spec
            .build(&Registry::default())
            .unwrap()
            .stages
            .remove(0)
            .kind
        {
            StageKind::Source { splits, .. } => splits,
            _ => panic!("not a source"),
        }
    }

    #[test]
    fn the_inputs_of_a_join_travel_once_each_with_their_splits() {
        let side = |tag| {
            Arc::new(Side {
                ops: Vec::new(),
                tag: Some(tag),
            })
        };
        let (left, right) = (side(0), side(1));
        let range = |start| SourceSplit::Range {
            start,
            end: start + 10,
        };
        let splits = [(0, &left), (10, &left), (20, &right), (30, &left)]
            .map(|(start, side)| SourceSplit::Side {
                inner: Arc::new(range(start)),
                side: side.clone(),
            })
            .into_iter()
            .chain([range(40)])
            .collect();
        let got = travelled(splits);
        let read: Vec<(String, Option<u8>)> = got
            .iter()
            .map(|s| match s {
                SourceSplit::Side { inner, side } => (inner.describe(), side.tag),
                plain => (plain.describe(), None),
            })
            .collect();
        let tags = [Some(0), Some(0), Some(1), Some(0), None];
        let expected: Vec<(String, Option<u8>)> = (0..5)
            .map(|i| {
                (
                    format!("range {}..{}", i * 10, i * 10 + 10),
                    tags[i as usize],
                )
            })
            .collect();
        assert_eq!(read, expected);
        // One side per input, shared by its splits.
        let sides: Vec<&Arc<Side>> = got
            .iter()
            .filter_map(|s| match s {
                SourceSplit::Side { side, .. } => Some(side),
                _ => None,
            })
            .collect();
        assert!(Arc::ptr_eq(sides[0], sides[1]) && Arc::ptr_eq(sides[0], sides[3]));
        assert!(!Arc::ptr_eq(sides[0], sides[2]));
    }

    #[test]
    fn csv_json_images_and_binary_splits_travel_whole() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
        ]));
        let size = ImageSize {
            height: 48,
            width: 64,
        };
        let splits = travelled(vec![
            SourceSplit::Csv {
                path: "/data/a.csv".into(),
                schema: schema.clone(),
            },
            SourceSplit::Json {
                path: "/data/a.json".into(),
                schema: schema.clone(),
            },
            SourceSplit::Images {
                paths: Arc::new(vec!["/data/a.png".into(), "/data/b.jpg".into()]),
                size,
            },
            SourceSplit::BinaryFiles {
                paths: Arc::new(vec!["/data/blob".into()]),
                largest: 7 << 20,
            },
        ]);
        match &splits[..] {
            [
                SourceSplit::Csv {
                    path: csv,
                    schema: s1,
                },
                SourceSplit::Json {
                    path: json,
                    schema: s2,
                },
                SourceSplit::Images { paths, size: got },
                SourceSplit::BinaryFiles { largest, .. },
            ] => {
                assert_eq!(csv.to_str(), Some("/data/a.csv"));
                assert_eq!(json.to_str(), Some("/data/a.json"));
                assert_eq!((s1, s2), (&schema, &schema));
                assert_eq!(paths.len(), 2);
                assert_eq!(*got, size);
                assert_eq!(*largest, 7 << 20);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_side_of_a_train_test_split_travels_with_its_sample() {
        let sample = RowSample {
            key: 11,
            seed: 7,
            test_fraction: 0.25,
            test: true,
        };
        let splits = travelled(vec![
            SourceSplit::Range { start: 0, end: 5 },
            SourceSplit::Sampled {
                inner: Arc::new(SourceSplit::Range { start: 5, end: 9 }),
                sample,
            },
        ]);
        match &splits[..] {
            [
                SourceSplit::Range { start: 0, end: 5 },
                SourceSplit::Sampled { inner, sample: got },
            ] => {
                assert!(matches!(**inner, SourceSplit::Range { start: 5, end: 9 }));
                assert_eq!(*got, sample);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn operator_names_that_do_not_match_the_operators_are_refused() {
        let stage = Stage {
            name: "source".into(),
            kind: StageKind::Source {
                splits: vec![SourceSplit::Range { start: 0, end: 10 }],
                ops: Vec::new(),
            },
            options: streambatch_core::Resources::cpu(1.0).into(),
            op_names: vec!["source".into()],
            counters: vec![Arc::default()],
            cut: None,
        };
        let good = PlanSpec::of(&ExecPlan {
            stages: vec![stage],
        })
        .unwrap();
        for names in [vec![], vec!["source".to_string(), "extra".to_string()]] {
            let mut spec = good.clone();
            spec.stages[0].op_names = names.clone();
            let err = spec
                .build(&Registry::default())
                .err()
                .map(|e| e.to_string());
            let err = err.unwrap_or_else(|| panic!("{names:?} accepted"));
            assert!(err.contains("stage `source` names"), "{err}");
        }
        let mut limit = good.clone();
        limit.stages.push(super::StageSpec {
            name: "limit".into(),
            kind: super::KindSpec::Limit(3),
            options: good.stages[0].options.clone(),
            op_names: vec!["limit".into()],
            cut: None,
        });
        assert!(limit.build(&Registry::default()).is_err());
        let built = good.build(&Registry::default()).unwrap();
        assert_eq!(built.stages[0].op_stats().len(), 1);
    }
}
