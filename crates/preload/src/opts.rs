//! Socket options on engine sockets: accept only what is applied (issue 20,
//! finding 2).
//!
//! Every setsockopt on an engine socket (or a candidate) is first made on
//! the application's own kernel socket under the fd, so the kernel
//! validates it, keeps it and `getsockopt` reads it back as plainly. What
//! the engine then does with it is decided by one table, [`ROWS`]: per
//! option and per kind of socket (UDP, TCP listener, TCP connection)
//!
//! * [`How::Keep`]: nothing for the engine to do (a bind-time option the
//!   kernel applied, a timeout the shim reads, a value the engine's
//!   behaviour already matches);
//! * [`How::Engine`]: the engine applies it (IP_TTL, IP_TOS and
//!   IP_MULTICAST_TTL on the headers it writes, TCP_NODELAY, keepalive,
//!   ...);
//! * [`How::Off`]: as `Keep` while off (an all-zero value), otherwise as
//!   `Kernel`;
//! * [`How::Kernel`]: the engine cannot honour it, so the socket is the
//!   kernel's: a UDP socket leaves the engine, a TCP candidate is not
//!   accelerated, a TCP listener sends its new connections to the kernel,
//!   a TCP connection is handed over to the kernel (TCP_REPAIR) or, when
//!   that is impossible, the call fails (ENOPROTOOPT) instead of
//!   returning 0 for an option that would do nothing.
//!
//! An option the table does not name is `Kernel` for every kind. Each
//! move is said on stderr at the default level with the option's name.
//! `docs/preload.md` ("Socket options on engine sockets") prints the table.

use crate::log::log;
use crate::spin::{errno, set_errno};
use crate::table;
use libc::{c_int, c_void, socklen_t};
use nanowire_options::Level;

/// Options the process has set (on any socket, whatever the outcome) that
/// an engine connection takes from a kernel socket: a TCP candidate is
/// made by `socket` in this process and never shared with another (a fork
/// or exec takes candidacy away, `tcpx::prepare_child`), so until the
/// process sets one, every candidate and engine listener holds the
/// kernel's defaults and reading them back per connect or accept (2 to 28
/// getsockopt/setsockopt calls) is skipped. Not seen: a raw `setsockopt`
/// syscall, or another process setting an option on a candidate passed to
/// it (SCM_RIGHTS) before this process connects it (docs/preload.md).
static OPTS_SET: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
/// SO_RCVBUF / SO_SNDBUF (and their FORCE forms).
pub const SET_BUFFERS: u8 = 1;
/// What `tcpx::inherit_options` reads: SO_LINGER, SO_KEEPALIVE and any
/// IPPROTO_TCP option.
pub const SET_TCP: u8 = 2;
/// What `tcpx::carry_options` carries to an accepted connection (and what
/// changes it: IP_TOS sets SO_PRIORITY too).
pub const SET_CARRIED: u8 = 4;
/// IP_TTL / IP_TOS: what a connect reads for its IP header
/// (`EngineOptions::ip_header_default` while none was set).
pub const SET_IP: u8 = 8;
/// SO_REUSEADDR: what a connect reads for `EngineOptions::reuseaddr_unset`.
pub const SET_REUSE: u8 = 16;

/// A `setsockopt`'s option as the caller gave it (the value is still the
/// caller's memory).
#[derive(Clone, Copy)]
pub struct Opt {
    pub level: c_int,
    pub name: c_int,
    pub val: *const c_void,
    pub len: socklen_t,
}

impl Opt {
    /// Level, name, value, length.
    #[inline]
    pub fn parts(self) -> (c_int, c_int, *const c_void, socklen_t) {
        (self.level, self.name, self.val, self.len)
    }
}

/// A setsockopt of (level, name) is about to be made on some fd.
#[inline]
pub fn note_set(level: c_int, name: c_int) {
    let bits = bits_of(level, name);
    if bits == 0 {
        return;
    }
    use std::sync::atomic::Ordering::Relaxed;
    if OPTS_SET.load(Relaxed) & bits != bits {
        OPTS_SET.fetch_or(bits, Relaxed);
    }
}

