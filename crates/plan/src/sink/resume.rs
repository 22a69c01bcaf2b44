//! The journal of a resumable write (`ParquetWriteOptions::resume`): what
//! a write killed part way has done, so that the same write started again
//! runs only the rest.
//!
//! A resumable write runs its source splits in waves, one job each; each
//! wave's tasks write into `<dir>/.streambatch-resume/wave-<k>/`, and when
//! its job has succeeded, `wave-<k>.done` records which splits it read and
//! the part files it wrote (written whole, synced). `plan.json` records
//! what the write is: its format, its steps (each by name and what it was
//! given: an expression, columns, a recipe's parameters) and its input
//! (each split, with its files' sizes and modification times). Started again with `resume`,
//! a write whose `plan.json` matches skips the splits of the done waves; a
//! wave folder without its `.done` (the wave the kill cut short) is
//! removed. When every split is done, `committing` is written, and the
//! parts move into `<dir>` (renamed `part-<wave>-<task>.<extension>`),
//! replacing an earlier write's parts; a commit cut short is finished by
//! the next start, whether or not it asks to resume. Then the journal goes.
//!
//! The journal's files are read back as hostile: a wave's record naming a
//! path outside its folder is refused.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{EMPTY_PREFIX, place};
use crate::error::{Error, Result};
use crate::object::files::url_of;
use crate::object::manifest::{self, Manifest};

/// The journal's folder in an output directory.
const JOURNAL: &str = ".streambatch-resume";

/// What a write is, as its journal records it: a resumed write must be
/// the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteIdentity {
    /// The files' format (its extension and, for Parquet, codec).
    pub format: String,
    /// The plan's steps after the source: each its name and what it was
    /// given (an expression, columns, an operator's recipe).
    pub steps: Vec<String>,
    /// Each source split, with its files' sizes and modification times.
    pub splits: Vec<String>,
}

impl WriteIdentity {
    fn to_json(&self) -> Vec<u8> {
        let json = serde_json::json!({
            "format": self.format, "steps": self.steps, "splits": self.splits,
        });
        json.to_string().into_bytes()
    }

    fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let bad = || corrupt(path, "not a write's identity");
        let json: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| bad())?;
        let strings = |key: &str| -> Result<Vec<String>> {
            json[key]
                .as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|s| s.as_str().map(str::to_string).ok_or_else(bad))
                .collect()
        };
        Ok(Self {
            format: json["format"].as_str().ok_or_else(bad)?.to_string(),
            steps: strings("steps")?,
            splits: strings("splits")?,
        })
    }

    /// What differs from `then` (the journal's), in words; `None` when
    /// nothing does.
    fn difference(&self, then: &Self) -> Option<String> {
        if self.format != then.format {
            return Some(format!(
                "the format was {}, now {}",
                then.format, self.format
            ));
        }
        if self.steps != then.steps {
            return Some(format!(
                "the plan's steps were [{}], now [{}]",
                then.steps.join(", "),
                self.steps.join(", ")
            ));
        }
        if self.splits.len() != then.splits.len() {
            return Some(format!(
                "the input had {} splits, now {}",
                then.splits.len(),
                self.splits.len()
            ));
        }
        let (at, (now, was)) = (self.splits.iter().zip(&then.splits))
            .enumerate()
            .find(|(_, (now, was))| now != was)?;
        Some(format!("input split {at} was {was}, now {now}"))
    }
}

fn corrupt(path: &Path, why: &str) -> Error {
    Error::Invalid(format!("resume journal {}: {why}", path.display()))
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |e| Error::io(what, path, e)
}

/// A resumable write's journal, open.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    root: PathBuf,
    /// Each done wave: its number, its splits and its parts' names.
    waves: Vec<(usize, Vec<usize>, Vec<String>)>,
    committing: bool,
}

/// What a write finds when it opens its journal.
#[derive(Debug)]
pub enum Opened {
    /// A journal to write into (new, or a resumed write's).
    Journal(Journal),
    /// A resumed write whose commit a kill had cut short, now finished:
    /// its files.
    Committed(Vec<PathBuf>),
}

