//! The binary-files benchmark: `read_binary_files` over five files of
//! 200 MiB among 200 small ones, each file cut into 64 KiB pieces
//! (`ops::chunk_binary`), on 2 CPU slots with a 256 MiB store; the figure is
//! the process's peak memory against the store's cap. The same files cut by
//! a row-level `flat_map` instead (a row per piece, as Ray Data's API
//! invites) are [`FilesApi::Rows`], checked piece by piece.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use arrow_array::cast::AsArray;
use streambatch::{Context, Error, NodeConfig, Resources, Result, Row};

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

/// How the benchmark cuts the files into pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilesApi {
    /// `ops::chunk_binary`, a batch operator whose pieces are slices of the
    /// file's buffer (workload `binary_files`).
    Chunk,
    /// A row-level `flat_map` returning a row (`path`, `offset`, `bytes`)
    /// per piece, each piece a copy (workload `binary_files_rows`).
    Rows,
}

/// The row-level cut: one row per piece of at most [`PIECE_BYTES`] of the
/// file's bytes, with its path and offset.
fn cut_rows(row: Row) -> std::result::Result<Vec<Row>, String> {
    let path = row.str("path").ok_or("no column `path`")?;
    let data = row.bytes("bytes").ok_or("no column `bytes`")?;
    Ok(data
        .chunks(PIECE_BYTES)
        .enumerate()
        .map(|(i, piece)| {
            Row::new()
                .with("path", path)
                .with("offset", (i * PIECE_BYTES) as i64)
                .with("bytes", piece.to_vec())
        })
        .collect())
}

/// What the driver saw of one file in the row variant: its bytes and the
/// offsets of its pieces.
#[derive(Default)]
struct FileSeen {
    bytes: u64,
    offsets: HashSet<i64>,
}

/// Checks the pieces of the row variant as they arrive: each piece's bytes
/// against the bytes its file was written with at its offset, and at the
/// end each file whole (its pieces' bytes its size, every offset once).
struct PieceCheck {
    /// The byte pattern files are written with, long enough that a piece
    /// at any phase is one slice of it.
    pattern: Vec<u8>,
    /// The size of each file written.
    sizes: Vec<usize>,
    files: HashMap<String, FileSeen>,
    wrong: u64,
}

impl PieceCheck {
    fn new(sizes: Vec<usize>) -> Self {
        Self {
            pattern: (0..PIECE_BYTES + 251).map(|i| (i % 251) as u8).collect(),
            sizes,
            files: HashMap::new(),
            wrong: 0,
        }
    }

    /// The index of the file at `path` (`file-KKK.bin`).
    fn file_index(path: &str) -> Option<usize> {
        let name = Path::new(path).file_name()?.to_str()?;
        name.strip_prefix("file-")?
            .strip_suffix(".bin")?
            .parse()
            .ok()
    }

    fn piece(&mut self, path: &str, offset: i64, piece: &[u8]) {
        let expected = match (Self::file_index(path), usize::try_from(offset)) {
            (Some(k), Ok(at)) if piece.len() <= PIECE_BYTES => {
                let phase = (at + 13 * k) % 251;
                debug_assert_eq!(self.pattern[phase], byte_at(k, at));
                Some(&self.pattern[phase..phase + piece.len()])
            }
            _ => None,
        };
        if expected != Some(piece) {
            self.wrong += 1;
        }
        let seen = self.files.entry(path.to_string()).or_default();
        seen.bytes += piece.len() as u64;
        if !seen.offsets.insert(offset) {
            self.wrong += 1;
        }
    }

    /// True when every piece was right and every file arrived whole.
    fn all_whole(&self) -> bool {
        self.wrong == 0
            && self.files.len() == self.sizes.len()
            && self.files.iter().all(|(path, seen)| {
                Self::file_index(path)
                    .and_then(|k| self.sizes.get(k))
                    .is_some_and(|&size| {
                        seen.bytes == size as u64
                            && seen.offsets.len() == size.div_ceil(PIECE_BYTES)
                    })
            })
    }
}

