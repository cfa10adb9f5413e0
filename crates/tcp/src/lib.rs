//! A sans-IO TCP for IPv4, written for the nanowire engine.
//!
//! Nothing in here opens a socket, reads a clock or spawns a thread. The
//! caller (the xdp engine, a test, the raw-socket interop harness) feeds
//! received segments with [`TcpStack::input`], drains segments to send with
//! [`TcpStack::poll_transmit`], and calls [`TcpStack::poll_timers`] at
//! [`TcpStack::next_deadline`]. Time is monotonic nanoseconds chosen by the
//! caller, so tests run on a simulated clock and are deterministic.
//!
//! One file per concern, as in Onload: `input` (receive processing),
//! `output` (transmit), `timer` (RTO, delayed ACK, persist, keepalive,
//! TIME-WAIT), `wheel` (the timer queue), `stack` (demux, listeners, SYN
//! queue and cookies, accept queue), `cc` (NewReno), `isn` (RFC 6528 ISNs
//! and cookies), `buffer` (rings, assembler), `fault` (the seeded fault
//! injector).
//!
//! References: RFC 9293, 5961, 6298, 5681, 6582, 6928, 7323, 2018, 6528,
//! 4987, 1122; Linux and smoltcp behaviour.

pub mod buffer;
pub mod cc;
mod conn;
pub mod fault;
mod handover;
mod input;
pub mod isn;
mod output;
pub mod payload;
pub mod seq;
mod stack;
mod timer;
mod wheel;

pub use buffer::HeldBytes;
pub use conn::State;
pub use handover::{EngineState, Handover, peer_fin_packet, peer_packet};
pub use isn::Secret;
pub use payload::Payload;
pub use stack::{
    ConnId, DirectRead, EndState, HOLD_MIN, Hold, Intake, ListenerId, Readiness, TcpStack, Transmit,
};

use std::net::SocketAddrV4;

pub const NS_PER_MS: u64 = 1_000_000;
pub const NS_PER_S: u64 = 1_000_000_000;

/// A connection's identity, from the stack's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FourTuple {
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
}

impl std::hash::Hash for FourTuple {
    /// Two words (addresses, ports): one mix each in the demux's hasher.
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64(
            (u64::from(self.local.ip().to_bits()) << 32) | u64::from(self.remote.ip().to_bits()),
        );
        h.write_u32((u32::from(self.local.port()) << 16) | u32::from(self.remote.port()));
    }
}

