//! Shared-memory stats pages: each engine maps
//! `/dev/shm/nanowire/<pid>-<n>` (header + atomic u64 counters) so that
//! `nanowire stats` can read the counters of running engines without
//! talking to them. The page is removed when the engine closes; pages of
//! dead processes (SIGKILL) are ignored and cleaned up by `stats`.
//!
//! Writers are single (the engine, under its lock) and update counters with
//! relaxed load+store (no locked RMW on the hot path); readers see each
//! counter atomically.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const DIR: &str = "/dev/shm/nanowire";
const MAGIC: u64 = u64::from_le_bytes(*b"NWSTATS1");
pub const HEADER_BYTES: usize = 512;
pub const ENGINE_SLOTS: usize = 64;
pub const SOCK_SLOTS: usize = 32;
pub const MAX_SOCKETS: usize = 1024;
const PAGE_BYTES: usize = HEADER_BYTES + ENGINE_SLOTS * 8 + MAX_SOCKETS * SOCK_SLOTS * 8;
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
    "rx_multi_buffer",
    "mem_umem_bytes",
    "mem_ring_bytes",
    "mem_total_bytes",
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
    RxMultiBuffer,
    MemUmemBytes,
    MemRingBytes,
    MemTotalBytes,
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

impl StatsPage {
    pub fn create(info: &PageInfo) -> StatsPage {
        remove_dead_pages();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = PathBuf::from(DIR).join(format!("{}-{n}", info.pid));
        let file = std::fs::create_dir_all(DIR).ok().and_then(|_| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .ok()?;
            f.set_len(PAGE_BYTES as u64).ok()?;
            Some(f)
        });
        let (ptr, path) = match file
            .as_ref()
            .and_then(|f| map_fd(Some(f), PAGE_BYTES, true))
        {
            Some(p) => (p, Some(path)),
            None => {
                let _ = std::fs::remove_file(&path);
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
    let Ok(dir) = std::fs::read_dir(DIR) else {
        return;
    };
    for e in dir.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.split('-').next().and_then(|s| s.parse::<u32>().ok())
            && !pid_alive(pid)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Read every live engine's page; remove pages of dead processes.
pub fn read_all() -> Vec<EngineSnapshot> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(DIR) else {
        return out;
    };
    let mut paths: Vec<_> = dir.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(pid) = name.split('-').next().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if !pid_alive(pid) {
            let _ = std::fs::remove_file(&p);
            continue;
        }
        if let Some(s) = read_page(&p) {
            out.push(s);
        }
    }
    out
}

fn read_page(p: &Path) -> Option<EngineSnapshot> {
    let f = std::fs::File::open(p).ok()?;
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

    #[test]
    fn counter_names_match_enums() {
        assert_eq!(ENGINE_COUNTERS.len(), E::MemTotalBytes as usize + 1);
        assert_eq!(SOCK_COUNTERS.len(), S::DropNeigh as usize + 1);
        assert!(ENGINE_COUNTERS.len() <= ENGINE_SLOTS);
        assert!(SOCK_COUNTERS.len() < SOCK_SLOTS);
    }
}
