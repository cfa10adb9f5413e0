//! Issue 24, kill -9 on an engine of the process's own: the warden.
//!
//! On the engine service a killed process's connections are ended by the
//! service from the process's connection table (`conns.rs`). A process on
//! an engine of its own has no service, and nothing of it runs after
//! SIGKILL: before this, its peers learned nothing (no FIN, no RST) until
//! their own timeout. Now the engine's first TCP stack also makes the
//! table and starts a warden: `nanowire engine warden --pid P --pidfd 3
//! --table-fd 4` (the process's pidfd and table given as fds 3 and 4), a
//! small process of its own (detached: its own session, reparented to
//! init), that holds the table, the pidfd and a raw IPv4 socket, and sleeps in
//! `poll` until the process is gone. Then it reads the table and sends each
//! connection's FIN or RST as the service does (the kernel's rule at close:
//! FIN when nothing is lost, RST when data was unread, a connection waited
//! in an accept queue, or written data never left), skipping a 4-tuple the
//! kernel has a live connection for (one handed over at fork), and exits.
//! After a normal exit the table is empty (the shim finished the
//! connections on the way out) and it exits without a word.
//!
//! The death window (session 22): the warden also holds a copy of the
//! engine's XDP link, so the steering program stays attached after the
//! process's death, and steer.c drops (`redirect_tcp`) an owned TCP segment
//! whose AF_XDP socket is gone: a segment of the peer between the death and
//! the warden's end (a window update) is lost as on a wire (the peer
//! retransmits) instead of reaching a kernel without a socket, which would
//! reset the peer. The warden ends in the service's order: each
//! connection the kernel can take gets its repair socket (`Ender::hold`),
//! then the link goes (the program is detached: a dead process's claims go,
//! issue 20 finding 3), then the ends (`Ender::finish`). The link must not
//! outlive the process's image: an exec'd program attaches its own. So
//! the shim's exec asks the warden to let it go first ([`release_link`],
//! a byte on a socket pair, answered); an end of that pair closed without
//! the request (an exec the shim did not see) lets it go too, unless the
//! process is exiting (PF_EXITING: the death, whose ends need it).
//!
//! Cost: one process start with the first TCP stack, made and waited for
//! by a thread of the engine's (the application never waits for it), the
//! table's bookkeeping per touched connection (as on the service), no
//! system call on the data path. `NANOWIRE_TCP_WARDEN=0` turns it off (the
//! old behaviour). Limits: a process killed between its first TCP stack
//! and the thread's spawn has no warden (a connection can be established,
//! written and the process killed in that time: session 24's
//! `run_exit kill_9_right_after_...` waits for the warden first); the
//! set-up process is the application's
//! child for the few ms of its set-up (a `wait` for any child may reap it:
//! handled); exec keeps the pid, so the old image's connections are ended
//! when the new program dies, not at the exec; the warden needs the
//! nanowire binary (`NANOWIRE_BIN`, set by `nanowire run`) and a raw
//! socket (CAP_NET_RAW, which an engine of one's own needs anyway). An exec
//! (or posix_spawn, system, popen) of the application waits for a spawn in
//! flight (`settle`): the spawn's child holds copies of the engine's fds
//! until its own exec.

use rustix::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