/// Opens the journal of a write of `identity` into `dir`: a new one, or,
/// with `resume`, the one a write killed part way left when it is a write
/// of the same identity (an error naming what differs otherwise). A commit
/// a kill cut short is finished first. Without `resume`, an earlier
/// journal is dropped.
pub fn open_journal(dir: &Path, identity: &WriteIdentity, resume: bool) -> Result<Opened> {
    place::make_dir(dir)?;
    remove_finished_journals(dir);
    let root = dir.join(JOURNAL);
    let plan = root.join("plan.json");
    let mut found = place::has_folder(&root)?;
    if found && !place::is_file(&plan)? {
        // Killed before its identity was written (or after its commit
        // began removing it): nothing to resume.
        place::remove_folder(&root)?;
        found = false;
    }
    if found {
        let bytes = place::read(&plan)?;
        let then = WriteIdentity::parse(&bytes, &plan)?;
        let difference = identity.difference(&then);
        if let (true, Some(difference)) = (resume, &difference) {
            return Err(Error::Invalid(format!(
                "cannot resume the write into {}: {difference} (remove {} to start over)",
                dir.display(),
                root.display()
            )));
        }
        let mut journal = read(dir, &root)?;
        if journal.committing {
            let files = journal.commit(extension_of(&then.format, &plan)?)?;
            if resume {
                return Ok(Opened::Committed(files));
            }
        } else if resume {
            return Ok(Opened::Journal(journal));
        } else {
            remove_journal(&root)?;
        }
    }
    place::make_dir(&root)?;
    place::write(&plan, &identity.to_json())?;
    place::sync_dir(dir)?;
    Ok(Opened::Journal(Journal {
        dir: dir.to_path_buf(),
        root,
        waves: Vec::new(),
        committing: false,
    }))
}

/// The extension of a journal's `format` (its first word).
fn extension_of<'a>(format: &'a str, plan: &Path) -> Result<&'a str> {
    let extension = format.split(' ').next().unwrap_or_default();
    match ["parquet", "csv", "json", "arrow"].contains(&extension) {
        true => Ok(extension),
        false => Err(corrupt(plan, "an unknown format")),
    }
}

/// Reads the journal at `root`: its done waves, and whether its commit
/// had begun. Wave folders without their record are removed.
fn read(dir: &Path, root: &Path) -> Result<Journal> {
    let mut waves = Vec::new();
    let mut folders = Vec::new();
    for (name, _) in place::names(root)? {
        let path = root.join(&name);
        if let Some(k) = name
            .strip_prefix("wave-")
            .and_then(|n| n.strip_suffix(".done"))
        {
            let k: usize = k.parse().map_err(|_| corrupt(&path, "a bad wave number"))?;
            let (splits, parts) = parse_wave(&place::read(&path)?, &path)?;
            waves.push((k, splits, parts));
        } else if let Some(k) = name
            .strip_prefix("wave-")
            .and_then(|n| n.parse::<usize>().ok())
        {
            folders.push((k, path));
        }
    }
    for (k, folder) in folders {
        if !waves.iter().any(|(done, ..)| *done == k) {
            place::remove_folder(&folder)?;
        }
    }
    waves.sort();
    Ok(Journal {
        dir: dir.to_path_buf(),
        root: root.to_path_buf(),
        waves,
        committing: place::is_file(&root.join("committing"))?,
    })
}

fn parse_wave(bytes: &[u8], path: &Path) -> Result<(Vec<usize>, Vec<String>)> {
    let bad = || corrupt(path, "not a wave's record");
    let json: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| bad())?;
    let splits = json["splits"].as_array().ok_or_else(bad)?;
    let splits = splits
        .iter()
        .map(|s| s.as_u64().map(|s| s as usize).ok_or_else(bad))
        .collect::<Result<_>>()?;
    let parts = json["parts"].as_array().ok_or_else(bad)?;
    let parts = parts
        .iter()
        .map(|p| match p.as_str() {
            Some(name) if name.starts_with("part-") && !name.contains('/') => Ok(name.to_string()),
            _ => Err(corrupt(path, "a part that is not a file of its wave")),
        })
        .collect::<Result<_>>()?;
    Ok((splits, parts))
}

