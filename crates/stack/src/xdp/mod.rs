//! The xdp engine: a poll-mode user-space UDP/IPv4 path over AF_XDP.
//!
//! One [`Engine`] per (process, interface) owns the steering program, one
//! AF_XDP socket per RX queue and the UDP socket table. [`XdpSocket`]s are
//! handles on it. Whoever receives drives the engine: it drains the RX
//! rings in batches, parses each frame with crates/wire, and queues the
//! frame (not a copy) on every socket bound to its (destination, port);
//! the frame goes back to the fill ring when the last socket consumed it.
//!
//! Every frame taken off an RX ring ends up exactly once as either
//! delivered (`rx_packets`) or under one drop reason, so
//! `rx_frames = rx_packets + sum(drop_*)` for the engine, and frames the
//! kernel could not even queue show in the `xsk_*` counters (from
//! XDP_STATISTICS).
//!
//! Each socket also holds a kernel UDP socket bound to the same address: it
//! reserves the port against kernel users, picks ephemeral ports, and makes
//! the kernel send IGMP reports for multicast joins.

pub mod fallback;
pub mod shm;

use crate::{EngineKind, EngineOptions, SocketStats, UdpEndpoint, WaitPolicy};
use nanowire_wire::ipv4::PROTO_UDP;
use nanowire_wire::udp::ChecksumState;
use nanowire_wire::{EtherType, EthernetFrame, Ipv4Packet, Ipv4Repr, UdpDatagram, UdpRepr};
use nanowire_xdp::iface::{self, IfaceInfo};
use nanowire_xdp::netlink;
use nanowire_xdp::xsk::{BindMode, XskConfig, XskSocket};
use nanowire_xdp::{AttachMode, SteerProgram};
use shm::{E, PageInfo, S, StatsPage, bump, peak};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// RX descriptors taken per ring visit.
const RX_BATCH: u32 = 64;
/// Engine polls between two XDP_STATISTICS refreshes (4M, a syscall per
/// queue; explicit reads refresh them anyway).
const KERNEL_STATS_EVERY_MASK: u32 = (1 << 22) - 1;
/// Datagrams a socket may hold before new ones are dropped (counted).
pub const DEFAULT_SOCKET_QUEUE: usize = 65536;
/// Longest single sleep in poll() (a safety net: a thread that queues a
/// datagram for a sleeping socket wakes it through its eventfd).
const MAX_SLEEP_MS: i32 = 50;
const ETH_HDR: usize = 14;
const IP_HDR: usize = 20;
const UDP_HDR: usize = 8;
const HDRS: usize = ETH_HDR + IP_HDR + UDP_HDR;

/// Multiply-shift hasher for the (addr, port) socket table.
#[derive(Default)]
struct FastHash(u64);
impl Hasher for FastHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e3779b97f4a7c15);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
}
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHash>>;

#[inline]
fn key(addr: Ipv4Addr, port: u16) -> u64 {
    (u64::from(addr.to_bits()) << 16) | u64::from(port)
}

/// A received datagram still sitting in its UMEM frame.
#[derive(Debug, Clone, Copy)]
struct RxItem {
    q: u32,
    /// UMEM address of the UDP payload.
    addr: u64,
    len: u32,
    src: SocketAddrV4,
}

struct Sock {
    claims: Vec<(Ipv4Addr, u16)>,
    queue: VecDeque<RxItem>,
    cap: usize,
    slot: usize,
    kernel: UdpSocket,
    /// The owner sleeps in poll(): whoever queues a datagram for it
    /// signals `wake` (an eventfd in the sleeper's poll set).
    sleeping: bool,
    wake: std::os::fd::OwnedFd,
    /// Connected peer: datagrams from anyone else are not for this socket.
    peer: Option<SocketAddrV4>,
}

fn eventfd() -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain eventfd(2); checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

