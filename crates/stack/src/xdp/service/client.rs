//! The attached process's side of the engine service: connect (starting
//! the service when this process may), attach to an interface, claim and
//! release ports. Raw syscalls (rustix) only: under the LD_PRELOAD shim,
//! libc's socket calls are the shim's.

use super::proto::{self, AttachReply};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

/// Is the engine service asked for (the `service` option,
/// `NANOWIRE_SERVICE=1`, handed over in the process's EngineConfig)?
pub fn wanted() -> bool {
    crate::xdp::config::config().service
}

/// The connection to the service; closing it detaches the process.
pub struct Conn {
    sock: OwnedFd,
    /// The interface's program is the one without xdp.frags (generic
    /// mode): ask for the other at the first multi-buffer packet
    /// ([`Conn::want_frags`]).
    frags_lazy: bool,
    /// Answers still due to requests whose wait ended without one (the
    /// 10 s timeout): read and discarded before the next request's, so
    /// that no request takes an earlier one's answer for its own.
    owed: std::sync::atomic::AtomicU32,
    /// How long a request waits for its answer.
    timeout: Duration,
}

/// An attach: the connection, the answer, per queue ((UMEM file,
/// control memfd), member socket), and the steering program's count of
/// frames redirected per socket (`None` from an older service).
pub struct Attached {
    pub conn: Conn,
    pub reply: AttachReply,
    pub queues: Vec<((OwnedFd, OwnedFd), OwnedFd)>,
    pub ready: Option<OwnedFd>,
}

/// Test hook (issue 23, `NANOWIRE_TEST_ATTACH_STOP=STEP`, read once): the
/// process stops itself (SIGSTOP) at that step of attaching to the service,
/// for a test to kill it there (`engine_service
/// a_process_killed_at_each_step_of_attaching_leaves_nothing_behind`):
/// `connected` (connected, nothing sent), `asked` (the attach request sent,
/// its answer unread), `answered` (the answer and its descriptors received,
/// nothing mapped), `built` (the engine built on them, rings mapped, before
/// its first claim), `claiming` (a claim and its socket sent, the answer
/// unread).
pub(crate) fn test_stop(step: &str) {
    static STOP: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = STOP.get_or_init(|| std::env::var("NANOWIRE_TEST_ATTACH_STOP").ok());
    if at.as_deref() == Some(step) {
        eprintln!("nanowire: test hook: stopped at attach step {step}");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::STOP);
    }
}

fn connect_once() -> rustix::io::Result<OwnedFd> {
    let s = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let addr = SocketAddrUnix::new_abstract_name(proto::SOCKET_NAME)?;
    rustix::net::connect(&s, &addr)?;
    // Above the program's numbers, as the engine's other fds: a program
    // that dup2()s onto a low number (a launcher putting a socket on fd 4)
    // must not replace the connection, nor have its socket closed as ours.
    Ok(nanowire_xdp::sys::above_floor(s))
}

/// The nanowire binary to start the service with, if known.
fn nanowire_bin() -> Option<std::path::PathBuf> {
    if let Some(p) = &crate::xdp::config::config().service_bin {
        return Some(p.clone());
    }
    let exe = std::env::current_exe().ok()?;
    exe.file_name()?
        .to_str()?
        .starts_with("nanowire")
        .then_some(exe)
}

/// Start `nanowire engine serve --daemon` (it detaches itself); only root
/// can run the service.
fn start_service() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("no engine service runs in this network namespace (an operator starts it as root: `nanowire engine serve --daemon`)".into());
    }
    let bin = nanowire_bin().ok_or(
        "no engine service runs in this network namespace, and the nanowire binary to start one is unknown (set NANOWIRE_BIN)",
    )?;
    let mut child = std::process::Command::new(&bin)
        .args(["engine", "serve", "--daemon"])
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the engine service ({}): {e}", bin.display()))?;
    let st = match child.wait() {
        Ok(st) => st,
        // The program ignores SIGCHLD (a forking server often does): the
        // kernel reaped the starter, whose status is gone; whether the
        // service runs, the connect after this says.
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => return Ok(()),
        Err(e) => {
            return Err(format!(
                "cannot start the engine service ({}): {e}",
                bin.display()
            ));
        }
    };
    if !st.success() {
        return Err(format!(
            "the engine service ({}) did not start: {st}",
            bin.display()
        ));
    }
    Ok(())
}

