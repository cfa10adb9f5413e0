//! Shared-memory stats pages: each engine maps
//! `/dev/shm/nanowire/<pid>-<start>-<n>` (a self-describing header, then
//! atomic u64 counters) so that `nanowire stats` can read the counters of
//! running engines without talking to them. The page is removed when the
//! engine closes; pages of dead processes (SIGKILL) are ignored and cleaned
//! up by the next engine and by `stats`.
//!
//! **One table.** Every counter is one row of [`engine_counters!`]'s
//! invocation below (engine) or of the socket table: its enum variant, its
//! stable name, its kind and, for the TCP stacks' counters, the field of
//! `nanowire_tcp::Counters` it publishes. The enums ([`E`], [`S`]), the
//! names, the kinds, the page's descriptors and the TCP publishing
//! ([`publish_tcp`]) are all generated from those rows; nothing is kept in
//! step by position.
//!
//! **The page describes itself** (the idea of Aeron's counters file, where
//! each counter's label and type sit in a metadata record next to its
//! value): the header gives the layout (offsets and counts), a descriptor
//! per counter gives its name, kind, section and slot, and a reader takes
//! every name from the page, never from its own build. So adding a counter
//! moves offsets but breaks no reader; an older page format (`NWSTATS2`,
//! counters by position) is reported as unreadable by name, never misread.
//!
//! ```text
//! offset 0     header, u64 words (little endian, the machine's own):
//!              0 magic "NWSTATS3" (stored last, Release)  1 info JSON length
//!              2 page bytes  3 descriptor offset  4 descriptor count
//!              5 descriptor size  6 engine offset  7 engine counters
//!              8 socket offset  9 socket stride (bytes)  10 socket slots
//! offset 128   the engine's info (PageInfo) as JSON, up to HEADER_BYTES
//! desc. off.   descriptors, DESC_BYTES each: u32 section (1 engine,
//!              2 socket), u32 kind (Kind), u32 slot (engine: counter index;
//!              socket: word in the socket's block), u32 0, name (NUL-padded)
//! engine off.  engine counters, one u64 each, in slot order
//! socket off.  socket slots x stride: word 0 the local address packed as
//!              (1 << 48 | ipv4 << 16 | port), 0 = slot free; then counters
//! ```
//!
//! /dev/shm is world-writable, and engines run as root, so (issue 9, item
//! 10): the directory must be a real directory (not a symlink) owned by
//! the engine's effective uid with no group/other write permission, or the
//! engine refuses it (one line on stderr, the page is then anonymous and
//! not listed). It is opened once with O_DIRECTORY|O_NOFOLLOW and pages are
//! created relative to that descriptor with O_CREAT|O_EXCL|O_NOFOLLOW, so
//! nothing planted there can redirect a write. Pages are mode 0600: they
//! list the engine's sockets, which is nobody else's business (issue 20).
//! `<start>` is the process
//! start time (clock ticks since boot, /proc/PID/stat field 22): a page is
//! live only while a process with that pid *and* that start time exists,
//! so a reused pid never keeps a dead engine's page alive.
//! The process's engine settings may name another directory (`stats_dir`,
//! `NANOWIRE_STATS_DIR` as the binary read it; same checks).
//!
//! Writers are single (the engine, under its lock) and update counters with
//! relaxed load+store (no locked RMW on the hot path); readers see each
//! counter atomically.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const DIR: &str = "/dev/shm/nanowire";
const MAGIC: u64 = u64::from_le_bytes(*b"NWSTATS3");
/// The format before the page described itself (counters by position).
const MAGIC_V2: u64 = u64::from_le_bytes(*b"NWSTATS2");
/// Header words, then the info JSON from [`INFO_OFF`] up to here.
pub const HEADER_BYTES: usize = 512;
const INFO_OFF: usize = 128;
/// One descriptor: section, kind, slot, reserved (4 x u32), name.
pub const DESC_BYTES: usize = 64;
const NAME_BYTES: usize = DESC_BYTES - 16;
const SECTION_ENGINE: u32 = 1;
const SECTION_SOCKET: u32 = 2;
pub const MAX_SOCKETS: usize = 1024;

const fn align64(n: usize) -> usize {
    n.next_multiple_of(64)
}
/// Words per socket block: the address, the counters, rounded to a cache line.
const SOCK_WORDS: usize = (1 + S::COUNT).next_multiple_of(8);
const DESC_COUNT: usize = E::COUNT + 1 + S::COUNT;
const DESC_OFF: usize = HEADER_BYTES;
const ENGINE_OFF: usize = align64(DESC_OFF + DESC_COUNT * DESC_BYTES);
const SOCK_OFF: usize = align64(ENGINE_OFF + E::COUNT * 8);
const PAGE_BYTES: usize = SOCK_OFF + MAX_SOCKETS * SOCK_WORDS * 8;
/// Permissions of a page file: the owner (and root) only.
const PAGE_MODE: u32 = 0o600;
/// Bytes of one stats page (counted in the engine's memory).
pub const PAGE_SIZE_BYTES: usize = PAGE_BYTES;
/// A reader's bounds on what a page may claim (a page is only ever ours,
/// but a reader maps what the header says, so the header is checked).
const MAX_PAGE_BYTES: u64 = 64 << 20;
const MAX_DESCS: u64 = 1 << 16;

/// What a counter's value means; written into the page with each counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u32)]
pub enum Kind {
    /// Counts events since the engine opened; only grows.
    Counter = 1,
    /// A level now (entries held, bytes mapped, sockets open).
    Gauge = 2,
    /// The highest level seen (a high-water mark).
    Peak = 3,
    /// A socket slot's packed local address (0: the slot is free).
    Address = 4,
}

impl Kind {
    fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Counter,
            2 => Kind::Gauge,
            3 => Kind::Peak,
            4 => Kind::Address,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Peak => "peak",
            Kind::Address => "address",
        }
    }
}