/// The `SET_*` bits a setsockopt of (level, name) sets (0: none).
#[inline]
fn bits_of(level: c_int, name: c_int) -> u8 {
    match (level, name) {
        (
            libc::SOL_SOCKET,
            libc::SO_RCVBUF | libc::SO_SNDBUF | libc::SO_RCVBUFFORCE | libc::SO_SNDBUFFORCE,
        ) => SET_BUFFERS,
        (libc::SOL_SOCKET, libc::SO_LINGER | libc::SO_KEEPALIVE) | (libc::IPPROTO_TCP, _) => {
            SET_TCP | SET_CARRIED
        }
        (
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO
            | libc::SO_SNDTIMEO
            | libc::SO_RCVTIMEO_NEW
            | libc::SO_SNDTIMEO_NEW
            | libc::SO_PRIORITY
            | libc::SO_OOBINLINE
            | libc::SO_RCVLOWAT,
        ) => SET_CARRIED,
        (libc::IPPROTO_IP, libc::IP_TOS | libc::IP_TTL) => SET_CARRIED | SET_IP,
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => SET_REUSE,
        _ => 0,
    }
}

/// Has the process set any option of `bits` (see [`note_set`])? Relaxed
/// suffices: a setsockopt that happens before the connect (program order,
/// or the application's own synchronisation between threads) is seen.
#[inline]
pub fn set_any(bits: u8) -> bool {
    OPTS_SET.load(std::sync::atomic::Ordering::Relaxed) & bits != 0
}

/// What the engine does with an option (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    Keep,
    Engine,
    Off,
    Kernel,
}

/// The kind of engine socket an option is set on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Udp,
    TcpListener,
    TcpConn,
    /// A TCP socket before listen/connect: the option must suit both.
    TcpCandidate,
}

/// One row of the table.
pub struct Row {
    pub level: c_int,
    pub name: c_int,
    pub what: &'static str,
    pub udp: How,
    pub listener: How,
    pub conn: How,
}

const fn row(level: c_int, name: c_int, what: &'static str, udp: How, l: How, c: How) -> Row {
    Row {
        level,
        name,
        what,
        udp,
        listener: l,
        conn: c,
    }
}

use How::{Engine as E, Keep as K, Kernel as X, Off as O};
const S: c_int = libc::SOL_SOCKET;
const IP: c_int = libc::IPPROTO_IP;
const T: c_int = libc::IPPROTO_TCP;

// Not in every libc release.
const SO_RCVTIMEO_NEW: c_int = 66;
const SO_SNDTIMEO_NEW: c_int = 67;
const SO_TIMESTAMP_NEW: c_int = 63;
const SO_TIMESTAMPNS_NEW: c_int = 64;
const SO_TIMESTAMPING_NEW: c_int = 65;

