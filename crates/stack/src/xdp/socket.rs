//! The socket API and its wait policy: [`XdpSocket`].
//!
//! Receiving pops an owned frame from the socket's queue (polling the rings
//! when it is empty) under the RX lock, releases the lock, and only then
//! runs the caller's closure on the frame: a closure may send, receive on
//! another socket, or block without holding up anyone. The frame goes back
//! to the fill ring when the closure is done with it.
//!
//! Every socket has a kernel twin: a kernel UDP socket bound to the same
//! address. It reserves the port against kernel users, picks ephemeral
//! ports, makes the kernel answer IGMP for multicast joins, and carries
//! what the rings do not: loopback traffic, datagrams to destinations not
//! behind the engine's interface, fragmented datagrams (the steering
//! program passes fragments to the kernel, which reassembles them for the
//! twin; datagrams larger than the MTU are sent through it, and the kernel
//! fragments them). [`XdpSocket::open`] makes and owns the twin;
//! [`XdpSocket::adopt`] uses the caller's own bound socket.

use super::Engine;
use super::classify::PROTO_UDP;
use super::demux::{Delivery, EndpointId, EndpointKind};
use super::device::stamp::TxStamp;
use super::neigh::{Hop, Lookup, Queued};
use super::rx::RX_BUDGET;
use super::shm::{self, E, S, add, bump};
use super::tx::{HDRS, IP_HDR, IpHeader, Ready, UDP_HDR, Wire};
use crate::kernel::set_opt;
use crate::{EngineKind, EngineOptions, SocketStats, UdpEndpoint, WaitPolicy};
use nanowire_probe::{self as probe, Mark};
use nanowire_xdp::iface;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Empty `recv_batch` calls between two looks at the kernel twin.
const KERNEL_CHECK_EVERY: u32 = 4096;
/// Calls of `recv_batch` (turns of `recv_with`) answered without the RX
/// lock (nothing arrived, see `Engine::rx_wait_quiet`) before one takes it
/// and polls anyway (the RX path's idle upkeep: fragment expiry, kernel
/// counters).
const QUIET_LOOK_EVERY: u32 = 64;
/// Time between two looks at the kernel twin while `recv_with` spins.
const KERNEL_CHECK_INTERVAL: Duration = Duration::from_micros(200);

fn io_err(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

/// Why the xdp engine could not be used (an engine-level failure, as
/// opposed to a socket-level one such as "address in use").
#[derive(Debug)]
pub enum OpenError {
    /// No privilege, no AF_XDP, attach refused, queue busy, forked child
    /// while the parent's engine owns the interface, ...
    Engine(String),
    /// The socket itself failed (bad address, port in use, not bound).
    Socket(io::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Engine(s) => f.write_str(s),
            OpenError::Socket(e) => write!(f, "{e}"),
        }
    }
}

/// The socket's kernel twin.
enum Twin {
    /// Made by `open`, closed with the socket.
    Owned(UdpSocket),
    /// The caller's socket (`adopt`): never closed or duplicated by us.
    Adopted(RawFd),
}

impl Twin {
    fn fd(&self) -> RawFd {
        match self {
            Twin::Owned(s) => s.as_raw_fd(),
            Twin::Adopted(fd) => *fd,
        }
    }
}

use nanowire_xdp::sys::eventfd;

use crate::sockaddr::{from_sockaddr_in, sockaddr_in};
use nanowire_xdp::sys::{self, eventfd_drain};

fn kernel_socket(bind: SocketAddrV4, reuse: bool) -> io::Result<UdpSocket> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket(2); ownership passes to UdpSocket right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let s = unsafe { UdpSocket::from_raw_fd(fd) };
    if reuse {
        let _ = set_opt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32);
    }
    let sa = sockaddr_in(bind);
    // SAFETY: sa is a valid sockaddr_in of the size given.
    if unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(s)
}

/// The bound IPv4 address of `fd`.
fn local_of(fd: RawFd) -> io::Result<SocketAddrV4> {
    // SAFETY: zeroed sockaddr_in is valid; getsockname fills it.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: sa/len describe a writable buffer of the right size.
    if unsafe { libc::getsockname(fd, (&mut sa as *mut libc::sockaddr_in).cast(), &mut len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if i32::from(sa.sin_family) != libc::AF_INET {
        return Err(io_err(io::ErrorKind::InvalidInput, "not an IPv4 socket"));
    }
    Ok(from_sockaddr_in(&sa))
}

/// IP_ADD_MEMBERSHIP / IP_DROP_MEMBERSHIP on a kernel socket.
fn membership(fd: RawFd, add: bool, group: Ipv4Addr, ifaddr: Ipv4Addr) -> io::Result<()> {
    let m = libc::ip_mreq {
        imr_multiaddr: libc::in_addr {
            s_addr: u32::from(group).to_be(),
        },
        imr_interface: libc::in_addr {
            s_addr: u32::from(ifaddr).to_be(),
        },
    };
    let opt = if add {
        libc::IP_ADD_MEMBERSHIP
    } else {
        libc::IP_DROP_MEMBERSHIP
    };
    set_opt(fd, libc::IPPROTO_IP, opt, &m)
}

/// A UDP socket on the xdp engine.
pub struct XdpSocket {
    engine: Arc<Engine>,
    id: EndpointId,
    local: SocketAddrV4,
    /// Unicast addresses claimed in the steering program for this socket.
    claims: Vec<Ipv4Addr>,
    /// Multicast groups joined.
    groups: Vec<Ipv4Addr>,
    peer: Option<SocketAddrV4>,
    wait: WaitPolicy,
    twin: Twin,
    kcheck: u32,
    /// The engine's delivery count when this socket last found its queue
    /// empty (`None`: it may hold something), and the calls answered since
    /// without the RX lock (see `recv_batch_ts`).
    rx_seen: Option<u64>,
    quiet: u32,
    /// The next `recv_batch_ts` is a turn of a wait that spins alone on
    /// the engine (set by `idle_peek`, used once): it polls under the RX
    /// lock rather than answering from the quiet look
    /// (`Engine::rx_spin_alone`).
    direct: bool,
    /// The eventfd of this socket's endpoint (owned there, valid while we live).
    wake_fd: RawFd,
    /// Last destination: (address, neighbour generation, hop).
    hop: Option<(Ipv4Addr, u64, Hop)>,
    /// The datagrams the last receive delivered (their frames go back at
    /// the next receive: `recv_batch_ts`, `recv_with`), and its reused
    /// vector.
    batch: Vec<Delivery>,
    /// Counted in the engine's receive-stamp users (`RxStamps::users`) (receive stamps wanted).
    rx_stamping: bool,
    /// Receive stamp of the datagram `recv_with` returned last.
    last_rx: u64,
    /// Transmit stamps wanted: the request handed to the TX path per send.
    tx_stamp: Option<TxStamp>,
    /// IP_TTL, IP_MULTICAST_TTL, IP_TOS of the kernel twin (the
    /// application's socket when adopted), written into every header.
    hdr: IpHeader,
    /// The headers of the last destination this socket sent to through
    /// the rings, built once and patched per datagram, and the key they are
    /// ready for (see [`Ready`]; `None`: the next send takes the general
    /// path, which builds them).
    ready: Option<Ready>,
    /// The longest datagram the rings carry (`fits`): the interface MTU's
    /// payload, and one frame's without multi-buffer.
    fit_max: usize,
}

/// The int value of IPPROTO_IP option `name` of the kernel socket `fd`.
pub(crate) fn ip_int_opt(fd: RawFd, name: libc::c_int) -> Option<libc::c_int> {
    int_opt(fd, libc::IPPROTO_IP, name)
}

/// An int option of socket `fd` (`None`: the getsockopt failed).
pub(crate) fn int_opt(fd: RawFd, level: libc::c_int, name: libc::c_int) -> Option<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int out-buffer and its length.
    let r = unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &mut l) };
    (r == 0).then_some(v)
}