impl Journal {
    /// The splits the done waves read.
    pub fn done_splits(&self) -> BTreeSet<usize> {
        self.waves
            .iter()
            .flat_map(|(_, s, _)| s.iter().copied())
            .collect()
    }

    /// A fresh folder for the next wave's tasks to write into: its number
    /// and path.
    pub fn next_wave(&self) -> Result<(usize, PathBuf)> {
        let k = self.waves.iter().map(|(k, ..)| k + 1).max().unwrap_or(0);
        let folder = self.root.join(format!("wave-{k:04}"));
        if place::has_folder(&folder)? {
            place::remove_folder(&folder)?;
        }
        place::make_dir(&folder)?;
        Ok((k, folder))
    }

    /// Records wave `k`, which read `splits`, as done: its parts are kept.
    pub fn finish_wave(&mut self, k: usize, splits: &[usize], reported: &[String]) -> Result<()> {
        let folder = self.root.join(format!("wave-{k:04}"));
        let names = place::names(&folder)?;
        // In an object store, the wave's parts are those its write
        // committed, as its manifest lists them: a copy that an earlier,
        // killed attempt had asked of the store may land beside them.
        let manifest = url_of(&folder)
            .and_then(|_| {
                names
                    .iter()
                    .find(|(name, _)| name.starts_with("_streambatch-manifest."))
            })
            .map(|(name, _)| folder.join(name));
        let mut parts: Vec<String> = match manifest {
            Some(path) => Manifest::parse(&place::read(&path)?, &path.display().to_string())?.files,
            // Locally, the parts its tasks reported (a reported one
            // missing fails the wave; a file none reported is not its).
            None => {
                let files = names.iter().filter(|(_, is_folder)| !is_folder);
                let files: Vec<&str> = files.map(|(name, _)| name.as_str()).collect();
                super::check_reported(&folder, reported, files.iter().copied())?;
                files
                    .into_iter()
                    .filter(|name| {
                        reported.iter().any(|r| r == name) || name.starts_with(EMPTY_PREFIX)
                    })
                    .map(|name| name.replacen(EMPTY_PREFIX, "part-empty-", 1))
                    .collect()
            }
        };
        parts.sort();
        // A schema-only file is renamed so that the record names parts only.
        for part in parts.iter().filter(|p| p.starts_with("part-empty-")) {
            let from = folder.join(part.replacen("part-empty-", EMPTY_PREFIX, 1));
            place::rename(&from, &folder.join(part))?;
        }
        place::sync_dir(&folder)?;
        let record = serde_json::json!({ "splits": splits, "parts": parts });
        let path = self.root.join(format!("wave-{k:04}.done"));
        place::write(&path, record.to_string().as_bytes())?;
        self.waves.push((k, splits.to_vec(), parts));
        Ok(())
    }

    /// Whether any done wave wrote rows or a schema-only file.
    pub fn has_parts(&self) -> bool {
        self.waves.iter().any(|(_, _, parts)| !parts.is_empty())
    }

