//! A write to an object store folder (`s3://bucket/out/`), with a local
//! write's promise: nothing of it is output until the job has succeeded.
//! Object stores have no rename, so:
//!
//! - Tasks upload their parts into a staging folder inside the output,
//!   `.streambatch-staging-<pid>-<id>n<pid namespace>-<host>/` (the leading `.` hides it
//!   from readers: streambatch, Spark, pyarrow and Ray Data skip names
//!   starting with `.` or `_`). A retried task uploads the same name again.
//! - When the job has succeeded, into a folder with no manifest yet, a
//!   manifest listing nothing is written first (readers then find no
//!   files until the commit, never some). The store copies each part to
//!   `part-<task>-<id>.<extension>` in the output (a name no earlier write
//!   used; 16 copies in flight), then the manifest
//!   `_streambatch-manifest.<extension>.json` listing them is written in
//!   one request: that is the commit (a manifest upload that errs is read
//!   back: if it landed, the write is committed). Then the earlier writes'
//!   parts of that format (and any a killed write had copied) and the
//!   staging folder go; a failure there is a warning, not a failed write,
//!   and never touches what the manifest lists.
//! - When the job fails, the staging folder goes; a writer killed before
//!   its end leaves it, and the next write into the folder from the same
//!   host and pid namespace removes it (its process is gone; a process of
//!   another namespace cannot tell, so it leaves it).
//!
//! What a reader of the bucket sees: until the commit, the output as it
//! was. Readers here honour the manifest, so they switch from the earlier
//! write's parts to this one's at once. A reader that does not know the
//! manifest sees the new parts appear beside the earlier ones while they
//! are copied (seconds: the copies are the store's), and the earlier ones
//! go once the manifest is written.

use std::path::{Path, PathBuf};

use super::{EMPTY_PREFIX, Staging};
use crate::error::{Error, Result};
use crate::object::files::read_object;
use crate::object::manifest::{self, Manifest};
use crate::object::writes::{Put, copy_all, delete_all, folders, list, put_if, versions_in};

/// The start of a staging folder's name.
const STAGING: &str = ".streambatch-staging-";

/// A staging folder for one write into the object store folder `dir`,
/// after removing those that dead writers on this host left.
pub(super) fn create(dir: &Path) -> Result<Staging> {
    let url = url_text(dir)?;
    remove_abandoned(url)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!(
        "{STAGING}{}-{stamp:x}n{:x}-{}",
        std::process::id(),
        streambatch_core::pid_namespace(),
        host()
    );
    // The manifests as this write begins: another write's commit after
    // this point makes this one's fail, rather than be undone by it.
    let manifests = versions_in(url)?
        .into_iter()
        .filter(|(name, _)| manifest::is_manifest(name))
        .collect();
    Ok(Staging {
        path: dir.join(name),
        dir: dir.to_path_buf(),
        made: None,
        _lock: None,
        manifests,
    })
}

fn url_text(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| Error::Invalid(format!("{}: not a URL", path.display())))
}

/// This host's name, as a staging folder's name carries it.
fn host() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect();
    if name.is_empty() { "host".into() } else { name }
}

/// Removes the staging folders in `url` of writers on this host whose
/// process is gone.
fn remove_abandoned(url: &str) -> Result<()> {
    let (me, here) = (std::process::id(), host());
    for folder in folders(url)? {
        let Some(rest) = folder.strip_prefix(STAGING) else {
            continue;
        };
        let mut fields = rest.splitn(3, '-');
        let pid = fields.next().and_then(|p| p.parse::<u32>().ok());
        let (Some(pid), Some(stamp), Some(host)) = (pid, fields.next(), fields.next()) else {
            continue;
        };
        // A name of an older build, without its namespace, is of this one.
        let namespace = match stamp.split_once('n') {
            Some((_, ns)) => u64::from_str_radix(ns, 16).ok(),
            None => Some(streambatch_core::pid_namespace()),
        };
        let dead = host == here
            && pid != me
            && namespace.is_some_and(|ns| !streambatch_core::may_be_alive(pid, ns));
        if dead {
            remove_all(&join(url, &folder))?;
        }
    }
    Ok(())
}

fn join(folder: &str, name: &str) -> String {
    format!("{}/{name}", folder.trim_end_matches('/'))
}

/// Deletes every object under folder `url`.
fn remove_all(url: &str) -> Result<()> {
    let objects: Vec<String> = list(url, true)?.into_iter().map(|(url, _)| url).collect();
    delete_all(&objects)
}

/// Whether no task staged a file, not even a schema-only one.
pub(super) fn is_empty(staging: &Staging) -> Result<bool> {
    Ok(list(url_text(&staging.path)?, false)?.is_empty())
}