/// The IP header fields the options of the kernel socket `fd` set.
fn ip_header_of(fd: RawFd) -> IpHeader {
    let get = |name| ip_int_opt(fd, name);
    let d = IpHeader::default();
    IpHeader {
        ttl: get(libc::IP_TTL).map_or(d.ttl, |v| v.clamp(1, 255) as u8),
        // IP_MULTICAST_TTL reads back as one byte or an int; 0 is valid.
        mcast_ttl: get(libc::IP_MULTICAST_TTL).map_or(d.mcast_ttl, |v| (v & 0xff) as u8),
        tos: get(libc::IP_TOS).map_or(d.tos, |v| v as u8),
    }
}

impl XdpSocket {
    /// Open a socket bound to `bind` on the engine of `opts.iface` (or the
    /// interface owning the bind address). The socket makes and owns its
    /// kernel twin.
    pub fn open(bind: SocketAddrV4, opts: &EngineOptions) -> Result<XdpSocket, OpenError> {
        let engine = engine_for(*bind.ip(), opts)?;
        XdpSocket::check_addr(&engine, *bind.ip())?;
        let twin = kernel_socket(bind, bind.ip().is_multicast()).map_err(OpenError::Socket)?;
        if let Some(b) = opts.rcvbuf {
            let _ = set_int(twin.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, b);
        }
        if let Some(b) = opts.sndbuf {
            let _ = set_int(twin.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, b);
        }
        let mut s = XdpSocket::attach(engine, Twin::Owned(twin), opts.wait)?;
        if let Some(b) = opts.rcvbuf {
            s.set_rcvbuf(b);
        }
        Ok(s)
    }

    /// Put the caller's own kernel UDP socket `fd`, already bound, on the
    /// engine of `opts.iface` (or the interface owning its address), as
    /// the socket's kernel twin (port reservation, loopback and fragment
    /// path). The engine neither owns nor duplicates `fd`: the caller
    /// guarantees it stays open, and is not closed, while the `XdpSocket`
    /// lives. Receives from it use MSG_DONTWAIT; sends through it (large
    /// datagrams, non-XDP destinations) use the socket's own blocking mode.
    /// `connect` and multicast joins are not applied to `fd`: the caller
    /// does that on its own socket (the shim passes the application's
    /// calls through).
    pub fn adopt(fd: RawFd, opts: &EngineOptions) -> Result<XdpSocket, OpenError> {
        let local = local_of(fd).map_err(OpenError::Socket)?;
        if local.port() == 0 {
            return Err(OpenError::Socket(io_err(
                io::ErrorKind::InvalidInput,
                "adopt: the socket is not bound",
            )));
        }
        let engine = engine_for(*local.ip(), opts)?;
        XdpSocket::check_addr(&engine, *local.ip())?;
        XdpSocket::attach(engine, Twin::Adopted(fd), opts.wait)
    }

    /// Hold the engine that [`XdpSocket::adopt`] would put a socket bound
    /// to `ip` onto (`opts.iface`, or the interface of `ip`), opening it if
    /// no one has: for a caller that decides under a lock of its own and
    /// opens the engine before taking it (the open makes netlink requests,
    /// attaches the program and may wait up to a second for an AF_XDP
    /// queue a just-exited process leaves). While the returned handle
    /// lives, `adopt` finds the engine open; a failed open is remembered by
    /// the registry, so `adopt` answers the same at once.
    pub fn engine_ahead(ip: Ipv4Addr, opts: &EngineOptions) -> Result<EngineHold, OpenError> {
        engine_for(ip, opts).map(|e| EngineHold { _engine: e })
    }

    /// Open a socket on an existing engine.
    pub fn open_on(
        engine: Arc<Engine>,
        bind: SocketAddrV4,
        wait: WaitPolicy,
    ) -> Result<XdpSocket, OpenError> {
        XdpSocket::check_addr(&engine, *bind.ip())?;
        let twin = kernel_socket(bind, bind.ip().is_multicast()).map_err(OpenError::Socket)?;
        XdpSocket::attach(engine, Twin::Owned(twin), wait)
    }

    fn check_addr(engine: &Engine, ip: Ipv4Addr) -> Result<(), OpenError> {
        if !engine.is_own() {
            return Err(OpenError::Engine(
                "the engine belongs to the parent process (fork)".into(),
            ));
        }
        if ip.is_unspecified() || ip.is_multicast() || engine.rx().own.contains(&ip) {
            return Ok(());
        }
        Err(OpenError::Socket(io_err(
            io::ErrorKind::AddrNotAvailable,
            format!("{ip} is not the address of {}", engine.iface.name),
        )))
    }