/// Parameters of the stack. The engine fills these from its options table;
/// the defaults are Linux's.
#[derive(Debug, Clone)]
pub struct Config {
    /// MSS we announce: route MTU - 40 (IPv4 + TCP headers).
    pub mss: u16,
    /// RFC 6298 lower bound of the RTO (Linux: 200 ms).
    pub rto_min_ns: u64,
    /// Upper bound of the RTO (Linux: 120 s).
    pub rto_max_ns: u64,
    /// RTO before any RTT sample (RFC 6298: 1 s).
    pub rto_initial_ns: u64,
    /// Delayed-ACK timeout (Linux: 40 ms minimum).
    pub delayed_ack_ns: u64,
    /// Quick-ACK mode's ACK of a data segment (a connection's first
    /// segments) waits up to this long for the application's reply (or
    /// its FIN) to carry it, as a delayed ACK does, instead of going out
    /// alone at once. The engine's application runs its turn right after
    /// the segment's (a request, then its response): one segment and one
    /// peer receive fewer per request. A second full segment, a hole, a
    /// FIN, a window update still ACK at once. 0: at once (Linux's
    /// quick-ACK mode, whose ACK goes out from the softirq before the
    /// application runs).
    pub quickack_defer_ns: u64,
    /// Reorder grace: a super-frame (larger than the MSS: a GSO/GRO
    /// aggregate) that opens a hole (out of order) is not
    /// announced (no duplicate ACK, no SACK blocks on any ACK) for this
    /// long (Linux's `tcp_comp_sack_delay_ns` bound, 1 ms); a hole filled
    /// within it never was one to the sender. On veth a kernel sender's super-frames reach an engine from
    /// two CPUs' softirqs and overtake each other by a few hundred µs: each
    /// SACK made the sender resend a whole 45-segment super-frame (issue
    /// 21). A hole still open when it ends is SACKed at once. 0: off.
    pub reorder_grace_ns: u64,
    /// TIME-WAIT length (Linux: 60 s).
    pub time_wait_ns: u64,
    /// FIN-WAIT-2 timeout for connections the application closed (Linux tcp_fin_timeout: 60 s).
    pub fin_timeout_ns: u64,
    /// SYN retransmissions before connect fails (Linux tcp_syn_retries: 6).
    pub syn_retries: u32,
    /// SYN-ACK retransmissions (Linux tcp_synack_retries: 5).
    pub synack_retries: u32,
    /// Data retransmissions before the connection is dropped (Linux tcp_retries2: 15).
    pub retries: u32,
    /// Keepalive defaults (Linux: 7200 s, 75 s, 9); off per connection until enabled.
    pub keepalive_idle_ns: u64,
    pub keepalive_intvl_ns: u64,
    pub keepalive_cnt: u32,
    /// Default buffer sizes of new connections (SO_SNDBUF / SO_RCVBUF).
    pub sndbuf: usize,
    pub rcvbuf: usize,
    /// Receive buffer autotuning (Linux's tcp_rcv_space_adjust, up to
    /// `tcp_rmem[2]`): the most a connection's receive buffer, and so its
    /// window, grows to when the application reads fast; 0 keeps every
    /// buffer at `rcvbuf` (a socket whose application set SO_RCVBUF). Off
    /// here by default; the engine turns it on (`RCVBUF_AUTOTUNE_MAX`).
    pub rcvbuf_max: usize,
    /// Options we offer.
    pub window_scaling: bool,
    pub timestamps: bool,
    pub sack: bool,
    /// Half-open connections kept per listener before SYN cookies take over.
    pub syn_queue: usize,
    /// Whether a segment for no connection and no listener gets a RST.
    pub rst_unknown: bool,
    /// Whether checksums of received segments are verified.
    pub verify_checksum: bool,
    /// Connections' segments leave with only the pseudo-header's sum in
    /// their checksum field, for the transmit path's offload to complete
    /// (the kernel's CHECKSUM_PARTIAL; see `Transmit::csum_partial`).
    /// Control segments (resets for no connection, cookie SYN-ACKs) are
    /// always checksummed in full.
    pub tx_checksum_partial: bool,
    /// Least time between two ACKs answering unacceptable bare ACKs, RSTs
    /// or SYNs on one connection (Linux tcp_invalid_ratelimit: 500 ms).
    pub invalid_ratelimit_ns: u64,
    /// Most connections the stack holds (demux table and slab are sized for it).
    pub max_connections: usize,
    /// Initial congestion window in segments (RFC 6928: 10).
    pub initial_cwnd: u32,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            mss: 1460,
            rto_min_ns: 200 * NS_PER_MS,
            rto_max_ns: 120 * NS_PER_S,
            rto_initial_ns: NS_PER_S,
            delayed_ack_ns: 40 * NS_PER_MS,
            quickack_defer_ns: 0,
            reorder_grace_ns: NS_PER_MS,
            time_wait_ns: 60 * NS_PER_S,
            fin_timeout_ns: 60 * NS_PER_S,
            syn_retries: 6,
            synack_retries: 5,
            retries: 15,
            keepalive_idle_ns: 7200 * NS_PER_S,
            keepalive_intvl_ns: 75 * NS_PER_S,
            keepalive_cnt: 9,
            sndbuf: 256 * 1024,
            rcvbuf: 256 * 1024,
            rcvbuf_max: 0,
            window_scaling: true,
            timestamps: true,
            sack: true,
            syn_queue: 256,
            rst_unknown: true,
            verify_checksum: true,
            tx_checksum_partial: false,
            invalid_ratelimit_ns: 500 * NS_PER_MS,
            max_connections: 16384,
            initial_cwnd: 10,
        }
    }
}

/// Linux's `tcp_rmem[2]` as it comes (6 MiB): where autotuning stops.
pub const RCVBUF_AUTOTUNE_MAX: usize = 6 << 20;