/// Reads every file of `input` (made by [`binary_files_input`] if absent),
/// cuts it into 64 KiB pieces (as `api` says) and sums the pieces' bytes in
/// the driver, on a node of 2 CPU slots whose store holds `store_cap`
/// bytes. Correct when the pieces, their bytes and their sum are the
/// input's; the row variant also checks every piece against its file.
pub fn binary_files(
    input: &Path,
    store_cap: u64,
    api: FilesApi,
    base: &NodeConfig,
    progress: &mut ProgressLines,
) -> Result<BenchResult> {
    let expected = binary_files_input(input)?;
    // No GPU slots: the workload runs nothing on one, and probing for an
    // adapter maps a driver's libraries (Mesa's LLVM: 43 MiB resident on
    // a machine without a GPU), no part of the pipeline's memory.
    let config = NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        store_capacity: store_cap,
        ..base.clone()
    };
    let ctx = Context::with_config(config)?;
    let started = Instant::now();
    let files = ctx.read_binary_files(&input.display().to_string())?;
    let ds = match api {
        FilesApi::Chunk => files.flat_map_batches(
            streambatch::ops::chunk_binary("bytes", PIECE_BYTES),
            Resources::cpu(1.0),
        ),
        FilesApi::Rows => files.flat_map(cut_rows),
    };
    let (mut bytes, mut byte_sum) = (0u64, 0u64);
    let sizes = (0..SMALL + LARGE.0).map(file_size).collect();
    let mut check = (api == FilesApi::Rows).then(|| PieceCheck::new(sizes));
    let column = |batch: &arrow_array::RecordBatch, name: &str| {
        batch
            .column_by_name(name)
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("no column `{name}`")))
    };
    for batch in ds.iter_batches()? {
        let batch = batch?;
        progress.add(batch.num_rows() as u64);
        let pieces = column(&batch, "bytes")?;
        let pieces = pieces.as_binary::<i32>();
        for piece in pieces.iter().flatten() {
            bytes += piece.len() as u64;
            byte_sum += piece.iter().map(|&b| b as u64).sum::<u64>();
        }
        if let Some(check) = &mut check {
            let (paths, offsets) = (column(&batch, "path")?, column(&batch, "offset")?);
            let paths = paths.as_string::<i32>();
            let offsets = offsets.as_primitive::<arrow_array::types::Int64Type>();
            for i in 0..batch.num_rows() {
                check.piece(paths.value(i), offsets.value(i), pieces.value(i));
            }
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
    let workload = match api {
        FilesApi::Chunk => "binary_files",
        FilesApi::Rows => "binary_files_rows",
    };
    let mut result = BenchResult::new(
        workload,
        format!("store_cap={}", streambatch::format_bytes(store_cap)),
        wall,
        rows,
        &stats,
        &ctx.store_stats(),
        found == expected && check.as_ref().is_none_or(PieceCheck::all_whole),
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

    #[test]
    fn the_piece_check_fails_on_a_wrong_missing_or_repeated_piece() {
        let sizes = vec![1, PIECE_BYTES, 2 * PIECE_BYTES + 7, 300];
        let pieces = |skip: Option<(usize, usize)>| {
            let mut check = PieceCheck::new(sizes.clone());
            for (k, &size) in sizes.iter().enumerate() {
                let path = format!("dir/file-{k:03}.bin");
                for (i, at) in (0..size).step_by(PIECE_BYTES).enumerate() {
                    if skip != Some((k, i)) {
                        let piece: Vec<u8> = (at..size.min(at + PIECE_BYTES))
                            .map(|j| byte_at(k, j))
                            .collect();
                        check.piece(&path, at as i64, &piece);
                    }
                }
            }
            check
        };
        assert!(pieces(None).all_whole());
        assert!(!pieces(Some((2, 1))).all_whole(), "a piece missing");
        assert!(!pieces(Some((0, 0))).all_whole(), "a file missing");

        let piece = |k: usize, at: usize, len: usize| -> Vec<u8> {
            (at..at + len).map(|j| byte_at(k, j)).collect()
        };
        let mut check = pieces(None);
        check.piece("dir/file-003.bin", 0, &piece(3, 0, 300));
        assert!(!check.all_whole(), "a piece twice");
        let mut check = pieces(Some((2, 2)));
        check.piece("dir/file-002.bin", 2 * PIECE_BYTES as i64, &piece(2, 0, 7));
        assert!(!check.all_whole(), "a piece's bytes from another offset");
        let mut check = pieces(None);
        check.piece("dir/other.bin", 0, &[]);
        assert!(!check.all_whole(), "a file not written");
    }
}