/// The one list of the page's counters, by section: variant, name, kind
/// and, for the TCP stacks' counters, the `nanowire_tcp::Counters` field
/// published into it (`<- field`).
macro_rules! counter_table {
    (@field) => { None };
    (@field $f:ident) => { Some(stringify!($f)) };
    ($(
        $(#[$em:meta])*
        pub enum $T:ident {
            $( $(#[$m:meta])* $v:ident = $name:literal : $kind:ident $(<- $field:ident)? ),* $(,)?
        }
    )*) => {
        $(
            $(#[$em])*
            #[derive(Debug, Clone, Copy, PartialEq, Eq)]
            #[repr(usize)]
            pub enum $T { $( $(#[$m])* $v, )* }

            impl $T {
                /// Every counter, in slot order.
                pub const ALL: &'static [$T] = &[$($T::$v),*];
                pub const COUNT: usize = Self::ALL.len();
                /// The stable name (`nanowire stats`, the page's descriptor).
                pub const fn name(self) -> &'static str {
                    match self { $($T::$v => $name),* }
                }
                pub const fn kind(self) -> Kind {
                    match self { $($T::$v => Kind::$kind),* }
                }
                /// The `nanowire_tcp::Counters` field this row publishes.
                pub const fn tcp_field(self) -> Option<&'static str> {
                    match self { $($T::$v => counter_table!(@field $($field)?)),* }
                }
            }
        )*

        /// Add what a TCP stack counted since the last call (`was`) to the
        /// engine's `tcp_*` counters: the rows marked `<- field`. Call under
        /// the engine's RX lock (their single writer).
        pub fn publish_tcp(page: &StatsPage, now: &nanowire_tcp::Counters, was: &nanowire_tcp::Counters) {
            $($($(
                if now.$field > was.$field {
                    bump(page.e($T::$v), now.$field - was.$field);
                }
            )?)*)*
        }
    };
}

counter_table! {
    /// Engine counters (one writer each; see the module doc).
    pub enum E {
        RxFrames = "rx_frames": Counter,
        RxPackets = "rx_packets": Counter,
        RxBytes = "rx_bytes": Counter,
        TxPackets = "tx_packets": Counter,
        TxBytes = "tx_bytes": Counter,
        DropNoSocket = "drop_no_socket": Counter,
        DropTruncated = "drop_truncated": Counter,
        DropBadVersion = "drop_bad_version": Counter,
        DropBadIhl = "drop_bad_ihl": Counter,
        DropIpOptions = "drop_ip_options": Counter,
        DropBadTotalLength = "drop_bad_total_length": Counter,
        DropFragment = "drop_fragment": Counter,
        DropBadIpChecksum = "drop_bad_ip_checksum": Counter,
        DropBadUdpLength = "drop_bad_udp_length": Counter,
        DropBadUdpChecksum = "drop_bad_udp_checksum": Counter,
        /// A TCP header whose data offset is below 5 or past the segment.
        DropBadTcpDataOffset = "drop_bad_tcp_data_offset": Counter,
        /// TCP options the classifier refused (it does not parse them
        /// today: the TCP stack counts those as `tcp_drop_malformed`).
        DropBadTcpOptions = "drop_bad_tcp_options": Counter,
        DropBadTcpChecksum = "drop_bad_tcp_checksum": Counter,
        /// Not an IPv4 frame (ARP, IPv6, VLAN-tagged, ...).
        DropNotIpv4 = "drop_not_ipv4": Counter,
        /// IPv4, but neither UDP nor TCP.
        DropOtherProtocol = "drop_other_protocol": Counter,
        DropSocketQueueFull = "drop_socket_queue_full": Counter,
        DropTxRingFull = "drop_tx_ring_full": Counter,
        DropBadDesc = "drop_bad_desc": Counter,
        RxCsumPartial = "rx_csum_partial": Counter,
        XskRxDropped = "xsk_rx_dropped": Counter,
        XskRxRingFull = "xsk_rx_ring_full": Counter,
        XskRxFillRingEmpty = "xsk_rx_fill_ring_empty": Counter,
        XskRxInvalidDescs = "xsk_rx_invalid_descs": Counter,
        XskTxInvalidDescs = "xsk_tx_invalid_descs": Counter,
        XskTxRingEmpty = "xsk_tx_ring_empty": Counter,
        XdpNoSocketOnQueue = "xdp_no_socket_on_queue": Counter,
        PeakRxRing = "peak_rx_ring": Peak,
        PeakSocketQueue = "peak_socket_queue": Peak,
        Sockets = "sockets": Gauge,
        DropMartian = "drop_martian": Counter,
        DropNeighUnresolved = "drop_neigh_unresolved": Counter,
        NeighResolutions = "neigh_resolutions": Counter,
        /// TCP segments that waited for their next hop's MAC and left once
        /// it was known (`tcp.rs` unpark, woken by the resolution).
        NeighUnparked = "neigh_unparked": Counter,
        /// Neighbour entries (per next hop) held now (bounded, `neigh.rs`).
        NeighEntries = "neigh_entries": Gauge,
        /// Route entries (per off-link destination) held now (bounded).
        NeighRoutes = "neigh_routes": Gauge,
        RxMultiBuffer = "rx_multi_buffer": Counter,
        MemUmemBytes = "mem_umem_bytes": Gauge,
        MemRingBytes = "mem_ring_bytes": Gauge,
        MemTotalBytes = "mem_total_bytes": Gauge,
        DropFaultRx = "drop_fault_rx": Counter,
        FaultRxDuplicated = "fault_rx_duplicated": Counter,
        FaultRxReordered = "fault_rx_reordered": Counter,
        FaultRxCorrupted = "fault_rx_corrupted": Counter,
        FaultTxLost = "fault_tx_lost": Counter,
        FaultTxDuplicated = "fault_tx_duplicated": Counter,
        FaultTxCorrupted = "fault_tx_corrupted": Counter,
        TcpSegsIn = "tcp_segs_in": Counter <- segs_in,
        TcpSegsOut = "tcp_segs_out": Counter <- segs_out,
        TcpRetransmits = "tcp_retransmits": Counter <- retransmits,
        TcpFastRetransmits = "tcp_fast_retransmits": Counter <- fast_retransmits,
        TcpRtoExpirations = "tcp_rto_expirations": Counter <- rto_expirations,
        TcpRstSent = "tcp_rst_sent": Counter <- rst_sent,
        TcpRstReceived = "tcp_rst_received": Counter <- rst_received,
        TcpActiveOpens = "tcp_active_opens": Counter <- active_opens,
        TcpPassiveOpens = "tcp_passive_opens": Counter <- passive_opens,
        TcpConnectionsReset = "tcp_connections_reset": Counter <- connections_reset,
        TcpDropMalformed = "tcp_drop_malformed": Counter <- malformed,
        TcpDropBadChecksum = "tcp_drop_bad_checksum": Counter <- bad_checksum,
        TcpDropOutOfWindow = "tcp_drop_out_of_window": Counter <- out_of_window,
        TcpDropNoSocket = "tcp_drop_no_socket": Counter <- no_socket,
        TcpListenOverflows = "tcp_listen_overflows": Counter <- listen_overflows,
        TcpSyncookiesSent = "tcp_syncookies_sent": Counter <- syncookies_sent,
        TcpSyncookiesOk = "tcp_syncookies_ok": Counter <- syncookies_ok,
        TcpTailLossProbes = "tcp_tail_loss_probes": Counter <- tail_loss_probes,
        TcpHandovers = "tcp_handovers": Counter <- handovers,
        TcpHandoverDrops = "tcp_handover_drops": Counter <- handover_drops,
        TcpAdoptions = "tcp_adoptions": Counter <- adoptions,
        /// Fragment frames merged into a reassembled datagram (issue 20, 8).
        RxFragMerged = "rx_frag_merged": Counter,
        DropFragTimeout = "drop_frag_timeout": Counter,
        DropFragOverlap = "drop_frag_overlap": Counter,
        DropFragTooMany = "drop_frag_too_many": Counter,
        DropRxChain = "drop_rx_chain": Counter,
        TcpNoMultiBuffer = "tcp_no_multi_buffer": Counter,
        /// Unicast frames for another host's MAC (issue 20, finding 12).
        DropOtherHost = "drop_other_host": Counter,
        /// TCP segments sent with their checksum left to the kernel or the
        /// device (AF_XDP TX metadata, `XDP_TXMD_FLAGS_CHECKSUM`).
        TxCsumOffload = "tx_csum_offload": Counter,
        /// TCP payload bytes copied straight into a reading application's
        /// buffer, never through the connection's receive ring.
        TcpRxDirectBytes = "tcp_rx_direct_bytes": Counter <- rx_direct_bytes,
        /// TCP payload bytes kept in their receive frames until read
        /// (`nanowire_tcp::Hold`): copied once, by the application's read.
        TcpRxHeldBytes = "tcp_rx_held_bytes": Counter <- rx_held_bytes,
        /// Frames offered to keep that the connection copied instead (a
        /// hole before them, or its frames reached twice its buffer).
        TcpRxHoldDeclined = "tcp_rx_hold_declined": Counter <- rx_hold_declined,
        /// RX frames held in TCP receive queues now (sampled), and the most
        /// ever held (at most the engine's hold limit, 1/4 of the UMEM's RX
        /// frames, 1/8 on the engine service).
        TcpRxHeldFrames = "tcp_rx_held_frames": Gauge,
        /// Segments of ≥ 1 KiB copied without an offer: the engine's held
        /// frames were at the limit.
        TcpRxHoldLimited = "tcp_rx_hold_limited": Counter,
        PeakTcpRxHeldFrames = "peak_tcp_rx_held_frames": Peak,
        /// Connections a waiting blocking accept got late: the timer
        /// service's look found them (it turns a stack nobody else turned
        /// for SERVICE_RX_NS), or the accept itself after its sleep's slice
        /// (50 ms) ended, not its own wake on their frames: it slept
        /// without the engine's fds while nobody turned them.
        TcpAcceptLate = "tcp_accept_late": Counter,
        /// TCP segments queued beyond a hole (out of order), each answered
        /// at once with a SACK the peer may retransmit on (issue 21: on veth
        /// a kernel sender's super-frames reach the ring out of order when
        /// it sends from two CPUs).
        TcpOutOfOrder = "tcp_out_of_order": Counter <- out_of_order,
        /// Received bytes beyond the receive window, cut off.
        TcpBeyondWindowBytes = "tcp_beyond_window_bytes": Counter <- beyond_window_bytes,
        /// Segments with a timestamp older than the last one (PAWS), dropped.
        TcpPawsRejected = "tcp_paws_rejected": Counter <- paws_rejected,
        /// Out-of-order segments dropped: the reassembly had no free range.
        TcpOooDropped = "tcp_ooo_dropped": Counter <- ooo_dropped,
        /// Packets the kernel took off the TX ring and completed without
        /// sending (a kick answered EBUSY: the device's `NET_XMIT_DROP`,
        /// e.g. no carrier: a veth whose peer is down; or the veth peer's
        /// backlog full). Lost on the way out, as a kernel socket's packet
        /// the device drops (`nanowire_xdp::XskTx::kernel_dropped`).
        XskTxKernelDropped = "xsk_tx_kernel_dropped": Counter,
        /// Kicks tried again because the kernel refused for now (EAGAIN:
        /// the device queue stopped; ENOBUFS; EBUSY above): nothing lost.
        XskTxKickRetries = "xsk_tx_kick_retries": Counter,
        /// On the engine service: datagrams (or segments) dropped because
        /// this process's queues held its whole share of the shared UMEM's
        /// RX frames (`Demux::set_process_limit`; the socket counts them
        /// as `drop_queue_full`).
        DropProcessShare = "drop_process_share": Counter,
        /// TCP send rings on the heap instead of a slab of the connection
        /// table (issue 24 item 3: their unacknowledged bytes are not
        /// delivered after a kill -9), by reason: a send buffer larger
        /// than a slab (256 KiB), every slab in use (1,024), a forked
        /// child's copy of its parent's engine (`SlabMiss`).
        TcpSlabFallbackLargeBuffer = "tcp_slab_fallback_large_buffer": Counter,
        TcpSlabFallbackNoFreeSlab = "tcp_slab_fallback_no_free_slab": Counter,
        TcpSlabFallbackForkedChild = "tcp_slab_fallback_forked_child": Counter,
    }

    /// Per-socket counters (word 0 of a socket's block is its address).
    pub enum S {
        /// Datagrams queued on the socket (and their payload bytes).
        RxPackets = "rx_packets": Counter,
        RxBytes = "rx_bytes": Counter,
        /// Datagrams the socket put on the TX ring (and their payload bytes).
        TxPackets = "tx_packets": Counter,
        TxBytes = "tx_bytes": Counter,
        /// Arrived while the socket's queue was full (its own loss only).
        DropQueueFull = "drop_queue_full": Counter,
        DropTxRingFull = "drop_tx_ring_full": Counter,
        /// Datagrams queued now, and the most ever queued.
        QueueDepth = "queue_depth": Gauge,
        PeakQueueDepth = "peak_queue_depth": Peak,
        /// Datagrams that took the kernel twin (loopback, fragments,
        /// larger than the MTU, off-interface destinations).
        RxKernelPath = "rx_kernel_path": Counter,
        TxKernelPath = "tx_kernel_path": Counter,
        /// Datagrams dropped for an unresolved next hop.
        DropNeigh = "drop_neigh": Counter,
    }
}

impl E {
    /// The counter of a send ring's reason for the heap.
    pub fn slab_miss(m: nanowire_tcp::buffer::SlabMiss) -> E {
        use nanowire_tcp::buffer::SlabMiss as M;
        match m {
            M::TooLarge => E::TcpSlabFallbackLargeBuffer,
            M::NoneFree => E::TcpSlabFallbackNoFreeSlab,
            M::NotOwner => E::TcpSlabFallbackForkedChild,
        }
    }

    /// The counter of a malformed frame's reason.
    pub fn malformed(m: nanowire_wire::Malformed) -> E {
        use nanowire_wire::Malformed as M;
        match m {
            M::Truncated => E::DropTruncated,
            M::BadVersion => E::DropBadVersion,
            M::BadIhl => E::DropBadIhl,
            M::IpOptions => E::DropIpOptions,
            M::BadTotalLength => E::DropBadTotalLength,
            M::Fragment => E::DropFragment,
            M::BadIpChecksum => E::DropBadIpChecksum,
            M::BadUdpLength => E::DropBadUdpLength,
            M::BadUdpChecksum => E::DropBadUdpChecksum,
            M::BadTcpDataOffset => E::DropBadTcpDataOffset,
            M::BadTcpOptions => E::DropBadTcpOptions,
            M::BadTcpChecksum => E::DropBadTcpChecksum,
        }
    }
}

/// Header fields describing the engine.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct PageInfo {
    pub pid: u32,
    pub iface: String,
    pub queues: u32,
    pub xdp_mode: String,
    pub bind_mode: String,
    pub ring_depth: u32,
}

/// A mapped stats page: a file in the stats directory, or, when that
/// directory is unusable (an unprivileged process: it is root's), a sealed
/// memfd that the process may hand to the engine service (`memfd`), which
/// reads it for `nanowire stats`.
pub struct StatsPage {
    ptr: *mut u8,
    path: Option<PathBuf>,
    memfd: Option<std::os::fd::OwnedFd>,
}

// SAFETY: the page holds only atomics and immutable header bytes after
// creation; concurrent access goes through atomic types.
unsafe impl Send for StatsPage {}
// SAFETY: as above.
unsafe impl Sync for StatsPage {}

fn map_fd(fd: Option<&std::fs::File>, len: usize, write: bool) -> Option<*mut u8> {
    use std::os::fd::AsRawFd;
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    let (flags, raw) = match fd {
        Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: fresh mapping of a file we opened (or anonymous memory).
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, raw, 0) };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The stats directory (the engine settings' `stats_dir`, else [`DIR`]).
pub fn dir() -> PathBuf {
    super::config::config()
        .stats_dir
        .clone()
        .unwrap_or_else(default_dir)
}

#[cfg(not(test))]
fn default_dir() -> PathBuf {
    PathBuf::from(DIR)
}

/// Unit tests write and read pages of their own, in a directory of the
/// user running them: the machine's [`DIR`] may be another user's (root's,
/// once an engine ran as root), which this user's engines rightly refuse,
/// and the page tests must pass unprivileged too.
#[cfg(test)]
fn default_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    PathBuf::from(format!("{DIR}-unit-{}", unsafe { libc::geteuid() }))
}

/// An open, verified stats directory.
struct SafeDir {
    fd: std::os::fd::OwnedFd,
}

/// Why a directory is not used.
fn dir_problem(st: &libc::stat, euid: u32) -> Option<String> {
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Some("not a directory".into());
    }
    if st.st_uid != euid {
        return Some(format!("owned by uid {} (not {euid})", st.st_uid));
    }
    if st.st_mode & 0o022 != 0 {
        return Some(format!(
            "mode {:o} is group- or world-writable",
            st.st_mode & 0o7777
        ));
    }
    None
}

/// Open `path` as a stats directory: create it (mode 0755) if missing;
/// refuse a symlink, another owner, or group/other write permission.
fn open_dir(path: &Path, create: bool) -> Result<SafeDir, String> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "bad path".to_string())?;
    if create {
        // SAFETY: a NUL-terminated path; mkdir never follows a symlink in
        // the last component (EEXIST), and what exists is checked below.
        unsafe { libc::mkdir(c.as_ptr(), 0o755) };
    }
    // SAFETY: a NUL-terminated path; O_NOFOLLOW makes a symlink fail
    // (ELOOP/ENOTDIR) instead of opening its target.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and our stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    // Writers want their own directory; readers accept root's as well.
    let want = if !create && st.st_uid == 0 { 0 } else { euid };
    match dir_problem(&st, want) {
        Some(why) => Err(why),
        None => Ok(SafeDir { fd }),
    }
}

/// Start time of process `pid` (field 22 of /proc/PID/stat), if it exists.
fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and ')': split after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// (pid, start time) of a page name `<pid>-<start>-<n>` (or the old `<pid>-<n>`).
fn page_owner(name: &str) -> Option<(u32, Option<u64>)> {
    let parts: Vec<&str> = name.split('-').collect();
    let pid = parts.first()?.parse().ok()?;
    match parts.len() {
        2 => Some((pid, None)),
        3 => Some((pid, Some(parts[1].parse().ok()?))),
        _ => None,
    }
}

fn page_alive(name: &str) -> bool {
    match page_owner(name) {
        Some((pid, Some(start))) => start_time(pid) == Some(start),
        Some((pid, None)) => pid_alive(pid),
        None => true, // not ours: leave it alone
    }
}

fn warn_once(msg: String) {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !DONE.swap(true, Ordering::Relaxed) {
        eprintln!("nanowire: {msg}");
    }
}

/// Create this process's next page file in a verified directory.
fn create_page_file() -> Option<(std::fs::File, PathBuf)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let base = dir();
    let d = match open_dir(&base, true) {
        Ok(d) => d,
        Err(why) => {
            warn_once(format!(
                "stats directory {} refused ({why}); this engine's counters are in a private page (`nanowire stats` lists them only through the engine service)",
                base.display()
            ));
            return None;
        }
    };
    remove_dead_in(&d);
    let pid = std::process::id();
    let start = start_time(pid).unwrap_or(0);
    for _ in 0..16 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{pid}-{start}-{n}");
        let c = std::ffi::CString::new(name.clone()).ok()?;
        // SAFETY: a NUL-terminated name relative to our verified directory
        // fd; O_EXCL|O_NOFOLLOW never opens anything that already exists
        // (a planted file or symlink makes it fail with EEXIST).
        let fd = unsafe {
            libc::openat(
                d.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                // Owner only (issue 20, 13c): a page lists every accelerated
                // socket of the engine; `nanowire stats` runs as root.
                PAGE_MODE as libc::c_uint,
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh fd owned by nobody else.
            let f = unsafe { std::fs::File::from_raw_fd(fd) };
            if f.set_len(PAGE_BYTES as u64).is_err() {
                unlink_in(&d, &name);
                return None;
            }
            return Some((f, base.join(name)));
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            return None;
        }
    }
    None
}

