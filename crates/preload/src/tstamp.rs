//! `SO_TIMESTAMP`, `SO_TIMESTAMPNS` and `SO_TIMESTAMPING` (old and `_NEW`
//! variants) on sockets served by the xdp engine, as the kernel delivers
//! them (Documentation/networking/timestamping.rst, net/core/sock.c
//! `__sock_recv_timestamp`, net/ipv4/ip_sockglue.c `ip_recv_error`).
//!
//! The option itself is always set on the kernel socket under the fd first
//! (the kernel validates it, `getsockopt` reads it back, and datagrams that
//! take the kernel path are stamped by the kernel); on success the state is
//! mirrored here ([`Ts`], one per accelerated socket) and the engine told:
//!
//! * receive: the stamp the engine takes when it takes the frame off its RX
//!   ring (`XdpSocket::set_rx_stamping`); `recvmsg` adds `SCM_TIMESTAMP`,
//!   `SCM_TIMESTAMPNS` and/or `SCM_TIMESTAMPING` (ts[0]) by the kernel's
//!   rules. A datagram with no engine stamp (it took the kernel path, or
//!   arrived before stamping was turned on) is stamped when the shim reads
//!   it.
//! * transmit (`SOF_TIMESTAMPING_TX_SOFTWARE`): the stamp taken when the
//!   kick that handed the frame to the driver returned, queued per socket
//!   with the frame (or nothing with `OPT_TSONLY`) and read with
//!   `recvmsg(MSG_ERRQUEUE)`: `sock_extended_err` with `ENOMSG`,
//!   `SO_EE_ORIGIN_TIMESTAMPING`, `SCM_TSTAMP_SND` and, with `OPT_ID`, the
//!   per-socket counter in `ee_data`. poll/epoll report `POLLERR` while
//!   the queue is not empty.
//! * hardware stamps: none (see docs/capture.md: veth never gives one).
//!
//! Sockets without any of these options pay one relaxed load per receive.

use libc::{c_int, c_void, msghdr, socklen_t};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

pub const SO_TIMESTAMP_OLD: c_int = 29;
pub const SO_TIMESTAMPNS_OLD: c_int = 35;
pub const SO_TIMESTAMPING_OLD: c_int = 37;
pub const SO_TIMESTAMP_NEW: c_int = 63;
pub const SO_TIMESTAMPNS_NEW: c_int = 64;
pub const SO_TIMESTAMPING_NEW: c_int = 65;

const TX_SOFTWARE: u32 = 1 << 1;
const RX_SOFTWARE: u32 = 1 << 3;
const SOFTWARE: u32 = 1 << 4;
const OPT_ID: u32 = 1 << 7;
const OPT_CMSG: u32 = 1 << 10;
const OPT_TSONLY: u32 = 1 << 11;
const OPT_RX_FILTER: u32 = 1 << 17;

const SO_EE_ORIGIN_TIMESTAMPING: u8 = 4;
const SCM_TSTAMP_SND: u32 = 0;

/// Entries an error queue holds at most (the kernel bounds it by
/// SO_RCVBUF); a stamp beyond that is dropped and counted.
const ERRQ_MAX: usize = 4096;

/// Transmit stamps dropped because an error queue was full (process-wide).
pub static ERRQ_DROPS: AtomicU64 = AtomicU64::new(0);

/// Is `name` (at SOL_SOCKET) one of the timestamp options?
#[inline]
pub fn is_ts_opt(level: c_int, name: c_int) -> bool {
    level == libc::SOL_SOCKET
        && matches!(
            name,
            SO_TIMESTAMP_OLD
                | SO_TIMESTAMPNS_OLD
                | SO_TIMESTAMPING_OLD
                | SO_TIMESTAMP_NEW
                | SO_TIMESTAMPNS_NEW
                | SO_TIMESTAMPING_NEW
        )
}

struct ErrEntry {
    at: u64,
    key: u32,
    frame: Vec<u8>,
}

#[derive(Default)]
struct State {
    /// SOCK_RCVTSTAMP, SOCK_RCVTSTAMPNS, SOCK_TSTAMP_NEW.
    rcv: bool,
    ns: bool,
    new: bool,
    /// sk_tsflags.
    flags: u32,
    /// sk_tskey: the next OPT_ID.
    key: u32,
    errq: VecDeque<ErrEntry>,
}

/// The timestamping state of one accelerated socket.
#[derive(Default)]
pub struct Ts {
    /// Any timestamp option on (the fast-path test).
    on: AtomicBool,
    /// Transmit stamps wanted.
    tx: AtomicBool,
    /// Entries in the error queue.
    errq: AtomicU32,
    st: Mutex<State>,
}

