//! Tests that cannot run on this machine (no GPU adapter, no headless
//! Chromium) say so where a person reads it, instead of passing silently.

use std::io::Write;
use std::path::Path;

/// The environment variable naming the file each skipped test appends a
/// line to (`.ci/run` sets it and prints how many were skipped).
pub const SKIP_LOG: &str = "SB_SKIP_LOG";

/// Whether the tests run under CI: `CI` set to anything but empty, `0` or
/// `false`.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
}

/// For a test that cannot run here: `why` says what is missing and how to
/// get it; the test returns right after. Under CI ([`under_ci`]) it panics
/// instead, so that the test fails. Elsewhere it writes
/// `test NAME: SKIPPED (why)` straight to the process's stderr (libtest
/// captures `eprintln!` of a passing test, which would make a skip look
/// like a pass) and appends `NAME: why` to the file [`SKIP_LOG`] names,
/// where set.
pub fn skip_test(test: &str, why: &str) {
    let log = std::env::var_os(SKIP_LOG);
    let log = log.as_deref().map(Path::new);
    skip(test, why, under_ci(), log, &mut std::io::stderr().lock());
}

fn skip(test: &str, why: &str, ci: bool, log: Option<&Path>, stderr: &mut dyn Write) {
    assert!(!ci, "test {test} cannot run under CI: {why}");
    let line = format!("test {test}: SKIPPED ({why}; CI=true makes this a failure)\n");
    let _ = stderr.write_all(line.as_bytes());
    if let Some(log) = log {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(format!("{test}: {why}\n").as_bytes()));
        if let Err(e) = appended {
            panic!(
                "test {test} was skipped, and {} could not say so: {e}",
                log.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_logged_and_under_ci_it_fails() {
        let dir = tempfile_dir();
        let log = dir.join("skips");
        let mut said = Vec::new();
        skip("first", "no adapter", false, Some(&log), &mut said);
        skip("second", "no browser", false, Some(&log), &mut said);
        skip("unlogged", "nothing", false, None, &mut said);
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "first: no adapter\nsecond: no browser\n"
        );
        let said = String::from_utf8(said).unwrap();
        assert_eq!(said.lines().count(), 3, "{said}");
        assert!(
            said.starts_with("test first: SKIPPED (no adapter"),
            "{said}"
        );
        let failed = std::panic::catch_unwind(|| {
            skip("third", "no adapter", true, Some(&log), &mut Vec::new())
        });
        let message = failed.unwrap_err();
        let message = message.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("third") && message.contains("no adapter"),
            "{message}"
        );
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sb-skip-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