fn unlink_in(d: &SafeDir, name: &str) {
    use std::os::fd::AsRawFd;
    if let Ok(c) = std::ffi::CString::new(name) {
        // SAFETY: a NUL-terminated name relative to a verified directory
        // fd; unlinkat removes the entry itself, never a symlink's target.
        unsafe { libc::unlinkat(d.fd.as_raw_fd(), c.as_ptr(), 0) };
    }
}

/// Remove pages of dead processes from a verified directory.
fn remove_dead_in(d: &SafeDir) {
    use std::os::fd::AsRawFd;
    let Ok(rd) = std::fs::read_dir(format!("/proc/self/fd/{}", d.fd.as_raw_fd())) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if page_owner(&name).is_some() && !page_alive(&name) {
            unlink_in(d, &name);
        }
    }
}

/// A page in a memfd whose size is sealed (a reader's mapping can never
/// fault past its end: SIGBUS), for a page no directory lists.
fn page_memfd() -> Option<(std::fs::File, *mut u8)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: a NUL-terminated name; the result is checked.
    let raw = unsafe {
        libc::memfd_create(
            c"nanowire-stats".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor owned by nobody else. Kept open as long
    // as the engine: above the program's numbers (sys::above_floor).
    let f = std::fs::File::from(nanowire_xdp::sys::above_floor(unsafe {
        std::os::fd::OwnedFd::from_raw_fd(raw)
    }));
    f.set_len(PAGE_BYTES as u64).ok()?;
    // SAFETY: fcntl on our own descriptor.
    let sealed = unsafe {
        libc::fcntl(
            f.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    };
    if sealed != 0 {
        return None;
    }
    let p = map_fd(Some(&f), PAGE_BYTES, true)?;
    Some((f, p))
}

impl StatsPage {
    pub fn create(info: &PageInfo) -> StatsPage {
        let file = create_page_file();
        let (ptr, path, memfd) = match file
            .as_ref()
            .and_then(|(f, p)| Some((map_fd(Some(f), PAGE_BYTES, true)?, p.clone())))
        {
            Some((p, path)) => (p, Some(path), None),
            None => {
                if let Some((_, p)) = &file {
                    let _ = std::fs::remove_file(p);
                }
                match page_memfd() {
                    Some((f, p)) => (p, None, Some(std::os::fd::OwnedFd::from(f))),
                    None => (
                        map_fd(None, PAGE_BYTES, true).expect("anonymous mmap of the stats page"),
                        None,
                        None,
                    ),
                }
            }
        };
        StatsPage::init(StatsPage { ptr, path, memfd }, info)
    }

    /// Write the header and descriptors of a freshly mapped page.
    fn init(page: StatsPage, info: &PageInfo) -> StatsPage {
        let ptr = page.ptr;
        let json = serde_json::to_vec(info).unwrap_or_default();
        let len = json.len().min(HEADER_BYTES - INFO_OFF);
        // SAFETY: bytes INFO_OFF..INFO_OFF+len are inside the header of the
        // page we just mapped writable; no reader trusts them before the
        // magic is stored (Release) below.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), ptr.add(INFO_OFF), len);
        }
        let descs = E::ALL
            .iter()
            .map(|c| (SECTION_ENGINE, c.kind(), *c as usize, c.name()))
            .chain(std::iter::once((SECTION_SOCKET, Kind::Address, 0, "local")))
            .chain(
                S::ALL
                    .iter()
                    .map(|c| (SECTION_SOCKET, c.kind(), 1 + *c as usize, c.name())),
            );
        for (i, (section, kind, slot, name)) in descs.enumerate() {
            let mut d = [0u8; DESC_BYTES];
            d[0..4].copy_from_slice(&section.to_ne_bytes());
            d[4..8].copy_from_slice(&(kind as u32).to_ne_bytes());
            d[8..12].copy_from_slice(&(slot as u32).to_ne_bytes());
            let n = name.len().min(NAME_BYTES - 1);
            d[16..16 + n].copy_from_slice(&name.as_bytes()[..n]);
            // SAFETY: descriptor i of DESC_COUNT lies inside the page
            // (DESC_OFF + DESC_COUNT * DESC_BYTES <= ENGINE_OFF); written
            // before the magic is published.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    d.as_ptr(),
                    ptr.add(DESC_OFF + i * DESC_BYTES),
                    DESC_BYTES,
                );
            }
        }
        let layout = [
            len,
            PAGE_BYTES,
            DESC_OFF,
            DESC_COUNT,
            DESC_BYTES,
            ENGINE_OFF,
            E::COUNT,
            SOCK_OFF,
            SOCK_WORDS * 8,
            MAX_SOCKETS,
        ];
        for (i, v) in layout.into_iter().enumerate() {
            page.word(1 + i).store(v as u64, Ordering::Relaxed);
        }
        page.word(0).store(MAGIC, Ordering::Release);
        page
    }

    #[inline]
    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i * 8 < PAGE_BYTES);
        // SAFETY: i indexes an 8-byte aligned u64 inside the page (callers
        // use bounded slot indices); the mapping lives as long as self.
        unsafe { &*(self.ptr.add(i * 8) as *const AtomicU64) }
    }

    #[inline]
    pub fn e(&self, c: E) -> &AtomicU64 {
        self.word(ENGINE_OFF / 8 + c as usize)
    }

    #[inline]
    fn sock_base(slot: usize) -> usize {
        SOCK_OFF / 8 + slot.min(MAX_SOCKETS - 1) * SOCK_WORDS
    }

    #[inline]
    pub fn s(&self, slot: usize, c: S) -> &AtomicU64 {
        self.word(Self::sock_base(slot) + 1 + c as usize)
    }

    /// Every engine counter: (name, value).
    pub fn engine_counters(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        E::ALL
            .iter()
            .map(|&c| (c.name(), self.e(c).load(Ordering::Relaxed)))
    }

    /// Every counter of socket `slot`: (name, value).
    pub fn socket_counters(&self, slot: usize) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        S::ALL
            .iter()
            .map(move |&c| (c.name(), self.s(slot, c).load(Ordering::Relaxed)))
    }

    /// Mark a socket slot in use with its local address (0 = free).
    pub fn set_sock_addr(&self, slot: usize, addr: Option<std::net::SocketAddrV4>) {
        let v = addr.map_or(0, |a| {
            (1u64 << 48) | (u64::from(a.ip().to_bits()) << 16) | u64::from(a.port())
        });
        let b = Self::sock_base(slot);
        if addr.is_some() {
            for i in 1..SOCK_WORDS {
                self.word(b + i).store(0, Ordering::Relaxed);
            }
        }
        self.word(b).store(v, Ordering::Release);
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The sealed memfd of a page no directory lists (to hand to the
    /// engine service), if this page is one.
    pub fn memfd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.memfd.as_ref().map(|f| f.as_fd())
    }
}