impl Ts {
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
    #[inline(always)]
    pub fn tx_on(&self) -> bool {
        self.tx.load(Ordering::Relaxed)
    }
    /// The error queue is not empty (POLLERR).
    #[inline(always)]
    pub fn err_pending(&self) -> bool {
        self.errq.load(Ordering::Relaxed) > 0
    }
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// No option on, nothing queued: a reused record's next socket starts
    /// as a fresh one.
    pub fn reset(&self) {
        *self.st() = State::default();
        self.on.store(false, Ordering::Relaxed);
        self.tx.store(false, Ordering::Relaxed);
        self.errq.store(0, Ordering::Relaxed);
    }
}

fn read_int(val: *const c_void, len: socklen_t) -> Option<u32> {
    if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return None;
    }
    // SAFETY: at least an int is readable (checked), and the kernel has
    // just accepted this value.
    Some(unsafe { std::ptr::read_unaligned(val.cast::<u32>()) })
}

/// The application set option `name` on `a`'s fd and the kernel accepted
/// it: mirror the kernel's state change (net/core/sock.c
/// `__sock_set_timestamps`, `sock_set_timestamping`) and tell the engine.
pub fn set(ts: &Ts, name: c_int, val: *const c_void, len: socklen_t) -> Option<Stamping> {
    let v = read_int(val, len)?;
    {
        let mut s = ts.st();
        match name {
            SO_TIMESTAMP_OLD | SO_TIMESTAMP_NEW | SO_TIMESTAMPNS_OLD | SO_TIMESTAMPNS_NEW => {
                let on = v != 0;
                s.rcv = on;
                s.ns = on && (name == SO_TIMESTAMPNS_OLD || name == SO_TIMESTAMPNS_NEW);
                if on {
                    s.new = name == SO_TIMESTAMP_NEW || name == SO_TIMESTAMPNS_NEW;
                }
            }
            SO_TIMESTAMPING_OLD | SO_TIMESTAMPING_NEW => {
                if v & OPT_ID != 0 && s.flags & OPT_ID == 0 {
                    s.key = 0;
                }
                s.flags = v;
                s.new = name == SO_TIMESTAMPING_NEW;
            }
            _ => return None,
        }
    }
    Some(apply(ts))
}

/// Read the options a socket had before it went onto the engine (set while
/// it was a candidate) back from the kernel.
pub fn adopt(ts: &Ts, fd: c_int) -> Option<Stamping> {
    let get = |name: c_int| -> u32 {
        let mut v: u32 = 0;
        let mut l = std::mem::size_of::<u32>() as socklen_t;
        let e = crate::spin::errno();
        // SAFETY: an int-sized out-buffer and its length.
        let r = unsafe {
            crate::real::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut v).cast(), &mut l)
        };
        crate::spin::set_errno(e);
        if r == 0 { v } else { 0 }
    };
    let (t_old, ns_old, t_new, ns_new) = (
        get(SO_TIMESTAMP_OLD),
        get(SO_TIMESTAMPNS_OLD),
        get(SO_TIMESTAMP_NEW),
        get(SO_TIMESTAMPNS_NEW),
    );
    let flags = get(SO_TIMESTAMPING_OLD);
    if t_old | ns_old | t_new | ns_new == 0 && flags == 0 {
        return None;
    }
    {
        let mut s = ts.st();
        s.rcv = t_old | ns_old | t_new | ns_new != 0;
        s.ns = ns_old | ns_new != 0;
        s.new = t_new | ns_new != 0;
        s.flags = flags;
        s.key = 0;
    }
    Some(apply(ts))
}

/// What the engine stamps for one socket (`XdpSocket::set_rx_stamping`,
/// `set_tx_stamping`); the UDP record applies it (`accel::set_stamping`).
#[derive(Clone, Copy, Debug)]
pub struct Stamping {
    pub rx: bool,
    pub tx: bool,
    /// Transmit stamps carry the frame (no OPT_TSONLY).
    pub frame: bool,
}

/// The engine's stamping follows the socket's options.
fn apply(ts: &Ts) -> Stamping {
    let (rx, tx, frame, any) = {
        let s = ts.st();
        (
            s.rcv || s.flags & RX_SOFTWARE != 0,
            s.flags & TX_SOFTWARE != 0,
            s.flags & OPT_TSONLY == 0,
            s.rcv || s.flags != 0,
        )
    };
    ts.tx.store(tx, Ordering::Relaxed);
    ts.on.store(any, Ordering::Relaxed);
    Stamping { rx, tx, frame }
}

