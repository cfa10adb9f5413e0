//! TCP on the xdp engine (issue 11): `nanowire-tcp`'s sans-IO stack driven
//! by the engine's rings.
//!
//! One [`TcpEngine`] per listener or client connection set holds a
//! `TcpStack` and one demux endpoint (`EndpointKind::Tcp`) bound to every
//! local (address, port) it owns; the steering program claims the same
//! (address, port) for TCP (listeners) or the 4-tuple (client connections),
//! so the kernel never sees those segments. Each port is also held by a
//! kernel TCP socket (bound; listening for a listener) so that the kernel
//! never hands it to anyone else.
//!
//! Driving (`turn`): pop this endpoint's frames off the demux (polling the
//! rings), feed them to the stack, run its timers, then stage the segments it
//! wants to send with Ethernet/IPv4 headers and post them on the TX ring in
//! one batch. The next hop's MAC comes from the engine's neighbour table,
//! resolved outside the TX lock (locks are never nested).

use super::Engine;
use super::demux::{EndpointId, EndpointKind};
use super::neigh::{Hop, Lookup};
use super::rx::RX_BUDGET;
use super::shm::{E, bump};
use super::tx::{ETH_HDR, IP_HDR};
use crate::{EngineOptions, WaitPolicy};
use nanowire_tcp::{
    Config, ConnId, Error as TcpError, ListenerId, Secret, SocketOptions, State, TcpInfo, TcpStack,
};
use nanowire_wire::Ipv4Repr;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const PROTO_TCP: u8 = 6;
/// Segments staged per TX batch.
const TX_BATCH: usize = 32;
/// Bytes per staged segment (one frame).
const SLOT: usize = 2048;
const HDRS: usize = ETH_HDR + IP_HDR;

