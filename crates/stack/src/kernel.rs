//! The `kernel` and `spin` engines: kernel UDP sockets behind [`UdpEndpoint`],
//! plus TCP helpers and a stop-on-signal flag.
//!
//! * `kernel` ([`WaitPolicy::Block`]): `recvfrom` blocks in the kernel, as
//!   sockperf does. Deadlines are honoured through `SO_RCVTIMEO`, which is
//!   only changed when the wanted timeout changes (no extra syscall per
//!   receive in steady state).
//! * `spin` ([`WaitPolicy::Spin`]): `recvfrom(MSG_DONTWAIT)` polled in a loop,
//!   never sleeping.
//! * [`WaitPolicy::SpinThenBlock`]: spin for the given time, then block.
//!
//! This module holds the stack's syscall glue, so it is the one place with
//! `unsafe` here; every block says why it is sound.

use crate::sockaddr::{from_sockaddr_in, sockaddr_in};
use crate::{EngineKind, EngineOptions, SocketStats, UdpEndpoint, WaitPolicy};
use std::io;
use std::mem::{MaybeUninit, size_of};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest single blocking wait; a deadline further away is reached in slices.
const BLOCK_SLICE: Duration = Duration::from_millis(200);
/// Most datagrams handed to one `sendmmsg`.
const MAX_BATCH: usize = 1024;

/// setsockopt(2) of an option whose value is a `T` (an int, a timeval, an
/// in_addr, an ip_mreq...), through libc (the shim sees it as any
/// program's call).
pub fn set_opt<T: Copy>(fd: RawFd, level: i32, name: i32, val: &T) -> io::Result<()> {
    // SAFETY: `val` is a live, initialised T and its exact size is passed;
    // the kernel only reads it (a bad fd is an error, not UB).
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One sendmmsg(2): each of `bufs` as a message of its own, to `name` (a
/// sockaddr of any family; `None` on a connected socket). Returns the
/// messages sent and their bytes.
pub fn send_each<A: Copy>(
    fd: RawFd,
    bufs: &[&[u8]],
    name: Option<&A>,
    flags: libc::c_int,
) -> io::Result<(usize, u64)> {
    let mut iovs: Vec<libc::iovec> = bufs
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            if let Some(a) = name {
                m.msg_hdr.msg_name = (a as *const A).cast_mut().cast();
                m.msg_hdr.msg_namelen = size_of::<A>() as libc::socklen_t;
            }
            m.msg_hdr.msg_iov = iov as *mut libc::iovec;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    // SAFETY: `msgs` holds `msgs.len()` initialised headers whose iovecs point
    // into `bufs` (borrowed for this call) and whose names point at `name`;
    // the kernel only reads them (and writes msg_len).
    let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as libc::c_uint, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    Ok((n, msgs[..n].iter().map(|m| u64::from(m.msg_len)).sum()))
}

fn setsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32, val: i32) -> io::Result<()> {
    set_opt(fd.as_raw_fd(), level, name, &val)
}

fn getsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut val: i32 = 0;
    let mut len = size_of::<i32>() as libc::socklen_t;
    // SAFETY: `fd` is live; `val`/`len` are valid locals of the size we declare.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut val as *mut i32).cast(),
            &mut len,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(val)
    }
}

/// Set SO_RCVBUF / SO_SNDBUF. When the request exceeds the sysctl maximum
/// (net.core.rmem_max / wmem_max) and we are privileged, the FORCE variants
/// are used so the size asked for is the size obtained.
pub fn set_socket_buffers(
    fd: BorrowedFd<'_>,
    rcvbuf: Option<usize>,
    sndbuf: Option<usize>,
) -> io::Result<()> {
    let clamp = |v: usize| i32::try_from(v).unwrap_or(i32::MAX / 2);
    if let Some(r) = rcvbuf {
        let v = clamp(r);
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v).is_err() {
            setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v)?;
        }
    }
    if let Some(s) = sndbuf {
        let v = clamp(s);
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
            setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v)?;
        }
    }
    Ok(())
}

