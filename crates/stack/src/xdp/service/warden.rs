//! Issue 24, kill -9 on an engine of the process's own: the warden.
//!
//! On the engine service a killed process's connections are ended by the
//! service from the process's connection table (`conns.rs`). A process on
//! an engine of its own has no service, and nothing of it runs after
//! SIGKILL: before this, its peers learned nothing (no FIN, no RST) until
//! their own timeout. Now the engine's first TCP stack also makes the
//! table and starts a warden: `nanowire engine warden --pid P --table
//! /proc/P/fd/N`, a small process of its own (detached: its own session,
//! reparented to init, invisible to the application's `wait`), that holds
//! the table, a pidfd of the process and a raw IPv4 socket, and sleeps in
//! `poll` until the process is gone. Then it reads the table and sends each
//! connection's FIN or RST as the service does (the kernel's rule at close:
//! FIN when nothing is lost, RST when data was unread, a connection waited
//! in an accept queue, or written data never left), skipping a 4-tuple the
//! kernel has a live connection for (one handed over at fork), and exits.
//! After a normal exit the table is empty (the shim finished the
//! connections on the way out) and it exits without a word.
//!
//! Cost: one process start (the application waits for the warden to be
//! set up, a few ms) with the first TCP stack, the table's bookkeeping per
//! touched connection (as on the service), no system call on the data
//! path. `NANOWIRE_TCP_WARDEN=0` turns it off (the old behaviour).
//! Limits: exec keeps the pid, so the old image's connections are ended
//! when the new program dies, not at the exec; the warden needs the
//! nanowire binary (`NANOWIRE_BIN`, set by `nanowire run`) and a raw
//! socket (CAP_NET_RAW, which an engine of one's own needs anyway).

use rustix::fd::{AsFd, OwnedFd};
use std::time::Duration;

/// Start the warden of this process for `table` (the connection table's
/// memfd). Returns once it holds what it needs (`true`), `false` when
/// turned off (`NANOWIRE_TCP_WARDEN=0`), or why it cannot start.
pub fn start(table: rustix::fd::BorrowedFd<'_>) -> Result<bool, String> {
    if std::env::var_os("NANOWIRE_TCP_WARDEN").is_some_and(|v| v == "0") {
        return Ok(false);
    }
    let bin = warden_bin().ok_or("the nanowire binary is unknown (set NANOWIRE_BIN)")?;
    let pid = std::process::id();
    let fd = rustix::fd::AsRawFd::as_raw_fd(&table);
    // Its stderr is the application's: it says there what it did, and why
    // it could not start.
    let st = std::process::Command::new(&bin)
        .args([
            "engine",
            "warden",
            "--pid",
            &pid.to_string(),
            "--table",
            &format!("/proc/{pid}/fd/{fd}"),
        ])
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status();
    match st {
        Ok(s) if s.success() => Ok(true),
        Ok(s) => Err(format!("the warden did not start ({s})")),
        // The application's SIGCHLD handler (or SIG_IGN) reaped the set-up
        // process first: it exits only once the warden is set up, and the
        // warden says so itself if it fails.
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Ok(true),
        Err(e) => Err(format!("cannot start the warden ({}): {e}", bin.display())),
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

/// `nanowire engine warden`: set up (the table, a pidfd of `pid`, a raw
/// socket), detach (the caller returns: the process goes on), wait for the
/// process's end, end its connections. Runs in a fresh process (the
/// caller closed inherited descriptors).
pub fn run(pid: u32, table: &str) -> Result<i32, String> {
    let tfd = rustix::fs::open(
        table,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("connection table {table}: {e}"))?;
    let st = rustix::fs::fstat(&tfd).map_err(|e| format!("connection table: {e}"))?;
    if st.st_size as usize != super::conns::TABLE_BYTES {
        return Err("connection table: not the table's size".into());
    }
    let pid_nz = rustix::process::Pid::from_raw(pid as i32).ok_or("pid 0")?;
    let pidfd = rustix::process::pidfd_open(pid_nz, rustix::process::PidfdFlags::empty())
        .map_err(|e| format!("pidfd_open({pid}): {e}"))?;
    let raw = raw_socket()?;
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
    wait_for_end(&pidfd);
    let (fin, rst, failed, skipped) = end_all(&tfd, &raw);
    if fin + rst + failed + skipped > 0 {
        eprintln!(
            "nanowire: process {pid} ended without closing {} tcp connection(s) (killed?): the warden sent FIN for {fin}, RST for {rst}{}{}",
            fin + rst + failed + skipped,
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

fn raw_socket() -> Result<OwnedFd, String> {
    rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::RAW,
        rustix::net::SocketFlags::CLOEXEC,
        Some(rustix::net::ipproto::RAW),
    )
    .map_err(|e| format!("raw socket (CAP_NET_RAW): {e}"))
}

/// Sleep until the process has exited (its pidfd becomes readable).
fn wait_for_end(pidfd: &OwnedFd) {
    loop {
        let mut p = [rustix::event::PollFd::new(
            pidfd,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut p, None) {
            Ok(n) if n > 0 => return,
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            // Cannot wait (should not happen): look now and then.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// End every connection of the table: (FIN sent, RST sent, failed,
/// skipped because the kernel has a live connection of that 4-tuple).
fn end_all(tfd: &OwnedFd, raw: &OwnedFd) -> (u64, u64, u64, u64) {
    let ends = super::conns::read_all(tfd);
    let (mut fin, mut rst, mut failed, mut skipped) = (0, 0, 0, 0);
    if ends.is_empty() {
        return (0, 0, 0, 0);
    }
    let mut diag = nanowire_xdp::netlink::SockDiag::open().ok();
    let now_ms = (crate::xdp::tcp::now_ns() / 1_000_000) as u32;
    for e in ends {
        let live = diag.as_mut().is_some_and(|d| {
            matches!(d.tcp_state(e.local, e.remote), Ok(Some(s))
                if s != nanowire_xdp::netlink::TCP_TIME_WAIT && s != nanowire_xdp::netlink::TCP_CLOSE)
        });
        if live {
            skipped += 1;
            continue;
        }
        match super::conns::send_end(raw.as_fd(), &e, now_ms) {
            Ok(()) if e.rst() => rst += 1,
            Ok(()) => fin += 1,
            Err(_) => failed += 1,
        }
    }
    (fin, rst, failed, skipped)
}
