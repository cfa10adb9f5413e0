//! Shared-memory stats pages: each engine maps
//! `/dev/shm/nanowire/<pid>-<start>-<n>` (header + atomic u64 counters) so
//! that `nanowire stats` can read the counters of running engines without
//! talking to them. The page is removed when the engine closes; pages of
//! dead processes (SIGKILL) are ignored and cleaned up by the next engine
//! and by `stats`.
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
//! `NANOWIRE_STATS_DIR` names another directory (same checks).
//!
//! Writers are single (the engine, under its lock) and update counters with
//! relaxed load+store (no locked RMW on the hot path); readers see each
//! counter atomically.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const DIR: &str = "/dev/shm/nanowire";
const MAGIC: u64 = u64::from_le_bytes(*b"NWSTATS2");
pub const HEADER_BYTES: usize = 512;
pub const ENGINE_SLOTS: usize = 128;
pub const SOCK_SLOTS: usize = 32;
pub const MAX_SOCKETS: usize = 1024;
const PAGE_BYTES: usize = HEADER_BYTES + ENGINE_SLOTS * 8 + MAX_SOCKETS * SOCK_SLOTS * 8;
/// Permissions of a page file: the owner (and root) only.
const PAGE_MODE: u32 = 0o600;
/// Bytes of one stats page (counted in the engine's memory).
pub const PAGE_SIZE_BYTES: usize = PAGE_BYTES;

/// Engine counter names, in slot order (stable: the stats CLI prints them).
pub const ENGINE_COUNTERS: &[&str] = &[
    "rx_frames",
    "rx_packets",
    "rx_bytes",
    "tx_packets",
    "tx_bytes",
    "drop_no_socket",
    "drop_truncated",
    "drop_bad_version",
    "drop_bad_ihl",
    "drop_ip_options",
    "drop_bad_total_length",
    "drop_fragment",
    "drop_bad_ip_checksum",
    "drop_bad_udp_length",
    "drop_bad_udp_checksum",
    "drop_not_udp",
    "drop_socket_queue_full",
    "drop_tx_ring_full",
    "drop_bad_desc",
    "rx_csum_partial",
    "xsk_rx_dropped",
    "xsk_rx_ring_full",
    "xsk_rx_fill_ring_empty",
    "xsk_rx_invalid_descs",
    "xsk_tx_invalid_descs",
    "xsk_tx_ring_empty",
    "xdp_no_socket_on_queue",
    "peak_rx_ring",
    "peak_socket_queue",
    "sockets",
    "drop_martian",
    "drop_neigh_unresolved",
    "neigh_resolutions",
    "neigh_entries",
    "neigh_routes",
    "rx_multi_buffer",
    "mem_umem_bytes",
    "mem_ring_bytes",
    "mem_total_bytes",
    "drop_fault_rx",
    "fault_rx_duplicated",
    "fault_rx_reordered",
    "fault_rx_corrupted",
    "fault_tx_lost",
    "fault_tx_duplicated",
    "fault_tx_corrupted",
    "tcp_segs_in",
    "tcp_segs_out",
    "tcp_retransmits",
    "tcp_fast_retransmits",
    "tcp_rto_expirations",
    "tcp_rst_sent",
    "tcp_rst_received",
    "tcp_active_opens",
    "tcp_passive_opens",
    "tcp_connections_reset",
    "tcp_drop_malformed",
    "tcp_drop_bad_checksum",
    "tcp_drop_out_of_window",
    "tcp_drop_no_socket",
    "tcp_listen_overflows",
    "tcp_syncookies_sent",
    "tcp_syncookies_ok",
    "tcp_tail_loss_probes",
    "tcp_handovers",
    "tcp_handover_drops",
    "rx_frag_merged",
    "drop_frag_timeout",
    "drop_frag_overlap",
    "drop_frag_too_many",
    "drop_rx_chain",
    "tcp_no_multi_buffer",
    "drop_other_host",
];

