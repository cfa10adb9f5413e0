//! nanowire engines behind one datagram-socket contract:
//!
//! * `kernel`: kernel UDP sockets, blocking in `recv` (what sockperf does);
//! * `spin`: kernel UDP sockets, non-blocking, polled without sleeping;
//! * `xdp`: AF_XDP kernel bypass, a user-space UDP/IPv4 path.
//!
//! Callers (the bench, the preload shim) open sockets with [`open_udp`] and
//! use [`UdpEndpoint`] without caring which engine serves them; TCP streams
//! and listeners of every engine meet the [`TcpEndpoint`] and
//! [`TcpAcceptor`] contracts (kernel `TcpStream`/`TcpListener`, and
//! `xdp::XdpTcpStream`/`XdpTcpListener`).

pub mod kernel;
pub mod repair;
pub mod sockaddr;
pub mod xdp;

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

/// Which engine serves a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Kernel,
    Spin,
    Xdp,
}

impl EngineKind {
    pub const ALL: [EngineKind; 3] = [EngineKind::Kernel, EngineKind::Spin, EngineKind::Xdp];
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Kernel => "kernel",
            EngineKind::Spin => "spin",
            EngineKind::Xdp => "xdp",
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kernel" => Ok(EngineKind::Kernel),
            "spin" => Ok(EngineKind::Spin),
            "xdp" => Ok(EngineKind::Xdp),
            o => Err(format!(
                "unknown engine {o:?}: expected kernel, spin or xdp"
            )),
        }
    }
}

/// How a receive waits when nothing is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Sleep in the kernel until data arrives.
    Block,
    /// Poll forever without sleeping.
    Spin,
    /// Poll for the given time, then sleep.
    SpinThenBlock(Duration),
}

/// Options for opening a socket on an engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub kind: EngineKind,
    pub wait: WaitPolicy,
    /// Interface for the xdp engine; derived from the bind address when `None`.
    pub iface: Option<String>,
    /// Ring depth (frames) for the xdp engine's RX/fill rings.
    pub ring_depth: u32,
    /// When the xdp engine cannot be used, fall back to `spin` (after saying why
    /// on stderr) instead of failing.
    pub fallback: bool,
    /// Kernel socket receive buffer (SO_RCVBUF) in bytes; `None` keeps the default.
    pub rcvbuf: Option<usize>,
    /// Kernel socket send buffer (SO_SNDBUF) in bytes; `None` keeps the default.
    pub sndbuf: Option<usize>,
    /// The kernel socket a TCP connect adopts holds the kernel's defaults
    /// for IP_TTL and IP_TOS (the caller knows nothing set either): the
    /// engine's values, read once from the first such socket, serve
    /// instead of two getsockopt calls per connect. `false`: read them from
    /// the socket.
    pub ip_header_default: bool,
    /// The kernel socket a TCP connect adopts does not have SO_REUSEADDR
    /// (the caller knows nothing set it): no getsockopt per connect.
    /// `false`: read it from the socket.
    pub reuseaddr_unset: bool,
}

impl EngineOptions {
    pub fn new(kind: EngineKind) -> EngineOptions {
        EngineOptions {
            kind,
            wait: match kind {
                EngineKind::Kernel => WaitPolicy::Block,
                EngineKind::Spin | EngineKind::Xdp => WaitPolicy::Spin,
            },
            iface: None,
            ring_depth: 16384,
            fallback: true,
            rcvbuf: None,
            sndbuf: None,
            ip_header_default: false,
            reuseaddr_unset: false,
        }
    }
}

/// Per-socket counters, all monotonically increasing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SocketStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Datagrams dropped because this socket's queue was full.
    pub rx_drop_queue_full: u64,
}