/// Start the warden of this process for `table` (the connection table's
/// memfd), off the caller's path: the caller (inside a first connect or
/// listen) makes a pidfd of this process and a duplicate of the table,
/// and a short-lived thread of the engine's spawns the warden with both
/// (fds 3 and 4), waits for its set-up and reaps it. The caller never
/// waits for a process start (it did: fork + exec of the nanowire binary
/// and its set-up, ~9 ms of `ab -n 1`'s first connect at load 17,
/// docs/benchmarks.md "Session 14: churn"). Once spawned the warden holds
/// what it needs even if this process is killed before it is set up: it
/// was given the pidfd and the table, it opens nothing of this process's.
/// `Ok(true)`: the thread runs (a failure to start is said by it, once),
/// `Ok(false)`: turned off (`NANOWIRE_TCP_WARDEN=0`).
///
/// `link`: the engine's XDP link, held by the warden until the process's
/// connections are ended (see the module's note; `None`: not held).
pub fn start(
    table: rustix::fd::BorrowedFd<'_>,
    link: Option<rustix::fd::BorrowedFd<'_>>,
) -> Result<bool, String> {
    if std::env::var_os("NANOWIRE_TCP_WARDEN").is_some_and(|v| v == "0") {
        return Ok(false);
    }
    let bin = warden_bin().ok_or("the nanowire binary is unknown (set NANOWIRE_BIN)")?;
    let pid = std::process::id();
    let me = rustix::process::Pid::from_raw(pid as i32).ok_or("pid 0")?;
    let pidfd = rustix::process::pidfd_open(me, rustix::process::PidfdFlags::empty())
        .map_err(|e| format!("pidfd_open: {e}"))?;
    // Above the spawn's targets (3, 4), so that no dup2 of the file
    // actions overwrites the other's source.
    let tdup =
        rustix::io::fcntl_dupfd_cloexec(table, 16).map_err(|e| format!("connection table: {e}"))?;
    let pfd = rustix::io::fcntl_dupfd_cloexec(&pidfd, 16).map_err(|e| format!("pidfd: {e}"))?;
    drop_raw(pidfd);
    let held = match link {
        Some(l) => Some(hold_link(l, pid)?),
        None => None,
    };
    SPAWNING.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    let spawned = std::thread::Builder::new()
        .name("nanowire-warden".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            let mut fds = Some((pfd, tdup, held));
            crate::xdp::order::as_engine_thread(&mut || {
                block_signals();
                if let Some((p, t, l)) = fds.take() {
                    // Past posix_spawn (the child exec'd) and the set-up.
                    let r = spawn_and_reap(&bin, pid, &p, &t, l.as_ref());
                    SPAWNING.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    drop_raw(p);
                    drop_raw(t);
                    if let Some((link, peer)) = l {
                        drop_raw(link);
                        drop_raw(peer);
                    }
                    if let Err(e) = r {
                        eprintln!(
                            "nanowire: no warden: if this process is killed, its TCP connections end without a FIN or RST: {e}"
                        );
                    }
                }
            });
        });
    spawned.map(|_| true).map_err(|e| {
        SPAWNING.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        format!("cannot start the warden's thread: {e}")
    })
}

