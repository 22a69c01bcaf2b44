//! The crate's layout holds: each folder imports only the folders below it
//! (so no import runs back up and no circle forms), names imported through
//! the crate root's re-exports count for the folder they come from, and no
//! source file grows past 900 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which top-level modules each folder may import, bottom floor first.
/// `logical` is the dispatcher that names every family of the floors below
/// it; `dataset` builds plans; `train` consumes datasets.
const ALLOWED: [(&str, &[&str]); 10] = [
    ("error", &[]),
    ("udf", &["error"]),
    ("object", &["error"]),
    ("read", &["error", "udf", "object"]),
    ("exchange", &["error", "udf"]),
    ("sink", &["error", "udf", "object"]),
    ("stats", &["error", "sink"]),
    (
        "logical",
        &[
            "error", "udf", "object", "read", "exchange", "sink", "stats",
        ],
    ),
    (
        "dataset",
        &[
            "error", "udf", "object", "read", "exchange", "sink", "stats", "logical",
        ],
    ),
    (
        "train",
        &[
            "error", "udf", "object", "read", "exchange", "sink", "stats", "logical", "dataset",
        ],
    ),
];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names the crate root re-exports, each with the top-level module it
/// comes from (`pub use dataset::held::{Piece, Pulled}` gives `Piece` and
/// `Pulled` from `dataset`; `x as y` gives `y`).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in lib.split(';') {
        let Some(at) = statement.find("pub use ") else {
            continue;
        };
        let path = &statement[at + 8..];
        let module: String = path
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let items = match path.find('{') {
            Some(open) => &path[open + 1..path.rfind('}').unwrap_or(path.len())],
            None => path.rsplit("::").next().unwrap_or(path),
        };
        for item in items.split(',') {
            let name = item.split(" as ").last().unwrap_or(item).trim();
            if !name.is_empty() {
                names.insert(name.to_string(), module.clone());
            }
        }
    }
    names
}

/// The top-level modules `text` names as `crate::NAME` outside comments,
/// a re-exported name counting for its module.
fn imports(text: &str, reexported: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        for (at, _) in line.match_indices("crate::") {
            let before = line[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // streambatch_core::, ractor_cluster::...
            }
            let rest = &line[at + 7..];
            // `crate::{a::X, b::Y}`: every item of the group.
            let group = rest
                .strip_prefix('{')
                .map(|g| g.split('}').next().unwrap_or(g));
            for item in group.map_or(vec![rest], |g| g.split(',').collect()) {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name.is_empty() {
                    continue;
                }
                found.insert(reexported.get(&name).cloned().unwrap_or(name));
            }
        }
    }
    found
}

#[test]
fn folders_import_only_the_floors_below_them_and_files_stay_small() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let reexported = reexports(&lib);
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.into_iter().collect();
    let mut broken = Vec::new();
    let mut all = Vec::new();
    files(&src, &mut all);
    for file in &all {
        let text = std::fs::read_to_string(file).unwrap();
        let lines = text.lines().count();
        if lines > 900 {
            broken.push(format!("{}: {lines} lines (at most 900)", file.display()));
        }
        let relative = file.strip_prefix(&src).unwrap();
        if relative == Path::new("lib.rs") {
            continue;
        }
        let top = relative.iter().next().and_then(|f| f.to_str()).unwrap();
        let folder = top.strip_suffix(".rs").unwrap_or(top);
        let Some(may) = allowed.get(folder) else {
            broken.push(format!(
                "{}: a module without rules; add it to ALLOWED",
                relative.display()
            ));
            continue;
        };
        for import in imports(&text, &reexported) {
            if import != folder && !may.contains(&import.as_str()) {
                broken.push(format!("{} imports {import}", relative.display()));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_checker_sees_a_forbidden_import_through_a_reexport_or_a_group() {
    let lib = "pub use dataset::held::{Piece, Pulled};\npub use stats::{JobStats,\n  RankStats as Ranks};\npub use logical::ops;";
    let reexported = reexports(lib);
    assert_eq!(reexported["Pulled"], "dataset");
    assert_eq!(reexported["Ranks"], "stats");
    assert_eq!(reexported["ops"], "logical");
    let text = "use crate::{error::Error, Pulled};\n/// [`x`](crate::train::Split)\nlet r: crate::Ranks = crate::ops::f();\nmy_crate::x";
    let found: Vec<String> = imports(text, &reexported).into_iter().collect();
    assert_eq!(found, ["dataset", "error", "logical", "stats"]);
}