    fn attach(engine: Arc<Engine>, twin: Twin, wait: WaitPolicy) -> Result<XdpSocket, OpenError> {
        let local = local_of(twin.fd()).map_err(OpenError::Socket)?;
        let wake = eventfd().map_err(OpenError::Socket)?;
        let wake_fd = wake.as_raw_fd();
        let (id, claims) = {
            let mut g = engine.rx();
            // A wildcard bind claims every IPv4 address of the interface.
            let claims: Vec<Ipv4Addr> = if local.ip().is_unspecified() {
                if g.own.is_empty() {
                    match engine.iface.addr {
                        Some(a) => vec![a],
                        None => {
                            return Err(OpenError::Engine(format!(
                                "{} has no IPv4 address",
                                engine.iface.name
                            )));
                        }
                    }
                } else {
                    g.own.clone()
                }
            } else {
                vec![*local.ip()]
            };
            let id = g
                .demux
                .add(EndpointKind::Udp, wake, shm::MAX_SOCKETS)
                .ok_or_else(|| {
                    OpenError::Socket(io_err(
                        io::ErrorKind::OutOfMemory,
                        format!(
                            "the xdp engine supports at most {} sockets",
                            shm::MAX_SOCKETS
                        ),
                    ))
                })?;
            engine.page.set_sock_addr(id, Some(local));
            bump(engine.page.e(E::Sockets), 1);
            (id, claims)
        };
        let mut s = XdpSocket {
            engine,
            id,
            local,
            claims: Vec::new(),
            groups: Vec::new(),
            peer: None,
            wait,
            twin,
            kcheck: 0,
            rx_seen: None,
            quiet: 0,
            direct: false,
            wake_fd,
            hop: None,
            batch: Vec::new(),
            rx_stamping: false,
            last_rx: 0,
            tx_stamp: None,
            hdr: IpHeader::default(),
            ready: None,
            fit_max: 0,
        };
        s.fit_max = {
            let e = &s.engine;
            let mtu = (e.iface.mtu as usize).saturating_sub(IP_HDR + UDP_HDR);
            if e.multi_buffer {
                mtu
            } else {
                mtu.min(e.frame_size.saturating_sub(HDRS))
            }
        };
        s.hdr = ip_header_of(s.twin.fd());
        {
            let mut p = s.engine.prog();
            for ip in claims {
                p.claim(ip, local.port(), s.twin.fd())
                    .map_err(OpenError::Engine)?;
                s.claims.push(ip);
            }
        }
        s.engine.rx().demux.bind(id, PROTO_UDP, local);
        Ok(s)
    }

    pub fn engine_handle(&self) -> &Arc<Engine> {
        &self.engine
    }

    #[inline]
    fn own(&self) -> io::Result<()> {
        if self.engine.is_own() {
            Ok(())
        } else {
            Err(io_err(
                io::ErrorKind::Other,
                "xdp socket inherited through fork: its engine belongs to the parent process",
            ))
        }
    }

    /// Frames this socket may hold from now on: SO_RCVBUF semantics (the
    /// kernel doubles the value; each datagram costs one UMEM frame), and
    /// never more than the socket's share of the UMEM.
    pub fn set_rcvbuf(&mut self, bytes: usize) {
        if self.own().is_err() {
            return;
        }
        let frames = (bytes.saturating_mul(2) / self.engine.frame_size).max(1);
        if let Some(e) = self.engine.rx().demux.get_mut(self.id) {
            e.rcvbuf_frames = frames;
        }
    }

    /// Datagrams this socket may queue now (its SO_RCVBUF and UMEM share).
    pub fn queue_capacity(&self) -> usize {
        self.engine.rx().demux.cap(self.id)
    }