impl Drop for StatsPage {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
        // SAFETY: ptr maps PAGE_BYTES bytes created in `create`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), PAGE_BYTES) };
    }
}

/// Add `n` to a counter owned by a single writer.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Add `n` to a counter that several threads may write (rare paths: the
/// kernel path, the neighbour worker).
#[inline]
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Set a gauge.
#[inline]
pub fn set(c: &AtomicU64, v: u64) {
    c.store(v, Ordering::Relaxed);
}

/// Raise a high-water mark.
#[inline]
pub fn peak(c: &AtomicU64, v: u64) {
    if v > c.load(Ordering::Relaxed) {
        c.store(v, Ordering::Relaxed);
    }
}

/// One engine's counters as read by `nanowire stats`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineSnapshot {
    pub page: String,
    #[serde(flatten)]
    pub info: PageInfo,
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Each counter's kind as the page describes it (`counter`, `gauge`,
    /// `peak`; a kind this reader does not know is `unknown`).
    pub kinds: std::collections::BTreeMap<String, &'static str>,
    pub sockets: Vec<SocketSnapshot>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SocketSnapshot {
    pub local: String,
    pub counters: std::collections::BTreeMap<String, u64>,
}

/// A page `nanowire stats` found but cannot read, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Unreadable {
    pub page: String,
    pub reason: String,
}