fn eventfd_write(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

fn eventfd_drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

struct Queue {
    xsk: XskSocket,
    /// References per RX frame (index = frame number).
    refs: Vec<u16>,
    /// Frames waiting to go back to the fill ring.
    to_fill: Vec<u64>,
    frame_shift: u32,
}

struct Inner {
    prog: SteerProgram,
    queues: Vec<Queue>,
    table: FastMap<u64, Vec<usize>>,
    socks: Vec<Option<Sock>>,
    /// dst -> (source address, destination MAC)
    /// `None`: not routed through this interface, sent by the kernel.
    neigh: FastMap<u32, Option<(Ipv4Addr, [u8; 6])>>,
    ip_id: u16,
    polls: u32,
    /// (UMEM address, length) of the frames built for one TX kick (kept to
    /// avoid initialising a batch array on every send).
    tx_batch: Vec<(u64, u32)>,
    page: Arc<StatsPage>,
}

/// The xdp engine on one interface.
pub struct Engine {
    inner: Mutex<Inner>,
    fds: Vec<RawFd>,
    iface: IfaceInfo,
    attach: AttachMode,
    bind: BindMode,
    page: Arc<StatsPage>,
}

/// Open engines of this process by (network namespace inode, interface).
static ENGINES: Mutex<Vec<(u64, String, Weak<Engine>)>> = Mutex::new(Vec::new());

/// The calling thread's network namespace (threads may setns).
fn netns_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

impl Engine {
    /// The process's engine on `ifname`, opened on first use.
    pub fn get(ifname: &str, opts: &EngineOptions) -> Result<Arc<Engine>, String> {
        let ns = netns_id();
        let mut reg = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|(_, _, w)| w.strong_count() > 0);
        if let Some(e) = reg
            .iter()
            .find(|(i, n, _)| *i == ns && n == ifname)
            .and_then(|(_, _, w)| w.upgrade())
        {
            return Ok(e);
        }
        let e = Arc::new(Engine::open(ifname, opts)?);
        reg.push((ns, ifname.to_string(), Arc::downgrade(&e)));
        Ok(e)
    }

    fn open(ifname: &str, opts: &EngineOptions) -> Result<Engine, String> {
        let info = iface::lookup(ifname).map_err(|e| format!("interface {ifname}: {e}"))?;
        if !rustix::process::geteuid().is_root() {
            // Capabilities could suffice, but say plainly what usually lacks.
            let caps = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let eff = caps
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(0);
            let need = (1u64 << 12) | (1 << 13) | (1 << 39); // NET_ADMIN, NET_RAW, BPF
            if eff & need != need {
                return Err("no privilege for AF_XDP/XDP (run as root or with CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF)".into());
            }
        }
        let frame_size = if info.mtu as usize + ETH_HDR <= 2048 - 256 {
            2048
        } else if info.mtu as usize + ETH_HDR <= 4096 - 256 {
            4096
        } else {
            return Err(format!(
                "{ifname} MTU {} is larger than an AF_XDP frame (max 3826 without multi-buffer)",
                info.mtu
            ));
        };
        let depth = opts.ring_depth.max(64).next_power_of_two();
        let mut prog = SteerProgram::attach(ifname, info.index)?;
        let cfg = XskConfig {
            rx_frames: depth,
            tx_frames: 2048,
            frame_size,
            // Zero-copy needs native XDP; generic mode is copy-only.
            try_zero_copy: prog.mode() == AttachMode::Driver,
        };
        cfg.validate()?;
        let mut queues = Vec::new();
        for q in 0..info.rx_queues {
            let xsk = XskSocket::open(ifname, info.index, q, cfg)?;
            prog.set_xsk(q, &xsk)?;
            queues.push(Queue {
                xsk,
                refs: vec![0; depth as usize],
                to_fill: Vec::with_capacity(depth as usize),
                frame_shift: frame_size.trailing_zeros(),
            });
        }
        let bind = queues[0].xsk.mode();
        let page = Arc::new(StatsPage::create(&PageInfo {
            pid: std::process::id(),
            iface: ifname.to_string(),
            queues: info.rx_queues,
            xdp_mode: prog.mode().as_str().to_string(),
            bind_mode: bind.as_str().to_string(),
            ring_depth: depth,
        }));
        let fds = queues.iter().map(|q| q.xsk.as_raw_fd()).collect();
        let attach = prog.mode();
        Ok(Engine {
            inner: Mutex::new(Inner {
                prog,
                queues,
                table: FastMap::default(),
                socks: Vec::new(),
                neigh: FastMap::default(),
                ip_id: 1,
                polls: 0,
                tx_batch: Vec::with_capacity(256),
                page: page.clone(),
            }),
            fds,
            iface: info,
            attach,
            bind,
            page,
        })
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn iface(&self) -> &IfaceInfo {
        &self.iface
    }
    /// Native or generic XDP.
    pub fn attach_mode(&self) -> AttachMode {
        self.attach
    }
    /// Zero-copy or copy AF_XDP.
    pub fn bind_mode(&self) -> BindMode {
        self.bind
    }
    /// XDP_MAX_TX_SKB_BUDGET in effect (copy-mode frames per TX kick), if
    /// the kernel supports it.
    pub fn tx_budget(&self) -> Option<u32> {
        self.lock().queues[0].xsk.tx_budget()
    }
    /// RX ring depth (frames per queue).
    pub fn ring_depth(&self) -> u32 {
        self.lock().queues[0].xsk.config().rx_frames
    }
    /// Path of the shared stats page, if in /dev/shm.
    pub fn stats_page(&self) -> Option<std::path::PathBuf> {
        self.page.path().map(|p| p.to_path_buf())
    }

    /// Engine counters by name (refreshes the kernel's XDP_STATISTICS).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.lock().refreshkernel_stats();
        shm::ENGINE_COUNTERS
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, self.page.engine_word(i)))
            .collect()
    }

    /// Drain the RX rings once (for callers that only send, e.g. to keep
    /// counters current). Returns frames processed.
    pub fn poll(&self) -> u32 {
        self.lock().poll_rx()
    }

    fn wait_fds(&self, extra: &[RawFd], timeout_ms: i32) {
        let mut pfds: Vec<libc::pollfd> = self
            .fds
            .iter()
            .chain(extra.iter())
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: pfds is a valid array of pollfd of the given length.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    }
}