/// The effective (kernel-doubled) SO_RCVBUF and SO_SNDBUF of a socket.
pub fn socket_buffers(fd: BorrowedFd<'_>) -> io::Result<(usize, usize)> {
    let r = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
    let s = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?;
    Ok((r.max(0) as usize, s.max(0) as usize))
}

/// Datagrams the kernel dropped on this socket (`sk_drops`, e.g. receive
/// buffer full), read through SO_MEMINFO.
fn socket_drops(fd: BorrowedFd<'_>) -> io::Result<u64> {
    const SK_MEMINFO_VARS: usize = 9;
    const SK_MEMINFO_DROPS: usize = 8;
    let mut info = [0u32; SK_MEMINFO_VARS];
    let mut len = size_of::<[u32; SK_MEMINFO_VARS]>() as libc::socklen_t;
    // SAFETY: `info` is a valid writable buffer of `len` bytes; the kernel writes
    // at most `len` bytes and updates `len`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from(info[SK_MEMINFO_DROPS]))
}

/// A kernel UDP socket serving the `kernel` or `spin` engine.
#[derive(Debug)]
pub struct KernelUdp {
    sock: UdpSocket,
    kind: EngineKind,
    wait: WaitPolicy,
    peer: Option<SocketAddrV4>,
    /// SO_RCVTIMEO currently set; `None` means "block forever".
    rcvtimeo: Option<Duration>,
    stats: SocketStats,
}