/// One UDP socket on some engine. Implementations: kernel/spin in
/// [`kernel`], AF_XDP in `xdp`.
pub trait UdpEndpoint: Send {
    /// The engine actually serving this socket (after any fallback).
    fn engine(&self) -> EngineKind;
    /// Why the requested engine was not used, if it fell back.
    fn fallback_reason(&self) -> Option<&str> {
        None
    }
    fn local_addr(&self) -> io::Result<SocketAddrV4>;
    /// Ask for receive stamps (xdp engine: `CLOCK_REALTIME` ns when the
    /// engine took the frame off its RX ring); others have none.
    fn set_rx_stamping(&mut self, _on: bool) {}
    /// The receive stamp of the datagram the last receive returned (0:
    /// none: stamping off, the kernel path, or an engine without stamps).
    fn last_rx_stamp(&self) -> u64 {
        0
    }
    /// Default destination for `send`.
    fn connect(&mut self, peer: SocketAddrV4) -> io::Result<()>;
    fn send_to(&mut self, buf: &[u8], dst: SocketAddrV4) -> io::Result<usize>;
    /// Send several datagrams to one destination with as few kernel
    /// crossings as the engine allows; returns how many were queued.
    fn send_batch_to(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            match self.send_to(b, dst) {
                Ok(_) => n += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && n > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
    /// Wait (per the socket's policy) for one datagram until `deadline`;
    /// `Ok(None)` when the deadline passed first. `None` waits forever.
    fn recv_from(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<(usize, SocketAddrV4)>>;
    /// Never waits.
    fn try_recv_from(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddrV4)>>;
    /// Join an IPv4 multicast group on the interface with address `iface_addr`.
    fn join_multicast(&mut self, group: Ipv4Addr, iface_addr: Ipv4Addr) -> io::Result<()>;
    fn stats(&self) -> SocketStats;
    /// Engine-level counters by name (drops by reason, kernel ring
    /// statistics, high-water marks such as `peak_rx_ring`), followed by
    /// this socket's own as `socket.<name>`. Empty for engines without any.
    fn engine_counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// One TCP connection on some engine, the stream counterpart of
/// [`UdpEndpoint`]: `Read`/`Write` never wait (`WouldBlock` instead; a
/// kernel stream is set non-blocking by its opener), and one way to wait.
/// Implementations: `std::net::TcpStream` (kernel and spin engines) and
/// [`xdp::XdpTcpStream`].
pub trait TcpEndpoint: io::Read + io::Write {
    /// Wait until the stream may be readable (`write`: writable) or
    /// `timeout` passes. A hint: the next call may still say `WouldBlock`.
    fn wait_io(&self, write: bool, timeout: Duration) -> io::Result<()>;
    fn set_nodelay(&self, on: bool) -> io::Result<()>;
    fn peer_addr(&self) -> io::Result<SocketAddrV4>;
}

/// A listening TCP socket on some engine, polled without waiting.
/// Implementations: a non-blocking `std::net::TcpListener` and
/// [`xdp::XdpTcpListener`].
pub trait TcpAcceptor {
    type Stream: TcpEndpoint;
    /// The next established connection and its peer, if one waits.
    fn try_accept(&self) -> io::Result<Option<(Self::Stream, SocketAddrV4)>>;
    fn local_addr(&self) -> io::Result<SocketAddrV4>;
}

fn v4(a: std::net::SocketAddr) -> io::Result<SocketAddrV4> {
    match a {
        std::net::SocketAddr::V4(a) => Ok(a),
        std::net::SocketAddr::V6(_) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "an IPv6 address (nanowire is IPv4 only)",
        )),
    }
}

impl TcpEndpoint for std::net::TcpStream {
    fn wait_io(&self, write: bool, timeout: Duration) -> io::Result<()> {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let flags = if write { PollFlags::OUT } else { PollFlags::IN };
        let mut fds = [PollFd::new(self, flags)];
        let ts = Timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
    fn set_nodelay(&self, on: bool) -> io::Result<()> {
        std::net::TcpStream::set_nodelay(self, on)
    }
    fn peer_addr(&self) -> io::Result<SocketAddrV4> {
        v4(std::net::TcpStream::peer_addr(self)?)
    }
}

impl TcpAcceptor for std::net::TcpListener {
    type Stream = std::net::TcpStream;
    fn try_accept(&self) -> io::Result<Option<(std::net::TcpStream, SocketAddrV4)>> {
        match self.accept() {
            Ok((s, peer)) => Ok(Some((s, v4(peer)?))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
    fn local_addr(&self) -> io::Result<SocketAddrV4> {
        v4(std::net::TcpListener::local_addr(self)?)
    }
}

/// Open a UDP socket bound to `bind` on the engine `opts.kind` asks for.
pub fn open_udp(bind: SocketAddrV4, opts: &EngineOptions) -> io::Result<Box<dyn UdpEndpoint>> {
    match opts.kind {
        EngineKind::Kernel | EngineKind::Spin => Ok(Box::new(kernel::KernelUdp::bind(bind, opts)?)),
        EngineKind::Xdp => open_xdp(bind, opts),
    }
}

/// The xdp arm of [`open_udp`]: an AF_XDP socket, or (when the engine
/// cannot be used and `opts.fallback` allows) a `spin` kernel socket after
/// one line on stderr saying why; `fallback_reason()` returns that line.
fn open_xdp(bind: SocketAddrV4, opts: &EngineOptions) -> io::Result<Box<dyn UdpEndpoint>> {
    xdp::fallback::open_endpoint(bind, opts, |b, o| {
        Ok(Box::new(kernel::KernelUdp::bind(b, o)?) as Box<dyn UdpEndpoint>)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// The stream and listener contracts on the kernel engine (loopback,
    /// no privilege): non-blocking accept and read, one wait, data both
    /// ways.
    #[test]
    fn kernel_streams_meet_the_tcp_contract() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        assert!(l.try_accept().unwrap().is_none(), "nobody yet");
        let port = TcpAcceptor::local_addr(&l).unwrap().port();
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_nonblocking(true).unwrap();
        let (mut s, peer) = loop {
            if let Some(x) = l.try_accept().unwrap() {
                break x;
            }
            std::thread::yield_now();
        };
        assert_eq!(peer, v4(c.local_addr().unwrap()).unwrap());
        assert_eq!(TcpEndpoint::peer_addr(&c).unwrap().port(), port);
        s.set_nonblocking(true).unwrap();
        TcpEndpoint::set_nodelay(&s, true).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(
            s.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        c.write_all(b"ping").unwrap();
        s.wait_io(false, Duration::from_secs(5)).unwrap();
        assert_eq!(s.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"ping");
        s.wait_io(true, Duration::from_secs(5)).unwrap();
        s.write_all(b"pong").unwrap();
        c.wait_io(false, Duration::from_secs(5)).unwrap();
        assert_eq!(c.read(&mut buf).unwrap(), 4);
    }

    #[test]
    fn engine_names_parse_back() {
        for k in EngineKind::ALL {
            assert_eq!(k.as_str().parse::<EngineKind>(), Ok(k));
        }
        assert!("dpdk".parse::<EngineKind>().is_err());
    }
}