/// What `read_all` found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Pages {
    pub engines: Vec<EngineSnapshot>,
    pub unreadable: Vec<Unreadable>,
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Remove the pages of processes that died without cleaning up (SIGKILL).
pub fn remove_dead_pages() {
    if let Ok(d) = open_dir(&dir(), false) {
        remove_dead_in(&d);
    }
}

/// Read every live engine's page; remove pages of dead processes.
pub fn read_all() -> Pages {
    let base = dir();
    let Ok(d) = open_dir(&base, false) else {
        return Pages::default();
    };
    remove_dead_in(&d);
    read_in(&d, &base, true)
}

/// Read every page in stats directory `base` (as `stats_dir` /
/// `NANOWIRE_STATS_DIR` named it for the engines that wrote there), those
/// of processes that have exited included, and remove nothing: the final
/// counters of a finished process (tests give each process under run a
/// private directory and read what it counted after it exits).
pub fn read_finished(base: &Path) -> Pages {
    match open_dir(base, false) {
        Ok(d) => read_in(&d, base, false),
        Err(_) => Pages::default(),
    }
}

/// The pages of verified directory `d` (at `base`); `live_only`: skip the
/// pages of processes that are gone.
fn read_in(d: &SafeDir, base: &Path, live_only: bool) -> Pages {
    let mut out = Pages::default();
    let Ok(rd) = std::fs::read_dir(base) else {
        return out;
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| page_owner(n).is_some())
        .collect();
    names.sort();
    for name in names {
        if live_only && !page_alive(&name) {
            continue;
        }
        let page = base.join(&name).display().to_string();
        match read_page(d, &name) {
            Ok(Some(mut s)) => {
                s.page = page;
                out.engines.push(s);
            }
            Ok(None) => {}
            Err(reason) => out.unreadable.push(Unreadable { page, reason }),
        }
    }
    out
}

