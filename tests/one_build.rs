//! The examples build on the `streambatch` binary's release build only
//! while their package depends on every crate the binary does (the same
//! crates, so the same features): a dependency added to the binary and not
//! to crates/examples would make `cargo run -p streambatch-examples`
//! build every crate above it again.

use std::collections::BTreeSet;
use std::path::Path;

/// The names under `[dependencies]` of a Cargo manifest.
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.']).next().unwrap_or(line).trim();
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn the_examples_depend_on_every_crate_the_binary_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let binary = dependencies(&read("crates/cli/Cargo.toml"));
    let examples = dependencies(&read("crates/examples/Cargo.toml"));
    assert!(binary.contains("streambatch"), "{binary:?}");
    let missing: Vec<_> = binary.difference(&examples).collect();
    assert!(
        missing.is_empty(),
        "crates/examples lacks the binary's {missing:?}"
    );
}

#[test]
fn the_reader_finds_dependencies_only() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\n# a comment\na.workspace = true\nb = { workspace = true }\n\n[dev-dependencies]\nc = \"1\"\n";
    let found: Vec<String> = dependencies(manifest).into_iter().collect();
    assert_eq!(found, ["a", "b"]);
}