/// Commits the staged parts (see the module's text); returns their URLs.
pub(super) fn commit(
    staging: &Staging,
    extension: &str,
    reported: &[String],
) -> Result<Vec<PathBuf>> {
    let (dir, staged) = (url_text(&staging.dir)?, url_text(&staging.path)?);
    let write = staged
        .rsplit_once(STAGING)
        .and_then(|(_, rest)| rest.split('-').nth(1))
        .unwrap_or("0")
        .to_string();
    let mut parts = Vec::new();
    let mut empty = None;
    let listed = list(staged, false)?;
    let names = listed.iter().map(|(_, name)| name.as_str());
    super::check_reported(&staging.path, reported, names)?;
    for (url, name) in listed {
        if name.starts_with(EMPTY_PREFIX) {
            empty.get_or_insert(url);
        } else if !reported.contains(&name) {
            continue; // no task's: not this write's output
        } else if let Some(task) = name
            .strip_prefix("part-")
            .and_then(|n| n.strip_suffix(&format!(".{extension}")))
        {
            parts.push((url, format!("part-{task}-{write}.{extension}")));
        }
    }
    if let (true, Some(empty)) = (parts.is_empty(), empty) {
        parts.push((empty, format!("part-000000-{write}.{extension}")));
    }
    parts.sort_by(|a, b| a.1.cmp(&b.1));
    let copies: Vec<(String, String)> = parts
        .iter()
        .map(|(from, name)| (from.clone(), join(dir, name)))
        .collect();
    let manifest = Manifest {
        write,
        files: parts.iter().map(|(_, name)| name.clone()).collect(),
    };
    let manifest_url = join(dir, &manifest::name(extension));
    let conflict = || {
        Error::Invalid(format!(
            "{dir}: another write committed into it since this one began; nothing of this one is in it"
        ))
    };
    // A fresh folder has no manifest to hide the copies until the commit:
    // one listing nothing goes first, so that a reader meanwhile (or after
    // a kill) finds no files, never some of them.
    let mut base = staging.manifests.get(&manifest::name(extension)).cloned();
    let fresh = base.is_none();
    if fresh {
        let pending = Manifest {
            write: format!("{}-pending", manifest.write),
            files: Vec::new(),
        };
        match put_if(&manifest_url, pending.to_json(), None)? {
            Put::Done(version) => base = Some(version),
            Put::Conflict => return Err(conflict()),
        }
    }
    // On a failure before the commit, the folder goes back as it was: the
    // copies go, and the empty manifest if this write put it.
    let undo = |copies: Vec<(String, String)>| {
        let mut made: Vec<String> = copies.into_iter().map(|(_, to)| to).collect();
        if fresh {
            made.push(manifest_url.clone());
        }
        let _ = delete_all(&made);
    };
    if let Err(e) = copy_all(&copies) {
        undo(copies);
        return Err(e);
    }
    #[cfg(feature = "failpoints")]
    super::commit_pause();
    let put = match put_if(&manifest_url, manifest.to_json(), base) {
        Ok(Put::Done(_)) => Ok(()),
        Ok(Put::Conflict) => {
            // Another write's manifest is there: only the copies go.
            let copied: Vec<String> = copies.into_iter().map(|(_, to)| to).collect();
            let _ = delete_all(&copied);
            return Err(conflict());
        }
        Err(e) => Err(e),
    };
    if let Err(e) = put {
        // The request may have failed after the manifest landed: its
        // parts are then the output, and must stay.
        match read_object(&manifest_url) {
            Ok(landed) if landed.as_ref() == manifest.to_json().as_slice() => {
                tracing::warn!(manifest = %manifest_url, error = %e, "the manifest's upload reported an error, yet it landed: the write is committed");
            }
            Ok(_) => {
                undo(copies);
                return Err(e);
            }
            // Unknown: the copies stay (unlisted, the next write removes
            // them; listed, they are the output).
            Err(_) => return Err(e),
        }
    }
    // Committed: from here a failure is reported as a warning, and nothing
    // the manifest lists is touched. Then the earlier writes' parts of
    // this format (and those a killed write copied), and the staging.
    let tidy = || -> Result<()> {
        let earlier: Vec<String> = list(dir, false)?
            .into_iter()
            .filter(|(_, name)| {
                manifest::is_part(name, extension) && !manifest.files.contains(name)
            })
            .map(|(url, _)| url)
            .collect();
        delete_all(&earlier)?;
        remove_all(staged)
    };
    if let Err(error) = tidy() {
        tracing::warn!(folder = %dir, %error, "committed, but the earlier parts or the staging could not all be removed; the next write into the folder removes them");
    }
    Ok(manifest
        .files
        .iter()
        .map(|name| join(dir, name).into())
        .collect())
}

/// Removes a failed write's staging folder.
pub(super) fn abort(staging: &Staging) {
    // A cancelled task may still be uploading as the folder goes: a second
    // pass removes what the first one missed.
    for _ in 0..3 {
        let Ok(url) = url_text(&staging.path) else {
            return;
        };
        if remove_all(url).is_ok() && is_empty(staging).unwrap_or(false) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