/// The options the engine honours, per kind of socket. Everything not
/// here is `Kernel`. Special values: IP_MTU_DISCOVER (the engine always
/// sets DF: WANT, DO and PROBE are honoured, DONT, INTERFACE and OMIT are
/// not), IP_MULTICAST_IF (0.0.0.0 / ifindex 0 only), SO_LINGER (off or a
/// zero timeout). On a TCP candidate (before listen/connect) an option
/// counts as honoured when it is for both a listener and a connection,
/// and buffer sizes are (they size the engine's rings).
pub static ROWS: &[Row] = &[
    // ---- SOL_SOCKET
    row(S, libc::SO_REUSEADDR, "SO_REUSEADDR", K, K, K),
    row(S, libc::SO_REUSEPORT, "SO_REUSEPORT", O, K, K),
    row(S, libc::SO_KEEPALIVE, "SO_KEEPALIVE", K, E, E),
    row(S, libc::SO_LINGER, "SO_LINGER", K, O, O),
    row(S, libc::SO_RCVBUF, "SO_RCVBUF", E, E, X),
    row(S, libc::SO_SNDBUF, "SO_SNDBUF", K, E, X),
    row(S, libc::SO_RCVBUFFORCE, "SO_RCVBUFFORCE", E, E, X),
    row(S, libc::SO_SNDBUFFORCE, "SO_SNDBUFFORCE", K, E, X),
    row(S, libc::SO_RCVTIMEO, "SO_RCVTIMEO", E, E, E),
    row(S, SO_RCVTIMEO_NEW, "SO_RCVTIMEO_NEW", E, E, E),
    row(S, libc::SO_SNDTIMEO, "SO_SNDTIMEO", E, E, E),
    row(S, SO_SNDTIMEO_NEW, "SO_SNDTIMEO_NEW", E, E, E),
    row(S, libc::SO_TIMESTAMP, "SO_TIMESTAMP", E, O, O),
    row(S, libc::SO_TIMESTAMPNS, "SO_TIMESTAMPNS", E, O, O),
    row(S, libc::SO_TIMESTAMPING, "SO_TIMESTAMPING", E, O, O),
    row(S, SO_TIMESTAMP_NEW, "SO_TIMESTAMP_NEW", E, O, O),
    row(S, SO_TIMESTAMPNS_NEW, "SO_TIMESTAMPNS_NEW", E, O, O),
    row(S, SO_TIMESTAMPING_NEW, "SO_TIMESTAMPING_NEW", E, O, O),
    row(S, libc::SO_BROADCAST, "SO_BROADCAST", K, K, K),
    row(S, libc::SO_OOBINLINE, "SO_OOBINLINE", K, K, K),
    row(S, libc::SO_RCVLOWAT, "SO_RCVLOWAT", K, X, X),
    row(S, libc::SO_DEBUG, "SO_DEBUG", K, K, K),
    row(S, libc::SO_BUSY_POLL, "SO_BUSY_POLL", K, K, K),
    row(S, libc::SO_PREFER_BUSY_POLL, "SO_PREFER_BUSY_POLL", K, K, K),
    row(S, libc::SO_INCOMING_CPU, "SO_INCOMING_CPU", K, K, K),
    row(S, libc::SO_DETACH_FILTER, "SO_DETACH_FILTER", K, K, K),
    row(S, libc::SO_PRIORITY, "SO_PRIORITY", O, O, O),
    row(S, libc::SO_MARK, "SO_MARK", O, O, O),
    row(S, libc::SO_DONTROUTE, "SO_DONTROUTE", O, O, O),
    row(S, libc::SO_NO_CHECK, "SO_NO_CHECK", O, K, K),
    row(S, libc::SO_BINDTODEVICE, "SO_BINDTODEVICE", O, O, O),
    row(S, libc::SO_ZEROCOPY, "SO_ZEROCOPY", O, O, O),
    row(S, libc::SO_RXQ_OVFL, "SO_RXQ_OVFL", O, O, O),
    // ---- IPPROTO_IP
    row(IP, libc::IP_TTL, "IP_TTL", E, E, E),
    row(IP, libc::IP_TOS, "IP_TOS", E, E, E),
    row(IP, libc::IP_MULTICAST_TTL, "IP_MULTICAST_TTL", E, K, K),
    row(IP, libc::IP_MULTICAST_LOOP, "IP_MULTICAST_LOOP", K, K, K),
    row(IP, libc::IP_MULTICAST_ALL, "IP_MULTICAST_ALL", K, K, K),
    row(IP, libc::IP_MULTICAST_IF, "IP_MULTICAST_IF", O, K, K),
    row(IP, libc::IP_ADD_MEMBERSHIP, "IP_ADD_MEMBERSHIP", E, K, K),
    row(IP, libc::IP_DROP_MEMBERSHIP, "IP_DROP_MEMBERSHIP", E, K, K),
    row(IP, libc::IP_MTU_DISCOVER, "IP_MTU_DISCOVER", O, O, O),
    row(IP, libc::IP_FREEBIND, "IP_FREEBIND", K, K, K),
    row(
        IP,
        libc::IP_BIND_ADDRESS_NO_PORT,
        "IP_BIND_ADDRESS_NO_PORT",
        K,
        K,
        K,
    ),
    row(IP, libc::IP_PKTINFO, "IP_PKTINFO", O, K, K),
    row(IP, libc::IP_RECVTOS, "IP_RECVTOS", O, O, O),
    row(IP, libc::IP_RECVTTL, "IP_RECVTTL", O, K, K),
    row(IP, libc::IP_RECVERR, "IP_RECVERR", O, O, O),
    row(IP, libc::IP_RECVORIGDSTADDR, "IP_RECVORIGDSTADDR", O, K, K),
    row(IP, libc::IP_MINTTL, "IP_MINTTL", O, O, O),
    row(IP, libc::IP_OPTIONS, "IP_OPTIONS", O, O, O),
    // ---- IPPROTO_TCP
    row(T, libc::TCP_NODELAY, "TCP_NODELAY", K, E, E),
    row(T, libc::TCP_QUICKACK, "TCP_QUICKACK", K, K, E),
    row(T, libc::TCP_KEEPIDLE, "TCP_KEEPIDLE", K, E, E),
    row(T, libc::TCP_KEEPINTVL, "TCP_KEEPINTVL", K, E, E),
    row(T, libc::TCP_KEEPCNT, "TCP_KEEPCNT", K, E, E),
];