    /// Moves every done wave's parts into the output directory, replacing
    /// its earlier parts of `extension`, and removes the journal; returns
    /// the files. Each step can be cut short and done again.
    pub fn commit(&mut self, extension: &str) -> Result<Vec<PathBuf>> {
        let marker = self.root.join("committing");
        if !self.committing {
            place::write(&marker, b"")?;
            self.committing = true;
        }
        let with_rows = self
            .waves
            .iter()
            .any(|(_, _, parts)| parts.iter().any(|p| !p.starts_with("part-empty-")));
        let mut moves: Vec<(PathBuf, PathBuf)> = Vec::new();
        for (k, _, parts) in &self.waves {
            for part in parts {
                let empty = part.starts_with("part-empty-");
                if empty && (with_rows || !moves.is_empty()) {
                    continue;
                }
                let name = match empty {
                    true => format!("part-000000.{extension}"),
                    false => format!("part-{k:04}-{}", &part["part-".len()..]),
                };
                let from = self.root.join(format!("wave-{k:04}")).join(part);
                moves.push((from, self.dir.join(&name)));
            }
        }
        // In an object store folder without a manifest yet, one listing
        // nothing goes first: until the commit's own, readers find no
        // files there, never some of this write's.
        let manifest_at = self.dir.join(manifest::name(extension));
        if url_of(&self.dir).is_some() && !place::is_file(&manifest_at)? {
            let pending = Manifest {
                write: "resumed-pending".into(),
                files: Vec::new(),
            };
            place::write(&manifest_at, &pending.to_json())?;
        }
        // A part moved before a kill is in the output already.
        if let Some(lost) = place::move_files(&moves)? {
            return Err(corrupt(
                &lost,
                "a recorded part is neither staged nor in the output",
            ));
        }
        let mut committed: Vec<PathBuf> = moves.into_iter().map(|(_, to)| to).collect();
        place::sync_dir(&self.dir)?;
        if url_of(&self.dir).is_some() {
            // Readers of an object store folder follow its manifest.
            let files = committed.iter().filter_map(|f| f.file_name());
            let manifest = Manifest {
                write: "resumed".into(),
                files: files.map(|f| f.to_string_lossy().into_owned()).collect(),
            };
            place::write(&manifest_at, &manifest.to_json())?;
        }
        let earlier: Vec<PathBuf> = place::names(&self.dir)?
            .into_iter()
            .filter(|(name, is_folder)| {
                !is_folder && name.starts_with("part-") && name.ends_with(&format!(".{extension}"))
            })
            .map(|(name, _)| self.dir.join(name))
            .filter(|old| !committed.contains(old))
            .collect();
        place::remove_files(&earlier)?;
        self.remove()?;
        committed.sort();
        Ok(committed)
    }

    /// Removes the journal so that a kill part way leaves none that looks
    /// whole: locally by a rename first; in an object store, its
    /// `plan.json` first (a journal without it is removed at the next start).
    fn remove(&self) -> Result<()> {
        if url_of(&self.root).is_some() {
            return remove_journal(&self.root);
        }
        let done = self
            .dir
            .join(format!("{JOURNAL}-done-{}", std::process::id()));
        place::rename(&self.root, &done)?;
        place::sync_dir(&self.dir)?;
        std::fs::remove_dir_all(&done).map_err(io("removing", &done))
    }
}

/// Removes the journal at `root`, its `plan.json` first: a removal cut
/// short leaves none that looks whole.
fn remove_journal(root: &Path) -> Result<()> {
    place::remove_file(&root.join("plan.json"))?;
    place::remove_folder(root)
}

