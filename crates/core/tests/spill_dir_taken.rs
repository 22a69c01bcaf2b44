//! A local user who makes the default spill directory's predictable name
//! first cannot stop a node from starting: the default moves to a private
//! directory of an unpredictable name. Its own binary: it sets TMPDIR
//! before the default is first resolved (and runs itself again, as the
//! next run).

use std::os::unix::fs::{MetadataExt, PermissionsExt};

#[test]
fn a_spill_directory_name_taken_by_another_user_is_not_used() {
    // Run again by itself as the next run: it prints what it resolved.
    if std::env::var_os("SB_SECOND_RUN").is_some() {
        let dir = streambatch_core::NodeConfig::default().spill_dir;
        println!("spill_dir={}", dir.display());
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // SAFETY: set before any other thread of this binary reads the
    // environment (its one test).
    unsafe { std::env::set_var("TMPDIR", tmp.path()) };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let taken = tmp.path().join(format!("streambatch-spill-{uid}"));
    std::fs::create_dir(&taken).unwrap();
    // Another user's: as root, given away; else left open to everyone,
    // which a store refuses just as well.
    if uid == 0 {
        std::os::unix::fs::chown(&taken, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o777)).unwrap();

    let dir = streambatch_core::NodeConfig::default().spill_dir;
    assert_ne!(dir, taken);
    assert_eq!(dir.parent(), Some(tmp.path()));
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("streambatch-spill-{uid}-")),
        "{name}"
    );
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    assert!(meta.is_dir());
    assert_eq!((meta.uid(), meta.mode() & 0o777), (uid, 0o700));
    // Resolved once: every config of the process spills to the same place.
    assert_eq!(streambatch_core::NodeConfig::default().spill_dir, dir);
    // The next run (another process) takes the same one, rather than make
    // one more each run.
    let again = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_spill_directory_name_taken_by_another_user_is_not_used",
            "--nocapture",
        ])
        .env("TMPDIR", tmp.path())
        .env("SB_SECOND_RUN", "1")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&again.stdout);
    assert!(
        printed.contains(&format!("spill_dir={}\n", dir.display())),
        "{printed}"
    );
}
