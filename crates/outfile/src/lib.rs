//! Open an output file safely (issue 20, finding 11).
//!
//! nanowire's tools run as root and write packet contents and logs
//! (`nanowire capture -w`, `bench --full-log`, `lab report`). A path a
//! user gives may sit in a directory another user can write (`/tmp`),
//! where that user can plant a symlink to `/etc/shadow` or a file of
//! their own that root then fills. [`create`] is the one way the tools
//! open such files:
//!
//! * the last component is never followed if it is a symlink
//!   (`O_NOFOLLOW`): a one-line error says so;
//! * in a directory others can write (world- or group-writable, like
//!   `/tmp`) the file must be new (`O_EXCL`): an existing name there may
//!   be someone else's plant;
//! * the directory must belong to root or to us (a directory owned by
//!   another user is theirs to rearrange under us);
//! * the result must be a regular file (no FIFO or device a plant could
//!   redirect to), and it is created with `mode` (0600 for packet data,
//!   0640 for reports; the umask may only remove bits); an existing file
//!   of ours loses any group/other bits beyond `mode`.
#![forbid(unsafe_code)]

use rustix::fs::{Mode, OFlags};
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Packet contents and per-sample logs: owner only.
pub const PRIVATE: u32 = 0o600;
/// Reports: owner and group.
pub const SHARED_GROUP: u32 = 0o640;

/// Create (or truncate) `path` for writing with at most `mode`
/// permissions, refusing every way another user could redirect the
/// write. Errors are one line naming the path.
pub fn create(path: &Path, mode: u32) -> io::Result<File> {
    let err =
        |kind: io::ErrorKind, why: &str| io::Error::new(kind, format!("{}: {why}", path.display()));
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = std::fs::metadata(parent)
        .map_err(|e| err(e.kind(), &format!("cannot use its directory: {e}")))?;
    let me = rustix::process::geteuid().as_raw();
    if dir.uid() != 0 && dir.uid() != me {
        return Err(err(
            io::ErrorKind::PermissionDenied,
            &format!(
                "its directory belongs to uid {} (not root, not us): refusing to write there",
                dir.uid()
            ),
        ));
    }
    let shared = dir.mode() & 0o022 != 0;
    let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    flags |= if shared { OFlags::EXCL } else { OFlags::TRUNC };
    let fd = match rustix::fs::open(path, flags, Mode::from_raw_mode(mode & 0o777)) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) => {
            return Err(err(
                io::ErrorKind::PermissionDenied,
                "is a symbolic link: refusing to follow it (give the target's own path)",
            ));
        }
        Err(rustix::io::Errno::EXIST) if shared => {
            return Err(err(
                io::ErrorKind::AlreadyExists,
                "exists in a directory other users can write: refusing to reuse it (remove it or choose a new name)",
            ));
        }
        Err(e) => {
            return Err(err(
                io::Error::from(e).kind(),
                &format!("cannot create: {e}"),
            ));
        }
    };
    let f = File::from(fd);
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(err(
            io::ErrorKind::InvalidInput,
            "is not a regular file: refusing to write to it",
        ));
    }
    if m.uid() == me && m.mode() & 0o777 & !(mode & 0o777) != 0 {
        rustix::fs::fchmod(&f, Mode::from_raw_mode(m.mode() & mode & 0o777))?;
    }
    Ok(f)
}

/// Create a directory (and its parents) for output with at most `mode`
/// (an existing one is used as it is, if it is a directory). A symbolic
/// link as the directory itself is refused, as [`create`] refuses one for a
/// file: a link planted by another user would make the files created in it
/// land wherever it points (say, a directory of root's).
pub fn create_dir(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    not_a_link(path)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode & 0o777)
        .create(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: cannot create: {e}", path.display())))
}

/// Refuse `path` if it is a symbolic link (an output directory that must
/// exist already, as `lab report --render-only`'s, is checked as
/// [`create_dir`] checks a new one): the same one-line error.
pub fn not_a_link(path: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: is a symbolic link: refusing to follow it (give the target's own path)",
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh private directory of the test's own, removed with what is in
    /// it when the test ends (passed or not).
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            let d = std::env::temp_dir()
                .join(format!("nw-outfile-{tag}-{}-{nanos}", std::process::id()));
            // A fresh name (create_dir fails on anything already there).
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
            Scratch(d)
        }
        fn path(&self) -> &Path {
            &self.0
        }
        fn join(&self, name: &str) -> std::path::PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_new_file_is_not_world_readable() {
        let d = Scratch::new("mode");
        let p = d.join("cap.pcapng");
        create(&p, PRIVATE).unwrap().write_all(b"x").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777 & !0o600, 0);
        let q = d.join("index.html");
        create(&q, SHARED_GROUP).unwrap();
        assert_eq!(std::fs::metadata(&q).unwrap().mode() & 0o007, 0);
    }

    #[test]
    fn an_existing_world_readable_file_of_ours_is_narrowed_and_truncated() {
        let d = Scratch::new("narrow");
        let p = d.join("log");
        std::fs::write(&p, b"old contents").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        create(&p, PRIVATE).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o077, 0);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn a_planted_symlink_is_refused_with_one_line_and_the_target_untouched() {
        let d = Scratch::new("link");
        let target = d.join("precious");
        std::fs::write(&target, b"keep").unwrap();
        let p = d.join("out.pcapng");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let e = create(&p, PRIVATE).unwrap_err().to_string();
        assert!(e.contains("symbolic link") && !e.contains('\n'), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // A dangling one too (the plant that would create root's file).
        let q = d.join("dangling");
        std::os::unix::fs::symlink(d.join("nothing"), &q).unwrap();
        assert!(create(&q, PRIVATE).is_err());
        assert!(!d.join("nothing").exists());
    }

    #[test]
    fn a_planted_symlink_as_the_output_directory_is_refused() {
        let d = Scratch::new("dirlink");
        let target = d.join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let p = d.join("report");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let e = create_dir(&p, 0o750).unwrap_err().to_string();
        assert!(e.contains("symbolic link") && !e.contains('\n'), "{e}");
        // A real directory (new, or existing) is fine.
        create_dir(&d.join("new/sub"), 0o750).unwrap();
        create_dir(&target, 0o750).unwrap();
        assert!(std::fs::read_dir(&target).unwrap().next().is_none());
    }

    #[test]
    fn an_existing_name_in_a_shared_directory_is_refused() {
        let d = Scratch::new("shared");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let p = d.join("planted");
        std::fs::write(&p, b"").unwrap();
        let e = create(&p, PRIVATE).unwrap_err().to_string();
        assert!(e.contains("other users can write"), "{e}");
        // A new name there is fine.
        create(&d.join("fresh"), PRIVATE).unwrap();
    }

    #[test]
    fn a_fifo_is_refused() {
        let d = Scratch::new("fifo");
        let p = d.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &p,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Opened for writing without a reader would block: O_NONBLOCK is
        // not ours to add, so the check is on a FIFO with a reader.
        let _r = rustix::fs::open(&p, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).unwrap();
        let e = create(&p, PRIVATE).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    #[ignore = "needs root"]
    fn a_directory_of_another_user_is_refused() {
        let d = Scratch::new("other");
        rustix::fs::chown(d.path(), Some(rustix::process::Uid::from_raw(65534)), None).unwrap();
        let e = create(&d.join("x"), PRIVATE).unwrap_err().to_string();
        assert!(e.contains("belongs to uid 65534"), "{e}");
    }
}
