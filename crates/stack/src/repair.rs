//! TCP_REPAIR, shared by the two places that hand an engine connection to
//! the kernel: the shim at fork (`nanowire-preload`'s `handover`, through
//! the real libc functions it keeps apart from its own) and the engine
//! service or warden when a process died with connections (issue 24,
//! `xdp::service::conns::repair_take`). The sequence is CRIU's TCP
//! restore: repair mode, queue sequences, bind, connect (no SYN in repair
//! mode), options, windows, timestamp clock; then repair mode off.

use libc::{c_int, c_void, socklen_t};
use std::io;

pub const TCP_RECV_QUEUE: c_int = 1;
pub const TCP_SEND_QUEUE: c_int = 2;
const TCPOPT_MAXSEG: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;

/// setsockopt(2) as the caller reaches it (libc's, or the shim's real one).
pub type SetSockOpt = unsafe fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;

/// libc's setsockopt, for callers outside the shim.
///
/// # Safety
/// As setsockopt(2): `v` points to `len` readable bytes.
pub unsafe fn libc_setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: the caller's contract is setsockopt's.
    unsafe { libc::setsockopt(fd, level, name, v, len) }
}

#[repr(C)]
struct RepairOpt {
    code: u32,
    val: u32,
}

/// `struct tcp_repair_window`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct Window {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// One setsockopt of `v` on `fd` through `f`; `what` names it in the error.
pub fn setopt<T>(
    f: SetSockOpt,
    fd: c_int,
    level: c_int,
    name: c_int,
    v: &T,
    what: &str,
) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed.
    let r = unsafe {
        f(
            fd,
            level,
            name,
            (v as *const T).cast::<c_void>(),
            std::mem::size_of::<T>() as socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(last_err(what)) }
}

/// Repair mode on (needs CAP_NET_ADMIN; it also forces reuse of the
/// address: SO_REUSEADDR after it would undo that; off clears SO_REUSEADDR:
/// [`reuse_again`]) or off (the kernel
/// sends a window probe, which the peer answers).
pub fn mode(f: SetSockOpt, fd: c_int, on: bool) -> io::Result<()> {
    let what = if on {
        "TCP_REPAIR (needs CAP_NET_ADMIN)"
    } else {
        "TCP_REPAIR off"
    };
    setopt(
        f,
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR,
        &i32::from(on),
        what,
    )
}

/// SO_REUSEADDR again after repair mode is off, when the socket had it
/// (`had`): TCP_REPAIR forces address reuse while on and clears it when
/// turned off, so a kernel socket that took a connection over would
/// otherwise, in TIME-WAIT, refuse a later SO_REUSEADDR bind of its port
/// (EADDRINUSE) that the original socket's TIME-WAIT allows.
pub fn reuse_again(f: SetSockOpt, fd: c_int, had: bool) -> io::Result<()> {
    if !had {
        return Ok(());
    }
    setopt(
        f,
        fd,
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        &1i32,
        "SO_REUSEADDR",
    )
}

/// Repair mode off without the window probe (TCP_REPAIR_OFF_NO_WP): a
/// socket that must send nothing (a TIME-WAIT taken over).
pub fn off_without_probe(f: SetSockOpt, fd: c_int) -> io::Result<()> {
    setopt(
        f,
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR,
        &-1i32,
        "TCP_REPAIR off (no window probe)",
    )
}

/// Select the queue (receive or send) later repair calls act on.
pub fn queue(f: SetSockOpt, fd: c_int, q: c_int) -> io::Result<()> {
    setopt(
        f,
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR_QUEUE,
        &q,
        "TCP_REPAIR_QUEUE",
    )
}

/// The sequence numbers the queues start at: `rcv` (the first byte of
/// the receive queue), `snd` (the first unacknowledged byte). Leaves the
/// send queue selected.
pub fn queue_seqs(f: SetSockOpt, fd: c_int, rcv: u32, snd: u32) -> io::Result<()> {
    for (q, seq, what) in [
        (TCP_RECV_QUEUE, rcv, "TCP_QUEUE_SEQ (receive)"),
        (TCP_SEND_QUEUE, snd, "TCP_QUEUE_SEQ (send)"),
    ] {
        queue(f, fd, q)?;
        setopt(f, fd, libc::IPPROTO_TCP, libc::TCP_QUEUE_SEQ, &seq, what)?;
    }
    Ok(())
}

/// The options the handshake negotiated: the peer's MSS, window scaling
/// (the peer's shift, ours), SACK, timestamps.
pub fn options(
    f: SetSockOpt,
    fd: c_int,
    mss: u32,
    wscale: Option<(u8, u8)>,
    sack: bool,
    ts: bool,
) -> io::Result<()> {
    let mut opts = vec![RepairOpt {
        code: TCPOPT_MAXSEG,
        val: mss,
    }];
    if let Some((snd, rcv)) = wscale {
        opts.push(RepairOpt {
            code: TCPOPT_WINDOW,
            val: u32::from(snd) | (u32::from(rcv) << 16),
        });
    }
    if sack {
        opts.push(RepairOpt {
            code: TCPOPT_SACK_PERM,
            val: 0,
        });
    }
    if ts {
        opts.push(RepairOpt {
            code: TCPOPT_TIMESTAMP,
            val: 0,
        });
    }
    // SAFETY: an array of `opts.len()` repair options.
    if unsafe {
        f(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR_OPTIONS,
            opts.as_ptr().cast(),
            std::mem::size_of_val(opts.as_slice()) as socklen_t,
        )
    } != 0
    {
        return Err(last_err("TCP_REPAIR_OPTIONS"));
    }
    Ok(())
}

/// The windows (after the receive queue is filled: the kernel's rcv_nxt
/// must be where `w.rcv_wup` says).
pub fn window(f: SetSockOpt, fd: c_int, w: &Window) -> io::Result<()> {
    setopt(
        f,
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR_WINDOW,
        w,
        "TCP_REPAIR_WINDOW",
    )
}

/// The timestamp clock: `tsval` is the TSval of a segment sent now (in
/// ms). Since Linux 6.7 the value's low bit selects a clock in µs (the
/// kernel's TSvals then run 1000 times faster than the engine's did): the
/// value goes in rounded up to even, a clock in ms at most 1 ms ahead
/// (never behind: the peer's PAWS check must pass).
pub fn timestamp(f: SetSockOpt, fd: c_int, tsval: u32) -> io::Result<()> {
    setopt(
        f,
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_TIMESTAMP,
        &(tsval.wrapping_add(1) & !1),
        "TCP_TIMESTAMP",
    )
}