/// The `OPT_ID` key of the datagram about to be sent (`None` without
/// OPT_ID): the socket's counter, advanced (`sk_tskey`, taken once per
/// datagram that asks for a transmit stamp).
pub fn next_key(ts: &Ts) -> Option<u32> {
    let mut s = ts.st();
    if s.flags & OPT_ID == 0 {
        return None;
    }
    let k = s.key;
    s.key = k.wrapping_add(1);
    Some(k)
}

/// After a send through the engine by a socket with transmit stamps on:
/// queue the stamp (if the datagram went through the ring).
pub fn sent(ts: &Ts, x: &nanowire_stack::xdp::XdpSocket, key: Option<u32>) {
    let mut s = ts.st();
    let Some((at, frame)) = x.last_tx_stamp() else {
        return;
    };
    if s.errq.len() >= ERRQ_MAX {
        let n = ERRQ_DROPS.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            // Announced, with the count, at 1, 2, 4, 8, ... drops.
            crate::log::log!(
                nanowire_options::Level::Warn,
                "{n} transmit timestamp(s) dropped so far: error queue full ({ERRQ_MAX} entries; read it with MSG_ERRQUEUE)"
            );
        }
        return;
    }
    let frame = if s.flags & OPT_TSONLY != 0 {
        Vec::new()
    } else {
        frame.to_vec()
    };
    s.errq.push_back(ErrEntry {
        at,
        key: key.unwrap_or(0),
        frame,
    });
    ts.errq.store(s.errq.len() as u32, Ordering::Relaxed);
}

/// `CLOCK_REALTIME` in ns (the clock of the kernel's stamps and the engine's).
fn realtime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    (t.tv_sec as u64).wrapping_mul(1_000_000_000) + t.tv_nsec as u64
}

thread_local! {
    /// The receive stamp of the datagram this thread's receive is delivering.
    static LAST: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Remember the stamp of the datagram being delivered (0: none). Out of
/// line (see `uaccess::ok`): callers run it only with stamps on.
#[inline(never)]
pub fn set_last(at: u64) {
    LAST.with(|c| c.set(at));
}

/// Control-message writer with the kernel's `put_cmsg` truncation rules.
struct Cmsgs<'a> {
    m: &'a mut msghdr,
    used: usize,
}

impl Cmsgs<'_> {
    fn put(&mut self, level: c_int, ty: c_int, data: &[u8]) {
        let room = self.m.msg_controllen.saturating_sub(self.used);
        let hdr = std::mem::size_of::<libc::cmsghdr>();
        if self.m.msg_control.is_null() || room < hdr {
            self.m.msg_flags |= libc::MSG_CTRUNC;
            return;
        }
        // SAFETY: pure arithmetic on the length.
        let full = unsafe { libc::CMSG_LEN(data.len() as u32) } as usize;
        // SAFETY: pure arithmetic on the length.
        let space = unsafe { libc::CMSG_SPACE(data.len() as u32) } as usize;
        let cmlen = if room < full {
            self.m.msg_flags |= libc::MSG_CTRUNC;
            room
        } else {
            full
        };
        let h = libc::cmsghdr {
            // The kernel writes the truncated length.
            cmsg_len: cmlen as _,
            cmsg_level: level,
            cmsg_type: ty,
        };
        // SAFETY: `room` bytes of the caller's control buffer are free from
        // `used`; we write at most `cmlen <= room` bytes.
        unsafe {
            let p = self.m.msg_control.cast::<u8>().add(self.used);
            std::ptr::copy_nonoverlapping((&raw const h).cast::<u8>(), p, hdr.min(cmlen));
            let n = data.len().min(cmlen - hdr.min(cmlen));
            std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(hdr), n);
        }
        self.used += space.min(room);
    }
}

fn two(a: i64, b: i64) -> [u8; 16] {
    let mut o = [0u8; 16];
    o[..8].copy_from_slice(&a.to_ne_bytes());
    o[8..].copy_from_slice(&b.to_ne_bytes());
    o
}

