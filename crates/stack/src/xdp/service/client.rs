//! The attached process's side of the engine service: connect (starting
//! the service when this process may), attach to an interface, claim and
//! release ports. Raw syscalls (rustix) only: under the LD_PRELOAD shim,
//! libc's socket calls are the shim's.

use super::proto::{self, AttachReply};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Is the engine service asked for (the `service` option,
/// `NANOWIRE_SERVICE=1`, handed over in the process's EngineConfig)?
pub fn wanted() -> bool {
    crate::xdp::config::config().service
}

/// The connection to the service; closing it detaches the process.
pub struct Conn {
    sock: OwnedFd,
}

/// An attach: the connection, the answer, and per queue (memfd, socket).
pub struct Attached {
    pub conn: Conn,
    pub reply: AttachReply,
    pub queues: Vec<(OwnedFd, OwnedFd)>,
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
    Ok(s)
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
    let st = std::process::Command::new(&bin)
        .args(["engine", "serve", "--daemon"])
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot start the engine service ({}): {e}", bin.display()))?;
    if !st.success() {
        return Err(format!(
            "the engine service ({}) did not start: {st}",
            bin.display()
        ));
    }
    Ok(())
}

impl Conn {
    /// Connect to this network namespace's service, starting it if there is
    /// none and this process may.
    pub fn connect() -> Result<Conn, String> {
        match connect_once() {
            Ok(s) => return Ok(Conn { sock: s }),
            Err(rustix::io::Errno::CONNREFUSED) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(format!("engine service: connect: {e}")),
        }
        start_service()?;
        let t0 = Instant::now();
        loop {
            match connect_once() {
                Ok(s) => return Ok(Conn { sock: s }),
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
            Some(Duration::from_secs(10)),
        );
        proto::send(self.sock.as_fd(), msg, fds)
            .map_err(|e| format!("engine service: send: {e}"))?;
        loop {
            match proto::recv(self.sock.as_fd(), max, false) {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => return Err("engine service closed the connection".into()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(format!("engine service: no answer: {e}")),
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

    /// Attach to `iface`.
    pub fn attach(self, iface: &str, ring_depth: u32) -> Result<Attached, String> {
        let m = self.call(&proto::encode_attach(iface, ring_depth), &[], 512)?;
        self.expect_ok(&m)?;
        let reply = proto::decode_attach_reply(&m.bytes)?;
        if m.fds.len() != 2 * reply.queues as usize {
            return Err(format!(
                "engine service: {} descriptors for {} queue(s)",
                m.fds.len(),
                reply.queues
            ));
        }
        let mut it = m.fds.into_iter();
        let mut queues = Vec::new();
        while let (Some(a), Some(b)) = (it.next(), it.next()) {
            queues.push((a, b));
        }
        Ok(Attached {
            conn: self,
            reply,
            queues,
        })
    }

    /// Claim UDP (addr, port); `sock` is the kernel socket holding it.
    pub fn claim(&self, addr: Ipv4Addr, port: u16, sock: BorrowedFd<'_>) -> Result<(), String> {
        let m = self.call(
            &proto::encode_claim(true, proto::PROTO_UDP, addr, port),
            &[sock],
            512,
        )?;
        self.expect_ok(&m)
    }

    pub fn unclaim(&self, addr: Ipv4Addr, port: u16) {
        let _ = self.call(
            &proto::encode_claim(false, proto::PROTO_UDP, addr, port),
            &[],
            512,
        );
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
            .map(|sock| Conn { sock })
            .map_err(|e| format!("no engine service in this network namespace: {e}"))
    }
}