/// Per-socket counter names (slot 0 is the packed local address).
pub const SOCK_COUNTERS: &[&str] = &[
    "rx_packets",
    "rx_bytes",
    "tx_packets",
    "tx_bytes",
    "drop_queue_full",
    "drop_tx_ring_full",
    "queue_depth",
    "peak_queue_depth",
    "rx_kernel_path",
    "tx_kernel_path",
    "drop_neigh",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum E {
    RxFrames,
    RxPackets,
    RxBytes,
    TxPackets,
    TxBytes,
    DropNoSocket,
    DropTruncated,
    DropBadVersion,
    DropBadIhl,
    DropIpOptions,
    DropBadTotalLength,
    DropFragment,
    DropBadIpChecksum,
    DropBadUdpLength,
    DropBadUdpChecksum,
    DropNotUdp,
    DropSocketQueueFull,
    DropTxRingFull,
    DropBadDesc,
    RxCsumPartial,
    XskRxDropped,
    XskRxRingFull,
    XskRxFillRingEmpty,
    XskRxInvalidDescs,
    XskTxInvalidDescs,
    XskTxRingEmpty,
    XdpNoSocketOnQueue,
    PeakRxRing,
    PeakSocketQueue,
    Sockets,
    DropMartian,
    DropNeighUnresolved,
    NeighResolutions,
    /// Gauges: neighbour entries (per next hop) and route entries (per
    /// off-link destination) held now (both bounded, see `neigh.rs`).
    NeighEntries,
    NeighRoutes,
    RxMultiBuffer,
    MemUmemBytes,
    MemRingBytes,
    MemTotalBytes,
    DropFaultRx,
    FaultRxDuplicated,
    FaultRxReordered,
    FaultRxCorrupted,
    FaultTxLost,
    FaultTxDuplicated,
    FaultTxCorrupted,
    TcpSegsIn,
    TcpSegsOut,
    TcpRetransmits,
    TcpFastRetransmits,
    TcpRtoExpirations,
    TcpRstSent,
    TcpRstReceived,
    TcpActiveOpens,
    TcpPassiveOpens,
    TcpConnectionsReset,
    TcpDropMalformed,
    TcpDropBadChecksum,
    TcpDropOutOfWindow,
    TcpDropNoSocket,
    TcpListenOverflows,
    TcpSyncookiesSent,
    TcpSyncookiesOk,
    TcpTailLossProbes,
    TcpHandovers,
    TcpHandoverDrops,
    /// Fragment frames merged into a reassembled datagram (issue 20, 8).
    RxFragMerged,
    DropFragTimeout,
    DropFragOverlap,
    DropFragTooMany,
    DropRxChain,
    TcpNoMultiBuffer,
    /// Unicast frames for another host's MAC (issue 20, finding 12).
    DropOtherHost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum S {
    RxPackets,
    RxBytes,
    TxPackets,
    TxBytes,
    DropQueueFull,
    DropTxRingFull,
    QueueDepth,
    PeakQueueDepth,
    RxKernelPath,
    TxKernelPath,
    DropNeigh,
}

impl E {
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

/// A mapped stats page (shared file, or anonymous when /dev/shm is unusable).
pub struct StatsPage {
    ptr: *mut u8,
    path: Option<PathBuf>,
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

/// The stats directory (`NANOWIRE_STATS_DIR`, else [`DIR`]).
pub fn dir() -> PathBuf {
    std::env::var_os("NANOWIRE_STATS_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DIR), PathBuf::from)
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
                "stats directory {} refused ({why}); this engine's counters are not listed by `nanowire stats`",
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

impl StatsPage {
    pub fn create(info: &PageInfo) -> StatsPage {
        let file = create_page_file();
        let (ptr, path) = match file
            .as_ref()
            .and_then(|(f, p)| Some((map_fd(Some(f), PAGE_BYTES, true)?, p.clone())))
        {
            Some((p, path)) => (p, Some(path)),
            None => {
                if let Some((_, p)) = &file {
                    let _ = std::fs::remove_file(p);
                }
                (
                    map_fd(None, PAGE_BYTES, true).expect("anonymous mmap of the stats page"),
                    None,
                )
            }
        };
        let page = StatsPage { ptr, path };
        let json = serde_json::to_vec(info).unwrap_or_default();
        let len = json.len().min(HEADER_BYTES - 16);
        // SAFETY: header bytes 16..16+len are inside the page; no reader
        // trusts them before the magic is stored (Release) below.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), ptr.add(16), len);
        }
        page.word(1).store(len as u64, Ordering::Relaxed);
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
        self.word(HEADER_BYTES / 8 + c as usize)
    }

    #[inline]
    fn sock_base(slot: usize) -> usize {
        (HEADER_BYTES + ENGINE_SLOTS * 8) / 8 + slot.min(MAX_SOCKETS - 1) * SOCK_SLOTS
    }

    #[inline]
    pub fn s(&self, slot: usize, c: S) -> &AtomicU64 {
        self.word(Self::sock_base(slot) + 1 + c as usize)
    }

    /// Engine counter `i` (in ENGINE_COUNTERS order).
    pub fn engine_word(&self, i: usize) -> u64 {
        if i >= ENGINE_SLOTS {
            return 0;
        }
        self.word(HEADER_BYTES / 8 + i).load(Ordering::Relaxed)
    }

    /// Socket counter `i` (in SOCK_COUNTERS order) of `slot`.
    pub fn sock_word(&self, slot: usize, i: usize) -> u64 {
        if i + 1 >= SOCK_SLOTS {
            return 0;
        }
        self.word(Self::sock_base(slot) + 1 + i)
            .load(Ordering::Relaxed)
    }

    /// Mark a socket slot in use with its local address (0 = free).
    pub fn set_sock_addr(&self, slot: usize, addr: Option<std::net::SocketAddrV4>) {
        let v = addr.map_or(0, |a| {
            (1u64 << 48) | (u64::from(a.ip().to_bits()) << 16) | u64::from(a.port())
        });
        let b = Self::sock_base(slot);
        if addr.is_some() {
            for i in 1..SOCK_SLOTS {
                self.word(b + i).store(0, Ordering::Relaxed);
            }
        }
        self.word(b).store(v, Ordering::Release);
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
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
    pub sockets: Vec<SocketSnapshot>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SocketSnapshot {
    pub local: String,
    pub counters: std::collections::BTreeMap<String, u64>,
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
pub fn read_all() -> Vec<EngineSnapshot> {
    let mut out = Vec::new();
    let base = dir();
    let Ok(d) = open_dir(&base, false) else {
        return out;
    };
    remove_dead_in(&d);
    let Ok(rd) = std::fs::read_dir(&base) else {
        return out;
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| page_owner(n).is_some())
        .collect();
    names.sort();
    for name in names {
        if !page_alive(&name) {
            continue;
        }
        if let Some(s) = read_page(&d, &base.join(&name), &name) {
            out.push(s);
        }
    }
    out
}

fn read_page(d: &SafeDir, p: &Path, name: &str) -> Option<EngineSnapshot> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = std::ffi::CString::new(name).ok()?;
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
        return None;
    }
    // SAFETY: a fresh fd owned by nobody else.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    if f.metadata().ok()?.len() < PAGE_BYTES as u64 {
        return None;
    }
    let ptr = map_fd(Some(&f), PAGE_BYTES, false)?;
    let page = StatsPage { ptr, path: None };
    let snap = (|| {
        if page.word(0).load(Ordering::Acquire) != MAGIC {
            return None;
        }
        let len = (page.word(1).load(Ordering::Relaxed) as usize).min(HEADER_BYTES - 16);
        // SAFETY: bytes 16..16+len of the mapped header, written before MAGIC.
        let hdr = unsafe { std::slice::from_raw_parts(page.ptr.add(16), len) };
        let info: PageInfo = serde_json::from_slice(hdr).ok()?;
        let counters = ENGINE_COUNTERS
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    n.to_string(),
                    page.word(HEADER_BYTES / 8 + i).load(Ordering::Relaxed),
                )
            })
            .collect();
        let mut sockets = Vec::new();
        for slot in 0..MAX_SOCKETS {
            let b = StatsPage::sock_base(slot);
            let v = page.word(b).load(Ordering::Acquire);
            if v == 0 {
                continue;
            }
            let ip = std::net::Ipv4Addr::from_bits((v >> 16) as u32);
            let local = std::net::SocketAddrV4::new(ip, v as u16).to_string();
            let counters = SOCK_COUNTERS
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), page.word(b + 1 + i).load(Ordering::Relaxed)))
                .collect();
            sockets.push(SocketSnapshot { local, counters });
        }
        Some(EngineSnapshot {
            page: p.display().to_string(),
            info,
            counters,
            sockets,
        })
    })();
    drop(page);
    snap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_roundtrip_and_cleanup() {
        let info = PageInfo {
            pid: std::process::id(),
            iface: "test0".into(),
            queues: 1,
            xdp_mode: "native".into(),
            bind_mode: "copy".into(),
            ring_depth: 64,
        };
        let page = StatsPage::create(&info);
        bump(page.e(E::RxFrames), 5);
        peak(page.e(E::PeakRxRing), 9);
        page.set_sock_addr(3, Some("1.2.3.4:99".parse().unwrap()));
        bump(page.s(3, S::RxPackets), 2);
        let path = page.path().unwrap().to_path_buf();
        // Not readable by the group or the world (issue 20, 13c).
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "page mode {mode:o}");
        let all = read_all();
        let me = all.iter().find(|s| Path::new(&s.page) == path).unwrap();
        assert_eq!(me.info, info);
        assert_eq!(me.counters["rx_frames"], 5);
        assert_eq!(me.counters["peak_rx_ring"], 9);
        assert_eq!(me.sockets.len(), 1);
        assert_eq!(me.sockets[0].local, "1.2.3.4:99");
        assert_eq!(me.sockets[0].counters["rx_packets"], 2);
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

    /// Every variant (listed here in any order) names the slot it indexes,
    /// and the variants cover the name list exactly once.
    fn check_names<T: std::fmt::Debug + Copy>(
        variants: &[T],
        index: impl Fn(T) -> usize,
        names: &[&str],
    ) {
        let mut seen = vec![false; names.len()];
        for &v in variants {
            let i = index(v);
            assert!(i < names.len(), "{v:?} indexes slot {i} past the name list");
            assert_eq!(
                names[i],
                snake(&format!("{v:?}")),
                "{v:?} indexes slot {i}, named {:?}",
                names[i]
            );
            assert!(!seen[i], "two variants index slot {i}");
            seen[i] = true;
        }
        let unnamed: Vec<&str> = names
            .iter()
            .zip(&seen)
            .filter(|(_, s)| !**s)
            .map(|(n, _)| *n)
            .collect();
        assert!(unnamed.is_empty(), "names without a variant: {unnamed:?}");
    }

    #[test]
    fn counter_names_match_enums() {
        let engine = [
            E::RxFrames,
            E::RxPackets,
            E::RxBytes,
            E::TxPackets,
            E::TxBytes,
            E::DropNoSocket,
            E::DropTruncated,
            E::DropBadVersion,
            E::DropBadIhl,
            E::DropIpOptions,
            E::DropBadTotalLength,
            E::DropFragment,
            E::DropBadIpChecksum,
            E::DropBadUdpLength,
            E::DropBadUdpChecksum,
            E::DropNotUdp,
            E::DropSocketQueueFull,
            E::DropTxRingFull,
            E::DropBadDesc,
            E::RxCsumPartial,
            E::XskRxDropped,
            E::XskRxRingFull,
            E::XskRxFillRingEmpty,
            E::XskRxInvalidDescs,
            E::XskTxInvalidDescs,
            E::XskTxRingEmpty,
            E::XdpNoSocketOnQueue,
            E::PeakRxRing,
            E::PeakSocketQueue,
            E::Sockets,
            E::DropMartian,
            E::DropNeighUnresolved,
            E::NeighResolutions,
            E::NeighEntries,
            E::NeighRoutes,
            E::RxMultiBuffer,
            E::MemUmemBytes,
            E::MemRingBytes,
            E::MemTotalBytes,
            E::DropFaultRx,
            E::FaultRxDuplicated,
            E::FaultRxReordered,
            E::FaultRxCorrupted,
            E::FaultTxLost,
            E::FaultTxDuplicated,
            E::FaultTxCorrupted,
            E::TcpSegsIn,
            E::TcpSegsOut,
            E::TcpRetransmits,
            E::TcpFastRetransmits,
            E::TcpRtoExpirations,
            E::TcpRstSent,
            E::TcpRstReceived,
            E::TcpActiveOpens,
            E::TcpPassiveOpens,
            E::TcpConnectionsReset,
            E::TcpDropMalformed,
            E::TcpDropBadChecksum,
            E::TcpDropOutOfWindow,
            E::TcpDropNoSocket,
            E::TcpListenOverflows,
            E::TcpSyncookiesSent,
            E::TcpSyncookiesOk,
            E::TcpTailLossProbes,
            E::TcpHandovers,
            E::TcpHandoverDrops,
            E::RxFragMerged,
            E::DropFragTimeout,
            E::DropFragOverlap,
            E::DropFragTooMany,
            E::DropRxChain,
            E::TcpNoMultiBuffer,
            E::DropOtherHost,
        ];
        check_names(&engine, |v| v as usize, ENGINE_COUNTERS);
        let sock = [
            S::RxPackets,
            S::RxBytes,
            S::TxPackets,
            S::TxBytes,
            S::DropQueueFull,
            S::DropTxRingFull,
            S::QueueDepth,
            S::PeakQueueDepth,
            S::RxKernelPath,
            S::TxKernelPath,
            S::DropNeigh,
        ];
        check_names(&sock, |v| v as usize, SOCK_COUNTERS);
        assert!(ENGINE_COUNTERS.len() <= ENGINE_SLOTS);
        // Slot 0 of a socket's block is its packed local address.
        assert!(SOCK_COUNTERS.len() < SOCK_SLOTS);
    }
}
