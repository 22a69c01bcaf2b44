//! A runtime directory for processes started without one: Mesa's Vulkan
//! drivers (lavapipe among them) print `error: XDG_RUNTIME_DIR is invalid
//! or not set in the environment.` on stderr each time wgpu enumerates the
//! adapters of a process that has no `XDG_RUNTIME_DIR` (a node started by
//! systemd, cron, ssh with a bare environment, a container).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// The variable Mesa (through the Wayland client it tries) looks at.
const VAR: &str = "XDG_RUNTIME_DIR";

/// Gives this process a private `XDG_RUNTIME_DIR` when it has none, so that
/// no Mesa driver prints that it is missing: a directory
/// `streambatch-runtime-UID` in [`std::env::temp_dir`], made 0700 if absent,
/// used only if it is a directory (not a link) of this user's with mode
/// 0700. Returns the directory it set, or `None` where the variable was
/// already set (then nothing changes) or no such directory could be had.
/// The `streambatch` command calls it first thing in `main`; a program of
/// yours that uses the GPU pool on such machines can do the same.
///
/// # Safety
/// It sets an environment variable: call it before this process starts any
/// other thread (first thing in `main`), as [`std::env::set_var`] requires.
pub unsafe fn use_private_runtime_dir() -> Option<PathBuf> {
    if std::env::var_os(VAR).is_some_and(|v| !v.is_empty()) {
        return None;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let dir = std::env::temp_dir().join(format!("streambatch-runtime-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    // Another user's directory, or a link planted in a shared /tmp, is not
    // ours to use.
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o777 != 0o700 {
        return None;
    }
    // SAFETY: the caller guarantees no other thread runs yet.
    unsafe { std::env::set_var(VAR, &dir) };
    Some(dir)
}