impl Inner {
    /// Drain every RX ring once, demultiplexing into socket queues.
    #[inline]
    fn poll_rx(&mut self) -> u32 {
        let mut total = 0;
        self.polls = self.polls.wrapping_add(1);
        if self.polls & KERNEL_STATS_EVERY_MASK == 0 {
            // A getsockopt per queue: rare, so it almost never delays a frame.
            self.refreshkernel_stats();
        }
        for qi in 0..self.queues.len() {
            loop {
                let n = {
                    let q = &mut self.queues[qi];
                    let n = q.xsk.rx.cons_avail(u32::MAX);
                    if n == 0 {
                        q.xsk.prefetch_rx();
                        break;
                    }
                    peak(self.page.e(E::PeakRxRing), u64::from(n));
                    n.min(RX_BATCH)
                };
                for i in 0..n {
                    let d = self.queues[qi].xsk.rx.cons_read(i);
                    self.queues[qi].xsk.rx_taken(d.addr);
                    self.classify(qi, d.addr, d.len);
                }
                let q = &mut self.queues[qi];
                q.xsk.rx.cons_release(n);
                total += n;
            }
            self.flush_fill(qi);
        }
        total
    }

    #[inline]
    fn flush_fill(&mut self, qi: usize) {
        let q = &mut self.queues[qi];
        if !q.to_fill.is_empty() {
            let n = q.xsk.fill(&q.to_fill);
            q.to_fill.drain(..n);
            q.xsk.wake_rx_if_needed();
        }
    }

    #[inline]
    fn recycle(&mut self, qi: usize, addr: u64) {
        let q = &mut self.queues[qi];
        q.to_fill.push(addr);
    }

    #[inline]
    fn drop_frame(&mut self, qi: usize, addr: u64, why: E) {
        bump(self.page.e(why), 1);
        self.recycle(qi, addr);
    }

    /// Parse one frame and queue it on its sockets, or count why not.
    #[inline]
    fn classify(&mut self, qi: usize, addr: u64, len: u32) {
        bump(self.page.e(E::RxFrames), 1);
        let parsed = {
            let Some(data) = self.queues[qi].xsk.data(addr, len) else {
                return self.drop_frame(qi, addr, E::DropBadDesc);
            };
            parse_udp(data)
        };
        let (src, dst, off, plen, partial) = match parsed {
            Ok(p) => p,
            Err(why) => return self.drop_frame(qi, addr, why),
        };
        if partial {
            bump(self.page.e(E::RxCsumPartial), 1);
        }
        let Some(sids) = self.table.get(&key(*dst.ip(), dst.port())) else {
            return self.drop_frame(qi, addr, E::DropNoSocket);
        };
        let item = RxItem {
            q: qi as u32,
            addr: addr + off as u64,
            len: plen as u32,
            src,
        };
        let mut refs = 0u16;
        let mut full = false;
        for &sid in sids {
            if let Some(Some(s)) = self.socks.get_mut(sid) {
                // A connected socket takes datagrams from its peer only
                // (as a kernel UDP socket does).
                if s.peer.is_some_and(|p| p != src) {
                    continue;
                }
                if s.queue.len() >= s.cap {
                    full = true;
                    bump(self.page.s(s.slot, S::DropQueueFull), 1);
                    continue;
                }
                s.queue.push_back(item);
                if s.sleeping {
                    s.sleeping = false;
                    eventfd_write(s.wake.as_raw_fd());
                }
                let depth = s.queue.len() as u64;
                self.page
                    .s(s.slot, S::QueueDepth)
                    .store(depth, std::sync::atomic::Ordering::Relaxed);
                peak(self.page.s(s.slot, S::PeakQueueDepth), depth);
                peak(self.page.e(E::PeakSocketQueue), depth);
                refs += 1;
            }
        }
        if refs == 0 {
            let why = if full {
                E::DropSocketQueueFull
            } else {
                E::DropNoSocket
            };
            return self.drop_frame(qi, addr, why);
        }
        bump(self.page.e(E::RxPackets), 1);
        bump(self.page.e(E::RxBytes), plen as u64);
        let q = &mut self.queues[qi];
        let f = (addr >> q.frame_shift) as usize;
        if let Some(r) = q.refs.get_mut(f) {
            *r = refs;
        }
    }

    /// Release a consumed item's frame reference.
    #[inline]
    fn release(&mut self, item: &RxItem) {
        let qi = item.q as usize;
        let q = &mut self.queues[qi];
        let f = (item.addr >> q.frame_shift) as usize;
        let last = match q.refs.get_mut(f) {
            Some(r) if *r > 1 => {
                *r -= 1;
                false
            }
            Some(r) => {
                *r = 0;
                true
            }
            None => true,
        };
        if last {
            q.to_fill.push(item.addr);
            if q.to_fill.len() >= RX_BATCH as usize {
                self.flush_fill(qi);
            }
        }
    }