/// For the warden: a copy of `link` and its end of a new socket pair,
/// whose other end this process keeps (`CTL`, close-on-exec) to ask for
/// the link's release at exec ([`release_link`]).
fn hold_link(link: rustix::fd::BorrowedFd<'_>, pid: u32) -> Result<(OwnedFd, OwnedFd), String> {
    let ldup = rustix::io::fcntl_dupfd_cloexec(link, 16).map_err(|e| format!("XDP link: {e}"))?;
    let (mine, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    let theirs =
        rustix::io::fcntl_dupfd_cloexec(&theirs, 16).map_err(|e| format!("socketpair: {e}"))?;
    let mut ctl = CTL.lock().unwrap_or_else(|e| e.into_inner());
    if ctl.0 != pid {
        // Inherited from a parent (its wardens are not ours).
        for fd in ctl.1.drain(..) {
            nanowire_xdp::sys::close(fd);
        }
        ctl.0 = pid;
    }
    ctl.1.push(rustix::fd::IntoRawFd::into_raw_fd(mine));
    Ok((ldup, theirs))
}

/// The process the ends below belong to (a forked child inherits them and
/// must not ask for its parent's wardens' links), and its ends of the
/// socket pairs to its wardens (one per engine, i.e. per interface).
static CTL: std::sync::Mutex<(u32, Vec<i32>)> = std::sync::Mutex::new((0, Vec::new()));

/// In a forked child (`Engine::disown`): the parent's ends are closed, so
/// that an exec of the parent the shim did not see still closes the last
/// copy (the warden then lets the link go).
/// (Not if another thread of the parent held the lock at the fork: then
/// the copies stay until the child's exec or exit.)
pub fn disown() {
    let Ok(mut ctl) = CTL.try_lock() else {
        return;
    };
    if ctl.0 != std::process::id() {
        for fd in ctl.1.drain(..) {
            nanowire_xdp::sys::close(fd);
        }
    }
}

/// Before this process's exec: its warden lets the XDP link go (and says
/// so), so that the new image's engine can attach its own program. At
/// most `limit` waited for the answer (a warden that failed to start has
/// closed its end: at once). After it the warden still ends the
/// connections of the old image when the process dies, without holding
/// the program (the death window again; an exec that fails leaves the
/// process so, said in docs/architecture.md). `false`: no answer.
pub fn release_link(limit: Duration) -> bool {
    let ctl = CTL.lock().unwrap_or_else(|e| e.into_inner());
    if ctl.0 != std::process::id() {
        return true;
    }
    let ts = rustix::event::Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: i64::from(limit.subsec_nanos()),
    };
    ctl.1.iter().all(|&fd| {
        // SAFETY: this process's end of a pair (CTL owns it; closed only
        // in a forked child).
        let s = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
        if rustix::net::send(s, b"x", rustix::net::SendFlags::NOSIGNAL).is_err() {
            return true;
        }
        let mut p = [rustix::event::PollFd::new(&s, rustix::event::PollFlags::IN)];
        if !matches!(rustix::event::poll(&mut p, Some(&ts)), Ok(n) if n > 0) {
            return false;
        }
        let mut b = [0u8; 1];
        let _ = rustix::io::read(s, &mut b);
        true
    })
}