fn io_err(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

fn open_err(e: super::OpenError) -> io::Error {
    match e {
        super::OpenError::Socket(e) => e,
        super::OpenError::Engine(m) => io_err(io::ErrorKind::Unsupported, m),
    }
}

fn tcp_err(e: TcpError) -> io::Error {
    let kind = match e {
        TcpError::WouldBlock => io::ErrorKind::WouldBlock,
        TcpError::ConnectionRefused => io::ErrorKind::ConnectionRefused,
        TcpError::ConnectionReset => io::ErrorKind::ConnectionReset,
        TcpError::TimedOut => io::ErrorKind::TimedOut,
        TcpError::Aborted => io::ErrorKind::ConnectionAborted,
        TcpError::Shutdown => io::ErrorKind::BrokenPipe,
        TcpError::NotConnected => io::ErrorKind::NotConnected,
        TcpError::AddrInUse => io::ErrorKind::AddrInUse,
        TcpError::InvalidHandle => io::ErrorKind::InvalidInput,
        TcpError::TooManyConnections => io::ErrorKind::OutOfMemory,
    };
    io::Error::new(kind, e.to_string())
}

/// A kernel TCP socket holding a port: bound (and listening for a listener).
fn reserve(local: SocketAddrV4, listen: bool) -> io::Result<(OwnedFd, SocketAddrV4)> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own exclusively.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: local.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(local.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in and the length matches.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen on a bound socket we own.
    if listen && unsafe { libc::listen(fd.as_raw_fd(), 1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an all-zero sockaddr_in is valid; getsockname writes at most len bytes.
    let mut out: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: out/len are valid for writes.
    if unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut out as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    let got = SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(out.sin_addr.s_addr)),
        u16::from_be(out.sin_port),
    );
    Ok((fd, got))
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with valid flags; checked before use.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn eventfd_drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a u64 from an eventfd we keep open.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

struct Core {
    stack: TcpStack,
    id: EndpointId,
    wake_fd: RawFd,
    epoch: Instant,
    /// Local addresses bound in the demux and claimed in the program.
    listen_claims: Vec<SocketAddrV4>,
    flow_claims: Vec<(SocketAddrV4, SocketAddrV4)>,
    /// Kernel sockets holding our ports.
    reservations: Vec<OwnedFd>,
    /// Next hop per destination: (neighbour generation, source, MAC).
    hops: Vec<(Ipv4Addr, u64, Ipv4Addr, [u8; 6])>,
    scratch: Vec<u8>,
    lens: Vec<usize>,
    ip_id: u16,
    unresolved: u64,
    /// Stack counters already added to the engine's stats page, and turns
    /// since the last publication.
    published: nanowire_tcp::Counters,
    turns: u32,
}

/// The TCP stack of one set of sockets on one xdp engine.
pub struct TcpEngine {
    engine: Arc<Engine>,
    core: Mutex<Core>,
    wait: WaitPolicy,
}

impl TcpEngine {
    fn new(engine: Arc<Engine>, wait: WaitPolicy, cfg: Config) -> io::Result<Arc<TcpEngine>> {
        static WARNED: std::sync::Once = std::sync::Once::new();
        if engine.attach_mode() == nanowire_xdp::AttachMode::Skb
            && nanowire_xdp::iface::driver(&engine.iface().name).as_deref() == Some("veth")
        {
            WARNED.call_once(|| {
                eprintln!(
                    "nanowire: xdp TCP on {} (veth, generic XDP): a peer's TSO/GSO super-frames cannot reach AF_XDP; \
                     turn TSO/GSO off on the peer (ethtool -K <peer> tso off gso off) or use NANOWIRE_XDP_MODE=native",
                    engine.iface().name
                )
            });
        }
        let wake = eventfd()?;
        let wake_fd = wake.as_raw_fd();
        let id = engine
            .rx()
            .demux
            .add(EndpointKind::Tcp, wake, super::shm::MAX_SOCKETS)
            .ok_or_else(|| {
                io_err(
                    io::ErrorKind::OutOfMemory,
                    "the xdp engine has no free endpoint",
                )
            })?;
        bump(engine.page.e(E::Sockets), 1);
        let secret = Secret::from_os()?;
        Ok(Arc::new(TcpEngine {
            engine,
            wait,
            core: Mutex::new(Core {
                stack: TcpStack::new(cfg, secret),
                id,
                wake_fd,
                epoch: Instant::now(),
                listen_claims: Vec::new(),
                flow_claims: Vec::new(),
                reservations: Vec::new(),
                hops: Vec::new(),
                scratch: vec![0u8; TX_BATCH * SLOT],
                lens: vec![0; TX_BATCH],
                ip_id: 1,
                unresolved: 0,
                published: Default::default(),
                turns: 0,
            }),
        }))
    }

    fn config(engine: &Engine, opts: &EngineOptions) -> Config {
        // One segment per frame: MSS from the MTU, bounded by the frame.
        let mtu = (engine.iface().mtu as usize).min(engine.frame_size() - ETH_HDR);
        let mut cfg = Config {
            mss: Config::mss_for_mtu(mtu as u32),
            ..Config::default()
        };
        // The RTO floor: the options table's `tcp_rto_min_us` row, passed
        // through the environment (NANOWIRE_TCP_RTO_MIN_US; 200 ms when unset).
        if let Ok(v) = std::env::var("NANOWIRE_TCP_RTO_MIN_US") {
            match v.trim().parse::<u64>() {
                Ok(us) if (1000..=60_000_000).contains(&us) => cfg.rto_min_ns = us * 1000,
                _ => {
                    static BAD: std::sync::Once = std::sync::Once::new();
                    BAD.call_once(|| {
                        eprintln!(
                            "nanowire: ignoring NANOWIRE_TCP_RTO_MIN_US={v:?}: expected 1000..=60000000 (µs); using {} µs",
                            cfg.rto_min_ns / 1000
                        )
                    });
                }
            }
        }
        if let Some(b) = opts.rcvbuf {
            cfg.rcvbuf = b.max(4096);
        }
        if let Some(b) = opts.sndbuf {
            cfg.sndbuf = b.max(4096);
        }
        cfg
    }

    fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Next hop for `dst` (neighbour lock only; never under the TX lock).
    fn hop(&self, core: &mut Core, dst: Ipv4Addr) -> Option<(Ipv4Addr, [u8; 6])> {
        let n = &self.engine.neigh;
        let g = n.generation();
        if let Some(&(_, seen, src, mac)) = core.hops.iter().find(|h| h.0 == dst)
            && seen == g
        {
            return Some((src, mac));
        }
        let mut l = n.lookup(dst);
        if l == Lookup::Unknown {
            let _ = n.learn(dst);
            l = n.lookup(dst);
        }
        match l {
            Lookup::Ready(Hop::Xdp { src, mac }) => {
                core.hops.retain(|h| h.0 != dst);
                core.hops.push((dst, g, src, mac));
                Some((src, mac))
            }
            _ => None,
        }
    }

    /// Wait until `dst`'s MAC is known (or `timeout`): a connect's first SYN
    /// should not be lost to ARP.
    fn resolve(&self, dst: Ipv4Addr, timeout: Duration) -> io::Result<()> {
        let end = Instant::now() + timeout;
        loop {
            {
                let mut c = self.core();
                if self.hop(&mut c, dst).is_some() {
                    return Ok(());
                }
            }
            if let Lookup::Ready(Hop::Kernel) = self.engine.neigh.lookup(dst) {
                return Err(io_err(
                    io::ErrorKind::Unsupported,
                    format!("{dst} is not reached through {}", self.engine.iface().name),
                ));
            }
            if Instant::now() >= end {
                return Err(io_err(
                    io::ErrorKind::HostUnreachable,
                    format!("no route to host {dst} (neighbour unresolved)"),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// One pass: receive, timers, transmit. True if anything moved.
    fn turn(&self, core: &mut Core) -> bool {
        let now = core.epoch.elapsed().as_nanos() as u64;
        let mut moved = 0usize;
        {
            let mut g = self.engine.rx();
            g.poll(RX_BUDGET);
            let page = g.page.clone();
            while let Some(d) = g.demux.pop(core.id, &page) {
                // The stack copies the payload into its ring: the frame goes
                // back to the fill ring as soon as `d` drops.
                core.stack.input(now, *d.src.ip(), *d.dst.ip(), d.segment());
                moved += 1;
            }
            core.turns = core.turns.wrapping_add(1);
            if core.turns.is_multiple_of(64) {
                // Under the RX lock: the single writer of these counters.
                publish_counters(&page, core);
            }
        }
        core.stack.poll_timers(now);
        moved += self.transmit(core, now);
        moved > 0
    }

    fn transmit(&self, core: &mut Core, now: u64) -> usize {
        let mut total = 0;
        loop {
            let mut n = 0;
            while n < TX_BATCH {
                let off = n * SLOT;
                let Some(t) = ({
                    let Core { stack, scratch, .. } = &mut *core;
                    stack.poll_transmit(now, &mut scratch[off + HDRS..off + SLOT])
                }) else {
                    break;
                };
                let Some((_, mac)) = self.hop(core, t.dst) else {
                    // Lost like a frame on the wire: TCP retransmits once
                    // the neighbour is known.
                    core.unresolved += 1;
                    bump(self.engine.page.e(E::DropNeighUnresolved), 1);
                    continue;
                };
                core.ip_id = core.ip_id.wrapping_add(1);
                let f = &mut core.scratch[off..off + SLOT];
                f[0..6].copy_from_slice(&mac);
                f[6..12].copy_from_slice(&self.engine.iface().mac);
                f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
                Ipv4Repr {
                    src: t.src,
                    dst: t.dst,
                    protocol: PROTO_TCP,
                    payload_len: t.len,
                    ttl: 64,
                    ident: core.ip_id,
                }
                .emit(&mut f[ETH_HDR..]);
                core.lens[n] = HDRS + t.len;
                n += 1;
            }
            if n == 0 {
                return total;
            }
            let sent = {
                let mut tx = self.engine.tx();
                let mut frames: [&[u8]; TX_BATCH] = [&[]; TX_BATCH];
                for (i, f) in frames.iter_mut().enumerate().take(n) {
                    *f = &core.scratch[i * SLOT..i * SLOT + core.lens[i]];
                }
                // Posts (and kicks), through the `faults` injector when on.
                let k = tx.post(&frames[..n]);
                bump(self.engine.page.e(E::TxPackets), k as u64);
                k
            };
            if sent < n {
                // Ring full: the segments are lost to the wire; TCP
                // retransmits them.
                bump(self.engine.page.e(E::DropTxRingFull), (n - sent) as u64);
            }
            total += n;
            if n < TX_BATCH {
                return total;
            }
        }
    }

    /// Run `f` until it yields, turning the engine and waiting per policy.
    fn until<T>(
        &self,
        deadline: Option<Instant>,
        mut f: impl FnMut(&mut TcpStack) -> Option<T>,
    ) -> Option<T> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            {
                let mut c = self.core();
                let moved = self.turn(&mut c);
                if let Some(v) = f(&mut c.stack) {
                    // Flush what the call queued (data, ACK, window update).
                    let now = c.epoch.elapsed().as_nanos() as u64;
                    self.transmit(&mut c, now);
                    return Some(v);
                }
                if moved {
                    spins = 0;
                    continue;
                }
            }
            spins = spins.wrapping_add(1);
            // A caller with a deadline (a poll: `accept(Some(now))`) gets its
            // answer after one idle turn, not after a burst of spins.
            if !spins.is_multiple_of(64) && deadline.is_none() {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return None;
            }
            let sleep = match self.wait {
                WaitPolicy::Spin => false,
                WaitPolicy::Block => true,
                WaitPolicy::SpinThenBlock(d) => now.duration_since(start) >= d,
            };
            if sleep {
                self.sleep(deadline);
            }
        }
    }

    fn sleep(&self, deadline: Option<Instant>) {
        let (id, wake, next) = {
            let c = self.core();
            let now = c.epoch.elapsed().as_nanos() as u64;
            let next = c
                .stack
                .next_deadline()
                .map(|t| Duration::from_nanos(t.saturating_sub(now)));
            (c.id, c.wake_fd, next)
        };
        let mut ms = super::MAX_SLEEP_MS;
        if let Some(n) = next {
            ms = ms.min(n.as_millis() as i32);
        }
        if let Some(d) = deadline {
            ms = ms.min(d.saturating_duration_since(Instant::now()).as_millis() as i32);
        }
        let ms = ms.max(1);
        let may = {
            let mut g = self.engine.rx();
            match g.demux.get_mut(id) {
                Some(e) if e.queue.is_empty() => {
                    e.sleeping = true;
                    true
                }
                _ => false,
            }
        };
        if may {
            self.engine.wait_fds(&[wake], ms);
            if let Some(e) = self.engine.rx().demux.get_mut(id) {
                e.sleeping = false;
            }
            eventfd_drain(wake);
        }
    }

    fn claim_listener(&self, core: &mut Core, local: SocketAddrV4) -> io::Result<()> {
        let addrs: Vec<Ipv4Addr> = if local.ip().is_unspecified() {
            let own = self.engine.rx().own.clone();
            if own.is_empty() {
                self.engine.iface().addr.into_iter().collect()
            } else {
                own
            }
        } else {
            vec![*local.ip()]
        };
        self.engine.rx().demux.bind(core.id, PROTO_TCP, local);
        let mut p = self.engine.prog();
        for a in addrs {
            p.prog
                .claim_tcp_listener(a, local.port(), std::process::id())
                .map_err(|e| io_err(io::ErrorKind::Other, e))?;
            core.listen_claims.push(SocketAddrV4::new(a, local.port()));
        }
        Ok(())
    }

    fn claim_flow(
        &self,
        core: &mut Core,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> io::Result<()> {
        self.engine.rx().demux.bind(core.id, PROTO_TCP, local);
        self.engine
            .prog()
            .prog
            .claim_tcp_flow(local, remote, std::process::id())
            .map_err(|e| io_err(io::ErrorKind::Other, e))?;
        core.flow_claims.push((local, remote));
        Ok(())
    }
}

impl Drop for TcpEngine {
    fn drop(&mut self) {
        if !self.engine.is_own() {
            return;
        }
        let c = self.core.get_mut().unwrap_or_else(|e| e.into_inner());
        {
            let mut p = self.engine.prog();
            for a in &c.listen_claims {
                p.prog.unclaim_tcp_listener(*a.ip(), a.port());
            }
            for (l, r) in &c.flow_claims {
                p.prog.unclaim_tcp_flow(*l, *r);
            }
        }
        let mut g = self.engine.rx();
        publish_counters(&self.engine.page, c);
        g.demux.remove(c.id);
        bump(self.engine.page.e(E::Sockets), 0);
    }
}

/// Add what this stack counted since the last call to the engine's stats
/// page (`nanowire stats`: the `tcp_*` counters, summed over every TCP stack
/// of the engine). Call with the engine's RX lock held (single writer).
fn publish_counters(page: &super::shm::StatsPage, core: &mut Core) {
    let c = core.stack.counters();
    let p = &core.published;
    for (e, now, was) in [
        (E::TcpSegsIn, c.segs_in, p.segs_in),
        (E::TcpSegsOut, c.segs_out, p.segs_out),
        (E::TcpRetransmits, c.retransmits, p.retransmits),
        (
            E::TcpFastRetransmits,
            c.fast_retransmits,
            p.fast_retransmits,
        ),
        (E::TcpRtoExpirations, c.rto_expirations, p.rto_expirations),
        (E::TcpRstSent, c.rst_sent, p.rst_sent),
        (E::TcpRstReceived, c.rst_received, p.rst_received),
        (E::TcpActiveOpens, c.active_opens, p.active_opens),
        (E::TcpPassiveOpens, c.passive_opens, p.passive_opens),
        (
            E::TcpConnectionsReset,
            c.connections_reset,
            p.connections_reset,
        ),
        (E::TcpDropMalformed, c.malformed, p.malformed),
        (E::TcpDropBadChecksum, c.bad_checksum, p.bad_checksum),
        (E::TcpDropOutOfWindow, c.out_of_window, p.out_of_window),
        (E::TcpDropNoSocket, c.no_socket, p.no_socket),
        (
            E::TcpListenOverflows,
            c.listen_overflows,
            p.listen_overflows,
        ),
        (E::TcpSyncookiesSent, c.syncookies_sent, p.syncookies_sent),
        (E::TcpSyncookiesOk, c.syncookies_ok, p.syncookies_ok),
    ] {
        if now > was {
            bump(page.e(e), now - was);
        }
    }
    core.published = c.clone();
}

/// A listening TCP socket on the xdp engine.
pub struct XdpTcpListener {
    eng: Arc<TcpEngine>,
    l: ListenerId,
    local: SocketAddrV4,
}

impl XdpTcpListener {
    /// Listen on `local` (port 0 is not supported: the port must be known to
    /// claim it). The kernel keeps a listening socket on the port so it is
    /// never handed out; the steering program takes every segment for it.
    pub fn bind(
        local: SocketAddrV4,
        backlog: usize,
        opts: &EngineOptions,
    ) -> io::Result<XdpTcpListener> {
        if local.ip().is_loopback() {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                format!("{local} is a loopback address: loopback TCP stays on the kernel"),
            ));
        }
        let engine = super::socket::engine_for(*local.ip(), opts).map_err(open_err)?;
        let cfg = TcpEngine::config(&engine, opts);
        let (fd, got) = reserve(local, true)?;
        let eng = TcpEngine::new(engine, opts.wait, cfg)?;
        let l = {
            let mut c = eng.core();
            c.reservations.push(fd);
            eng.claim_listener(&mut c, got)?;
            let so = SocketOptions::from_config(c.stack.config());
            c.stack
                .listen_with(got, backlog.max(1), so)
                .map_err(tcp_err)?
        };
        Ok(XdpTcpListener { eng, l, local: got })
    }

    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    /// The next connection, or `Ok(None)` at the deadline.
    pub fn accept(&self, deadline: Option<Instant>) -> io::Result<Option<XdpTcpStream>> {
        let l = self.l;
        Ok(self
            .eng
            .until(deadline, |s| s.accept(l))
            .map(|c| XdpTcpStream {
                eng: self.eng.clone(),
                c,
            }))
    }

    /// Counters of this listener's stack (all its connections).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.eng.core().stack.counters().iter().collect()
    }
}

/// A TCP connection on the xdp engine.
pub struct XdpTcpStream {
    eng: Arc<TcpEngine>,
    c: ConnId,
}

impl XdpTcpStream {
    /// Connect to `remote` from an ephemeral port the kernel reserves for us.
    pub fn connect(
        remote: SocketAddrV4,
        opts: &EngineOptions,
        timeout: Duration,
    ) -> io::Result<XdpTcpStream> {
        // The route to the peer gives the source address, and so the interface.
        let route = nanowire_xdp::netlink::route_get(*remote.ip())?;
        if route.kind == nanowire_xdp::netlink::RTN_LOCAL {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                format!("{} is local: loopback TCP stays on the kernel", remote.ip()),
            ));
        }
        let hint = route.prefsrc.unwrap_or(Ipv4Addr::UNSPECIFIED);
        let engine = super::socket::engine_for(hint, opts).map_err(open_err)?;
        let cfg = TcpEngine::config(&engine, opts);
        let src = route.prefsrc.or(engine.iface().addr).ok_or_else(|| {
            io_err(
                io::ErrorKind::AddrNotAvailable,
                "the interface has no IPv4 address",
            )
        })?;
        let (fd, local) = reserve(SocketAddrV4::new(src, 0), false)?;
        let eng = TcpEngine::new(engine, opts.wait, cfg)?;
        eng.resolve(*remote.ip(), timeout)?;
        let c = {
            let mut core = eng.core();
            core.reservations.push(fd);
            eng.claim_flow(&mut core, local, remote)?;
            let now = core.epoch.elapsed().as_nanos() as u64;
            core.stack.connect(now, local, remote).map_err(tcp_err)?
        };
        let end = Instant::now() + timeout;
        let r = eng.until(Some(end), |s| match s.state(c) {
            Ok(State::SynSent) => None,
            Ok(_) => Some(s.error(c)),
            Err(e) => Some(Some(e)),
        });
        match r {
            Some(None) => Ok(XdpTcpStream { eng, c }),
            Some(Some(e)) => Err(tcp_err(e)),
            None => Err(io_err(
                io::ErrorKind::TimedOut,
                format!("connect to {remote} timed out"),
            )),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddrV4> {
        self.eng.core().stack.local_addr(self.c).map_err(tcp_err)
    }
    pub fn peer_addr(&self) -> io::Result<SocketAddrV4> {
        self.eng.core().stack.peer_addr(self.c).map_err(tcp_err)
    }
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.eng
            .core()
            .stack
            .set_nodelay(self.c, on)
            .map_err(tcp_err)
    }
    pub fn set_quickack(&self, on: bool) -> io::Result<()> {
        self.eng
            .core()
            .stack
            .set_quickack(self.c, on)
            .map_err(tcp_err)
    }
    pub fn info(&self) -> io::Result<TcpInfo> {
        self.eng.core().stack.info(self.c).map_err(tcp_err)
    }

    /// This connection's stack counters (retransmissions, drops by reason).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.eng.core().stack.counters().iter().collect()
    }

    /// The engine's counters (the stats page: drops by reason, injected
    /// faults, the engine's summed `tcp_*`).
    pub fn engine_counters(&self) -> Vec<(&'static str, u64)> {
        self.eng.engine.counters()
    }

    /// Read at least one byte (0 = end of file); `Ok(None)` at the deadline.
    pub fn read(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<Option<usize>> {
        let c = self.c;
        match self.eng.until(deadline, |s| match s.recv(c, buf) {
            Err(TcpError::WouldBlock) => None,
            r => Some(r),
        }) {
            None => Ok(None),
            Some(Ok(n)) => Ok(Some(n)),
            Some(Err(e)) => Err(tcp_err(e)),
        }
    }

    /// Read what is there without waiting (one engine turn).
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut core = self.eng.core();
        self.eng.turn(&mut core);
        let r = core.stack.recv(self.c, buf);
        if r != Err(TcpError::WouldBlock) {
            // Reading may open the window: announce it now.
            let now = core.epoch.elapsed().as_nanos() as u64;
            self.eng.transmit(&mut core, now);
        }
        match r {
            Ok(n) => Ok(Some(n)),
            Err(TcpError::WouldBlock) => Ok(None),
            Err(e) => Err(tcp_err(e)),
        }
    }

    /// Write all of `data`, waiting while the send buffer is full.
    pub fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        let c = self.c;
        while !data.is_empty() {
            let n = self
                .eng
                .until(None, |s| match s.send(c, data) {
                    Err(TcpError::WouldBlock) => None,
                    r => Some(r),
                })
                .unwrap_or(Ok(0))
                .map_err(tcp_err)?;
            data = &data[n..];
        }
        Ok(())
    }

    /// shutdown(SHUT_WR).
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        let mut core = self.eng.core();
        core.stack.shutdown_write(self.c).map_err(tcp_err)?;
        let now = core.epoch.elapsed().as_nanos() as u64;
        self.eng.transmit(&mut core, now);
        Ok(())
    }
}