    /// Receive one datagram without copying: `f` sees the payload in its
    /// frame, after the engine's locks are released (it may send, or use
    /// other sockets). The frame stays with the socket until its next
    /// receive (as `recv_batch_ts`'s): a ping-pong's reply goes out before
    /// the frame's return (the recycle lock) is paid, not after.
    pub fn recv_with<R>(
        &mut self,
        deadline: Option<Instant>,
        mut f: impl FnMut(&[u8], SocketAddrV4) -> R,
    ) -> io::Result<Option<R>> {
        self.own()?;
        // What the last receive delivered goes back now (see above).
        self.batch.clear();
        // The clock is read only once the socket has to wait: a datagram
        // already there costs no clock read.
        let mut start: Option<Instant> = None;
        let mut next_kcheck: Option<Instant> = None;
        let mut spins: u32 = 0;
        loop {
            // An idle turn that sees nothing delivered since this socket
            // last found its queue empty, nothing on the rings and no frame
            // to give back takes no lock and does not poll (a few loads and
            // the RX prefetch: `Engine::rx_wait_quiet`), as
            // `recv_batch_ts`'s: a datagram that lands meanwhile is found
            // within a turn of ~20 instructions instead of one with the RX
            // lock's two atomics and a poll through the device wrappers.
            let quiet = self.rx_seen.is_some_and(|mark| {
                self.quiet < QUIET_LOOK_EVERY && self.engine.rx_wait_quiet(mark)
            });
            let d = if quiet {
                self.quiet += 1;
                None
            } else {
                self.quiet = 0;
                let mut g = self.engine.rx();
                let d = g.pop_or_poll(self.id);
                // Marked only when the queue was found empty (the mark is
                // read under the RX lock, after that attempt).
                self.rx_seen = match d {
                    None => self.engine.rx_mark(&g),
                    Some(_) => None,
                };
                d
            };
            if let Some(d) = d {
                self.last_rx = d.stamp;
                let r = f(d.payload(), d.src);
                // Held until the next receive (or the socket's end); a
                // panic in `f` drops it as before.
                self.batch.push(d);
                return Ok(Some(r));
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) || matches!(self.wait, WaitPolicy::Block) {
                let now = Instant::now();
                let start = *start.get_or_insert(now);
                let next = next_kcheck.get_or_insert(now + KERNEL_CHECK_INTERVAL);
                // The kernel twin costs a syscall: look at most every
                // KERNEL_CHECK_INTERVAL while spinning (and after each sleep).
                if now >= *next {
                    *next = now + KERNEL_CHECK_INTERVAL;
                    self.last_rx = 0;
                    if let Some(r) = self.try_kernel(&mut f)? {
                        return Ok(Some(r));
                    }
                }
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                }
                let sleep = match self.wait {
                    WaitPolicy::Spin => false,
                    WaitPolicy::Block => true,
                    WaitPolicy::SpinThenBlock(d) => now.duration_since(start) >= d,
                };
                if sleep {
                    let ms = deadline
                        .map(|d| {
                            d.saturating_duration_since(now)
                                .as_millis()
                                .min(super::MAX_SLEEP_MS as u128) as i32
                        })
                        .unwrap_or(super::MAX_SLEEP_MS)
                        .max(1);
                    // Announce the sleep under the lock, unless a datagram
                    // arrived for us meanwhile (another thread drained it).
                    let may_sleep = {
                        let mut g = self.engine.rx();
                        match g.demux.get_mut(self.id) {
                            Some(e) if e.queue.is_empty() => {
                                e.sleeping = true;
                                true
                            }
                            _ => false,
                        }
                    };
                    if may_sleep {
                        self.engine.wait_fds(&[self.twin.fd(), self.wake_fd], ms);
                        if let Some(e) = self.engine.rx().demux.get_mut(self.id) {
                            e.sleeping = false;
                            e.signalled = false;
                        }
                        eventfd_drain(self.wake_fd);
                        self.last_rx = 0;
                        if let Some(r) = self.try_kernel(&mut f)? {
                            return Ok(Some(r));
                        }
                    }
                    continue;
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Receive up to `max` queued datagrams without waiting, zero-copy;
    /// `f` runs after the engine's locks are released.
    pub fn recv_batch(&mut self, max: usize, mut f: impl FnMut(&[u8], SocketAddrV4)) -> usize {
        self.recv_batch_ts(max, |p, src, _| f(p, src))
    }

    /// [`XdpSocket::recv_batch`] with each datagram's receive stamp
    /// (`CLOCK_REALTIME` ns when the engine took the frame off its RX ring;
    /// 0 when stamping was off at the time, or for a datagram that took the
    /// kernel path: see [`XdpSocket::set_rx_stamping`]).
    pub fn recv_batch_ts(
        &mut self,
        max: usize,
        mut f: impl FnMut(&[u8], SocketAddrV4, u64),
    ) -> usize {
        if self.own().is_err() {
            return 0;
        }
        // The frames of what the last call delivered go back now: after
        // the caller acted on them (a ping-pong's reply is out), not on
        // the way to it (the return costs the recycle lock).
        self.batch.clear();
        // Nothing delivered to anyone since this socket last found its
        // queue empty, and nothing on the rings: its queue is still empty,
        // no need for the RX lock (a spinning reader's idle turn is then a
        // few loads instead of the lock and a poll).
        // (Not for a wait's turn that spins alone on the engine: that one
        // polls, see `idle_peek`.)
        let direct = std::mem::take(&mut self.direct);
        if let Some(mark) = self.rx_seen
            && !direct
            && self.quiet < QUIET_LOOK_EVERY
            && self.engine.rx_wait_quiet(mark)
        {
            self.quiet += 1;
            return self.nothing(&mut f);
        }
        self.quiet = 0;
        let mut mark = None;
        let mut batch = std::mem::take(&mut self.batch);
        {
            // What is queued first; the rings only when that is not enough
            // (polling regardless would grow the queue by a budget per call
            // for a reader taking one at a time, up to its cap: drops).
            let mut g = self.engine.rx();
            // Fields borrowed apart (no clone of the stats page's Arc: two
            // atomic read-modify-writes per call).
            let rx = &mut *g;
            let mut polled = false;
            while batch.len() < max {
                match rx.demux.pop(self.id, &rx.page) {
                    Some(d) => batch.push(d),
                    None if !polled => {
                        // The queue is empty: this socket's frames the
                        // poll finds come straight into the batch (up to
                        // its room; the rest are queued behind them), not
                        // through the queue (a push and a pop each).
                        polled = true;
                        let room = max - batch.len();
                        rx.poll_own(RX_BUDGET, Some(self.id), room, |d, _| batch.push(d));
                    }
                    None => {
                        mark = self.engine.rx_mark(rx);
                        break;
                    }
                }
            }
            if mark.is_none() && rx.demux.get(self.id).is_some_and(|e| e.queue.is_empty()) {
                // A full batch that took the last one queued drained the
                // queue as well: marked, so that the next calls (a
                // ping-pong reader's, after its reply) find it still empty
                // without the lock, the pop and the poll (from the turn
                // after the one that gave this frame back:
                // `Engine::rx_wait_quiet`).
                mark = self.engine.rx_mark(rx);
            }
        }
        probe::mark(Mark::UdpUnlocked);
        // Marked only when the queue was drained empty (a full batch may
        // have left some queued).
        self.rx_seen = mark;
        let n = batch.len();
        if n == 0 {
            self.batch = batch;
            return self.nothing(&mut f);
        }
        for d in &batch {
            f(d.payload(), d.src, d.stamp);
        }
        // The frames stay with the socket until its next receive (above)
        // or its end; a panic in `f` drops the batch with them.
        self.batch = batch;
        n
    }

    /// The address datagrams for this socket were sent to: its bound one,
    /// or for a wildcard bind the first address it claimed (what a
    /// datagram handed to the kernel again is addressed to: [`udp_packet`]).
    pub fn delivered_to(&self) -> SocketAddrV4 {
        match self.claims.first() {
            Some(ip) if self.local.ip().is_unspecified() => {
                SocketAddrV4::new(*ip, self.local.port())
            }
            _ => self.local,
        }
    }

    /// Hand the socket over to its kernel twin without losing a datagram
    /// (the shim takes a socket off the engine: an option the engine cannot
    /// honour, a fork, a port shared with another process). In this order:
    /// the steering program stops sending the socket's addresses to the
    /// engine (from then on they reach the twin); an RCU grace period makes
    /// sure every frame it had already redirected is on the rings; the
    /// rings are drained into the demux and everything queued for this
    /// socket goes to `f` (payload, source, receive stamp), oldest first;
    /// then the endpoint is removed. Returns the datagrams handed to `f`.
    /// (Dropping the socket instead discards what it had queued.) In a
    /// process that inherited the socket through fork nothing is touched.
    pub fn hand_to_kernel(mut self, mut f: impl FnMut(&[u8], SocketAddrV4, u64)) -> usize {
        if self.own().is_err() {
            return 0;
        }
        {
            let mut p = self.engine.prog();
            for ip in self.claims.drain(..).chain(self.groups.drain(..)) {
                p.unclaim(ip, self.local.port());
            }
        }
        // Where the kernel refuses the grace period (nohz_full), a frame
        // still in flight on another CPU may reach the ring after the drain:
        // it is then counted as `drop_no_socket`, never lost silently.
        let _ = sys::rcu_grace_period();
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear(); // the last receive's frames (delivered already)
        let mut n = 0;
        loop {
            let more = {
                let mut g = self.engine.rx();
                let page = g.page.clone();
                while let Some(d) = g.demux.pop(self.id, &page) {
                    batch.push(d);
                }
                let polled = g.poll(RX_BUDGET);
                while let Some(d) = g.demux.pop(self.id, &page) {
                    batch.push(d);
                }
                polled > 0
            };
            n += batch.len();
            for d in batch.drain(..) {
                f(d.payload(), d.src, d.stamp);
            }
            if !more {
                break;
            }
        }
        self.batch = batch;
        n
    }

    /// A `recv_batch_ts` that found nothing on the engine: every
    /// KERNEL_CHECK_EVERY such calls, a look at the kernel twin.
    /// Inline: a spinning reader's empty turn ends here (a counter); the
    /// look itself is out of line.
    #[inline(always)]
    fn nothing(&mut self, f: &mut impl FnMut(&[u8], SocketAddrV4, u64)) -> usize {
        self.kcheck = self.kcheck.wrapping_add(1);
        if self.kcheck >= KERNEL_CHECK_EVERY {
            self.kcheck = 0;
            return self.kernel_look(f);
        }
        0
    }

    /// A waiting receiver's idle turns without the caller's lock on this
    /// socket (a spinning receive of the shim): `peek` is made (on first
    /// use) or renewed after a [`XdpSocket::recv_batch_ts`] that found
    /// nothing, and answers [`IdlePeek::coast`] with no lock until the
    /// next such call, which counts the turns it answered as calls of its
    /// own (the RX path's idle upkeep every `QUIET_LOOK_EVERY` and the
    /// look at the kernel twin every `KERNEL_CHECK_EVERY` keep their pace
    /// in turns). Call it before and after every `recv_batch_ts` of the
    /// wait: before, it takes back the turns; after one that found
    /// nothing, it arms the peek (disarmed otherwise: the next turn calls
    /// `recv_batch_ts`). One reference to the engine per wait that coasts
    /// (the peek keeps the rings' mappings alive whatever another thread
    /// does to this socket meanwhile: drop it before the wait blocks
    /// elsewhere); none for a wait alone on the engine, which never coasts.
    pub fn idle_peek(&mut self, peek: &mut Option<IdlePeek>) {
        if let Some(p) = peek.as_mut() {
            let used = p.used;
            p.used = 0;
            p.left = 0;
            self.quiet = self.quiet.saturating_add(used);
            self.kcheck = self.kcheck.saturating_add(used);
            if p.engine
                .as_ref()
                .is_some_and(|e| !Arc::ptr_eq(e, &self.engine))
            {
                *peek = None;
            }
        }
        let Some(mark) = self.rx_seen else {
            return;
        };
        if self.engine.rx_hint.is_none() || self.own().is_err() {
            return;
        }
        // Up to the turn that takes the RX lock anyway, or looks at the
        // kernel twin (both in `recv_batch_ts`).
        let left = QUIET_LOOK_EVERY
            .saturating_sub(self.quiet)
            .min(KERNEL_CHECK_EVERY.saturating_sub(self.kcheck.saturating_add(1)));
        // A wait that spins alone on the engine (looked at once, when the
        // wait makes its peek) does not coast: each of its turns polls
        // under the RX lock (`Engine::rx_spin_alone`), in `recv_batch_ts`
        // too, and its peek holds no engine reference (no atomic).
        let p = peek.get_or_insert_with(|| IdlePeek {
            engine: (!self.engine.rx_spin_alone()).then(|| self.engine.clone()),
            mark,
            left: 0,
            used: 0,
        });
        p.mark = mark;
        self.direct = p.engine.is_none();
        p.left = if self.direct { 0 } else { left };
    }

    #[inline(never)]
    fn kernel_look(&mut self, f: &mut impl FnMut(&[u8], SocketAddrV4, u64)) -> usize {
        match self.try_kernel(&mut |p: &[u8], src| f(p, src, 0)) {
            Ok(Some(())) => 1,
            _ => 0,
        }
    }

    /// Receive stamps on or off for this socket. While any socket of the
    /// engine has them on, the engine reads `CLOCK_REALTIME` once per frame
    /// as it takes the frame off the RX ring (before classification).
    pub fn set_rx_stamping(&mut self, on: bool) {
        if on == self.rx_stamping || self.own().is_err() {
            return;
        }
        let mut g = self.engine.rx();
        if on {
            g.dev.users += 1;
        } else {
            g.dev.users = g.dev.users.saturating_sub(1);
        }
        self.rx_stamping = on;
    }

    /// Transmit stamps on or off for this socket (`frame`: keep a copy of
    /// the frame sent, for `MSG_ERRQUEUE` without `OPT_TSONLY`).
    pub fn set_tx_stamping(&mut self, on: bool, frame: bool) {
        self.tx_stamp = on.then(|| TxStamp {
            want_frame: frame,
            ..TxStamp::default()
        });
    }

    /// After a send with transmit stamping on: the stamp (`CLOCK_REALTIME`
    /// ns when the kick that handed the frame to the driver returned) and
    /// the frame, if the last send went through the ring; `None` if it did
    /// not (kernel path, neighbour not resolved yet, stamping off).
    pub fn last_tx_stamp(&self) -> Option<(u64, &[u8])> {
        let s = self.tx_stamp.as_ref()?;
        (s.at != 0).then_some((s.at, s.frame.as_slice()))
    }

    /// With transmit stamps on: the `OPT_ID` key of the next datagram (a
    /// datagram that takes the kernel path carries it in `SCM_TS_OPT_ID`),
    /// and forget the last stamp.
    pub fn set_tx_key(&mut self, key: Option<u32>) {
        if let Some(s) = self.tx_stamp.as_mut() {
            s.key = key;
            s.at = 0;
        }
    }

    /// One datagram from the kernel twin, if any (syscalls: called only
    /// every KERNEL_CHECK_EVERY empty polls, or after a sleep).
    fn try_kernel<R>(
        &mut self,
        f: &mut impl FnMut(&[u8], SocketAddrV4) -> R,
    ) -> io::Result<Option<R>> {
        let fd = self.twin.fd();
        // The length first (MSG_TRUNC reports the whole datagram).
        // SAFETY: a zero-length peek on a socket fd; no buffer is written.
        let n = unsafe {
            sys::recvfrom(
                fd,
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT | libc::MSG_PEEK | libc::MSG_TRUNC,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            // Nothing, or an ICMP error reported on the socket (consumed).
            return Ok(None);
        }
        let mut buf = vec![0u8; n as usize];
        // SAFETY: zeroed sockaddr_in is valid; recvfrom fills it.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: buf and sa/len are valid writable buffers of the sizes given.
        let got = unsafe {
            sys::recvfrom(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                (&mut sa as *mut libc::sockaddr_in).cast(),
                &mut len,
            )
        };
        if got < 0 || i32::from(sa.sin_family) != libc::AF_INET {
            return Ok(None);
        }
        let got = got as usize;
        let p = &self.engine.page;
        add(p.s(self.id, S::RxPackets), 1);
        add(p.s(self.id, S::RxBytes), got as u64);
        add(p.s(self.id, S::RxKernelPath), 1);
        Ok(Some(f(&buf[..got.min(buf.len())], from_sockaddr_in(&sa))))
    }

    /// How `dst` is reached, from the socket's cache (one atomic load) or
    /// the neighbour table (learning it without waiting when unknown).
    fn lookup(&mut self, dst: Ipv4Addr) -> io::Result<Lookup> {
        let n = &self.engine.neigh;
        let g = n.generation();
        if let Some((ip, seen, h)) = self.hop
            && ip == dst
            && seen == g
        {
            return Ok(Lookup::Ready(h));
        }
        let mut l = n.lookup(dst);
        if l == Lookup::Unknown {
            n.learn(dst)?;
            l = n.lookup(dst);
        }
        if let Lookup::Ready(h) = l {
            self.hop = Some((dst, g, h));
        }
        Ok(l)
    }

    /// Fits the rings (else the kernel twin sends it, fragmenting if needed).
    #[inline]
    fn fits(&self, len: usize) -> bool {
        len <= self.fit_max
    }

    /// One datagram to `dst`. The straight line when the socket's headers
    /// are ready for `dst` ([`Ready`]: its last destination through the
    /// rings, no neighbour or route change since, no stamps): the TX lock,
    /// [`TxPath::send_one`]. Otherwise [`XdpSocket::send_many`], which
    /// looks the next hop up, builds the headers and makes them ready.
    #[inline]
    pub fn send_one(&mut self, buf: &[u8], dst: SocketAddrV4) -> io::Result<usize> {
        probe::mark(Mark::UdpSendIn);
        if let Some(r) = &self.ready
            && buf.len() <= self.fit_max
            && r.is_for(dst, || self.engine.neigh.generation())
            && self.tx_stamp.is_none()
            && self.engine.is_own()
        {
            let mut tx = self.engine.tx();
            probe::mark(Mark::UdpTxLocked);
            return match tx.send_one(buf, &r.t, self.id) {
                Ok(()) => Ok(buf.len()),
                Err(e) => Err(self.tx_error(e)),
            };
        }
        self.send_many(&[buf], dst).map(|_| buf.len())
    }

    /// A transmit error as the socket reports it: `WouldBlock` (ring full)
    /// as is, others naming the interface.
    #[cold]
    fn tx_error(&self, e: io::Error) -> io::Error {
        if e.kind() == io::ErrorKind::WouldBlock {
            e
        } else {
            io::Error::new(
                e.kind(),
                format!("{} cannot transmit: {e}", self.engine.iface.name),
            )
        }
    }

    /// Send several datagrams to `dst` with as few kicks as possible.
    /// Returns how many were queued.
    pub fn send_many(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        self.own()?;
        if !bufs.iter().all(|b| self.fits(b.len())) {
            // Datagrams larger than the MTU payload go through the kernel
            // twin (the kernel fragments them); the rest as usual.
            let mut n = 0;
            for b in bufs {
                let r = if self.fits(b.len()) {
                    self.send_many(&[b], dst)
                } else {
                    self.send_kernel(&[b], dst)
                };
                match r {
                    Ok(_) => n += 1,
                    Err(e) if n == 0 => return Err(e),
                    Err(_) => break,
                }
            }
            return Ok(n);
        }
        match self.lookup(*dst.ip())? {
            Lookup::Ready(Hop::Xdp { src, mac }) => {
                let src_ip = if self.local.ip().is_unspecified() || self.local.ip().is_multicast() {
                    src
                } else {
                    *self.local.ip()
                };
                let w = Wire {
                    src: SocketAddrV4::new(src_ip, self.local.port()),
                    dst,
                    mac,
                };
                // The headers: the socket's last ones if built for the
                // same, else new; ready for `dst` at the generation the hop
                // was looked up at.
                let seen = self.hop.map_or(0, |(_, g, _)| g);
                let mac = self.engine.iface.mac;
                let t = Ready::keep(&mut self.ready, mac, w, self.hdr, seen);
                let r = match self.tx_stamp.as_mut() {
                    None => self.engine.tx().send_hdr(bufs, t, self.id),
                    Some(req) => {
                        let mut tx = self.engine.tx();
                        let mut st = std::mem::take(req);
                        st.at = 0;
                        st.frame.clear();
                        tx.dev.req = Some(st);
                        let r = tx.send_hdr(bufs, t, self.id);
                        *req = tx.dev.req.take().unwrap_or_default();
                        r
                    }
                };
                r.map(|s| s.n).map_err(|e| self.tx_error(e))
            }
            Lookup::Ready(Hop::Kernel) => self.send_kernel(bufs, dst),
            // With transmit stamps on, a datagram that would wait for the
            // neighbour goes through the kernel twin, which resolves it and
            // stamps it when it leaves (on the twin's error queue, under the
            // same OPT_ID key).
            Lookup::Pending if self.tx_stamp.is_some() => self.send_kernel(bufs, dst),
            // The neighbour queue writes default headers: a socket with its
            // own TTL/TOS sends through the kernel twin (which has them)
            // until the neighbour is known.
            Lookup::Pending if self.hdr != IpHeader::default() => self.send_kernel(bufs, dst),
            Lookup::Pending => {
                // As the kernel: success now, the datagram waits for the
                // neighbour (a few per neighbour, then counted drops).
                let src_ip = if self.local.ip().is_unspecified() {
                    self.engine.iface.addr.unwrap_or(Ipv4Addr::UNSPECIFIED)
                } else {
                    *self.local.ip()
                };
                for (i, b) in bufs.iter().enumerate() {
                    let q = Queued {
                        src: SocketAddrV4::new(src_ip, self.local.port()),
                        dst,
                        slot: self.id,
                        payload: b.to_vec(),
                    };
                    if self.engine.neigh.enqueue(q).is_err() {
                        // Resolved meanwhile: the rest goes out directly.
                        return self.send_many(&bufs[i..], dst).map(|n| i + n);
                    }
                }
                Ok(bufs.len())
            }
            Lookup::Failed | Lookup::Unknown => {
                if self.peer == Some(dst) {
                    return Err(io_err(
                        io::ErrorKind::HostUnreachable,
                        format!("no route to host {} (neighbour unresolved)", dst.ip()),
                    ));
                }
                self.engine.neigh.count_drop(self.id, bufs.len() as u64);
                Ok(bufs.len())
            }
        }
    }

    /// Send through the kernel twin.
    fn send_kernel(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        let fd = self.twin.fd();
        let sa = sockaddr_in(dst);
        let mut n = 0;
        for b in bufs {
            let key = self.tx_stamp.as_ref().and_then(|t| t.key);
            let r = match key {
                // Transmit stamps under the key the shim's counter gave.
                Some(k) => sys::sendto_tskey(fd, b, 0, &sa, k),
                // SAFETY: b and sa are valid buffers of the sizes given.
                None => unsafe {
                    sys::sendto(
                        fd,
                        b.as_ptr().cast(),
                        b.len(),
                        0,
                        (&sa as *const libc::sockaddr_in).cast(),
                        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    )
                },
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if n == 0 {
                    return Err(e);
                }
                break;
            }
            let p = &self.engine.page;
            add(p.s(self.id, S::TxPackets), 1);
            add(p.s(self.id, S::TxBytes), b.len() as u64);
            add(p.s(self.id, S::TxKernelPath), 1);
            n += 1;
        }
        Ok(n)
    }

    /// The socket's kernel twin: a real fd number for fd-based code, and
    /// the path for loopback, fragmented and non-XDP traffic.
    pub fn kernel_fd(&self) -> RawFd {
        self.twin.fd()
    }

    /// Descriptors that become readable when a datagram may be waiting for
    /// this socket on the rings: the engine's AF_XDP sockets and this
    /// socket's wake-up eventfd. The kernel twin is not included (the
    /// caller adds it, [`XdpSocket::kernel_fd`]). A readable fd is a hint,
    /// [`XdpSocket::pending`] is the answer.
    pub fn poll_fds(&self) -> Vec<RawFd> {
        let mut v = self.engine.fds.clone();
        v.push(self.wake_fd);
        v
    }

    /// Drain the rings and report (queued datagrams, length of the next
    /// one) without consuming anything. Does not look at the kernel twin.
    pub fn pending(&self) -> (usize, usize) {
        if self.own().is_err() {
            return (0, 0);
        }
        let mut g = self.engine.rx();
        if g.demux.get(self.id).is_some_and(|e| e.queue.is_empty()) {
            g.poll(RX_BUDGET);
        }
        match g.demux.get(self.id) {
            Some(e) => (
                e.queue.len(),
                e.queue.front().map_or(0, |d| d.payload_len as usize),
            ),
            None => (0, 0),
        }
    }

    /// The connected peer, if any.
    pub fn peer(&self) -> Option<SocketAddrV4> {
        self.peer
    }
    /// Send to the connected peer.
    pub fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        let p = self
            .peer
            .ok_or_else(|| io_err(io::ErrorKind::NotConnected, "socket is not connected"))?;
        self.send_to(buf, p)
    }

    /// Read IP_TTL, IP_MULTICAST_TTL and IP_TOS again from the kernel twin
    /// (after the application set one on its socket) for the headers the
    /// engine writes.
    pub fn sync_ip_header(&mut self) {
        self.hdr = ip_header_of(self.twin.fd());
        self.ready = None;
    }

    /// Leave a multicast group joined with `join_multicast`.
    pub fn leave_multicast(&mut self, group: Ipv4Addr, iface_addr: Ipv4Addr) -> io::Result<()> {
        self.own()?;
        let Some(i) = self.groups.iter().position(|g| *g == group) else {
            return Err(io_err(
                io::ErrorKind::AddrNotAvailable,
                format!("not a member of {group}"),
            ));
        };
        self.groups.swap_remove(i);
        let port = self.local.port();
        self.engine
            .rx()
            .demux
            .unbind(self.id, PROTO_UDP, SocketAddrV4::new(group, port));
        self.engine.prog().unclaim(group, port);
        if let Twin::Owned(_) = self.twin {
            let ifaddr = self.ifaddr(iface_addr);
            match membership(self.twin.fd(), false, group, ifaddr) {
                Err(e) if e.raw_os_error() != Some(libc::EADDRNOTAVAIL) => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    fn ifaddr(&self, iface_addr: Ipv4Addr) -> Ipv4Addr {
        if iface_addr.is_unspecified() {
            self.engine.iface.addr.unwrap_or(iface_addr)
        } else {
            iface_addr
        }
    }
}

fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: usize) -> io::Result<()> {
    set_opt(fd, level, opt, &(v.min(i32::MAX as usize) as libc::c_int))
}

/// A look at one socket's receive queue and its engine's RX rings without
/// any lock, for the idle turns of a waiting receiver whose socket sits
/// behind a lock of the caller's (see [`XdpSocket::idle_peek`]).
pub struct IdlePeek {
    /// `None`: the wait spins alone on the engine and polls every turn.
    engine: Option<Arc<Engine>>,
    mark: u64,
    /// Turns it may still answer before the socket's own call.
    left: u32,
    /// Turns answered since the last `idle_peek`.
    used: u32,
}

impl IdlePeek {
    /// `true`: nothing came for the socket since it found its queue empty
    /// (`Engine::rx_wait_quiet`: a few loads, no lock, no store but this
    /// peek's own count), so this idle turn is over; `false`: something
    /// may have come, or the turn is due that takes the locks anyway: the
    /// caller makes its receive.
    ///
    /// Sound as `recv_batch_ts`'s quiet calls are (the argument at
    /// `Engine::rx_quiet`: every delivery to any endpoint bumps the
    /// delivery count under the RX lock, so a datagram another thread of
    /// the process polled off the rings, for this socket or into the
    /// caller's own queue, makes this `false`; the RX rings are this
    /// process's alone, the engine service included, whose shared fill
    /// ring is never read here). What the caller's lock guards and no
    /// delivery changes (a close, a shutdown, the socket taken off the
    /// engine by another thread) is the caller's to see at its next
    /// locked turn, at most `QUIET_LOOK_EVERY` turns later; meanwhile the
    /// peek's own reference keeps the engine's mappings alive.
    #[inline(always)]
    pub fn coast(&mut self) -> bool {
        match &self.engine {
            Some(e) if self.left != 0 && e.rx_wait_quiet(self.mark) => {}
            _ => return false,
        }
        self.left -= 1;
        self.used += 1;
        true
    }
}

/// An engine kept open ([`XdpSocket::engine_ahead`]) until dropped.
pub struct EngineHold {
    _engine: Arc<Engine>,
}

/// The process's engine for local address `ip`. The interface facts are
/// read once for the whole look-up, the engine's open included (it asked
/// getifaddrs five times: `iface::one_read`).
pub(crate) fn engine_for(ip: Ipv4Addr, opts: &EngineOptions) -> Result<Arc<Engine>, OpenError> {
    iface::one_read(|| {
        let ifname = match &opts.iface {
            Some(i) => i.clone(),
            None => iface::iface_for_addr(ip).map_err(OpenError::Engine)?,
        };
        Engine::get(&ifname, opts).map_err(OpenError::Engine)
    })
}

impl Drop for XdpSocket {
    fn drop(&mut self) {
        if !self.engine.is_own() {
            // Inherited through fork: the parent's engine is not ours to
            // touch. (An owned twin fd is closed, which is what close(2) of
            // a fork-inherited fd does.)
            return;
        }
        let ep = {
            let mut g = self.engine.rx();
            if self.rx_stamping {
                g.dev.users = g.dev.users.saturating_sub(1);
            }
            let ep = g.demux.remove(self.id);
            self.engine.page.set_sock_addr(self.id, None);
            let c = self.engine.page.e(E::Sockets);
            c.store(
                c.load(std::sync::atomic::Ordering::Relaxed)
                    .saturating_sub(1),
                std::sync::atomic::Ordering::Relaxed,
            );
            ep
        };
        // Queued frames go back to the fill ring (outside the lock).
        drop(ep);
        {
            let mut p = self.engine.prog();
            for ip in &self.claims {
                p.unclaim(*ip, self.local.port());
            }
            for g in &self.groups {
                p.unclaim(*g, self.local.port());
            }
        }
        self.engine.rx().refill();
    }
}

impl UdpEndpoint for XdpSocket {
    fn engine(&self) -> EngineKind {
        EngineKind::Xdp
    }
    fn local_addr(&self) -> io::Result<SocketAddrV4> {
        Ok(self.local)
    }
    fn connect(&mut self, peer: SocketAddrV4) -> io::Result<()> {
        self.own()?;
        // Learn the route now (never waiting for the neighbour), so the
        // first send does not pay for it and a missing route fails here.
        self.lookup(*peer.ip())?;
        if let Twin::Owned(s) = &self.twin {
            // The kernel twin filters the same way (loopback path).
            s.connect(peer)?;
        }
        self.engine
            .rx()
            .demux
            .connect(self.id, PROTO_UDP, self.local, peer);
        self.peer = Some(peer);
        Ok(())
    }
    #[inline]
    fn send_to(&mut self, buf: &[u8], dst: SocketAddrV4) -> io::Result<usize> {
        self.send_one(buf, dst)
    }
    fn send_batch_to(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        self.send_many(bufs, dst)
    }
    fn set_rx_stamping(&mut self, on: bool) {
        XdpSocket::set_rx_stamping(self, on);
    }
    fn last_rx_stamp(&self) -> u64 {
        self.last_rx
    }
    fn recv_from(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<(usize, SocketAddrV4)>> {
        self.recv_with(deadline, |p, src| {
            let n = p.len().min(buf.len());
            buf[..n].copy_from_slice(&p[..n]);
            (n, src)
        })
    }
    fn try_recv_from(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddrV4)>> {
        let mut out = None;
        self.recv_batch(1, |p, src| {
            let n = p.len().min(buf.len());
            buf[..n].copy_from_slice(&p[..n]);
            out = Some((n, src));
        });
        Ok(out)
    }
    fn join_multicast(&mut self, group: Ipv4Addr, iface_addr: Ipv4Addr) -> io::Result<()> {
        self.own()?;
        if !group.is_multicast() {
            return Err(io_err(
                io::ErrorKind::InvalidInput,
                format!("{group} is not a multicast group"),
            ));
        }
        if self.groups.contains(&group) {
            return Err(io_err(
                io::ErrorKind::AddrInUse,
                format!("already a member of {group}"),
            ));
        }
        let ifaddr = self.ifaddr(iface_addr);
        if let Twin::Owned(_) = self.twin {
            // The kernel socket's membership makes the kernel answer IGMP.
            membership(self.twin.fd(), true, group, ifaddr)?;
        }
        let port = self.local.port();
        self.engine
            .prog()
            .claim(group, port, self.twin.fd())
            .map_err(|e| io_err(io::ErrorKind::Other, e))?;
        self.engine
            .rx()
            .demux
            .bind(self.id, PROTO_UDP, SocketAddrV4::new(group, port));
        self.groups.push(group);
        Ok(())
    }
    fn engine_counters(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .engine
            .counters()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let p = &self.engine.page;
        v.extend(
            p.socket_counters(self.id)
                .map(|(n, c)| (format!("socket.{n}"), c)),
        );
        v
    }
    fn stats(&self) -> SocketStats {
        let p = &self.engine.page;
        let r = |c: S| p.s(self.id, c).load(std::sync::atomic::Ordering::Relaxed);
        SocketStats {
            rx_packets: r(S::RxPackets),
            rx_bytes: r(S::RxBytes),
            tx_packets: r(S::TxPackets),
            tx_bytes: r(S::TxBytes),
            rx_drop_queue_full: r(S::DropQueueFull),
        }
    }
}

/// A datagram as the IPv4 packet that carried it, from `src` to `dst`
/// (header and UDP checksums filled in): what the shim shows the kernel,
/// through a raw socket to its own address, for a datagram the engine had
/// queued when a child process came to share the socket (the kernel
/// socket, which both read, then holds it).
pub fn udp_packet(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let ip = nanowire_wire::Ipv4Repr {
        src: *src.ip(),
        dst: *dst.ip(),
        protocol: PROTO_UDP,
        payload_len: UDP_HDR + payload.len(),
        ttl: 64,
        ident: 0,
    };
    let mut p = vec![0; IP_HDR + UDP_HDR + payload.len()];
    p[IP_HDR + UDP_HDR..].copy_from_slice(payload);
    ip.emit(&mut p);
    let udp = nanowire_wire::UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
    };
    udp.emit(&mut p[IP_HDR..], payload.len(), *src.ip(), *dst.ip());
    p
}