impl Config {
    /// MSS for a route MTU.
    pub fn mss_for_mtu(mtu: u32) -> u16 {
        mtu.saturating_sub(40).clamp(88, 65495) as u16
    }
}

/// Per-socket options fixed when a connection is created (a listener's are
/// inherited by the connections it accepts, as in Linux).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketOptions {
    /// SO_SNDBUF / SO_RCVBUF in bytes (the rings' sizes).
    pub sndbuf: usize,
    pub rcvbuf: usize,
    /// Receive buffer autotuning up to this many bytes (0: off; see
    /// [`Config::rcvbuf_max`]).
    pub rcvbuf_max: usize,
    /// TCP_NODELAY.
    pub nodelay: bool,
    /// SO_LINGER with a zero timeout.
    pub linger0: bool,
    /// SO_KEEPALIVE with (idle, interval, count).
    pub keepalive: Option<(u64, u64, u32)>,
    /// IP_TTL and IP_TOS of the segments sent (the IP header the engine
    /// writes; see [`crate::Transmit`]).
    pub ttl: u8,
    pub tos: u8,
    /// SO_REUSEADDR of the kernel socket (a listener's, for the connections
    /// it accepts, as the kernel's accepted sockets inherit it): a kernel
    /// socket that takes the connection over (exit, kill -9, fork) sets it
    /// again, so its TIME-WAIT blocks a later bind of the port exactly as
    /// the kernel's would (TCP_REPAIR off clears it).
    pub reuseaddr: bool,
}

/// The TTL of a socket that did not set IP_TTL (Linux's
/// `net.ipv4.ip_default_ttl` as it comes).
pub const DEFAULT_TTL: u8 = 64;

impl SocketOptions {
    pub fn from_config(cfg: &Config) -> SocketOptions {
        SocketOptions {
            sndbuf: cfg.sndbuf,
            rcvbuf: cfg.rcvbuf,
            rcvbuf_max: cfg.rcvbuf_max,
            nodelay: false,
            linger0: false,
            keepalive: None,
            ttl: DEFAULT_TTL,
            tos: 0,
            reuseaddr: false,
        }
    }
}

/// Readiness bits, as epoll reports them.
pub mod ready {
    pub const IN: u8 = 1;
    pub const OUT: u8 = 2;
    /// The peer sent FIN (EPOLLRDHUP).
    pub const RDHUP: u8 = 4;
    /// Both directions are closed (EPOLLHUP).
    pub const HUP: u8 = 8;
    /// An error is pending (EPOLLERR).
    pub const ERR: u8 = 16;
}

/// Why a connection ended or an operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The handle is stale or was never valid.
    InvalidHandle,
    /// connect(): the peer answered with RST.
    ConnectionRefused,
    /// The peer reset an established connection.
    ConnectionReset,
    /// Retransmissions or keepalive probes ran out.
    TimedOut,
    /// The connection was aborted locally.
    Aborted,
    /// Sending after shutdown(SHUT_WR) or close.
    Shutdown,
    /// Not in a state where this makes sense (e.g. send before established).
    NotConnected,
    /// The 4-tuple or local address is in use.
    AddrInUse,
    /// The stack holds `max_connections` already.
    TooManyConnections,
    /// Nothing to read, or no room to write, right now (EAGAIN).
    WouldBlock,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Error::InvalidHandle => "invalid connection handle",
            Error::ConnectionRefused => "connection refused",
            Error::ConnectionReset => "connection reset by peer",
            Error::TimedOut => "connection timed out",
            Error::Aborted => "connection aborted",
            Error::Shutdown => "cannot send after transport endpoint shutdown",
            Error::NotConnected => "transport endpoint is not connected",
            Error::AddrInUse => "address already in use",
            Error::TooManyConnections => "too many connections",
            Error::WouldBlock => "operation would block",
        })
    }
}

impl std::error::Error for Error {}

macro_rules! counters {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {
        /// Everything the stack dropped, retransmitted or decided, with reasons.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Counters { $($(#[$m])* pub $name: u64,)* }
        impl Counters {
            /// (stable name, value) pairs for export.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$((stringify!($name), self.$name)),*].into_iter()
            }
        }
    };
}