    #[inline]
    fn pop(&mut self, sid: usize) -> Option<RxItem> {
        let s = self.socks.get_mut(sid)?.as_mut()?;
        let it = s.queue.pop_front()?;
        self.page
            .s(s.slot, S::QueueDepth)
            .store(s.queue.len() as u64, std::sync::atomic::Ordering::Relaxed);
        bump(self.page.s(s.slot, S::RxPackets), 1);
        bump(self.page.s(s.slot, S::RxBytes), u64::from(it.len));
        Some(it)
    }

    #[inline]
    fn payload(&self, it: &RxItem) -> &[u8] {
        self.queues[it.q as usize]
            .xsk
            .data(it.addr, it.len)
            .unwrap_or(&[])
    }

    fn refreshkernel_stats(&mut self) {
        let mut t = nanowire_xdp::XskStats::default();
        for q in &self.queues {
            let s = q.xsk.stats();
            t.rx_dropped += s.rx_dropped;
            t.rx_ring_full += s.rx_ring_full;
            t.rx_fill_ring_empty_descs += s.rx_fill_ring_empty_descs;
            t.rx_invalid_descs += s.rx_invalid_descs;
            t.tx_invalid_descs += s.tx_invalid_descs;
            t.tx_ring_empty_descs += s.tx_ring_empty_descs;
        }
        let set = |c: E, v: u64| {
            self.page
                .e(c)
                .store(v, std::sync::atomic::Ordering::Relaxed)
        };
        // The kernel counts a fill-ring-empty drop in rx_dropped too; keep
        // the counters disjoint so that they add up.
        set(
            E::XskRxDropped,
            t.rx_dropped.saturating_sub(t.rx_fill_ring_empty_descs),
        );
        set(E::XskRxRingFull, t.rx_ring_full);
        set(E::XskRxFillRingEmpty, t.rx_fill_ring_empty_descs);
        set(E::XskRxInvalidDescs, t.rx_invalid_descs);
        set(E::XskTxInvalidDescs, t.tx_invalid_descs);
        set(E::XskTxRingEmpty, t.tx_ring_empty_descs);
    }

    /// Source address and MAC for `dst`, from the cache or the kernel.
    fn route(
        &mut self,
        dst: Ipv4Addr,
        ifindex: u32,
        ifaddr: Option<Ipv4Addr>,
    ) -> io::Result<Option<(Ipv4Addr, [u8; 6])>> {
        if let Some(r) = self.neigh.get(&dst.to_bits()) {
            return Ok(*r);
        }
        let route = if dst.is_multicast() || dst.is_broadcast() {
            netlink::Route {
                oif: ifindex,
                gateway: None,
                prefsrc: ifaddr,
                kind: netlink::RTN_MULTICAST,
            }
        } else {
            netlink::route_get(dst)?
        };
        if route.oif != ifindex || route.kind == netlink::RTN_LOCAL {
            // Not through our interface (loopback, another NIC): the
            // kernel socket carries it.
            self.neigh.insert(dst.to_bits(), None);
            return Ok(None);
        }
        let src = route.prefsrc.or(ifaddr).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                "interface has no IPv4 address",
            )
        })?;
        let mac = netlink::resolve_mac(dst, &route, Duration::from_secs(1))
            .map_err(|e| io::Error::new(io::ErrorKind::HostUnreachable, e))?;
        self.neigh.insert(dst.to_bits(), Some((src, mac)));
        Ok(Some((src, mac)))
    }
}

/// Validate a frame as Ethernet/IPv4/UDP: (src, dst, payload offset,
/// payload length, checksum was partial), or the drop reason.
#[inline]
fn parse_udp(data: &[u8]) -> Result<(SocketAddrV4, SocketAddrV4, usize, usize, bool), E> {
    let eth = EthernetFrame::new_checked(data).map_err(E::malformed)?;
    if eth.ethertype() != EtherType::Ipv4 {
        return Err(E::DropNotUdp);
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).map_err(E::malformed)?;
    let repr = Ipv4Repr::parse(&ip, true).map_err(E::malformed)?;
    if repr.protocol != PROTO_UDP {
        return Err(E::DropNotUdp);
    }
    let udp = UdpDatagram::new_checked(ip.payload()).map_err(E::malformed)?;
    let partial = match udp.checksum_state(repr.src, repr.dst) {
        ChecksumState::Bad => return Err(E::DropBadUdpChecksum),
        ChecksumState::Partial => true,
        ChecksumState::Valid | ChecksumState::Absent => false,
    };
    let off = ETH_HDR + IP_HDR + UDP_HDR;
    Ok((
        SocketAddrV4::new(repr.src, udp.src_port()),
        SocketAddrV4::new(repr.dst, udp.dst_port()),
        off,
        udp.payload().len(),
        partial,
    ))
}

/// A UDP socket on the xdp engine.
pub struct XdpSocket {
    engine: Arc<Engine>,
    sid: usize,
    local: SocketAddrV4,
    peer: Option<SocketAddrV4>,
    wait: WaitPolicy,
    /// Duplicate of the reservation socket: datagrams that reach it (sent
    /// over loopback or another interface) are received too, never lost.
    kernel: UdpSocket,
    scratch: Vec<u8>,
    kcheck: u32,
    /// The eventfd of this socket's `Sock` (owned there, valid while we live).
    wake_fd: RawFd,
}

