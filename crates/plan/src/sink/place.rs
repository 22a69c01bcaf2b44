//! Where a resumable write keeps its journal and its waves' parts: a local
//! directory, or an object store folder (`dir` a URL). The journal takes
//! the same steps on both; in an object store a folder is a key prefix
//! (made by writing into it), a file is written whole by one upload, a
//! rename is a copy and a delete, and there is nothing to sync.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{durable, write_whole};
use crate::error::{Error, Result};
use crate::object::files::{Object, url_of};
use crate::object::writes as object_writes;

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |e| Error::io(what, path, e)
}

/// Makes folder `dir` and its parents.
pub(super) fn make_dir(dir: &Path) -> Result<()> {
    match url_of(dir) {
        Some(_) => Ok(()),
        None => std::fs::create_dir_all(dir).map_err(io("creating", dir)),
    }
}

/// Whether the file at `path` exists.
pub(super) fn is_file(path: &Path) -> Result<bool> {
    match url_of(path) {
        Some(url) => object_writes::exists(url),
        None => Ok(path.is_file()),
    }
}

/// Whether folder `dir` exists (in an object store: holds anything).
pub(super) fn has_folder(dir: &Path) -> Result<bool> {
    match url_of(dir) {
        Some(_) => Ok(!names(dir)?.is_empty()),
        None => Ok(dir.is_dir()),
    }
}

/// The bytes of the file at `path`.
pub(super) fn read(path: &Path) -> Result<Vec<u8>> {
    match url_of(path) {
        Some(url) => Ok(Object::at(url)?.read()?.to_vec()),
        None => std::fs::read(path).map_err(io("reading", path)),
    }
}

/// Writes the file at `path` whole: all of `bytes` or nothing.
pub(super) fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    match url_of(path) {
        Some(url) => object_writes::put(url, bytes.to_vec()),
        None => write_whole(path, |tmp| {
            std::fs::write(tmp, bytes).map_err(io("writing", tmp))
        }),
    }
}

/// What folder `dir` holds: each file's name, and each folder's once,
/// with whether it is a folder.
pub(super) fn names(dir: &Path) -> Result<Vec<(String, bool)>> {
    let Some(url) = url_of(dir) else {
        let entries = std::fs::read_dir(dir).map_err(io("listing", dir))?;
        return Ok(entries
            .flatten()
            .map(|e| {
                let folder = e.file_type().is_ok_and(|t| t.is_dir());
                (e.file_name().to_string_lossy().into_owned(), folder)
            })
            .collect());
    };
    object_writes::children(url)
}

/// Removes folder `dir` and everything in it.
pub(super) fn remove_folder(dir: &Path) -> Result<()> {
    match url_of(dir) {
        Some(url) => {
            let objects = object_writes::list(url, true)?;
            object_writes::delete_all(&objects.into_iter().map(|(u, _)| u).collect::<Vec<_>>())
        }
        None => std::fs::remove_dir_all(dir).map_err(io("removing", dir)),
    }
}

/// Moves the file `from` to `to` (in an object store, by the store's copy).
pub(super) fn rename(from: &Path, to: &Path) -> Result<()> {
    match (url_of(from), url_of(to)) {
        (Some(from), Some(to)) => object_writes::move_all(&[(from.to_string(), to.to_string())]),
        _ => durable::rename(from, to),
    }
}

/// Moves each file `from` to `to` that is still at `from` (one moved
/// before is at `to`); the first `from` that is at neither, when one is.
/// In an object store, the folders are listed once and the copies and
/// deletes go 16 at a time.
pub(super) fn move_files(moves: &[(PathBuf, PathBuf)]) -> Result<Option<PathBuf>> {
    let urls = moves
        .iter()
        .map(|(from, to)| Some((url_of(from)?.to_string(), url_of(to)?.to_string())))
        .collect::<Option<Vec<_>>>();
    let Some(urls) = urls.filter(|u| !u.is_empty()) else {
        for (from, to) in moves {
            if is_file(from)? {
                rename(from, to)?;
            } else if !is_file(to)? {
                return Ok(Some(from.clone()));
            }
        }
        return Ok(None);
    };
    // The keys of every object in the folders the moves are from and to
    // (keys, not URLs: a URL may be written with or without its escapes).
    let mut present = HashSet::new();
    let folders: HashSet<&str> = urls
        .iter()
        .flat_map(|(from, to)| [from, to])
        .filter_map(|url| url.rsplit_once('/').map(|(folder, _)| folder))
        .collect();
    for folder in folders {
        present.extend(object_writes::keys_in(folder)?);
    }
    let mut copies = Vec::new();
    for ((from, to), (path, _)) in urls.into_iter().zip(moves) {
        if present.contains(&object_writes::key(&from)?) {
            copies.push((from, to));
        } else if !present.contains(&object_writes::key(&to)?) {
            return Ok(Some(path.clone()));
        }
    }
    object_writes::move_all(&copies)?;
    Ok(None)
}

/// Removes the files at `paths` (in an object store, 16 at a time).
pub(super) fn remove_files(paths: &[PathBuf]) -> Result<()> {
    let urls = paths
        .iter()
        .map(|p| url_of(p).map(str::to_string))
        .collect::<Option<Vec<_>>>();
    match urls {
        Some(urls) => object_writes::delete_all(&urls),
        None => paths.iter().try_for_each(|p| durable::remove_file(p)),
    }
}

/// Removes the file at `path`.
pub(super) fn remove_file(path: &Path) -> Result<()> {
    remove_files(&[path.to_path_buf()])
}

/// Makes what was written in folder `dir` last through a power loss.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    match url_of(dir) {
        Some(_) => Ok(()),
        None => durable::sync_dir(dir),
    }
}