/// Removes what commits of resumable writes left in `dir` (a journal
/// renamed to be removed).
fn remove_finished_journals(dir: &Path) {
    if url_of(dir).is_some() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name
            .to_string_lossy()
            .starts_with(&format!("{JOURNAL}-done-"))
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(splits: usize) -> WriteIdentity {
        WriteIdentity {
            format: "csv".into(),
            steps: vec!["preprocess".into()],
            splits: (0..splits)
                .map(|s| format!("file-{s}.csv (10 bytes)"))
                .collect(),
        }
    }

    fn journal(opened: Opened) -> Journal {
        match opened {
            Opened::Journal(journal) => journal,
            Opened::Committed(files) => panic!("committed already: {files:?}"),
        }
    }

    /// A wave that wrote one part per split it read.
    fn wave(journal: &mut Journal, splits: &[usize]) {
        let (k, folder) = journal.next_wave().unwrap();
        let mut parts = Vec::new();
        for s in splits {
            let part = format!("part-{s:06}.csv");
            std::fs::write(folder.join(&part), format!("x\n{s}\n")).unwrap();
            parts.push(part);
        }
        journal.finish_wave(k, splits, &parts).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_commit_cut_short_is_finished_by_the_next_start() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path();
        std::fs::write(dir.join("part-000009.csv"), "x\n9\n").unwrap();
        let mut first = journal(open_journal(dir, &identity(3), true).unwrap());
        wave(&mut first, &[0, 1]);
        wave(&mut first, &[2]);
        // The kill: after the marker and one part's move, before the rest.
        std::fs::write(dir.join(JOURNAL).join("committing"), b"").unwrap();
        std::fs::rename(
            dir.join(JOURNAL).join("wave-0000/part-000000.csv"),
            dir.join("part-0000-000000.csv"),
        )
        .unwrap();
        drop(first);
        let Opened::Committed(files) = open_journal(dir, &identity(3), true).unwrap() else {
            panic!("the commit was not finished");
        };
        let expected = [
            "part-0000-000000.csv",
            "part-0000-000001.csv",
            "part-0001-000002.csv",
        ];
        assert_eq!(files, expected.map(|n| dir.join(n)));
        // The earlier write's part replaced; no journal left.
        assert_eq!(names(dir), expected);
        assert_eq!(
            std::fs::read_to_string(dir.join(expected[2])).unwrap(),
            "x\n2\n"
        );
    }

    #[test]
    fn a_resumed_write_keeps_done_waves_and_drops_the_one_cut_short() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path();
        let mut first = journal(open_journal(dir, &identity(4), true).unwrap());
        wave(&mut first, &[0, 1]);
        let (_, cut_short) = first.next_wave().unwrap();
        std::fs::write(cut_short.join("part-000002.csv"), "x\n").unwrap();
        let again = journal(open_journal(dir, &identity(4), true).unwrap());
        assert_eq!(again.done_splits(), BTreeSet::from([0, 1]));
        assert!(!cut_short.exists());
        // Without resume, the journal starts over.
        let fresh = journal(open_journal(dir, &identity(4), false).unwrap());
        assert!(fresh.done_splits().is_empty());
    }

    /// A wave records the parts its tasks reported: one reported but not
    /// in its folder fails the wave; a file there that no task reported
    /// is not recorded (nor committed). Before, the folder's listing was
    /// the record.
    #[test]
    fn a_wave_records_what_its_tasks_reported() {
        let out = tempfile::tempdir().unwrap();
        let mut journal = journal(open_journal(out.path(), &identity(2), true).unwrap());
        let (k, folder) = journal.next_wave().unwrap();
        std::fs::write(folder.join("part-000000.csv"), "x\n0\n").unwrap();
        std::fs::write(folder.join("part-000009.csv"), "x\n9\n").unwrap(); // a stray
        let reported = ["part-000000.csv".to_string(), "part-000001.csv".to_string()];
        let e = journal
            .finish_wave(k, &[0, 1], &reported)
            .unwrap_err()
            .to_string();
        assert!(e.contains("part-000001.csv"), "{e}");
        std::fs::write(folder.join("part-000001.csv"), "x\n1\n").unwrap();
        journal.finish_wave(k, &[0, 1], &reported).unwrap();
        let files = journal.commit("csv").unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(!names.iter().any(|n| n.contains("000009")), "{names:?}");
    }

    #[test]
    fn a_changed_plan_or_input_is_refused_naming_what_differs() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path();
        let mut first = journal(open_journal(dir, &identity(3), true).unwrap());
        wave(&mut first, &[0]);
        let mut changed = identity(3);
        changed.splits[2] = "file-2.csv (11 bytes)".into();
        let e = open_journal(dir, &changed, true).unwrap_err().to_string();
        assert!(
            e.contains("input split 2 was file-2.csv (10 bytes), now file-2.csv (11 bytes)"),
            "{e}"
        );
        let mut steps = identity(3);
        steps.steps.push("filter".into());
        let e = open_journal(dir, &steps, true).unwrap_err().to_string();
        assert!(
            e.contains("steps were [preprocess], now [preprocess, filter]"),
            "{e}"
        );
        let e = open_journal(dir, &identity(4), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 splits, now 4"), "{e}");
        // A record naming a path outside its wave is refused.
        let record = dir.join(JOURNAL).join("wave-0000.done");
        std::fs::write(&record, r#"{"splits":[0],"parts":["../../etc/passwd"]}"#).unwrap();
        let e = open_journal(dir, &identity(3), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a file of its wave"), "{e}");
    }
}