/// Empty `recv_batch` calls between two looks at the kernel twin.
const KERNEL_CHECK_EVERY: u32 = 4096;
/// Time between two looks at the kernel twin while `recv_with` spins.
const KERNEL_CHECK_INTERVAL: Duration = Duration::from_micros(200);

fn io_err(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

fn kernel_socket(bind: SocketAddrV4, reuse: bool) -> io::Result<UdpSocket> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket(2); ownership passes to UdpSocket right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let s = unsafe { UdpSocket::from_raw_fd(fd) };
    if reuse {
        let one: libc::c_int = 1;
        // SAFETY: setsockopt with an int option value.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                4,
            )
        };
    }
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: bind.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*bind.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
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

/// Why the xdp engine could not be used (an engine-level failure, as
/// opposed to a socket-level one such as "address in use").
#[derive(Debug)]
pub enum OpenError {
    /// No privilege, no AF_XDP, attach refused, queue busy, ...
    Engine(String),
    /// The socket itself failed (bad address, port in use).
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

impl XdpSocket {
    /// Open a socket bound to `bind` on the engine of `opts.iface` (or the
    /// interface owning the bind address).
    pub fn open(bind: SocketAddrV4, opts: &EngineOptions) -> Result<XdpSocket, OpenError> {
        let ifname = match &opts.iface {
            Some(i) => i.clone(),
            None => iface::iface_for_addr(*bind.ip()).map_err(OpenError::Engine)?,
        };
        let engine = Engine::get(&ifname, opts).map_err(OpenError::Engine)?;
        XdpSocket::open_on(engine, bind, opts.wait)
    }

    /// Open a socket on an existing engine.
    pub fn open_on(
        engine: Arc<Engine>,
        bind: SocketAddrV4,
        wait: WaitPolicy,
    ) -> Result<XdpSocket, OpenError> {
        let ifaddr = engine.iface.addr;
        let iface_addrs: Vec<Ipv4Addr> = iface::ipv4_addrs()
            .unwrap_or_default()
            .into_iter()
            .filter(|(n, _)| *n == engine.iface.name)
            .map(|(_, a)| a)
            .collect();
        if !bind.ip().is_unspecified()
            && !bind.ip().is_multicast()
            && !iface_addrs.contains(bind.ip())
        {
            return Err(OpenError::Socket(io_err(
                io::ErrorKind::AddrNotAvailable,
                format!("{} is not the address of {}", bind.ip(), engine.iface.name),
            )));
        }
        let kernel = kernel_socket(bind, bind.ip().is_multicast()).map_err(OpenError::Socket)?;
        let kernel_dup = kernel
            .try_clone()
            .and_then(|k| k.set_nonblocking(true).map(|_| k));
        let local = match kernel.local_addr().map_err(OpenError::Socket)? {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!("IPv4 socket"),
        };
        // A wildcard bind claims every IPv4 address of the interface.
        let claim_ips: Vec<Ipv4Addr> = if local.ip().is_unspecified() {
            let all = iface_addrs;
            if all.is_empty() {
                let a = ifaddr.ok_or_else(|| {
                    OpenError::Engine(format!("{} has no IPv4 address", engine.iface.name))
                })?;
                vec![a]
            } else {
                all
            }
        } else {
            vec![*local.ip()]
        };
        let mut g = engine.lock();
        let slot = g
            .socks
            .iter()
            .position(|s| s.is_none())
            .unwrap_or(g.socks.len());
        if slot >= shm::MAX_SOCKETS {
            return Err(OpenError::Socket(io_err(
                io::ErrorKind::OutOfMemory,
                format!(
                    "the xdp engine supports at most {} sockets",
                    shm::MAX_SOCKETS
                ),
            )));
        }
        let wake = eventfd().map_err(OpenError::Socket)?;
        let wake_fd = wake.as_raw_fd();
        let sock = Sock {
            peer: None,
            sleeping: false,
            wake,
            claims: Vec::new(),
            queue: VecDeque::with_capacity(1024),
            cap: DEFAULT_SOCKET_QUEUE,
            slot,
            kernel,
        };
        if slot == g.socks.len() {
            g.socks.push(Some(sock));
        } else {
            g.socks[slot] = Some(sock);
        }
        engine.page.set_sock_addr(slot, Some(local));
        bump(engine.page.e(E::Sockets), 1);
        let r = claim_ips
            .iter()
            .try_for_each(|ip| g.claim(slot, *ip, local.port()));
        drop(g);
        let kernel = match kernel_dup {
            Ok(k) => k,
            Err(e) => {
                engine.lock().close(slot);
                return Err(OpenError::Socket(e));
            }
        };
        let s = XdpSocket {
            engine,
            sid: slot,
            local,
            peer: None,
            wait,
            kernel,
            scratch: vec![0u8; 65536],
            kcheck: 0,
            wake_fd,
        };
        r.map_err(OpenError::Engine)?;
        Ok(s)
    }

