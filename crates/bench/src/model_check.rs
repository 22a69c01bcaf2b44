//! The check of a model's outputs: every row a job wrote against the
//! reference engine's answer for its image, computed directly (one rten
//! session over the preprocessed images, no pipeline in between).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use streambatch::onnx::{Engine, OnnxModel};
use streambatch::{Context, Error, Result, ops};

use crate::w4::{EmbeddingCheck, embedding_matches};

/// Rows a reference call takes.
const CHUNK_ROWS: usize = 256;

/// Checks each row of `column` in `output` against `model` run by rten
/// directly on its image in `input` (rows `id`, `image`, preprocessed as
/// the main job does), with [`embedding_matches`]: each value within 1e-4
/// of the reference's largest; NaN never matches. A row whose id is no
/// image's, or repeats one, does not match.
pub fn check_model_outputs(
    ctx: &Context,
    input: &Path,
    output: &Path,
    model: &OnnxModel,
    column: &str,
) -> Result<EmbeddingCheck> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let reference = model.clone().engine(Engine::Rten);
    let mut session = reference.session(threads).map_err(udf_error)?;
    let mut want: HashMap<i64, Vec<f32>> = HashMap::new();
    let images = ctx.read_parquet(&input.display().to_string())?.collect()?;
    for batch in &images {
        for start in (0..batch.num_rows()).step_by(CHUNK_ROWS) {
            let rows = batch.slice(start, CHUNK_ROWS.min(batch.num_rows() - start));
            let pixels = ops::preprocess(rows).map_err(|e| Error::Udf {
                operator: "check".into(),
                source: e,
            })?;
            let out = session.run(&pixels).map_err(udf_error)?;
            for (id, values) in rows_of(&out, column, output)? {
                want.insert(id, values);
            }
        }
    }
    let mut check = EmbeddingCheck {
        images: images.iter().map(|b| b.num_rows() as u64).sum(),
        rows: 0,
        matching: 0,
    };
    let mut seen = HashSet::new();
    for batch in ctx.read_parquet(&output.display().to_string())?.collect()? {
        for (id, got) in rows_of(&batch, column, output)? {
            check.rows += 1;
            if let Some(want) = want.get(&id)
                && seen.insert(id)
                && embedding_matches(&got, want)
            {
                check.matching += 1;
            }
        }
    }
    Ok(check)
}

/// Each row's `id` and `column`'s values (a fixed-size list of f32, or
/// one f32).
fn rows_of(batch: &RecordBatch, column: &str, file: &Path) -> Result<Vec<(i64, Vec<f32>)>> {
    let bad = |message: String| Error::BadFile {
        path: file.to_path_buf(),
        message,
    };
    let ids = batch
        .column_by_name("id")
        .and_then(|c| c.as_primitive_opt::<Int64Type>())
        .ok_or_else(|| bad("no Int64 column `id`".into()))?;
    let values = batch
        .column_by_name(column)
        .ok_or_else(|| bad(format!("no column `{column}`")))?;
    let rows = ids.values().iter().enumerate();
    if let Some(list) = values.as_fixed_size_list_opt() {
        let floats = list
            .values()
            .as_primitive_opt::<Float32Type>()
            .ok_or_else(|| bad(format!("`{column}` does not hold f32 values")))?;
        let width = list.value_length() as usize;
        let offset = list.value_offset_at(0);
        return Ok(rows
            .map(|(r, id)| {
                let start = offset + r * width;
                (*id, floats.values()[start..start + width].to_vec())
            })
            .collect());
    }
    let floats = values
        .as_primitive_opt::<Float32Type>()
        .ok_or_else(|| bad(format!("`{column}` is not f32 nor a list of f32")))?;
    Ok(rows.map(|(r, id)| (*id, vec![floats.value(r)])).collect())
}

fn udf_error(e: streambatch::onnx::OnnxError) -> Error {
    Error::Udf {
        operator: "check".into(),
        source: e.into(),
    }
}