impl Conn {
    fn of(sock: OwnedFd) -> Conn {
        Conn {
            sock,
            frags_lazy: false,
            owed: std::sync::atomic::AtomicU32::new(0),
            timeout: Duration::from_secs(10),
        }
    }

    /// Connect to this network namespace's service, starting it if there is
    /// none and this process may.
    pub fn connect() -> Result<Conn, String> {
        match connect_once() {
            Ok(s) => {
                test_stop("connected");
                return Ok(Conn::of(s));
            }
            Err(rustix::io::Errno::CONNREFUSED) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(format!("engine service: connect: {e}")),
        }
        start_service()?;
        let t0 = Instant::now();
        loop {
            match connect_once() {
                Ok(s) => {
                    test_stop("connected");
                    return Ok(Conn::of(s));
                }
                Err(e) if t0.elapsed() > Duration::from_secs(3) => {
                    return Err(format!("engine service started but does not answer: {e}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    fn call(
        &self,
        msg: &[u8],
        fds: &[BorrowedFd<'_>],
        max: usize,
    ) -> Result<proto::Received, String> {
        let _ = rustix::net::sockopt::set_socket_timeout(
            &self.sock,
            rustix::net::sockopt::Timeout::Recv,
            Some(self.timeout),
        );
        use std::sync::atomic::Ordering::Relaxed;
        while self.owed.load(Relaxed) > 0 {
            match proto::recv(self.sock.as_fd(), 64, false) {
                Ok(Some(_)) => {
                    self.owed.fetch_sub(1, Relaxed);
                }
                Ok(None) => return Err("engine service closed the connection".into()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(format!(
                        "engine service: an earlier request is still unanswered: {e}"
                    ));
                }
            }
        }
        proto::send(self.sock.as_fd(), msg, fds)
            .map_err(|e| format!("engine service: send: {e}"))?;
        match proto::kind(msg) {
            Ok(proto::K_ATTACH) => test_stop("asked"),
            Ok(proto::K_CLAIM) => test_stop("claiming"),
            _ => {}
        }
        loop {
            match proto::recv(self.sock.as_fd(), max, false) {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => return Err("engine service closed the connection".into()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    // Its answer may still come: the next request skips it.
                    self.owed.fetch_add(1, Relaxed);
                    return Err(format!("engine service: no answer: {e}"));
                }
            }
        }
    }

    /// `Ok` with the answer's body, or the service's reason.
    fn expect_ok(&self, m: &proto::Received) -> Result<(), String> {
        match proto::kind(&m.bytes) {
            Ok(proto::K_OK) => Ok(()),
            Ok(proto::K_ERR) => Err(String::from_utf8_lossy(&m.bytes[8..]).into_owned()),
            _ => Err("engine service: malformed answer".into()),
        }
    }

    /// A request answered by `K_OK` (`Ok`) or the service's reason.
    fn request(&self, msg: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), String> {
        let m = self.call(msg, fds, 512)?;
        self.expect_ok(&m)
    }

    /// Claim (`fd`: the kernel socket holding the port) or unclaim (no fd)
    /// `proto`'s (addr, port), with the claim's `flags`.
    fn claim_request(
        &self,
        proto: u8,
        flags: u8,
        addr: Ipv4Addr,
        port: u16,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), String> {
        let msg = proto::encode_claim_flags(fd.is_some(), proto, flags, addr, port);
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        self.request(&msg, &fds)
    }

    /// Attach to `iface`.
    pub fn attach(mut self, iface: &str, ring_depth: u32) -> Result<Attached, String> {
        let m = self.call(&proto::encode_attach(iface, ring_depth), &[], 512)?;
        test_stop("answered");
        self.expect_ok(&m)?;
        let reply = proto::decode_attach_reply(&m.bytes)?;
        let per_queue = proto::ATTACH_FDS_PER_QUEUE * reply.queues as usize;
        if m.fds.len() != per_queue && m.fds.len() != per_queue + 1 {
            return Err(format!(
                "engine service: {} descriptors for {} queue(s)",
                m.fds.len(),
                reply.queues
            ));
        }
        self.frags_lazy = reply.frags_lazy;
        // Above the program's numbers too (see `connect_once`).
        let mut fds: Vec<OwnedFd> = m
            .fds
            .into_iter()
            .map(nanowire_xdp::sys::above_floor)
            .collect();
        let ready = (fds.len() > per_queue).then(|| fds.pop()).flatten();
        let mut it = fds.into_iter();
        let mut queues = Vec::new();
        while let (Some(umem), Some(ctl), Some(xsk)) = (it.next(), it.next(), it.next()) {
            queues.push(((umem, ctl), xsk));
        }
        Ok(Attached {
            conn: self,
            reply,
            queues,
            ready,
        })
    }

    /// Claim UDP (addr, port); `sock` is the kernel socket holding it.
    pub fn claim(&self, addr: Ipv4Addr, port: u16, sock: BorrowedFd<'_>) -> Result<(), String> {
        self.claim_request(proto::PROTO_UDP, 0, addr, port, Some(sock))
    }

    pub fn unclaim(&self, addr: Ipv4Addr, port: u16) {
        let _ = self.claim_request(proto::PROTO_UDP, 0, addr, port, None);
    }

    /// Claim a TCP listener's (addr, port): every segment for it (its
    /// connections') comes to this process; `sock` is the kernel socket
    /// holding the port.
    pub fn claim_tcp_listener(
        &self,
        addr: Ipv4Addr,
        port: u16,
        sock: BorrowedFd<'_>,
    ) -> Result<(), String> {
        self.claim_request(proto::PROTO_TCP, 0, addr, port, Some(sock))
    }

    /// Claim a port of the process's client port block (every segment for
    /// it comes here, as for a listener); `sock`: the socket holding it
    /// alone, which the service keeps while the claim lasts.
    pub fn claim_client_port(
        &self,
        addr: Ipv4Addr,
        port: u16,
        sock: BorrowedFd<'_>,
    ) -> Result<(), String> {
        let flags = proto::CLAIM_CLIENT_PORT;
        self.claim_request(proto::PROTO_TCP, flags, addr, port, Some(sock))
    }

    pub fn unclaim_tcp_listener(&self, addr: Ipv4Addr, port: u16) {
        let _ = self.claim_request(proto::PROTO_TCP, 0, addr, port, None);
    }

    /// Join the listener group of TCP (addr, port) (issue 24): `sock` is
    /// this process's copy of the listening socket the claim holds (a
    /// forked worker's); new connections are spread over the group's
    /// accepting members, this process among them.
    pub fn tcp_join(&self, addr: Ipv4Addr, port: u16, sock: BorrowedFd<'_>) -> Result<(), String> {
        self.request(&proto::encode_tcp_group(true, addr, port), &[sock])
    }

    /// Stop accepting from the listener group of TCP (addr, port) for now.
    pub fn tcp_idle(&self, addr: Ipv4Addr, port: u16) -> Result<(), String> {
        self.request(&proto::encode_tcp_group(false, addr, port), &[])
    }

    /// Claim one TCP connection (`Flow`; `sock`: the kernel socket holding
    /// `local`'s port, or none under this process's own listener claim) or
    /// give it to the kernel under this process's listener (`Pass`).
    pub fn tcp_flow(
        &self,
        what: proto::TcpFlow,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        sock: Option<BorrowedFd<'_>>,
    ) -> Result<(), String> {
        let fds: Vec<BorrowedFd<'_>> = sock.into_iter().collect();
        self.request(&proto::encode_tcp_flow(Some(what), local, remote), &fds)
    }

    /// Move the TCP connection (local, remote) between two processes
    /// holding its socket `sock` (`K_TCP_MOVE`): the owner offers it
    /// (`take` false), then the other takes it (`take` true: its copy of the
    /// same socket), and the service steers it to the taker.
    pub fn tcp_move(
        &self,
        take: bool,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        sock: BorrowedFd<'_>,
    ) -> Result<(), String> {
        self.request(&proto::encode_tcp_move(take, local, remote), &[sock])
    }

    pub fn tcp_unflow(&self, local: SocketAddrV4, remote: SocketAddrV4) {
        let _ = self.call(&proto::encode_tcp_flow(None, local, remote), &[], 512);
    }

    /// Hand the service this process's TCP connection table (conns.rs).
    pub fn conn_table(&self, fd: BorrowedFd<'_>) -> Result<(), String> {
        self.request(&proto::encode_conn_table(), &[fd])
    }

    /// Hand the service this process's stats page (`fd`: a sealed memfd)
    /// to read for `nanowire stats`.
    pub fn stats_page(&self, fd: BorrowedFd<'_>) -> Result<(), String> {
        self.request(&proto::encode_stats_page(), &[fd])
    }

    /// Whether the interface's program can still be replaced by the
    /// frags-aware one ([`Conn::want_frags`]).
    pub fn frags_lazy(&self) -> bool {
        self.frags_lazy
    }

    /// This process received a multi-buffer packet: ask the service for
    /// the frags-aware program (once; `Ok` when it is in place).
    pub fn want_frags(&mut self) -> Result<(), String> {
        if !self.frags_lazy {
            return Ok(());
        }
        self.frags_lazy = false;
        self.request(&proto::encode_frags(), &[])
    }

    /// The service's status (JSON text).
    pub fn status(&self) -> Result<String, String> {
        let m = self.call(&proto::encode_status(), &[], 1 << 20)?;
        match proto::kind(&m.bytes) {
            Ok(proto::K_STATUS_REPLY) => Ok(String::from_utf8_lossy(&m.bytes[8..]).into_owned()),
            Ok(proto::K_ERR) => Err(String::from_utf8_lossy(&m.bytes[8..]).into_owned()),
            _ => Err("engine service: malformed answer".into()),
        }
    }

    /// Send raw bytes (tests: garbage must be refused, not crash anything);
    /// returns the service's answer text, if any.
    pub fn raw(&self, bytes: &[u8]) -> Result<String, String> {
        let m = self.call(bytes, &[], 4096)?;
        Ok(String::from_utf8_lossy(m.bytes.get(8..).unwrap_or_default()).into_owned())
    }

    /// The control socket (its closing detaches the process).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Connect without starting anything (status, tests).
    pub fn connect_existing() -> Result<Conn, String> {
        connect_once()
            .map(Conn::of)
            .map_err(|e| format!("no engine service in this network namespace: {e}"))
    }
}

/// What the process runs when an engine service it was attached to is gone
/// (the LD_PRELOAD shim: take its sockets on that engine off it, so their
/// kernel sockets carry on). Set once, at load.
static ON_LOST: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Set what runs when an engine's service is gone (once; later calls are
/// ignored). It runs on a thread of its own, with every signal blocked.
pub fn set_service_lost_hook(f: fn()) {
    let _ = ON_LOST.set(f);
}

/// The engine's neighbour thread watches the control socket of an engine
/// attached to the service: a hang-up means the service died (or was
/// stopped). Its XDP program and claims went with it (the program's link is
/// the service's), so every frame goes to the kernel again, where each
/// claimed port has the kernel socket that held it: the engine is marked
/// lost, says so at the default log level, and the hook moves the sockets
/// to their kernel sockets (their queued datagrams first). The process's
/// next engine on the interface attaches to a restarted service.
pub(crate) struct Watch {
    fd: std::os::fd::RawFd,
    lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
    iface: String,
}

impl Watch {
    pub(crate) fn new(
        conn: &Conn,
        lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
        iface: &str,
    ) -> Watch {
        Watch {
            fd: std::os::fd::AsRawFd::as_raw_fd(&conn.sock),
            lost,
            iface: iface.to_string(),
        }
    }

    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.fd
    }

    /// The control socket hung up (the neighbour thread saw it).
    pub(crate) fn lost(self) {
        self.lost.store(true, std::sync::atomic::Ordering::Release);
        eprintln!(
            "nanowire: {}: the engine service is gone (its XDP program and claims went with it): \
             this process's sockets on it fall back to their kernel sockets",
            self.iface
        );
        // The service's process, while it may still be exiting: a dying
        // process closes its descriptors in order, the control sockets
        // before the program's link, so for a moment the program may still
        // steer frames to this process's AF_XDP sockets.
        let pid = rustix::net::sockopt::socket_peercred(
            // SAFETY: the engine's open control socket, borrowed for the call
            // (the engine, which owns it, outlives its neighbour thread).
            unsafe { BorrowedFd::borrow_raw(self.fd) },
        )
        .ok()
        .map(|c| c.pid);
        if let Some(&f) = ON_LOST.get() {
            // Not on the neighbour thread: the hook may drop the engine's
            // last reference, whose drop joins that thread.
            let r = std::thread::Builder::new()
                .name("nanowire-svclost".into())
                .stack_size(256 * 1024)
                .spawn(move || {
                    if let Some(pid) = pid {
                        wait_exit(pid);
                    }
                    f()
                });
            if let Err(e) = r {
                eprintln!(
                    "nanowire: {}: cannot start the thread that takes sockets off the lost engine \
                     service ({e}); they stay on it, and what they receive comes through their \
                     kernel sockets",
                    self.iface
                );
            }
        }
    }
}

/// Wait (at most a second) until process `pid` has exited (its descriptors,
/// and with them the XDP program's link, are closed by then). A service
/// that only closed this connection (it detached the process: its claims
/// and sockets are out of the program already) does not exit: the wait
/// just ends.
fn wait_exit(pid: rustix::process::Pid) {
    let Ok(pfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return; // gone already (or no pidfd on this kernel)
    };
    let mut p = [libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&pfd),
        events: libc::POLLIN,
        revents: 0,
    }];
    nanowire_xdp::sys::poll(&mut p, 1000);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request whose answer came too late (the service was stopped, or
    /// slow) must not leave that answer to the next request: every later
    /// request would take its predecessor's answer for its own.
    #[test]
    fn a_late_answer_is_never_taken_for_the_next_requests() {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let mut c = Conn::of(a);
        c.timeout = Duration::from_millis(100);
        let (go, late) = std::sync::mpsc::channel::<()>();
        let stub = std::thread::spawn(move || {
            let first = proto::recv(b.as_fd(), 512, false).unwrap().unwrap();
            assert_eq!(first.bytes, b"request one");
            late.recv().unwrap();
            proto::send(b.as_fd(), b"answer: one", &[]).unwrap();
            let second = proto::recv(b.as_fd(), 512, false).unwrap().unwrap();
            assert_eq!(second.bytes, b"request two");
            proto::send(b.as_fd(), b"answer: two", &[]).unwrap();
        });
        let e = c.raw(b"request one").unwrap_err();
        assert!(e.contains("no answer"), "{e}");
        go.send(()).unwrap();
        assert_eq!(c.raw(b"request two").unwrap(), "two");
        stub.join().unwrap();
    }
}