/// A read-only mapping of a page file (unmapped on drop).
struct Mapped {
    ptr: *const u8,
    len: usize,
}

impl Mapped {
    fn word(&self, off: usize) -> Option<u64> {
        if !off.is_multiple_of(8) || off + 8 > self.len {
            return None;
        }
        // SAFETY: an aligned u64 inside the mapping (checked above), which
        // lives as long as self; the writer updates it atomically.
        Some(unsafe { &*(self.ptr.add(off) as *const AtomicU64) }.load(Ordering::Acquire))
    }
    fn bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: inside the mapping (checked above); these bytes (info and
        // descriptors) are written once, before the magic is published.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: ptr/len is the mapping made in `read_page`, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Read one page by the description it carries. `Ok(None)`: not a page yet
/// (being created); `Err`: a page this reader cannot read, and why.
fn read_page(d: &SafeDir, name: &str) -> Result<Option<EngineSnapshot>, String> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = std::ffi::CString::new(name).map_err(|_| "bad name".to_string())?;
    // SAFETY: a NUL-terminated name relative to a verified directory fd,
    // read-only, never following a symlink.
    let fd = unsafe {
        libc::openat(
            d.fd.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Ok(None);
    }
    // SAFETY: a fresh fd owned by nobody else.
    read_file(&unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Is a counter of this name a drop (`drop_*`, the TCP stacks'
/// `tcp_drop_*`, and the frames of this engine the kernel dropped: on the
/// way into the AF_XDP socket, `xsk_rx_*`, and on the way out,
/// `xsk_tx_kernel_dropped`)? (`nanowire stats`: drops by reason per
/// process.)
pub fn is_drop(name: &str) -> bool {
    name.starts_with("drop_")
        || name.contains("_drop_")
        || matches!(
            name,
            "xsk_rx_dropped"
                | "xsk_rx_ring_full"
                | "xsk_rx_fill_ring_empty"
                | "xsk_tx_kernel_dropped"
        )
}

/// Read a page another process handed over (the engine service: an
/// attached process's memfd page). Only a memfd whose size is sealed
/// against shrinking is read: the mapping can then never fault (SIGBUS)
/// whatever its owner does; its contents are checked as any page's.
pub fn read_fd(fd: std::os::fd::BorrowedFd<'_>) -> Result<Option<EngineSnapshot>, String> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl F_GET_SEALS on a descriptor we hold; fails (EINVAL)
    // on anything but a memfd.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err("not a memfd sealed against shrinking".into());
    }
    let f = std::fs::File::from(fd.try_clone_to_owned().map_err(|e| e.to_string())?);
    read_file(&f)
}

fn read_file(f: &std::fs::File) -> Result<Option<EngineSnapshot>, String> {
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let file_len = meta.len();
    if file_len < HEADER_BYTES as u64 {
        return Ok(None);
    }
    let map = |len: usize| {
        map_fd(Some(f), len, false).map(|p| Mapped {
            ptr: p.cast_const(),
            len,
        })
    };
    let head = map(HEADER_BYTES).ok_or("mmap failed")?;
    match head.word(0) {
        Some(MAGIC) => {}
        Some(0) => return Ok(None),
        Some(MAGIC_V2) => {
            return Err(
                "format NWSTATS2 (counters by position, written by an older nanowire): \
                 this nanowire reads only self-describing NWSTATS3 pages; use the engine's own \
                 version of `nanowire stats`"
                    .into(),
            );
        }
        Some(m) => {
            return Err(format!(
                "unknown format {:?}",
                String::from_utf8_lossy(&m.to_le_bytes())
            ));
        }
        None => return Ok(None),
    }
    let h = |i: usize| head.word(i * 8).unwrap_or(0);
    let (info_len, page_bytes) = (h(1), h(2));
    let (desc_off, desc_count, desc_bytes) = (h(3), h(4), h(5));
    let (eng_off, eng_count) = (h(6), h(7));
    let (sock_off, sock_stride, sock_slots) = (h(8), h(9), h(10));
    let bad = |what: &str| Err(format!("inconsistent header: {what}"));
    if page_bytes > file_len || page_bytes > MAX_PAGE_BYTES {
        return bad("page larger than its file");
    }
    if info_len > (HEADER_BYTES - INFO_OFF) as u64 {
        return bad("info length");
    }
    if desc_count > MAX_DESCS || !(17..=4096).contains(&desc_bytes) {
        return bad("descriptors");
    }
    let end = |off: u64, n: u64, size: u64| off.checked_add(n.checked_mul(size)?);
    let within = |e: Option<u64>| e.is_some_and(|e| e <= page_bytes);
    if !within(end(desc_off, desc_count, desc_bytes))
        || !within(end(eng_off, eng_count, 8))
        || !within(end(sock_off, sock_slots, sock_stride))
        || !sock_stride.is_multiple_of(8)
    {
        return bad("a section outside the page");
    }
    drop(head);
    let page = map(page_bytes as usize).ok_or("mmap failed")?;
    let info: PageInfo = page
        .bytes(INFO_OFF, info_len as usize)
        .and_then(|b| serde_json::from_slice(b).ok())
        .ok_or("unreadable info")?;
    let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut engine = Vec::new();
    let mut socket = Vec::new();
    let mut addr_word = None;
    for i in 0..desc_count as usize {
        let b = page
            .bytes(
                desc_off as usize + i * desc_bytes as usize,
                desc_bytes as usize,
            )
            .ok_or("descriptor outside the page")?;
        let (section, kind, slot) = (u32_at(b, 0), u32_at(b, 4), u32_at(b, 8) as u64);
        let raw = &b[16..];
        let name =
            std::str::from_utf8(&raw[..raw.iter().position(|&c| c == 0).unwrap_or(raw.len())])
                .map_err(|_| "a counter name is not UTF-8")?
                .to_string();
        let kind = Kind::from_u32(kind);
        match section {
            SECTION_ENGINE if slot < eng_count => engine.push((name, kind, slot)),
            SECTION_SOCKET if slot * 8 < sock_stride => {
                if kind == Some(Kind::Address) {
                    addr_word = Some(slot);
                } else {
                    socket.push((name, slot));
                }
            }
            // A section or slot this reader does not know: skipped.
            _ => {}
        }
    }
    let kind_str = |k: Option<Kind>| k.map_or("unknown", Kind::as_str);
    let value = |off: u64| page.word(off as usize).unwrap_or(0);
    let counters = engine
        .iter()
        .map(|(n, _, s)| (n.clone(), value(eng_off + s * 8)))
        .collect();
    let kinds = engine
        .iter()
        .map(|(n, k, _)| (n.clone(), kind_str(*k)))
        .collect();
    let mut sockets = Vec::new();
    if let Some(aw) = addr_word {
        for slot in 0..sock_slots {
            let b = sock_off + slot * sock_stride;
            let v = value(b + aw * 8);
            if v == 0 {
                continue;
            }
            let ip = std::net::Ipv4Addr::from_bits((v >> 16) as u32);
            let local = std::net::SocketAddrV4::new(ip, v as u16).to_string();
            let counters = socket
                .iter()
                .map(|(n, w)| (n.clone(), value(b + w * 8)))
                .collect();
            sockets.push(SocketSnapshot { local, counters });
        }
    }
    Ok(Some(EngineSnapshot {
        page: String::new(),
        info,
        counters,
        kinds,
        sockets,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> PageInfo {
        PageInfo {
            pid: std::process::id(),
            iface: "test0".into(),
            queues: 1,
            xdp_mode: "native".into(),
            bind_mode: "copy".into(),
            ring_depth: 64,
        }
    }

    /// A page no directory lists, handed over as a sealed memfd, reads the
    /// same; a descriptor that is not a sealed memfd is refused.
    #[test]
    fn a_sealed_memfd_page_is_read_and_an_unsealed_file_refused() {
        let (f, ptr) = page_memfd().expect("memfd page");
        let page = StatsPage::init(
            StatsPage {
                ptr,
                path: None,
                memfd: Some(f.into()),
            },
            &info(),
        );
        bump(page.e(E::DropOtherHost), 3);
        let snap = read_fd(page.memfd().unwrap()).unwrap().unwrap();
        assert_eq!(snap.info, info());
        assert_eq!(snap.counters["drop_other_host"], 3);
        assert!(is_drop("drop_other_host") && is_drop("tcp_drop_malformed"));
        assert!(is_drop("xsk_tx_kernel_dropped") && is_drop("xsk_rx_ring_full"));
        assert!(!is_drop("xsk_tx_kick_retries"));
        assert!(!is_drop("rx_frames"));
        let plain = std::fs::File::open("/proc/self/stat").unwrap();
        use std::os::fd::AsFd;
        assert!(read_fd(plain.as_fd()).unwrap_err().contains("sealed"));
    }

    #[test]
    fn page_roundtrip_and_cleanup() {
        let info = info();
        let page = StatsPage::create(&info);
        bump(page.e(E::RxFrames), 5);
        peak(page.e(E::PeakRxRing), 9);
        bump(page.e(E::DropOtherHost), 7);
        page.set_sock_addr(3, Some("1.2.3.4:99".parse().unwrap()));
        bump(page.s(3, S::RxPackets), 2);
        bump(page.s(3, S::DropNeigh), 4);
        let path = page.path().unwrap().to_path_buf();
        // Not readable by the group or the world (issue 20, 13c).
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "page mode {mode:o}");
        let all = read_all();
        let me = all
            .engines
            .iter()
            .find(|s| Path::new(&s.page) == path)
            .unwrap();
        assert_eq!(me.info, info);
        assert_eq!(me.counters.len(), E::COUNT);
        assert_eq!(me.counters["rx_frames"], 5);
        assert_eq!(me.counters["peak_rx_ring"], 9);
        assert_eq!(me.counters["drop_other_host"], 7, "the last row");
        assert_eq!(me.kinds["peak_rx_ring"], "peak");
        assert_eq!(me.kinds["sockets"], "gauge");
        assert_eq!(me.kinds["rx_frames"], "counter");
        assert_eq!(me.sockets.len(), 1);
        assert_eq!(me.sockets[0].local, "1.2.3.4:99");
        assert_eq!(me.sockets[0].counters["rx_packets"], 2);
        assert_eq!(me.sockets[0].counters["drop_neigh"], 4);
        assert_eq!(me.sockets[0].counters.len(), S::COUNT);
        let named: Vec<_> = page.engine_counters().collect();
        assert_eq!(named[E::RxFrames as usize], ("rx_frames", 5));
        drop(page);
        assert!(!path.exists());
    }

    /// `TcpHandoverDrops` -> `tcp_handover_drops`.
    fn snake(camel: &str) -> String {
        let mut s = String::new();
        for (i, c) in camel.chars().enumerate() {
            if c.is_ascii_uppercase() {
                if i > 0 {
                    s.push('_');
                }
                s.push(c.to_ascii_lowercase());
            } else {
                s.push(c);
            }
        }
        s
    }

    /// The one table: every variant's name is its own (snake_case of the
    /// variant), unique, fits a descriptor, and `ALL` is in slot order.
    fn check_table<T: std::fmt::Debug + Copy>(
        all: &[T],
        index: impl Fn(T) -> usize,
        name: impl Fn(T) -> &'static str,
    ) {
        let mut seen = std::collections::HashSet::new();
        for (i, &v) in all.iter().enumerate() {
            assert_eq!(index(v), i, "{v:?} out of slot order");
            assert_eq!(
                name(v),
                snake(&format!("{v:?}")),
                "{v:?} is named {:?}",
                name(v)
            );
            assert!(seen.insert(name(v)), "two counters named {:?}", name(v));
            assert!(name(v).len() < NAME_BYTES, "{:?} too long", name(v));
        }
    }

    #[test]
    fn counter_names_match_enums() {
        check_table(E::ALL, |v| v as usize, E::name);
        check_table(S::ALL, |v| v as usize, S::name);
        // Every malformed reason has its own counter, named after it.
        use nanowire_wire::Malformed as M;
        for m in [
            M::Truncated,
            M::BadVersion,
            M::BadIhl,
            M::IpOptions,
            M::BadTotalLength,
            M::Fragment,
            M::BadIpChecksum,
            M::BadUdpLength,
            M::BadUdpChecksum,
            M::BadTcpDataOffset,
            M::BadTcpOptions,
            M::BadTcpChecksum,
        ] {
            assert_eq!(E::malformed(m).name(), format!("drop_{}", m.as_str()));
        }
    }

    /// Every `tcp_*` engine row publishes a TCP stack counter, and publishing
    /// adds what was counted since the last call.
    #[test]
    fn tcp_rows_publish_the_stack_counters() {
        let fields: Vec<&str> = nanowire_tcp::Counters::default()
            .iter()
            .map(|(n, _)| n)
            .collect();
        for e in E::ALL.iter().filter(|e| e.name().starts_with("tcp_")) {
            match e.tcp_field() {
                Some(f) => {
                    assert!(fields.contains(&f), "{e:?} <- {f}: no such TCP counter");
                    let short = e
                        .name()
                        .trim_start_matches("tcp_")
                        .trim_start_matches("drop_");
                    assert_eq!(short, f, "{e:?} publishes {f}");
                }
                // The engine's own: sockets it left to the kernel, frames
                // held, send rings on the heap (its connection table's),
                // accepts woken late.
                None => assert!(
                    matches!(
                        e,
                        E::TcpNoMultiBuffer
                            | E::TcpAcceptLate
                            | E::TcpRxHeldFrames
                            | E::TcpRxHoldLimited
                            | E::TcpSlabFallbackLargeBuffer
                            | E::TcpSlabFallbackNoFreeSlab
                            | E::TcpSlabFallbackForkedChild
                    ),
                    "{e:?} publishes nothing"
                ),
            }
        }
        let page = StatsPage::create(&info());
        let was = nanowire_tcp::Counters::default();
        let now = nanowire_tcp::Counters {
            segs_in: 3,
            bad_checksum: 2,
            handover_drops: 1,
            ..Default::default()
        };
        publish_tcp(&page, &now, &was);
        publish_tcp(&page, &now, &now);
        let v = |e: E| page.e(e).load(Ordering::Relaxed);
        assert_eq!(v(E::TcpSegsIn), 3);
        assert_eq!(v(E::TcpDropBadChecksum), 2);
        assert_eq!(v(E::TcpHandoverDrops), 1);
        assert_eq!(v(E::TcpSegsOut), 0);
    }

    /// Write `bytes` as a page file of this process in the stats directory
    /// and read it back through `read_page`.
    fn read_bytes(tag: u32, bytes: &[u8]) -> Result<Option<EngineSnapshot>, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let _keep = StatsPage::create(&info()); // makes sure the directory exists
        let d = open_dir(&dir(), false).unwrap();
        let pid = std::process::id();
        let name = format!("{pid}-{}-{}", start_time(pid).unwrap_or(0), 900_000 + tag);
        let path = dir().join(&name);
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        drop(f);
        let r = read_page(&d, &name);
        std::fs::remove_file(&path).unwrap();
        r
    }

    fn bytes_of(page: &StatsPage) -> Vec<u8> {
        // SAFETY: the test's own page, PAGE_BYTES long.
        unsafe { std::slice::from_raw_parts(page.ptr, PAGE_BYTES) }.to_vec()
    }

    /// A page from a build with more counters (a descriptor this build has
    /// no variant for, a kind it does not know, a section it does not
    /// know) reads by its own description: adding a counter is no format
    /// break.
    #[test]
    fn a_page_with_counters_this_build_does_not_know_reads_by_its_description() {
        let page = StatsPage::create(&info());
        bump(page.e(E::TxPackets), 11);
        page.set_sock_addr(0, Some("10.0.0.1:5".parse().unwrap()));
        bump(page.s(0, S::RxBytes), 5);
        let b = bytes_of(&page);
        let put = |b: &mut Vec<u8>, i: usize, section: u32, kind: u32, slot: u32, name: &str| {
            let d = &mut b[DESC_OFF + i * DESC_BYTES..][..DESC_BYTES];
            d.fill(0);
            d[0..4].copy_from_slice(&section.to_ne_bytes());
            d[4..8].copy_from_slice(&kind.to_ne_bytes());
            d[8..12].copy_from_slice(&slot.to_ne_bytes());
            d[16..16 + name.len()].copy_from_slice(name.as_bytes());
        };
        // A build with three more descriptors: everything after them moves
        // (the header says where), as adding a counter does.
        let n = DESC_COUNT;
        let extra = 3 * DESC_BYTES;
        let mut b2 = b[..DESC_OFF + n * DESC_BYTES].to_vec();
        b2.resize(b2.len() + extra, 0);
        b2.extend_from_slice(&b[ENGINE_OFF..]);
        let mut b = b2;
        let set_word = |b: &mut Vec<u8>, i: usize, v: usize| {
            b[i * 8..i * 8 + 8].copy_from_slice(&(v as u64).to_ne_bytes())
        };
        set_word(&mut b, 2, PAGE_BYTES + extra);
        set_word(&mut b, 4, n + 3);
        set_word(&mut b, 6, ENGINE_OFF + extra);
        set_word(&mut b, 8, SOCK_OFF + extra);
        // A new engine counter reading slot 3 (tx_packets' value) under a
        // new name and a kind this build does not know, a new socket
        // counter, a section this build does not know.
        put(
            &mut b,
            n,
            SECTION_ENGINE,
            9,
            E::TxPackets as u32,
            "tx_frames_future",
        );
        put(&mut b, n + 1, SECTION_SOCKET, 1, 2, "future_sock");
        put(&mut b, n + 2, 77, 1, 0, "elsewhere");
        let s = read_bytes(1, &b).unwrap().unwrap();
        assert_eq!(s.counters["tx_packets"], 11);
        assert_eq!(s.counters["tx_frames_future"], 11);
        assert_eq!(s.kinds["tx_frames_future"], "unknown");
        assert!(!s.counters.contains_key("elsewhere"));
        assert_eq!(s.sockets[0].local, "10.0.0.1:5");
        assert_eq!(s.sockets[0].counters["rx_bytes"], 5);
        assert_eq!(s.sockets[0].counters["future_sock"], 5);
        // A page whose header claims more than its file holds is refused
        // by name, never read past its end.
        let mut big = bytes_of(&page);
        big[2 * 8..3 * 8].copy_from_slice(&(PAGE_BYTES as u64 * 2).to_ne_bytes());
        let e = read_bytes(2, &big).unwrap_err();
        assert!(e.contains("inconsistent header"), "{e}");
    }

    #[test]
    fn an_older_format_is_named_not_misread() {
        let mut b = [0u8; 4096];
        b[..8].copy_from_slice(b"NWSTATS2");
        let e = read_bytes(3, &b).unwrap_err();
        assert!(e.contains("NWSTATS2"), "{e}");
        // A page still being created (no magic yet) is skipped quietly.
        assert!(read_bytes(4, &[0u8; 4096]).unwrap().is_none());
    }
}