    pub fn engine_handle(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Receive one datagram without copying: `f` sees the payload in its
    /// UMEM frame; the frame is released when `f` returns.
    pub fn recv_with<R>(
        &mut self,
        deadline: Option<Instant>,
        mut f: impl FnMut(&[u8], SocketAddrV4) -> R,
    ) -> io::Result<Option<R>> {
        // The clock is read only once the socket has to wait: a datagram
        // already there costs no clock read.
        let mut start: Option<Instant> = None;
        let mut next_kcheck: Option<Instant> = None;
        let mut spins: u32 = 0;
        loop {
            {
                let mut g = self.engine.lock();
                let mut it = g.pop(self.sid);
                if it.is_none() && g.poll_rx() > 0 {
                    it = g.pop(self.sid);
                }
                if let Some(it) = it {
                    let r = f(g.payload(&it), it.src);
                    g.release(&it);
                    return Ok(Some(r));
                }
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
                                .min(MAX_SLEEP_MS as u128) as i32
                        })
                        .unwrap_or(MAX_SLEEP_MS)
                        .max(1);
                    // Announce the sleep under the lock, unless a datagram
                    // arrived for us meanwhile (another thread drained it).
                    let may_sleep = {
                        let mut g = self.engine.lock();
                        match g.socks.get_mut(self.sid) {
                            Some(Some(s)) if s.queue.is_empty() => {
                                s.sleeping = true;
                                true
                            }
                            _ => false,
                        }
                    };
                    if may_sleep {
                        self.engine
                            .wait_fds(&[self.kernel.as_raw_fd(), self.wake_fd], ms);
                        if let Some(Some(s)) = self.engine.lock().socks.get_mut(self.sid) {
                            s.sleeping = false;
                        }
                        eventfd_drain(self.wake_fd);
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

    /// Receive up to `max` queued datagrams without waiting, zero-copy.
    pub fn recv_batch(&mut self, max: usize, mut f: impl FnMut(&[u8], SocketAddrV4)) -> usize {
        let mut n = 0;
        {
            let mut g = self.engine.lock();
            g.poll_rx();
            while n < max {
                let Some(it) = g.pop(self.sid) else { break };
                f(g.payload(&it), it.src);
                g.release(&it);
                n += 1;
            }
        }
        if n == 0 {
            self.kcheck = self.kcheck.wrapping_add(1);
            if self.kcheck.is_multiple_of(KERNEL_CHECK_EVERY)
                && let Ok(Some(())) = self.try_kernel(&mut f)
            {
                n = 1;
            }
        }
        n
    }

    /// One datagram from the kernel reservation socket, if any (a syscall:
    /// called only every KERNEL_CHECK_EVERY empty polls, or after a sleep).
    fn try_kernel<R>(
        &mut self,
        f: &mut impl FnMut(&[u8], SocketAddrV4) -> R,
    ) -> io::Result<Option<R>> {
        match self.kernel.recv_from(&mut self.scratch) {
            Ok((n, std::net::SocketAddr::V4(src))) => {
                let p = &self.engine.page;
                bump(p.s(self.sid, S::RxPackets), 1);
                bump(p.s(self.sid, S::RxBytes), n as u64);
                bump(p.s(self.sid, S::RxKernelPath), 1);
                Ok(Some(f(&self.scratch[..n], src)))
            }
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            // ICMP errors reported on the socket (e.g. port unreachable).
            Err(_) => Ok(None),
        }
    }

    /// Send several datagrams with one kick. Returns how many were queued.
    pub fn send_many(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        let mut g = self.engine.lock();
        let eng = &self.engine;
        let Some((src_ip, mac)) = g.route(*dst.ip(), eng.iface.index, eng.iface.addr)? else {
            drop(g);
            return self.send_kernel(bufs, dst);
        };
        let src_ip = if self.local.ip().is_unspecified() || self.local.ip().is_multicast() {
            src_ip
        } else {
            *self.local.ip()
        };
        let mtu = eng.iface.mtu as usize;
        // One kick sends at most the copy-mode budget (32 without
        // XDP_MAX_TX_SKB_BUDGET): never queue more per kick, or frames would
        // wait in the ring for the next send.
        let per_kick = g.queues[0].xsk.tx_budget().unwrap_or(32).clamp(1, 256) as usize;
        let g = &mut *g;
        let frames = &mut g.tx_batch;
        let mut sent = 0;
        for chunk in bufs.chunks(per_kick) {
            frames.clear();
            for b in chunk {
                if b.len() + IP_HDR + UDP_HDR > mtu {
                    if sent + frames.len() == 0 {
                        return Err(io_err(
                            io::ErrorKind::InvalidInput,
                            format!(
                                "message too long: {} B exceeds the MTU payload of {} B (no IP fragmentation)",
                                b.len(),
                                mtu - IP_HDR - UDP_HDR
                            ),
                        ));
                    }
                    break;
                }
                let id = g.ip_id;
                g.ip_id = g.ip_id.wrapping_add(1);
                let q = &mut g.queues[0].xsk;
                let Some(addr) = q.tx_alloc() else { break };
                let fr = q.frame_mut(addr);
                let len = build_frame(
                    fr,
                    eng.iface.mac,
                    mac,
                    src_ip,
                    self.local.port(),
                    dst,
                    b,
                    id,
                );
                frames.push((addr, len as u32));
            }
            let q = &mut g.queues[0].xsk;
            let k = q.transmit(frames);
            for &(a, _) in &frames[k..] {
                q.tx_unalloc(a);
            }
            let page = &eng.page;
            bump(page.e(E::TxPackets), k as u64);
            bump(page.s(self.sid_slot(), S::TxPackets), k as u64);
            let kb: u64 = chunk[..k].iter().map(|b| b.len() as u64).sum();
            bump(page.e(E::TxBytes), kb);
            bump(page.s(self.sid_slot(), S::TxBytes), kb);
            sent += k;
            if k < chunk.len() {
                break;
            }
        }
        if sent == 0 && !bufs.is_empty() {
            // Ring full even after reaping: kick and report the drop.
            g.queues[0].xsk.kick_tx();
            g.queues[0].xsk.reap_completions();
            bump(eng.page.e(E::DropTxRingFull), 1);
            bump(eng.page.s(self.sid_slot(), S::DropTxRingFull), 1);
            return Err(io_err(io::ErrorKind::WouldBlock, "xdp tx ring full"));
        }
        let q = &mut g.queues[0].xsk;
        // A kick the kernel could not finish (EAGAIN/ENOBUFS) leaves frames
        // in the ring: kick once more rather than strand them until the
        // next send.
        if q.tx.occupancy() > 0 {
            q.kick_tx();
        }
        // Completions of earlier sends.
        q.reap_completions();
        if let Some(e) = q.kick_error() {
            return Err(io::Error::new(
                e.kind(),
                format!("{} cannot transmit: {e}", eng.iface.name),
            ));
        }
        Ok(sent)
    }

    /// Destinations not behind the engine's interface go through the
    /// kernel reservation socket.
    fn send_kernel(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            match self.kernel.send_to(b, dst) {
                Ok(_) => {
                    let p = &self.engine.page;
                    bump(p.s(self.sid, S::TxPackets), 1);
                    bump(p.s(self.sid, S::TxBytes), b.len() as u64);
                    bump(p.s(self.sid, S::TxKernelPath), 1);
                    n += 1;
                }
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(n)
    }

    #[inline]
    fn sid_slot(&self) -> usize {
        self.sid
    }
}

/// Write Ethernet + IPv4 + UDP (full checksum) + payload into `fr`;
/// returns the frame length.
#[allow(clippy::too_many_arguments)]
#[inline]
fn build_frame(
    fr: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    sport: u16,
    dst: SocketAddrV4,
    payload: &[u8],
    id: u16,
) -> usize {
    let total = HDRS + payload.len();
    fr[0..6].copy_from_slice(&dst_mac);
    fr[6..12].copy_from_slice(&src_mac);
    fr[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    fr[HDRS..total].copy_from_slice(payload);
    Ipv4Repr {
        src,
        dst: *dst.ip(),
        protocol: PROTO_UDP,
        payload_len: UDP_HDR + payload.len(),
        ttl: if dst.ip().is_multicast() { 1 } else { 64 },
        ident: id,
    }
    .emit(&mut fr[ETH_HDR..]);
    UdpRepr {
        src_port: sport,
        dst_port: dst.port(),
    }
    .emit(
        &mut fr[ETH_HDR + IP_HDR..total],
        payload.len(),
        src,
        *dst.ip(),
    );
    total
}

impl Inner {
    fn claim(&mut self, sid: usize, addr: Ipv4Addr, port: u16) -> Result<(), String> {
        let k = key(addr, port);
        let e = self.table.entry(k).or_default();
        if e.is_empty() {
            self.prog.claim(addr, port, std::process::id())?;
        }
        if !e.contains(&sid) {
            e.push(sid);
        }
        if let Some(Some(s)) = self.socks.get_mut(sid)
            && !s.claims.contains(&(addr, port))
        {
            s.claims.push((addr, port));
        }
        Ok(())
    }

    fn close(&mut self, sid: usize) {
        let Some(s) = self.socks.get_mut(sid).and_then(|s| s.take()) else {
            return;
        };
        for (a, p) in &s.claims {
            let k = key(*a, *p);
            if let Some(v) = self.table.get_mut(&k) {
                v.retain(|&x| x != sid);
                if v.is_empty() {
                    self.table.remove(&k);
                    self.prog.unclaim(*a, *p);
                }
            }
        }
        for it in &s.queue {
            self.release(it);
        }
        for qi in 0..self.queues.len() {
            self.flush_fill(qi);
        }
        self.page.set_sock_addr(s.slot, None);
        let c = self.page.e(E::Sockets);
        c.store(
            c.load(std::sync::atomic::Ordering::Relaxed)
                .saturating_sub(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

impl Drop for XdpSocket {
    fn drop(&mut self) {
        self.engine.lock().close(self.sid);
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
        // Resolve now so the first send does not pay for it.
        let eng = self.engine.clone();
        let mut g = eng.lock();
        g.route(*peer.ip(), eng.iface.index, eng.iface.addr)?;
        if let Some(Some(s)) = g.socks.get_mut(self.sid) {
            s.peer = Some(peer);
            // The kernel twin filters the same way (loopback path).
            s.kernel.connect(peer)?;
        }
        self.peer = Some(peer);
        Ok(())
    }
    fn send_to(&mut self, buf: &[u8], dst: SocketAddrV4) -> io::Result<usize> {
        self.send_many(&[buf], dst).map(|_| buf.len())
    }
    fn send_batch_to(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        self.send_many(bufs, dst)
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
        if !group.is_multicast() {
            return Err(io_err(
                io::ErrorKind::InvalidInput,
                format!("{group} is not a multicast group"),
            ));
        }
        let ifaddr = if iface_addr.is_unspecified() {
            self.engine.iface.addr.unwrap_or(iface_addr)
        } else {
            iface_addr
        };
        let mut g = self.engine.lock();
        if let Some(Some(s)) = g.socks.get(self.sid) {
            // The kernel socket's membership makes the kernel answer IGMP.
            s.kernel.join_multicast_v4(&group, &ifaddr)?;
        }
        g.claim(self.sid, group, self.local.port())
            .map_err(|e| io_err(io::ErrorKind::Other, e))
    }
    fn engine_counters(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .engine
            .counters()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let p = &self.engine.page;
        for (i, n) in shm::SOCK_COUNTERS.iter().enumerate() {
            v.push((format!("socket.{n}"), p.sock_word(self.sid, i)));
        }
        v
    }
    fn stats(&self) -> SocketStats {
        let p = &self.engine.page;
        let r = |c: S| p.s(self.sid, c).load(std::sync::atomic::Ordering::Relaxed);
        SocketStats {
            rx_packets: r(S::RxPackets),
            rx_bytes: r(S::RxBytes),
            tx_packets: r(S::TxPackets),
            tx_bytes: r(S::TxBytes),
            rx_drop_queue_full: r(S::DropQueueFull),
        }
    }
}

impl XdpSocket {
    /// The socket's kernel twin (bound to the same address; non-blocking):
    /// a real fd number for fd-based code, and the path for loopback
    /// traffic. Datagrams XDP steers never show up on it.
    pub fn kernel_fd(&self) -> RawFd {
        self.kernel.as_raw_fd()
    }

    /// Descriptors that become readable when a datagram may be waiting for
    /// this socket: the engine's AF_XDP sockets, this socket's wake-up
    /// eventfd and its kernel twin (for poll/select/epoll integration; a
    /// readable fd is a hint, [`XdpSocket::pending`] is the answer).
    pub fn poll_fds(&self) -> Vec<RawFd> {
        let mut v = self.engine.fds.clone();
        v.push(self.wake_fd);
        v.push(self.kernel.as_raw_fd());
        v
    }

    /// Drain the rings and report (queued datagrams, length of the next
    /// one) without consuming anything. Does not look at the kernel twin.
    pub fn pending(&self) -> (usize, usize) {
        let mut g = self.engine.lock();
        g.poll_rx();
        match g.socks.get(self.sid) {
            Some(Some(s)) => (
                s.queue.len(),
                s.queue.front().map_or(0, |it| it.len as usize),
            ),
            _ => (0, 0),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; HDRS + payload.len()];
        let dst = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 7);
        let n = build_frame(
            &mut f,
            [2; 6],
            [4; 6],
            Ipv4Addr::new(198, 18, 0, 1),
            9,
            dst,
            payload,
            1,
        );
        f.truncate(n);
        f
    }

    #[test]
    fn built_frames_parse_back() {
        let f = frame(b"hello");
        let (src, dst, off, len, partial) = parse_udp(&f).unwrap();
        assert_eq!(src, "198.18.0.1:9".parse().unwrap());
        assert_eq!(dst, "198.18.0.2:7".parse().unwrap());
        assert_eq!(&f[off..off + len], b"hello");
        assert!(!partial, "we send full checksums");
    }

    #[test]
    fn garbage_never_panics() {
        // xorshift: deterministic pseudo-random mutations of a valid frame.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let base = frame(&[0x55; 40]);
        for _ in 0..20000 {
            let mut f = base.clone();
            for _ in 0..(next() % 6) {
                let i = (next() as usize) % f.len();
                f[i] = next() as u8;
            }
            let cut = (next() as usize) % (f.len() + 1);
            let _ = parse_udp(&f[..cut]);
            let _ = parse_udp(&f);
        }
        for n in 0..HDRS + 4 {
            assert!(parse_udp(&base[..n]).is_err());
        }
    }

    #[test]
    fn multicast_frames_use_ttl_1() {
        let mut f = vec![0u8; HDRS + 4];
        let g = SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 5);
        build_frame(
            &mut f,
            [2; 6],
            [1, 0, 0x5e, 1, 2, 3],
            Ipv4Addr::new(10, 0, 0, 1),
            6,
            g,
            b"abcd",
            3,
        );
        assert_eq!(f[ETH_HDR + 8], 1);
        assert!(parse_udp(&f).is_ok());
    }
}
