//! The Parquet sink. Each task writes its rows to one file in a staging
//! directory under a temporary name and renames it when complete; a retried
//! task writes the same name again, so a partition lands once. When the job
//! succeeds the staged files move into the output directory (replacing the
//! `part-*.parquet` files of an earlier write); when it fails the staging
//! directory is removed. The output never holds a partial file.

use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use streambatch_core::TaskId;

use crate::{BatchIter, Error, Result};

/// Writes all of `input` to `dir/part-<task>.parquet`; returns the file and
/// its rows, or nothing when the input was empty.
pub fn write_parquet_part(
    dir: &Path,
    task: TaskId,
    input: BatchIter,
) -> Result<Vec<(PathBuf, usize)>> {
    let path = dir.join(format!("part-{:06}.parquet", task.0));
    let tmp = dir.join(format!(".part-{:06}.parquet.tmp", task.0));
    let mut writer: Option<ArrowWriter<File>> = None;
    let mut rows = 0;
    let result = (|| -> Result<()> {
        for batch in input {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            if writer.is_none() {
                let file = File::create(&tmp).map_err(|e| Error::io("creating", &tmp, e))?;
                let props = WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .build();
                let w = ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(|e| {
                    Error::BadFile {
                        path: tmp.clone(),
                        message: e.to_string(),
                    }
                })?;
                writer = Some(w);
            }
            rows += batch.num_rows();
            let w = writer.as_mut().expect("set above");
            w.write(&batch).map_err(|e| Error::BadFile {
                path: path.clone(),
                message: e.to_string(),
            })?;
        }
        Ok(())
    })();
    let Some(writer) = writer else {
        return result.map(|()| Vec::new());
    };
    let finished = result.and_then(|()| {
        writer.close().map_err(|e| Error::BadFile {
            path: path.clone(),
            message: e.to_string(),
        })?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io("renaming into", &path, e))
    });
    if let Err(e) = finished {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(vec![(path, rows)])
}

/// A fresh staging directory inside `dir` for one write. The staging
/// directories that writers killed before they finished left in `dir`
/// (their process is gone) are removed first.
pub fn create_staging(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    remove_abandoned(dir);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let staging = dir.join(format!(
        ".streambatch-staging-{}-{stamp:x}",
        std::process::id()
    ));
    std::fs::create_dir(&staging).map_err(|e| Error::io("creating", &staging, e))?;
    Ok(staging)
}

/// Removes `dir`'s staging directories whose writer process is dead.
fn remove_abandoned(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(".streambatch-staging-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let dead = pid.is_some_and(|pid| {
            pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
        });
        if dead {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Moves the staged files into `dir`, replacing its earlier `part-*.parquet`
/// files, and removes the staging directory.
pub fn commit_staging(staging: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    for old in std::fs::read_dir(dir)
        .map_err(|e| Error::io("listing", dir, e))?
        .flatten()
    {
        let name = old.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("part-") && name.ends_with(".parquet") {
            std::fs::remove_file(old.path()).map_err(|e| Error::io("removing", old.path(), e))?;
        }
    }
    let mut committed = Vec::new();
    for staged in std::fs::read_dir(staging)
        .map_err(|e| Error::io("listing", staging, e))?
        .flatten()
    {
        let name = staged.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let target = dir.join(&name);
        std::fs::rename(staged.path(), &target)
            .map_err(|e| Error::io("renaming into", &target, e))?;
        committed.push(target);
    }
    std::fs::remove_dir_all(staging).map_err(|e| Error::io("removing", staging, e))?;
    committed.sort();
    Ok(committed)
}

/// Removes a failed write's staging directory.
pub fn abort_staging(staging: &Path) {
    let _ = std::fs::remove_dir_all(staging);
}