impl Drop for XdpTcpStream {
    fn drop(&mut self) {
        let mut core = self.eng.core();
        let now = core.epoch.elapsed().as_nanos() as u64;
        let _ = core.stack.close(now, self.c);
        self.eng.transmit(&mut core, now);
    }
}

/// Non-blocking reads: one engine turn, then `WouldBlock` if nothing came.
impl io::Read for XdpTcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.try_read(buf)? {
            Some(n) => Ok(n),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// Non-blocking writes: what fits the send buffer goes (and is transmitted
/// at once); `WouldBlock` when it is full.
impl io::Write for XdpTcpStream {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut core = self.eng.core();
        let mut r = core.stack.send(self.c, data);
        if r == Err(TcpError::WouldBlock) {
            // ACKs may have freed room.
            self.eng.turn(&mut core);
            r = core.stack.send(self.c, data);
        }
        let now = core.epoch.elapsed().as_nanos() as u64;
        self.eng.transmit(&mut core, now);
        r.map_err(tcp_err)
    }
    fn flush(&mut self) -> io::Result<()> {
        let mut core = self.eng.core();
        self.eng.turn(&mut core);
        Ok(())
    }
}

impl XdpTcpStream {
    /// Wait for the engine (the bench's blocking mode): sleep until a frame
    /// may be there or a timer is due, at most `timeout`.
    pub fn wait(&self, timeout: Duration) {
        self.eng.sleep(Some(Instant::now() + timeout));
    }
}
