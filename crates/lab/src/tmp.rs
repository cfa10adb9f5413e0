//! Private scratch directories for a process that runs as root.
//!
//! The temporary directory is world-writable, so a predictable name there
//! can be taken first by another user (a directory they own, or a symlink
//! to somewhere we would then write into). [`private_dir`] never reuses a
//! path: it makes a fresh directory with `mkdir` (which fails on anything
//! already there, a symlink included), mode 0700, and checks with `lstat`
//! that what it made is a real directory owned by us and closed to others
//! before anyone writes into it. Files inside it are then ours alone.
//!
//! [`sweep_stale`] removes such directories whose process is gone (a test
//! binary killed by a timeout, or one that never removed its own): a test
//! suite that leaves them fills the disk (50 MB bodies, once per binary).

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

/// Remove the directories that [`private_dir`] made for a tag starting with
/// one of `prefixes` (`<tag>-<pid>-<nanos>-<n>` in the temporary directory)
/// whose process `pid` no longer exists: only real directories (never a
/// symlink), owned by our effective uid, mode 0700, last changed more than
/// `min_age` ago (a pid of another pid namespace sharing the directory, a
/// directory being made). The temporary directory is sticky, so no other
/// user can rename or replace such an entry between the check and the
/// removal, and `remove_dir_all` does not follow symlinks inside it (it
/// opens each level with `O_NOFOLLOW`). A reused pid keeps its directory
/// until a later sweep. Returns how many were removed; errors are skipped
/// (another sweeper may be removing the same directory).
pub fn sweep_stale(prefixes: &[&str], min_age: std::time::Duration) -> usize {
    let base = std::env::temp_dir();
    let Ok(rd) = std::fs::read_dir(&base) else {
        return 0;
    };
    let me = std::process::id();
    let mut removed = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !prefixes.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let Some(pid) = made_by(name) else { continue };
        if pid == me || alive(pid) {
            continue;
        }
        let d = base.join(name);
        if check_private(&d).is_err() {
            continue;
        }
        let old = std::fs::symlink_metadata(&d)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if old && std::fs::remove_dir_all(&d).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The pid in a [`private_dir`] name `<tag>-<pid>-<nanos>-<n>`.
fn made_by(name: &str) -> Option<u32> {
    let mut it = name.rsplitn(4, '-');
    let (n, nanos, pid) = (it.next()?, it.next()?, it.next()?);
    it.next().filter(|tag| !tag.is_empty())?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(n) && digits(nanos) && digits(pid)) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

/// Whether process `pid` exists (a signal-0 probe: EPERM means it does).
fn alive(pid: u32) -> bool {
    let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(p),
        Err(rustix::io::Errno::SRCH)
    )
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
    fn only_private_directories_of_gone_processes_are_swept() {
        // A pid that cannot exist (above the kernel's pid_max limit).
        let gone = 4_194_305 + 1000;
        let base = std::env::temp_dir();
        let tag = format!("nanowire-sweep-test{}", std::process::id());
        let mk = |pid: u32, mode: u32| {
            let d = base.join(format!("{tag}-{pid}-1-0"));
            std::fs::DirBuilder::new().mode(mode).create(&d).unwrap();
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
            d
        };
        let stale = mk(gone, 0o700);
        std::fs::write(stale.join("body.bin"), b"x").unwrap();
        let ours = mk(std::process::id(), 0o700);
        let open = mk(gone + 1, 0o755);
        let link = base.join(format!("{tag}-{}-1-0", gone + 2));
        std::os::unix::fs::symlink(&ours, &link).unwrap();
        let young = private_dir(&tag).unwrap();
        assert_eq!(
            made_by(young.file_name().unwrap().to_str().unwrap()),
            Some(std::process::id())
        );
        // Too young: nothing goes.
        assert_eq!(
            sweep_stale(&[&tag], std::time::Duration::from_secs(3600)),
            0
        );
        assert!(stale.exists());
        assert_eq!(sweep_stale(&[&tag], std::time::Duration::ZERO), 1);
        assert!(!stale.exists());
        for d in [&ours, &open, &young] {
            assert!(
                std::fs::symlink_metadata(d).unwrap().is_dir(),
                "{}",
                d.display()
            );
            std::fs::remove_dir(d).unwrap();
        }
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        std::fs::remove_file(&link).unwrap();
    }

    #[test]
    fn names_not_made_by_private_dir_are_not_ours() {
        for n in [
            "nanowire-ts",
            "nanowire-ts-12",
            "nanowire-ts-x-1-2",
            "-1-2-3",
            "t-0-1-2",
            "t-1-2-",
        ] {
            assert_eq!(made_by(n), None, "{n}");
        }
        assert_eq!(made_by("nanowire-ts-123-456-7"), Some(123));
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let a = private_dir("nanowire-tmp-test").unwrap();
        std::fs::set_permissions(&a, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(check_private(&a).is_err());
        std::fs::remove_dir(&a).unwrap();
    }
}
