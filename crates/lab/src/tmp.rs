//! Private scratch directories for a process that runs as root.
//!
//! The temporary directory is world-writable, so a predictable name there
//! can be taken first by another user (a directory they own, or a symlink
//! to somewhere we would then write into). [`private_dir`] never reuses a
//! path: it makes a fresh directory with `mkdir` (which fails on anything
//! already there, a symlink included), mode 0700, and checks with `lstat`
//! that what it made is a real directory owned by us and closed to others
//! before anyone writes into it. Files inside it are then ours alone.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh private directory `<tmp>/<tag>-<pid>-<nanos>-<n>`; see the module
/// text. Errors name the path.
pub fn private_dir(tag: &str) -> io::Result<PathBuf> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    let mut last = None;
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let d = base.join(format!("{tag}-{}-{nanos}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => {
                check_private(&d)?;
                return Ok(d);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", d.display()))),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free name")))
}

/// `d` is a directory (not a symlink), owned by our effective uid, with no
/// access for group or others.
fn check_private(d: &std::path::Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(d)?;
    let euid = rustix::process::geteuid().as_raw();
    if !m.file_type().is_dir() || m.uid() != euid || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: not a private directory of uid {euid} (uid {}, mode {:o})",
                d.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_makes_a_new_private_directory() {
        let a = private_dir("nanowire-tmp-test").unwrap();
        let b = private_dir("nanowire-tmp-test").unwrap();
        assert_ne!(a, b);
        for d in [&a, &b] {
            let m = std::fs::symlink_metadata(d).unwrap();
            assert!(m.is_dir());
            assert_eq!(m.mode() & 0o077, 0);
            std::fs::remove_dir(d).unwrap();
        }
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let a = private_dir("nanowire-tmp-test").unwrap();
        std::fs::set_permissions(&a, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(check_private(&a).is_err());
        std::fs::remove_dir(&a).unwrap();
    }
}