/// TCP_MD5SIG_EXT and the TCP-AO options (Linux 6.7), not in every libc.
const TCP_MD5SIG_EXT: c_int = 32;
const TCP_AO_FIRST: c_int = 38;
const TCP_AO_LAST: c_int = 42;

/// The option's name for messages.
pub fn name_of(level: c_int, name: c_int) -> String {
    if let Some(r) = ROWS.iter().find(|r| r.level == level && r.name == name) {
        return r.what.to_string();
    }
    match (level, name) {
        (T, libc::TCP_MD5SIG) => "TCP_MD5SIG".into(),
        (T, TCP_MD5SIG_EXT) => "TCP_MD5SIG_EXT".into(),
        (T, n) if (TCP_AO_FIRST..=TCP_AO_LAST).contains(&n) => "TCP-AO".into(),
        (T, libc::TCP_CORK) => "TCP_CORK".into(),
        (T, libc::TCP_MAXSEG) => "TCP_MAXSEG".into(),
        (T, libc::TCP_CONGESTION) => "TCP_CONGESTION".into(),
        (T, libc::TCP_USER_TIMEOUT) => "TCP_USER_TIMEOUT".into(),
        (T, libc::TCP_DEFER_ACCEPT) => "TCP_DEFER_ACCEPT".into(),
        (T, libc::TCP_FASTOPEN) => "TCP_FASTOPEN".into(),
        (T, libc::TCP_ULP) => "TCP_ULP".into(),
        _ => {
            let l = match level {
                S => "SOL_SOCKET",
                IP => "IPPROTO_IP",
                T => "IPPROTO_TCP",
                _ => "level",
            };
            format!("{l} option {name}")
        }
    }
}