impl KernelUdp {
    /// Open a UDP socket bound to `bind`. A multicast bind address gets
    /// SO_REUSEADDR so several receivers can share the group's port.
    pub fn bind(bind: SocketAddrV4, opts: &EngineOptions) -> io::Result<KernelUdp> {
        // SAFETY: plain socket(2) call; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::IPPROTO_UDP,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        if bind.ip().is_multicast() {
            setsockopt_int(fd.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        }
        set_socket_buffers(fd.as_fd(), opts.rcvbuf, opts.sndbuf)?;
        let sa = sockaddr_in(bind);
        // SAFETY: `sa` is a properly initialised sockaddr_in of the size we pass.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("cannot bind {bind}: {e}")));
        }
        let kind = match opts.kind {
            EngineKind::Xdp => EngineKind::Spin,
            k => k,
        };
        Ok(KernelUdp {
            sock: UdpSocket::from(fd),
            kind,
            wait: opts.wait,
            peer: None,
            rcvtimeo: None,
            stats: SocketStats::default(),
        })
    }

    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// Send multicast through the interface with address `iface_addr`
    /// (IP_MULTICAST_IF), looping it back to local members too.
    pub fn set_multicast_if(&self, iface_addr: Ipv4Addr) -> io::Result<()> {
        let a = libc::in_addr {
            s_addr: u32::from(iface_addr).to_be(),
        };
        set_opt(self.fd(), libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &a)?;
        self.sock.set_multicast_loop_v4(true)
    }

    pub fn wait_policy(&self) -> WaitPolicy {
        self.wait
    }

    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn set_rcvtimeo(&mut self, t: Option<Duration>) -> io::Result<()> {
        if self.rcvtimeo == t {
            return Ok(());
        }
        let d = t.unwrap_or(Duration::ZERO);
        let tv = libc::timeval {
            tv_sec: d.as_secs() as libc::time_t,
            tv_usec: d.subsec_micros() as libc::suseconds_t,
        };
        set_opt(self.fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
        self.rcvtimeo = t;
        Ok(())
    }

    /// One recvfrom(2). `Ok(None)` on EAGAIN.
    fn recv_once(
        &mut self,
        buf: &mut [u8],
        flags: i32,
    ) -> io::Result<Option<(usize, SocketAddrV4)>> {
        let mut sa = MaybeUninit::<libc::sockaddr_in>::zeroed();
        let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes; `sa`/`len`
        // describe a writable sockaddr_in-sized area.
        let n = unsafe {
            libc::recvfrom(
                self.fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
                sa.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: recvfrom succeeded on an AF_INET socket, so it wrote a sockaddr_in
        // (the buffer was zeroed first in any case).
        let sa = unsafe { sa.assume_init() };
        let n = n as usize;
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += n as u64;
        Ok(Some((n, from_sockaddr_in(&sa))))
    }

    fn recv_spin(
        &mut self,
        buf: &mut [u8],
        until: Option<Instant>,
    ) -> io::Result<Option<(usize, SocketAddrV4)>> {
        let mut i: u32 = 0;
        loop {
            if let Some(r) = self.recv_once(buf, libc::MSG_DONTWAIT)? {
                return Ok(Some(r));
            }
            i = i.wrapping_add(1);
            if i.is_multiple_of(16) && until.is_some_and(|u| Instant::now() >= u) {
                return Ok(None);
            }
            std::hint::spin_loop();
        }
    }

    fn recv_block(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<(usize, SocketAddrV4)>> {
        loop {
            match deadline {
                None => self.set_rcvtimeo(None)?,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    let rem = d - now;
                    if rem < Duration::from_millis(10) {
                        // SO_RCVTIMEO counts in jiffies (4 ms at HZ=250): near
                        // deadlines (pacing) wait in ppoll, which has hrtimer
                        // precision.
                        self.wait_readable(rem)?;
                        if let Some(r) = self.recv_once(buf, libc::MSG_DONTWAIT)? {
                            return Ok(Some(r));
                        }
                        continue;
                    }
                    let want = if rem >= BLOCK_SLICE {
                        BLOCK_SLICE
                    } else {
                        // Whole milliseconds, so a deadline a fixed time ahead
                        // maps to one value and needs no setsockopt per call.
                        Duration::from_millis(rem.as_millis() as u64 + 1)
                    };
                    self.set_rcvtimeo(Some(want))?;
                }
            }
            if let Some(r) = self.recv_once(buf, 0)? {
                return Ok(Some(r));
            }
        }
    }

    /// Sleep in ppoll(2) until the socket is readable or `t` passes.
    fn wait_readable(&self, t: Duration) -> io::Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: t.as_secs() as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd and a valid timespec; no signal mask.
        let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }

    fn send_flags(&self) -> i32 {
        match self.wait {
            WaitPolicy::Block => 0,
            _ => libc::MSG_DONTWAIT,
        }
    }
}

impl UdpEndpoint for KernelUdp {
    fn engine(&self) -> EngineKind {
        self.kind
    }

    fn local_addr(&self) -> io::Result<SocketAddrV4> {
        match self.sock.local_addr()? {
            std::net::SocketAddr::V4(a) => Ok(a),
            std::net::SocketAddr::V6(a) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("not an IPv4 socket: {a}"),
            )),
        }
    }

    fn connect(&mut self, peer: SocketAddrV4) -> io::Result<()> {
        self.sock.connect(peer)?;
        self.peer = Some(peer);
        Ok(())
    }

    fn send_to(&mut self, buf: &[u8], dst: SocketAddrV4) -> io::Result<usize> {
        let flags = self.send_flags();
        let n = if self.peer == Some(dst) {
            // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
            unsafe { libc::send(self.fd(), buf.as_ptr().cast(), buf.len(), flags) }
        } else {
            let sa = sockaddr_in(dst);
            // SAFETY: `buf` is readable for its length; `sa` is a valid sockaddr_in.
            unsafe {
                libc::sendto(
                    self.fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    flags,
                    (&sa as *const libc::sockaddr_in).cast(),
                    size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += n as u64;
        Ok(n as usize)
    }

    fn send_batch_to(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        let bufs = &bufs[..bufs.len().min(MAX_BATCH)];
        if bufs.is_empty() {
            return Ok(0);
        }
        let sa = sockaddr_in(dst);
        let name = (self.peer != Some(dst)).then_some(&sa);
        let (n, bytes) = send_each(self.fd(), bufs, name, self.send_flags())?;
        self.stats.tx_packets += n as u64;
        self.stats.tx_bytes += bytes;
        Ok(n)
    }

    fn recv_from(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<(usize, SocketAddrV4)>> {
        match self.wait {
            WaitPolicy::Block => self.recv_block(buf, deadline),
            WaitPolicy::Spin => self.recv_spin(buf, deadline),
            WaitPolicy::SpinThenBlock(d) => {
                let spin_until = Instant::now() + d;
                let until = match deadline {
                    Some(dl) if dl < spin_until => dl,
                    _ => spin_until,
                };
                if let Some(r) = self.recv_spin(buf, Some(until))? {
                    return Ok(Some(r));
                }
                self.recv_block(buf, deadline)
            }
        }
    }

    fn try_recv_from(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddrV4)>> {
        self.recv_once(buf, libc::MSG_DONTWAIT)
    }

    fn join_multicast(&mut self, group: Ipv4Addr, iface_addr: Ipv4Addr) -> io::Result<()> {
        self.sock.join_multicast_v4(&group, &iface_addr)
    }

    fn stats(&self) -> SocketStats {
        let mut s = self.stats;
        s.rx_drop_queue_full = socket_drops(self.sock.as_fd()).unwrap_or(0);
        s
    }
}

// ---------------------------------------------------------------------------
// TCP helpers for the kernel and spin engines.

/// Connect a TCP stream with TCP_NODELAY and the requested buffers. For the
/// `spin` engine (any non-blocking policy) the stream is non-blocking and
/// callers poll it; for `kernel` it stays blocking.
pub fn tcp_connect(
    addr: SocketAddrV4,
    opts: &EngineOptions,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr.into(), timeout)?;
    tcp_setup(&s, opts)?;
    Ok(s)
}

/// Apply the engine's options to an accepted or connected stream.
pub fn tcp_setup(s: &TcpStream, opts: &EngineOptions) -> io::Result<()> {
    s.set_nodelay(true)?;
    set_socket_buffers(s.as_fd(), opts.rcvbuf, opts.sndbuf)?;
    s.set_nonblocking(!matches!(opts.wait, WaitPolicy::Block))?;
    Ok(())
}

/// A listening TCP socket (always non-blocking so one loop can serve the
/// listener and every connection).
pub fn tcp_listen(bind: SocketAddrV4, opts: &EngineOptions) -> io::Result<TcpListener> {
    let l = TcpListener::bind(bind)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {bind}: {e}")))?;
    set_socket_buffers(l.as_fd(), opts.rcvbuf, opts.sndbuf)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Ask the kernel to stamp received data with `CLOCK_REALTIME` at its
/// arrival (SO_TIMESTAMPNS); [`recv_stamped`] returns the stamp. On TCP the
/// stamp is that of the last segment whose data a read returns.
pub fn enable_rx_timestamps(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

/// Non-blocking read with the kernel's receive stamp (`CLOCK_REALTIME`
/// nanoseconds, when [`enable_rx_timestamps`] is on): `Ok(None)` when nothing
/// is there, `Ok(Some((0, _)))` at end of stream.
pub fn recv_stamped(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<Option<(usize, Option<u64>)>> {
    recvmsg_stamp(fd, buf, libc::MSG_DONTWAIT, libc::SCM_TIMESTAMPNS)
}

/// One `recvmsg(flags)` into `buf` that does not wait, and the first
/// timespec of the SOL_SOCKET control message of type `kind` (SCM_TIMESTAMPNS,
/// or SO_TIMESTAMPING's software stamp) as `CLOCK_REALTIME` ns. `Ok(None)`
/// when nothing is there.
fn recvmsg_stamp(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
    kind: libc::c_int,
) -> io::Result<Option<(usize, Option<u64>)>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for a timestamp message (three timespecs for SO_TIMESTAMPING) and
    // the extended error that comes with it on the error queue.
    let mut cbuf = [0u64; 32];
    // SAFETY: an all-zero msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: msg points at a live iovec over `buf` and at `cbuf`, both valid
    // for writes of the lengths given, for the duration of the call.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags | libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    let mut stamp = None;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled in,
    // bounded by msg_controllen; the timespec is read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == kind {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                if ts.tv_sec != 0 || ts.tv_nsec != 0 {
                    stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some((n as usize, stamp)))
}

/// Turn software transmit stamps of this socket's sends on or off
/// (SO_TIMESTAMPING: `TX_SOFTWARE` while on, always `SOFTWARE |
/// OPT_TSONLY`). The stamp is taken by the driver as it takes the frame (veth
/// and loopback stamp in their transmit routines, before the peer's receive
/// runs): the moment the datagram leaves the host. [`tx_stamp`] reads them.
/// Turning it on for one send only keeps other sends off the error queue.
pub fn set_tx_timestamps(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let report = libc::SOF_TIMESTAMPING_SOFTWARE | libc::SOF_TIMESTAMPING_OPT_TSONLY;
    let flags = if on {
        report | libc::SOF_TIMESTAMPING_TX_SOFTWARE
    } else {
        report
    };
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPING, flags as i32)
}

/// One transmit stamp (`CLOCK_REALTIME` ns) from the socket's error queue,
/// without waiting; `Ok(None)` when none is queued.
pub fn tx_stamp(fd: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    // OPT_TSONLY: no payload comes back, only the control messages
    // (scm_timestamping: software, deprecated, hardware).
    let r = recvmsg_stamp(fd, &mut [], libc::MSG_ERRQUEUE, libc::SO_TIMESTAMPING)?;
    Ok(r.and_then(|(_, stamp)| stamp))
}

/// `CLOCK_REALTIME` now, in nanoseconds (one clock for every namespace of a
/// machine: tick-to-trade spans two hosts of the lab).
pub fn realtime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

// ---------------------------------------------------------------------------
// Stop on SIGINT / SIGTERM.

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Install SIGINT and SIGTERM handlers that set a flag (without SA_RESTART,
/// so a blocking receive returns EINTR) and return that flag.
pub fn stop_on_signals() -> io::Result<&'static AtomicBool> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction is plain old data; all-zero is a valid starting value.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_stop_signal as *const () as libc::sighandler_t;
        sa.sa_flags = 0;
        // SAFETY: `sa.sa_mask` is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: installing a handler that only stores to an atomic, which is
        // async-signal-safe; `sa` is fully initialised.
        let r = unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(&STOP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(kind: EngineKind) -> EngineOptions {
        EngineOptions::new(kind)
    }

    #[test]
    fn transmit_stamps_only_while_on_one_per_send() {
        use std::os::fd::AsFd;
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        for on in [true, false, true] {
            set_tx_timestamps(tx.as_fd(), on).unwrap();
            let before = realtime_ns();
            tx.send_to(b"tick", to).unwrap();
            let after = realtime_ns();
            // Loopback stamps in its transmit routine, within the send call.
            match tx_stamp(tx.as_fd()).unwrap() {
                Some(ns) => {
                    assert!(on, "a stamp while off");
                    assert!(before <= ns && ns <= after, "{before} <= {ns} <= {after}");
                }
                None => assert!(!on, "no stamp while on"),
            }
            assert_eq!(tx_stamp(tx.as_fd()).unwrap(), None, "one stamp per send");
        }
    }

    #[test]
    fn loopback_echo_each_policy() {
        for wait in [
            WaitPolicy::Block,
            WaitPolicy::Spin,
            WaitPolicy::SpinThenBlock(Duration::from_micros(50)),
        ] {
            let mut o = opts(EngineKind::Kernel);
            o.wait = wait;
            let lo = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
            let mut a = KernelUdp::bind(lo, &o).unwrap();
            let mut b = KernelUdp::bind(lo, &o).unwrap();
            let ba = b.local_addr().unwrap();
            a.connect(ba).unwrap();
            a.send_to(b"hello", ba).unwrap();
            let mut buf = [0u8; 64];
            let dl = Instant::now() + Duration::from_secs(5);
            let (n, from) = b.recv_from(&mut buf, Some(dl)).unwrap().unwrap();
            assert_eq!(&buf[..n], b"hello");
            assert_eq!(from, a.local_addr().unwrap());
            // deadline passes with nothing to read
            let r = b
                .recv_from(&mut buf, Some(Instant::now() + Duration::from_millis(20)))
                .unwrap();
            assert!(r.is_none());
            assert!(b.try_recv_from(&mut buf).unwrap().is_none());
            assert_eq!(b.stats().rx_packets, 1);
            assert_eq!(a.stats().tx_packets, 1);
        }
    }

    #[test]
    fn batch_send() {
        let o = opts(EngineKind::Spin);
        let lo = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
        let mut a = KernelUdp::bind(lo, &o).unwrap();
        let mut b = KernelUdp::bind(lo, &o).unwrap();
        let ba = b.local_addr().unwrap();
        let msgs: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 20 + i as usize]).collect();
        let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
        assert_eq!(a.send_batch_to(&refs, ba).unwrap(), 10);
        let mut buf = [0u8; 64];
        for i in 0..10u8 {
            let dl = Instant::now() + Duration::from_secs(5);
            let (n, _) = b.recv_from(&mut buf, Some(dl)).unwrap().unwrap();
            assert_eq!(n, 20 + i as usize);
            assert_eq!(buf[0], i);
        }
        assert_eq!(a.stats().tx_bytes, (0..10).map(|i| 20 + i).sum::<u64>());
    }

    #[test]
    fn connected_refused() {
        let o = opts(EngineKind::Kernel);
        let lo = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
        // find a free port, then close it
        let port = KernelUdp::bind(lo, &o)
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut a = KernelUdp::bind(lo, &o).unwrap();
        let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        a.connect(dst).unwrap();
        a.send_to(b"x", dst).unwrap();
        let mut buf = [0u8; 16];
        let r = a.recv_from(&mut buf, Some(Instant::now() + Duration::from_secs(2)));
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn multicast_two_receivers_on_loopback() {
        let group = Ipv4Addr::new(239, 255, 77, 1);
        let o = opts(EngineKind::Spin);
        // Two sockets share the group's port (SO_REUSEADDR on multicast binds).
        let mut r1 = KernelUdp::bind(SocketAddrV4::new(group, 0), &o).unwrap();
        let port = r1.local_addr().unwrap().port();
        let mut r2 = KernelUdp::bind(SocketAddrV4::new(group, port), &o).unwrap();
        r1.join_multicast(group, Ipv4Addr::LOCALHOST).unwrap();
        r2.join_multicast(group, Ipv4Addr::LOCALHOST).unwrap();
        let mut tx = KernelUdp::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), &o).unwrap();
        tx.set_multicast_if(Ipv4Addr::LOCALHOST).unwrap();
        tx.send_to(b"feed", SocketAddrV4::new(group, port)).unwrap();
        for r in [&mut r1, &mut r2] {
            let mut buf = [0u8; 16];
            let dl = Instant::now() + Duration::from_secs(5);
            let (n, _) = r
                .recv_from(&mut buf, Some(dl))
                .unwrap()
                .expect("group datagram");
            assert_eq!(&buf[..n], b"feed");
        }
    }

    #[test]
    fn buffers_and_port_in_use() {
        let mut o = opts(EngineKind::Kernel);
        o.rcvbuf = Some(1 << 20);
        let lo = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
        let a = KernelUdp::bind(lo, &o).unwrap();
        let (r, _) = socket_buffers(a.socket().as_fd()).unwrap();
        assert!(r >= 1 << 20, "rcvbuf {r}");
        let e = KernelUdp::bind(a.local_addr().unwrap(), &o).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    }
}