/// The timestamp messages for a datagram (or an error-queue entry) stamped
/// `at`, by `__sock_recv_timestamp`'s rules.
fn put_stamps(c: &mut Cmsgs<'_>, s: &State, at: u64, errq: bool) {
    let (sec, nsec) = ((at / 1_000_000_000) as i64, (at % 1_000_000_000) as i64);
    if s.rcv {
        let (ty, v) = match (s.new, s.ns) {
            (false, false) => (SO_TIMESTAMP_OLD, two(sec, nsec / 1000)),
            (false, true) => (SO_TIMESTAMPNS_OLD, two(sec, nsec)),
            (true, false) => (SO_TIMESTAMP_NEW, two(sec, nsec / 1000)),
            (true, true) => (SO_TIMESTAMPNS_NEW, two(sec, nsec)),
        };
        c.put(libc::SOL_SOCKET, ty, &v);
    }
    if s.flags & SOFTWARE != 0
        && (s.flags & RX_SOFTWARE != 0 || errq || s.flags & OPT_RX_FILTER == 0)
    {
        let mut v = [0u8; 48];
        v[..16].copy_from_slice(&two(sec, nsec));
        let ty = if s.new {
            SO_TIMESTAMPING_NEW
        } else {
            SO_TIMESTAMPING_OLD
        };
        c.put(libc::SOL_SOCKET, ty, &v);
    }
}

/// `recvmsg` on `a` delivered a datagram: write its control messages
/// (none when the socket has no timestamp option).
pub fn put_rx(ts: &Ts, m: &mut msghdr) {
    let control = m.msg_controllen;
    m.msg_controllen = 0;
    if !ts.on() {
        return;
    }
    let s = ts.st();
    let mut at = LAST.with(|c| c.get());
    if at == 0 {
        // No engine stamp: the kernel path, or before stamping was on.
        // Like the kernel, which stamps a frame it did not stamp on arrival
        // when the socket reads it.
        if !(s.rcv || s.flags & RX_SOFTWARE != 0) {
            return;
        }
        at = realtime_ns();
    }
    m.msg_controllen = control;
    let mut c = Cmsgs { m, used: 0 };
    put_stamps(&mut c, &s, at, false);
    let used = c.used;
    m.msg_controllen = used as _;
}

/// `recvmsg(MSG_ERRQUEUE)` on a socket with state `ts`: `None` if the
/// engine's queue is empty (the kernel socket's own queue answers: EAGAIN,
/// or stamps of datagrams that took the kernel path). See
/// `accel::recv_err`.
pub fn recv_err(ts: &Ts, m: &mut msghdr, flags: c_int) -> Option<isize> {
    let mut s = ts.st();
    let e = if flags & libc::MSG_PEEK != 0 {
        let f = s.errq.front()?;
        ErrEntry {
            at: f.at,
            key: f.key,
            frame: f.frame.clone(),
        }
    } else {
        let e = s.errq.pop_front()?;
        ts.errq.store(s.errq.len() as u32, Ordering::Relaxed);
        e
    };
    // The frame into the iovecs.
    let mut off = 0;
    for i in 0..m.msg_iovlen {
        if off >= e.frame.len() {
            break;
        }
        // SAFETY: the caller's iovec array of msg_iovlen entries.
        let v = unsafe { &*m.msg_iov.add(i) };
        let n = v.iov_len.min(e.frame.len() - off);
        if n > 0 {
            // SAFETY: the caller's buffer of iov_len bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(e.frame.as_ptr().add(off), v.iov_base.cast(), n)
            };
        }
        off += n;
    }
    m.msg_flags = libc::MSG_ERRQUEUE;
    if off < e.frame.len() {
        m.msg_flags |= libc::MSG_TRUNC;
    }
    // No address for a timestamp (ip_recv_error leaves msg_name alone and
    // the socket layer reports length 0).
    m.msg_namelen = 0;
    let mut c = Cmsgs { m, used: 0 };
    put_stamps(&mut c, &s, e.at, true);
    // struct sock_extended_err + struct sockaddr_in offender.
    let mut ee = [0u8; 32];
    ee[..4].copy_from_slice(&(libc::ENOMSG as u32).to_ne_bytes());
    ee[4] = SO_EE_ORIGIN_TIMESTAMPING;
    ee[8..12].copy_from_slice(&SCM_TSTAMP_SND.to_ne_bytes());
    ee[12..16].copy_from_slice(&e.key.to_ne_bytes());
    if s.flags & OPT_CMSG != 0 && !e.frame.is_empty() {
        ee[16..18].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    }
    c.put(libc::IPPROTO_IP, libc::IP_RECVERR, &ee);
    let used = c.used;
    m.msg_controllen = used as _;
    Some(if flags & libc::MSG_TRUNC != 0 {
        e.frame.len() as isize
    } else {
        off as isize
    })
}