counters! {
    segs_in, segs_out,
    /// Malformed header or options.
    malformed,
    bad_checksum,
    /// Segment for no connection or listener (a RST is sent unless it was one).
    no_socket,
    rst_sent,
    rst_received,
    /// Unacceptable sequence number (RFC 9293 3.10.7.4); an ACK answers it.
    out_of_window,
    /// Timestamp older than ts_recent (PAWS, RFC 7323 5).
    paws_rejected,
    /// RFC 5961 challenge ACKs (in-window RST or SYN).
    challenge_acks,
    /// Answers to unacceptable segments suppressed by `invalid_ratelimit_ns`.
    oow_acks_ratelimited,
    /// ACK for data never sent (RFC 5961 5.2).
    ack_too_new,
    /// ACK older than the window allows (RFC 5961 5.2).
    ack_too_old,
    dup_acks,
    /// Out-of-order data dropped because the assembler had no free range.
    ooo_dropped,
    /// Segments queued out of order (beyond a hole), each answered at once
    /// with a SACK: the peer's reason to retransmit what the hole lacks.
    out_of_order,
    /// Bytes received beyond the receive window and cut off.
    beyond_window_bytes,
    /// In-order bytes copied straight into a waiting reader's buffer
    /// ([`DirectRead`]), never through the receive ring.
    rx_direct_bytes,
    /// In-order bytes kept in the frames they arrived in
    /// ([`Hold`]), copied once by the application's read.
    rx_held_bytes,
    /// Frames offered to keep with enough in-order data that were copied
    /// instead (out-of-order bytes waited behind a hole, or the
    /// connection's held frames reached twice its receive buffer).
    rx_hold_declined,
    /// Segments in states that take no data (after FIN), ignored.
    data_after_fin,
    retransmits,
    rto_expirations,
    fast_retransmits,
    sack_retransmits,
    zero_window_probes,
    keepalive_probes,
    keepalive_timeouts,
    retransmit_timeouts,
    syn_timeouts,
    active_opens,
    passive_opens,
    connections_reset,
    /// SYN dropped because the listener's accept queue was full.
    listen_overflows,
    /// Final ACK dropped because the accept queue was full (Linux behaviour).
    accept_queue_full,
    syncookies_sent,
    syncookies_ok,
    syncookies_failed,
    /// A SYN reopened a connection in TIME-WAIT.
    time_wait_reuse,
    /// A control segment (RST, cookie SYN-ACK) could not be queued.
    ctrl_queue_full,
    /// Segments given to `poll_transmit` with a buffer too small.
    tx_buffer_too_small,
    /// Tail-loss probes sent (RFC 8985 7): the last segment resent after
    /// 2·SRTT without an ACK, instead of waiting for the RTO.
    tail_loss_probes,
    /// Connections handed over to another owner (the kernel, TCP_REPAIR).
    handovers,
    /// Segments of handed-over connections that still reached the stack,
    /// dropped (the peer retransmits them to the new owner).
    handover_drops,
    /// Connections taken over from another engine (`TcpStack::adopt_state`).
    adoptions,
}

/// A TCP_INFO-like snapshot of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpInfo {
    pub state: State,
    pub rtt_us: u64,
    pub rttvar_us: u64,
    pub rto_us: u64,
    /// Congestion window and slow-start threshold in bytes.
    pub cwnd: u32,
    pub ssthresh: u32,
    /// Consecutive timeouts of the current backoff (tcpi_retransmits).
    pub retransmits: u32,
    /// Retransmitted segments over the connection's life (tcpi_total_retrans).
    pub total_retrans: u64,
    /// Bytes sent and not yet acknowledged.
    pub unacked: u32,
    pub snd_mss: u16,
    pub rcv_mss: u16,
    pub snd_wnd: u32,
    pub rcv_wnd: u32,
    /// The receive buffer's size now (it grows with autotuning).
    pub rcvbuf: u32,
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
    pub timestamps: bool,
    pub sack: bool,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    /// Sequence numbers (not in Linux's TCP_INFO; for tests and debugging).
    pub snd_nxt: u32,
    pub rcv_nxt: u32,
}
