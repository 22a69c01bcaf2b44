//! A workspace-wide rule: no `.rs` source file over 900 lines. The walk
//! covers `crates/`, `tests/`, `examples/`, `benches/` and `tools/` from the
//! workspace root, skipping `target` and hidden directories; a file over
//! the limit is split by concern into modules.

use std::path::{Path, PathBuf};

/// The most lines a `.rs` file may have.
const MAX_LINES: usize = 900;

/// The directories, under the workspace root, whose sources the rule covers.
const ROOTS: [&str; 5] = ["crates", "tests", "examples", "benches", "tools"];

/// Lines in `bytes`, as `wc -l` counts them plus a last line without a
/// newline.
fn lines(bytes: &[u8]) -> usize {
    let newlines = bytes.iter().filter(|&&b| b == b'\n').count();
    newlines + usize::from(bytes.last().is_some_and(|&b| b != b'\n'))
}

/// Every `.rs` file under `dir` (not under a `target` or hidden
/// directory, and not through a symbolic link), into `files`.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return; // absent: nothing to check there
    };
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&entry.path(), files);
            }
        } else if kind.is_file() && name.ends_with(".rs") {
            files.push(entry.path());
        }
    }
}

/// The `.rs` files under `roots` of `root` with more than `max` lines, with
/// their line counts, by path.
fn too_long(root: &Path, roots: &[&str], max: usize) -> Vec<(PathBuf, usize)> {
    let mut files = Vec::new();
    for dir in roots {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .filter_map(|path| {
            let bytes =
                std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let n = lines(&bytes);
            let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            (n > max).then_some((relative, n))
        })
        .collect()
}

#[test]
fn no_rust_source_file_is_over_900_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let long = too_long(root, &ROOTS, MAX_LINES);
    let list: Vec<String> = long
        .iter()
        .map(|(path, n)| format!("  {} ({n} lines)", path.display()))
        .collect();
    assert!(
        long.is_empty(),
        "{} .rs files over {MAX_LINES} lines; split each into modules by concern:\n{}",
        long.len(),
        list.join("\n")
    );
}

#[test]
fn the_walk_sees_a_file_one_line_over_and_skips_target_and_hidden_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, n: usize| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "// a line\n".repeat(n)).unwrap();
    };
    write("crates/a/src/long.rs", MAX_LINES + 1);
    write("crates/a/src/at_the_limit.rs", MAX_LINES);
    write("tools/deep/er/long.rs", 2 * MAX_LINES);
    write("crates/a/target/debug/generated.rs", MAX_LINES + 1);
    write("crates/.hidden/long.rs", MAX_LINES + 1);
    write("crates/a/long.txt", MAX_LINES + 1);
    write("elsewhere/long.rs", MAX_LINES + 1);
    // A last line without a newline counts too.
    let unterminated = dir.path().join("tests/unterminated.rs");
    std::fs::create_dir_all(unterminated.parent().unwrap()).unwrap();
    let text = "// a line\n".repeat(MAX_LINES) + "// one more";
    std::fs::write(&unterminated, text).unwrap();

    let long = too_long(dir.path(), &ROOTS, MAX_LINES);
    assert_eq!(
        long,
        [
            (PathBuf::from("crates/a/src/long.rs"), MAX_LINES + 1),
            (PathBuf::from("tests/unterminated.rs"), MAX_LINES + 1),
            (PathBuf::from("tools/deep/er/long.rs"), 2 * MAX_LINES),
        ]
    );
    assert_eq!(lines(b""), 0);
    assert_eq!(lines(b"a\nb"), 2);
    assert_eq!(lines(b"a\nb\n"), 2);
}
