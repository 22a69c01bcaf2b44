//! The binary-files benchmark: `read_binary_files` over five files of
//! 200 MiB among 200 small ones, each file cut into 64 KiB pieces
//! (`ops::chunk_binary`), on 2 CPU slots with a 256 MiB store; the figure is
//! the process's peak memory against the store's cap.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use arrow_array::cast::AsArray;
use streambatch::{Context, Error, NodeConfig, Resources, Result};

use crate::{BenchResult, ProgressLines};

/// Bytes of each piece a file is cut into.
pub const PIECE_BYTES: usize = 64 << 10;
/// The large files: how many, and their size.
const LARGE: (usize, usize) = (5, 200 << 20);
/// The small files.
const SMALL: usize = 200;

/// What the input holds, to check a run's output by: its bytes, the sum of
/// its bytes, and the pieces it cuts into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilesExpected {
    /// Bytes of all files.
    pub bytes: u64,
    /// The sum of every byte of every file.
    pub byte_sum: u64,
    /// Pieces of at most [`PIECE_BYTES`].
    pub pieces: u64,
}

/// The `k`-th file's size: the large ones spread among the small ones.
fn file_size(k: usize) -> usize {
    let every = (SMALL + LARGE.0) / LARGE.0;
    if k % every == every / 2 {
        LARGE.1
    } else {
        1 + (k * 7919) % (3 * PIECE_BYTES)
    }
}

/// Byte `i` of file `k`.
fn byte_at(k: usize, i: usize) -> u8 {
    ((i + 13 * k) % 251) as u8
}

/// Makes the benchmark's files in `dir` (unless a complete set is there,
/// as its summary `dir.json` says) and returns what they hold. The
/// summary is written last, so an interrupted run is redone.
pub fn binary_files_input(dir: &Path) -> Result<FilesExpected> {
    let summary = dir.with_extension("json");
    let mut expected = FilesExpected {
        bytes: 0,
        byte_sum: 0,
        pieces: 0,
    };
    let mut block = vec![0u8; 1 << 20];
    let sizes: Vec<usize> = (0..SMALL + LARGE.0).map(file_size).collect();
    for &size in &sizes {
        expected.bytes += size as u64;
        expected.pieces += size.div_ceil(PIECE_BYTES) as u64;
    }
    let text = std::fs::read_to_string(&summary).unwrap_or_default();
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) {
        let field = |k: &str| json[k].as_u64();
        let same =
            field("bytes") == Some(expected.bytes) && field("pieces") == Some(expected.pieces);
        if let (true, Some(byte_sum)) = (same, field("byte_sum")) {
            return Ok(FilesExpected {
                byte_sum,
                ..expected
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    for (k, &size) in sizes.iter().enumerate() {
        let path = dir.join(format!("file-{k:03}.bin"));
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(|e| Error::io("creating", &path, e))?,
        );
        let mut at = 0;
        while at < size {
            let n = block.len().min(size - at);
            for (j, b) in block[..n].iter_mut().enumerate() {
                *b = byte_at(k, at + j);
            }
            expected.byte_sum += block[..n].iter().map(|&b| b as u64).sum::<u64>();
            file.write_all(&block[..n])
                .map_err(|e| Error::io("writing", &path, e))?;
            at += n;
        }
        file.flush().map_err(|e| Error::io("writing", &path, e))?;
    }
    let json = serde_json::json!({
        "files": sizes.len(),
        "bytes": expected.bytes,
        "byte_sum": expected.byte_sum,
        "pieces": expected.pieces,
        "piece_bytes": PIECE_BYTES,
    });
    std::fs::write(&summary, json.to_string()).map_err(|e| Error::io("writing", &summary, e))?;
    Ok(expected)
}

/// Reads every file of `input` (made by [`binary_files_input`] if absent),
/// cuts it into 64 KiB pieces and sums the pieces' bytes in the driver, on
/// a node of 2 CPU slots whose store holds `store_cap` bytes. Correct when
/// the pieces, their bytes and their sum are the input's.
pub fn binary_files(
    input: &Path,
    store_cap: u64,
    base: &NodeConfig,
    progress: &mut ProgressLines,
) -> Result<BenchResult> {
    let expected = binary_files_input(input)?;
    let config = NodeConfig {
        cpus: 2.0,
        store_capacity: store_cap,
        ..base.clone()
    };
    let ctx = Context::with_config(config)?;
    let started = Instant::now();
    let ds = ctx
        .read_binary_files(&input.display().to_string())?
        .flat_map_batches(
            streambatch::ops::chunk_binary("bytes", PIECE_BYTES),
            Resources::cpu(1.0),
        );
    let (mut bytes, mut byte_sum) = (0u64, 0u64);
    for batch in ds.iter_batches()? {
        let batch = batch?;
        progress.add(batch.num_rows() as u64);
        let pieces = batch
            .column_by_name("bytes")
            .ok_or_else(|| Error::Invalid("no column `bytes`".into()))?
            .as_binary::<i32>();
        for piece in pieces.iter().flatten() {
            bytes += piece.len() as u64;
            byte_sum += piece.iter().map(|&b| b as u64).sum::<u64>();
        }
    }
    let wall = started.elapsed();
    let rows = progress.rows();
    let stats = ds.stats().unwrap_or_default();
    let found = FilesExpected {
        bytes,
        byte_sum,
        pieces: rows,
    };
    let mut result = BenchResult::new(
        "binary_files",
        format!("store_cap={}", streambatch::format_bytes(store_cap)),
        wall,
        rows,
        &stats,
        &ctx.store_stats(),
        found == expected,
    );
    result
        .extra
        .push(("input_bytes".into(), expected.bytes.into()));
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_large_files_lie_among_the_small_ones() {
        let sizes: Vec<usize> = (0..SMALL + LARGE.0).map(file_size).collect();
        let large: Vec<usize> = (0..sizes.len()).filter(|&k| sizes[k] == LARGE.1).collect();
        assert_eq!(large.len(), LARGE.0);
        assert!(large[0] > 0 && *large.last().unwrap() < sizes.len() - 1);
        assert!(sizes.iter().all(|&s| s > 0));
    }
}
