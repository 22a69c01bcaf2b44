//! The crate's layout holds: each folder imports only the folders its
//! rules allow (so no import runs back up and no circle forms), and no
//! source file grows past 900 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which folders (top-level modules) each folder may import.
const ALLOWED: [(&str, &[&str]); 6] = [
    ("job", &[]),
    ("wire", &[]),
    ("exec", &["job"]),
    ("sim", &["job", "exec"]),
    ("driver", &["job", "exec", "wire"]),
    ("cluster", &["job", "exec", "wire"]),
];

/// Names re-exported at the crate's root, and the folder they live in.
const REEXPORTS: [(&str, &str); 2] = [("metrics", "exec"), ("policy", "job")];

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

/// The top-level modules `text` names as `crate::NAME`.
fn imports(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // ractor_cluster::, streambatch_plan::...
        }
        let name: String = text[at + 7..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let folder = REEXPORTS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(name, |(_, f)| f.to_string());
        found.insert(folder);
    }
    found
}

#[test]
fn folders_import_only_what_their_rules_allow_and_files_stay_small() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
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
        let Some(folder) = relative.iter().next().and_then(|f| f.to_str()) else {
            continue;
        };
        let Some(may) = allowed.get(folder) else {
            assert!(
                relative.components().count() == 1,
                "{}: a folder without rules; add it to ALLOWED",
                relative.display()
            );
            continue;
        };
        for import in imports(&text) {
            let is_folder = allowed.contains_key(import.as_str());
            if is_folder && import != folder && !may.contains(&import.as_str()) {
                broken.push(format!("{} imports {import}", relative.display()));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_checker_sees_a_forbidden_import() {
    let text = "use crate::driver::msg::ExecutorMsg;\nuse ractor_cluster::NodeServer;\nlet p = crate::policy::next_decision;";
    let found: Vec<String> = imports(text).into_iter().collect();
    assert_eq!(found, ["driver", "job"]);
}