/// Warden spawns not yet past `posix_spawn`'s return. glibc's posix_spawn
/// clones with CLONE_VM|CLONE_VFORK but not CLONE_FILES: until the child's
/// execve the child holds a copy of every fd of this process, the XDP
/// link's and the AF_XDP sockets' included (close-on-exec, so its exec
/// drops them). If the application execs meanwhile, its new image finds
/// the interface still held by that copy and its attach is refused
/// (EBUSY/EEXIST: run_procs' listener-across-exec flake, session 20).
static SPAWNING: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Wait (at most `limit`) until no warden spawn is in flight: the shim
/// calls it before the application's exec, posix_spawn, system or popen,
/// so no copy of the engine's fds outlives the old image. A load of one
/// atomic when none is (the usual case); at most one process start and
/// the warden's set-up otherwise (the first TCP stack just before an exec). `false`: still in
/// flight at the limit.
pub fn settle(limit: Duration) -> bool {
    let until = std::time::Instant::now() + limit;
    while SPAWNING.load(std::sync::atomic::Ordering::Acquire) != 0 {
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

/// A warden spawn is in flight (see [`settle`]).
pub fn spawning() -> bool {
    SPAWNING.load(std::sync::atomic::Ordering::Acquire) != 0
}

/// Close `fd` with the raw system call (engine code never enters the
/// shim's `close`).
fn drop_raw(fd: OwnedFd) {
    nanowire_xdp::sys::close(rustix::fd::IntoRawFd::into_raw_fd(fd));
}

/// Block every signal in the calling thread (a process-directed signal
/// must never be delivered to an engine thread).
fn block_signals() {
    // SAFETY: a fresh sigset, filled, applied to this thread only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

/// The warden's fds in the spawned process.
const PIDFD_AT: i32 = 3;
const TABLE_AT: i32 = 4;
const CTL_AT: i32 = 5;
const LINK_AT: i32 = 6;
/// The test hook's FIFO in the spawn child (above every fd the warden is given).
const HOOK_FIFO_AT: i32 = LINK_AT + 1;

/// `nanowire engine warden --pid P --pidfd 3 --table-fd 4`, stdin and
/// stdout /dev/null, stderr the application's, no LD_PRELOAD, signals
/// unblocked and at their defaults; then wait for the set-up process
/// (it exits once the warden is set up and detached).
fn spawn_and_reap(
    bin: &std::path::Path,
    pid: u32,
    pidfd: &OwnedFd,
    table: &OwnedFd,
    link: Option<&(OwnedFd, OwnedFd)>,
) -> Result<(), String> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| "a NUL byte in an argument".to_string());
    let path = cstr(bin.as_os_str().as_bytes())?;
    let mut args = vec![
        path.clone(),
        cstr(b"engine")?,
        cstr(b"warden")?,
        cstr(b"--pid")?,
        cstr(pid.to_string().as_bytes())?,
        cstr(b"--pidfd")?,
        cstr(PIDFD_AT.to_string().as_bytes())?,
        cstr(b"--table-fd")?,
        cstr(TABLE_AT.to_string().as_bytes())?,
    ];
    if link.is_some() {
        args.push(cstr(b"--ctl-fd")?);
        args.push(cstr(CTL_AT.to_string().as_bytes())?);
        args.push(cstr(b"--link-fd")?);
        args.push(cstr(LINK_AT.to_string().as_bytes())?);
    }
    let env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != "LD_PRELOAD")
        .filter_map(|(k, v)| {
            let mut b = k.as_bytes().to_vec();
            b.push(b'=');
            b.extend_from_slice(v.as_bytes());
            CString::new(b).ok()
        })
        .collect();
    let mut argv: Vec<*mut libc::c_char> = args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let mut envp: Vec<*mut libc::c_char> = env.iter().map(|a| a.as_ptr().cast_mut()).collect();
    envp.push(std::ptr::null_mut());
    let null = cstr(b"/dev/null")?;
    // The test hook: the child waits in its open of the FIFO, before its exec.
    let fifo = match &crate::xdp::config::config().test_warden_spawn_fifo {
        Some(f) => Some(cstr(f.as_os_str().as_bytes())?),
        None => None,
    };
    let mut child: libc::pid_t = 0;
    // SAFETY: the file actions and attributes are initialised before use
    // and destroyed after; every pointer passed (path, argv, envp, the
    // /dev/null path, the hook's FIFO) points to a NUL-terminated string that outlives the
    // call; argv and envp end with a null pointer; posix_spawn writes the
    // child's pid into `child`; the dup2 sources are open fds above 16.
    let r = unsafe {
        let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut at: libc::posix_spawnattr_t = std::mem::zeroed();
        libc::posix_spawn_file_actions_init(&mut fa);
        libc::posix_spawnattr_init(&mut at);
        libc::posix_spawn_file_actions_adddup2(&mut fa, pidfd.as_raw_fd(), PIDFD_AT);
        libc::posix_spawn_file_actions_adddup2(&mut fa, table.as_raw_fd(), TABLE_AT);
        if let Some((l, c)) = link {
            libc::posix_spawn_file_actions_adddup2(&mut fa, c.as_raw_fd(), CTL_AT);
            libc::posix_spawn_file_actions_adddup2(&mut fa, l.as_raw_fd(), LINK_AT);
        }
        libc::posix_spawn_file_actions_addopen(&mut fa, 0, null.as_ptr(), libc::O_RDONLY, 0);
        libc::posix_spawn_file_actions_addopen(&mut fa, 1, null.as_ptr(), libc::O_WRONLY, 0);
        if let Some(f) = &fifo {
            libc::posix_spawn_file_actions_addopen(
                &mut fa,
                HOOK_FIFO_AT,
                f.as_ptr(),
                libc::O_RDONLY,
                0,
            );
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigfillset(&mut all);
        libc::posix_spawnattr_setsigmask(&mut at, &none);
        libc::posix_spawnattr_setsigdefault(&mut at, &all);
        libc::posix_spawnattr_setflags(
            &mut at,
            (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
        );
        let r = libc::posix_spawn(
            &mut child,
            path.as_ptr(),
            &fa,
            &at,
            argv.as_ptr(),
            envp.as_ptr(),
        );
        libc::posix_spawn_file_actions_destroy(&mut fa);
        libc::posix_spawnattr_destroy(&mut at);
        r
    };
    if r != 0 {
        return Err(format!(
            "cannot start the warden ({}): {}",
            bin.display(),
            std::io::Error::from_raw_os_error(r)
        ));
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child, writes its status.
        let w = unsafe { libc::waitpid(child, &mut status, 0) };
        if w == child {
            break;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // The application's SIGCHLD handler (or SIG_IGN) reaped the
            // set-up process first: it exits only once the warden is set
            // up, and the warden says so itself if it fails.
            _ => return Ok(()),
        }
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(format!(
            "the warden did not start (wait status {status:#x})"
        ))
    }
}

/// The nanowire binary: `NANOWIRE_BIN`, or this program if it is
/// `nanowire` itself (not a test binary or another program embedding the
/// engine).
fn warden_bin() -> Option<std::path::PathBuf> {
    if let Some(p) = &crate::xdp::config::config().service_bin {
        return Some(p.clone());
    }
    let exe = std::env::current_exe().ok()?;
    (exe.file_name()? == "nanowire").then_some(exe)
}

/// `nanowire engine warden`: set up (the table and the pidfd of `pid`
/// given at `table_fd` and `pidfd`, a raw socket), detach (the caller
/// returns: the process goes on), wait for the process's end, end its
/// connections. Runs in a fresh process (the caller closed every other
/// inherited descriptor). `held`: the socket pair's end and the XDP link
/// (`--ctl-fd`, `--link-fd`), if given.
pub fn run(pid: u32, pidfd: i32, table_fd: i32, held: Option<(i32, i32)>) -> Result<i32, String> {
    let own = |fd: i32, what: &str| {
        if fd < 0 {
            return Err(format!("{what}: no descriptor"));
        }
        // SAFETY: given to this process for it (the spawn's file actions);
        // nothing else here owns it.
        Ok(unsafe { <OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(fd) })
    };
    let tfd = own(table_fd, "connection table")?;
    let pidfd = own(pidfd, "pidfd")?;
    let (mut ctl, mut link) = match held {
        Some((c, l)) => (Some(own(c, "socket pair")?), Some(own(l, "XDP link")?)),
        None => (None, None),
    };
    // A pidfd (of a live or a dead process), not some other descriptor
    // (whose poll would say "ended" at once).
    // SAFETY: pidfd_send_signal with signal 0 only checks; no pointers.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, 0usize, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
        return Err(format!(
            "pidfd {}: not a process's ({})",
            pidfd.as_raw_fd(),
            std::io::Error::last_os_error()
        ));
    }
    let st = rustix::fs::fstat(&tfd).map_err(|e| format!("connection table: {e}"))?;
    if st.st_size as usize != super::conns::TABLE_BYTES {
        return Err("connection table: not the table's size".into());
    }
    let mut ender =
        super::conns::Ender::open().map_err(|e| format!("raw socket (CAP_NET_RAW): {e}"))?;
    // Detach: the set-up process exits (its parent, the application, is
    // waiting for it), the warden goes on in a session of its own.
    // SAFETY: this process has one thread (nothing started any); the child
    // continues with plain system calls and Rust code.
    match unsafe { libc::fork() } {
        -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {}
        // SAFETY: _exit ends the set-up process at once (nothing to flush).
        _ => unsafe { libc::_exit(0) },
    }
    let _ = rustix::process::setsid();
    wait_for_end(&pidfd, pid, &mut ctl, &mut link);
    let [repaired, fin, rst, failed, skipped, left] = end_all(&tfd, &mut ender, link);
    if let Some(note) = ender.note.take() {
        eprintln!("nanowire: warden: {note}");
    }
    if repaired + fin + rst + failed + skipped + left > 0 {
        eprintln!(
            "nanowire: process {pid} ended without closing {} tcp connection(s) (killed?): the warden handed {repaired} to the kernel (it sends the FIN and finishes them), sent FIN for {fin}, RST for {rst}{}{}",
            repaired + fin + rst + failed + skipped + left,
            if failed > 0 {
                format!(", {failed} could not be sent")
            } else {
                String::new()
            },
            if skipped > 0 {
                format!(", {skipped} left to the kernel (live there)")
            } else {
                String::new()
            },
        );
    }
    Ok(0)
}

/// Sleep until the process has exited (its pidfd becomes readable). On
/// the way, `link` goes when the process asks on `ctl` (its exec: the
/// byte is answered once the link is closed) or when its end of the pair
/// closes while it is not exiting (an exec the shim did not see).
fn wait_for_end(pidfd: &OwnedFd, pid: u32, ctl: &mut Option<OwnedFd>, link: &mut Option<OwnedFd>) {
    use rustix::event::{PollFd, PollFlags};
    loop {
        let mut p = [PollFd::new(pidfd, PollFlags::IN)];
        let r = match ctl.as_ref() {
            Some(c) => {
                let mut pc = [
                    PollFd::new(pidfd, PollFlags::IN),
                    PollFd::new(c, PollFlags::IN),
                ];
                let r = rustix::event::poll(&mut pc, None);
                if matches!(r, Ok(n) if n > 0) && pc[0].revents().is_empty() {
                    let mut b = [0u8; 16];
                    let asked = matches!(rustix::io::read(c, &mut b), Ok(n) if n > 0);
                    if asked || !exiting(pid) {
                        // The exec's new image attaches its own program.
                        drop(link.take());
                        if asked {
                            let _ = rustix::net::send(c, b"k", rustix::net::SendFlags::NOSIGNAL);
                        }
                    }
                    // Closed in the death: the link stays for the ends.
                    if !asked {
                        drop(ctl.take());
                    }
                    continue;
                }
                r
            }
            None => rustix::event::poll(&mut p, None),
        };
        match r {
            Ok(n) if n > 0 => return,
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            // Cannot wait (should not happen): look now and then.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Whether process `pid` is exiting (PF_EXITING in its flags, or gone):
/// its descriptors close in its exit, after the flag is set, and a killed
/// process's threads all exit; an exec closes its close-on-exec ones
/// without it.
fn exiting(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // After the command's closing parenthesis: state, ppid, pgrp, session,
    // tty_nr, tpgid, flags.
    let flags = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(6)?.parse::<u64>().ok());
    flags.is_none_or(|f| f & PF_EXITING != 0)
}

/// End every connection of the table: [handed to the kernel, FIN sent,
/// RST sent, failed, skipped because the kernel has a live connection of
/// that 4-tuple, left in FIN-WAIT-2 (nothing to send, no repair)]. In the
/// service's order: every repair socket first, then `link` closed (the
/// program detached: the peer's segments reach the kernel, which now has
/// a socket for each connection it took), then the ends.
fn end_all(tfd: &OwnedFd, ender: &mut super::conns::Ender, link: Option<OwnedFd>) -> [u64; 6] {
    let ends = super::conns::read_all(tfd);
    let mut n = [0u64; 6];
    if ends.is_empty() {
        return n;
    }
    let mut diag = nanowire_xdp::netlink::SockDiag::open().ok();
    let now_ms = (crate::xdp::tcp::now_ns() / 1_000_000) as u32;
    let mut held = Vec::with_capacity(ends.len());
    for e in ends {
        let live = diag.as_mut().is_some_and(|d| {
            matches!(d.tcp_state(e.local, e.remote), Ok(Some(s))
                if s != nanowire_xdp::netlink::TCP_TIME_WAIT && s != nanowire_xdp::netlink::TCP_CLOSE)
        });
        if live {
            n[4] += 1;
        } else {
            held.push(ender.hold(e, super::conns::unacked(tfd, &e), now_ms));
        }
    }
    drop(link);
    for h in held {
        let i = match ender.finish(h, now_ms) {
            super::conns::Ended::Repaired => 0,
            super::conns::Ended::Fin => 1,
            super::conns::Ended::Rst => 2,
            super::conns::Ended::Failed => 3,
            super::conns::Ended::Left => 5,
        };
        n[i] += 1;
    }
    n
}