/// The caller's value as bytes (at most 64: enough to tell "off").
fn bytes<'a>(val: *const c_void, len: socklen_t) -> &'a [u8] {
    if val.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the kernel has just read `len` bytes from `val` (the
    // caller makes the real setsockopt first), so they are readable.
    unsafe { std::slice::from_raw_parts(val.cast::<u8>(), (len as usize).min(64)) }
}

fn int_of(b: &[u8]) -> Option<c_int> {
    // IP options accept one byte as well as an int.
    match b.len() {
        0 => None,
        1..=3 => Some(c_int::from(b[0])),
        _ => Some(c_int::from_ne_bytes([b[0], b[1], b[2], b[3]])),
    }
}

/// The verdict for an option with value `b` on a socket of kind `k`.
pub fn how(k: Kind, level: c_int, name: c_int, b: &[u8]) -> How {
    if k == Kind::TcpCandidate {
        // Buffer sizes set before listen/connect size the engine's rings.
        if level == S
            && matches!(
                name,
                libc::SO_RCVBUF | libc::SO_SNDBUF | libc::SO_RCVBUFFORCE | libc::SO_SNDBUFFORCE
            )
        {
            return How::Engine;
        }
        let (l, c) = (
            how(Kind::TcpListener, level, name, b),
            how(Kind::TcpConn, level, name, b),
        );
        return if l == How::Kernel || c == How::Kernel {
            How::Kernel
        } else if l == How::Engine || c == How::Engine {
            How::Engine
        } else {
            How::Keep
        };
    }
    let Some(r) = ROWS.iter().find(|r| r.level == level && r.name == name) else {
        return How::Kernel;
    };
    let h = match k {
        Kind::Udp => r.udp,
        Kind::TcpListener => r.listener,
        _ => r.conn,
    };
    if h != How::Off {
        return h;
    }
    let off = b.iter().all(|x| *x == 0);
    let honoured = match (level, name) {
        // The engine sets DF: WANT (1), DO (2), PROBE (3).
        (IP, libc::IP_MTU_DISCOVER) => matches!(int_of(b), Some(1..=3)),
        // SO_LINGER: off, or on with a zero timeout (an abortive close,
        // which the engine does); a close that waits is the kernel's.
        (S, libc::SO_LINGER) => {
            b.len() >= 8 && (b[..4].iter().all(|x| *x == 0) || b[4..8].iter().all(|x| *x == 0))
        }
        _ => off,
    };
    if honoured { How::Keep } else { How::Kernel }
}

/// `Some(reason)` when the option must move the socket to the kernel.
pub fn kernel_reason(
    k: Kind,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> Option<String> {
    (how(k, level, name, bytes(val, len)) == How::Kernel).then(|| {
        format!(
            "option {} is not honoured by the xdp engine",
            name_of(level, name)
        )
    })
}

/// Does setting this option change the IP header the engine writes?
pub fn sets_ip_header(level: c_int, name: c_int) -> bool {
    level == IP && matches!(name, libc::IP_TTL | libc::IP_TOS | libc::IP_MULTICAST_TTL)
}

// ------------------------------------------------------------ TCP

/// After the kernel socket of a TCP candidate (before listen/connect) took
/// an option: one the engine does not honour keeps the socket off it.
pub fn tcp_candidate_after(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) {
    if table::get(fd) & table::F_TCAND == 0 {
        return;
    }
    if let Some(why) = kernel_reason(Kind::TcpCandidate, level, name, val, len) {
        let e = errno();
        table::clear_flags(fd, table::F_TCAND);
        log!(
            Level::Warn,
            "fd {fd} tcp: kernel socket; xdp not used: {why}"
        );
        set_errno(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(v: c_int) -> [u8; 4] {
        v.to_ne_bytes()
    }

    #[test]
    fn only_ip_ttl_and_ip_tos_make_a_connect_read_its_ip_header() {
        let ip = libc::IPPROTO_IP;
        assert_eq!(bits_of(ip, libc::IP_TTL), SET_CARRIED | SET_IP);
        assert_eq!(bits_of(ip, libc::IP_TOS), SET_CARRIED | SET_IP);
        for (level, name) in [
            (libc::SOL_SOCKET, libc::SO_RCVTIMEO),
            (libc::SOL_SOCKET, libc::SO_PRIORITY),
            (libc::SOL_SOCKET, libc::SO_RCVBUF),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY),
            (ip, libc::IP_MULTICAST_TTL),
        ] {
            assert_eq!(bits_of(level, name) & SET_IP, 0, "({level}, {name})");
        }
        assert_eq!(bits_of(libc::SOL_SOCKET, libc::SO_RCVTIMEO), SET_CARRIED);
        assert_eq!(bits_of(libc::SOL_SOCKET, libc::SO_REUSEADDR), SET_REUSE);
    }

    #[test]
    fn md5_and_ao_are_never_on_the_engine() {
        for k in [Kind::TcpCandidate, Kind::TcpListener, Kind::TcpConn] {
            assert_eq!(how(k, T, libc::TCP_MD5SIG, &[1; 80]), How::Kernel);
            assert_eq!(how(k, T, TCP_MD5SIG_EXT, &[1; 80]), How::Kernel);
            for n in TCP_AO_FIRST..=TCP_AO_LAST {
                assert_eq!(how(k, T, n, &[1; 80]), How::Kernel);
            }
        }
    }

    #[test]
    fn header_options_are_the_engines() {
        for k in [
            Kind::Udp,
            Kind::TcpListener,
            Kind::TcpConn,
            Kind::TcpCandidate,
        ] {
            assert_eq!(how(k, IP, libc::IP_TTL, &one(7)), How::Engine);
            assert_eq!(how(k, IP, libc::IP_TOS, &one(0xb8)), How::Engine);
        }
        assert_eq!(
            how(Kind::Udp, IP, libc::IP_MULTICAST_TTL, &[5]),
            How::Engine
        );
    }

    /// Each row: (socket kind, level, option, value, what `how` must say).
    fn check(rows: &[(Kind, c_int, c_int, &[u8], How)]) {
        for &(k, level, name, val, want) in rows {
            assert_eq!(
                how(k, level, name, val),
                want,
                "{k:?} {} = {val:?}",
                name_of(level, name)
            );
        }
    }

    #[test]
    fn off_values_keep_the_engine_and_on_values_do_not() {
        check(&[
            (Kind::Udp, S, libc::SO_MARK, &one(0), How::Keep),
            (Kind::Udp, S, libc::SO_MARK, &one(42), How::Kernel),
            (Kind::Udp, IP, libc::IP_RECVTTL, &one(1), How::Kernel),
            (Kind::Udp, IP, libc::IP_PKTINFO, &one(0), How::Keep),
            (Kind::TcpConn, IP, libc::IP_MINTTL, &one(255), How::Kernel),
            (Kind::TcpConn, IP, libc::IP_MINTTL, &one(0), How::Keep),
            (Kind::Udp, IP, libc::IP_MTU_DISCOVER, &one(2), How::Keep),
            (Kind::Udp, IP, libc::IP_MTU_DISCOVER, &one(0), How::Kernel),
            (Kind::Udp, S, libc::SO_BINDTODEVICE, b"\0", How::Keep),
            (Kind::Udp, S, libc::SO_BINDTODEVICE, b"eth0\0", How::Kernel),
        ]);
    }

    #[test]
    fn unknown_options_are_the_kernels() {
        let lg = |on: c_int, secs: c_int| [on.to_ne_bytes(), secs.to_ne_bytes()].concat();
        check(&[
            (Kind::Udp, IP, 9999, &one(1), How::Kernel),
            (Kind::TcpConn, T, libc::TCP_CORK, &one(1), How::Kernel),
            (
                Kind::TcpCandidate,
                T,
                libc::TCP_DEFER_ACCEPT,
                &one(1),
                How::Kernel,
            ),
            (
                Kind::TcpCandidate,
                T,
                libc::TCP_NODELAY,
                &one(1),
                How::Engine,
            ),
            (
                Kind::TcpCandidate,
                S,
                libc::SO_SNDBUF,
                &one(1 << 20),
                How::Engine,
            ),
            (
                Kind::TcpConn,
                S,
                libc::SO_SNDBUF,
                &one(1 << 20),
                How::Kernel,
            ),
            (Kind::TcpConn, S, libc::SO_LINGER, &lg(1, 0), How::Keep),
            (Kind::TcpConn, S, libc::SO_LINGER, &lg(0, 5), How::Keep),
            (Kind::TcpConn, S, libc::SO_LINGER, &lg(1, 5), How::Kernel),
        ]);
        assert!(name_of(T, libc::TCP_MD5SIG).contains("MD5"));
    }
}
