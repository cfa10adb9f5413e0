//! Issue 24, exit and kill: a process on the engine service publishes what
//! would end each of its TCP connections (4-tuple, the FIN's or RST's
//! sequence number, rcv_nxt, timestamps, window; `nanowire_tcp::EndState`)
//! in a table in shared memory (a memfd it hands the service once,
//! `K_CONN_TABLE`), so that when it dies (kill -9, or an exit that left
//! connections open: its control socket closes) the service ends them as
//! the kernel would have: FIN when nothing is lost, RST when data was
//! unread (the kernel's rule at close), a connection waited in an accept
//! queue, or written data never left. Onload/VMA's daemon model, without
//! a kernel module. docs/architecture.md, "The engine service".
//!
//! Layout: `REGIONS` headers of 16 bytes (sequence word, high-water
//! count), then per region `PER_REGION` entries of `ENTRY` bytes indexed by
//! the stack's connection slot. Each TCP stack of the process owns one
//! region and writes, under its own lock at the end of an engine turn, only
//! the entries of connections that changed (`TcpStack::take_end_changes`),
//! and among those only the bytes that differ: plain stores into a mapping,
//! no system call. The sequence word is odd while a batch is written, so a
//! region torn by a death mid-batch is known (it is still used: a stale
//! sequence number only turns a FIN or RST into one the peer answers, and
//! the kernel, which has no socket for that answer, resets the peer with the
//! exact number).
//!
//! The service reads the table with pread (never maps it: the process
//! cannot fault the service) and acts only on 4-tuples the dead process had
//! claimed through it, so a lying process can end only its own connections
//! (it could send any frame on its own AF_XDP socket anyway).

use rustix::fd::{AsFd, OwnedFd};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// TCP stacks of one process with a region (a listener's stack, the
/// clients' stack, ...); a stack beyond them is not published (counted in
/// `Region`'s absence: the engine says so once).
pub const REGIONS: usize = 64;
/// Connection slots per region: the stack's default `max_connections`.
pub const PER_REGION: usize = 16384;
pub const ENTRY: usize = 64;
const HEADER: usize = 16;
const ENTRIES_AT: usize = 4096;
// Entries are compared and stored as 8-byte words (`Region::publish`).
const _: () = assert!(ENTRY.is_multiple_of(8) && ENTRIES_AT.is_multiple_of(8));
/// The table's size (sparse: only the pages written take memory; a region
/// of a stack with 20 connections touches one page).
pub const TABLE_BYTES: usize = ARENA_AT + SLABS * SLAB_BYTES;
/// After the entries: the send rings' slabs (`nanowire_tcp::buffer::Slabs`),
/// so that the bytes a killed process wrote and the peer had not
/// acknowledged can be read by the service (sparse too: a slab's pages
/// are touched as its ring is written; slabs are reused, last freed first).
const ARENA_AT: usize = ENTRIES_AT + REGIONS * PER_REGION * ENTRY;
/// A slab: the default send buffer (SO_SNDBUF's 16 KiB doubled and grown
/// as Linux's autotuning would is held to 256 KiB by the engine).
pub const SLAB_BYTES: usize = 256 << 10;
/// Slabs per process (256 MiB of address space, sparse); a send ring
/// beyond them is on the heap (counted per table with its reason:
/// [`ConnTable::slab_misses`], the engine's `tcp_slab_fallback_*` counters)
/// and its unsent bytes are reset at a death, as before.
pub const SLABS: usize = 1024;

/// The entry is in use.
pub const F_LIVE: u8 = 1;
/// Timestamps were negotiated (the segment carries TSval/TSecr).
pub const F_TS: u8 = 2;
/// End with a RST (else a FIN; `nanowire_tcp::EndState::rst`).
pub const F_RST: u8 = 4;
/// Window scaling was negotiated (`Entry::wscale` holds the shifts).
pub const F_WS: u8 = 8;
pub const F_SACK: u8 = 16;
/// The peer's FIN was received (`rcv_nxt` counts it).
pub const F_PEER_FIN: u8 = 32;
/// Everything sent was acknowledged: the kernel can take the connection
/// over (TCP_REPAIR) with nothing to retransmit.
pub const F_ACKED: u8 = 64;
/// Our FIN was acknowledged (FIN-WAIT-2): only a kernel socket taking the
/// connection over has something to do (answer the peer's FIN); a raw
/// FIN would only draw an ACK the kernel resets.
pub const F_FIN_ACKED: u8 = 128;

/// One published connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
    /// The FIN's or RST's sequence number.
    pub seq: u32,
    pub rcv_nxt: u32,
    pub ts_offset: u32,
    pub ts_recent: u32,
    /// The receive window to advertise (already scaled).
    pub window: u16,
    pub flags: u8,
    /// The peer's MSS (before timestamp room), window scaling (the
    /// peer's shift in the low nibble, ours in the high one), the peer's
    /// window in bytes: what a kernel socket taking the connection over
    /// needs (`repair_take`).
    pub mss: u16,
    pub wscale: u8,
    pub snd_wnd: u32,
    /// SO_REUSEADDR of the kernel socket: set again on a kernel socket
    /// that takes the connection over (`reuse_again`).
    pub reuseaddr: bool,
    /// The first unacknowledged byte, the highest sent, and where the
    /// bytes from `snd_una` to `seq` lie in the table's slabs (`None`:
    /// nothing unacknowledged, or on the heap).
    pub snd_una: u32,
    pub snd_max: u32,
    pub slab: Option<nanowire_tcp::buffer::SlabAt>,
}

impl From<&nanowire_tcp::EndState> for Entry {
    fn from(e: &nanowire_tcp::EndState) -> Entry {
        Entry {
            local: e.tuple.local,
            remote: e.tuple.remote,
            seq: e.seq,
            rcv_nxt: e.rcv_nxt,
            ts_offset: e.ts.map_or(0, |t| t.0),
            ts_recent: e.ts.map_or(0, |t| t.1),
            window: e.window,
            flags: F_LIVE
                | if e.ts.is_some() { F_TS } else { 0 }
                | if e.rst { F_RST } else { 0 }
                | if e.wscale.is_some() { F_WS } else { 0 }
                | if e.sack { F_SACK } else { 0 }
                | if e.peer_fin { F_PEER_FIN } else { 0 }
                | if e.acked { F_ACKED } else { 0 }
                | if e.fin_acked { F_FIN_ACKED } else { 0 },
            mss: e.mss,
            wscale: e.wscale.map_or(0, |(snd, rcv)| (snd & 15) | (rcv << 4)),
            snd_wnd: e.snd_wnd,
            reuseaddr: e.reuseaddr,
            snd_una: e.snd_una,
            snd_max: e.snd_max,
            slab: e.slab,
        }
    }
}

impl Entry {
    pub fn rst(&self) -> bool {
        self.flags & F_RST != 0
    }

    /// A FIN the kernel can send and finish itself (`repair_take`): not a
    /// reset, and nothing of the data left unacknowledged (its bytes died
    /// with the process: the kernel could not retransmit them, and a FIN
    /// beyond them would wait at the peer for ever).
    pub fn repairable(&self) -> bool {
        self.flags & F_RST == 0 && (self.flags & F_ACKED != 0 || self.slab.is_some())
    }

    /// rcv_nxt without the peer's FIN: a kernel socket taking the
    /// connection over learns the FIN from a packet (`repair_close`).
    fn rcv_before_fin(&self) -> u32 {
        self.rcv_nxt
            .wrapping_sub(u32::from(self.flags & F_PEER_FIN != 0))
    }

    fn write(&self, b: &mut [u8; ENTRY]) {
        b[0..4].copy_from_slice(&self.local.ip().octets());
        b[4..8].copy_from_slice(&self.remote.ip().octets());
        b[8..10].copy_from_slice(&self.local.port().to_le_bytes());
        b[10..12].copy_from_slice(&self.remote.port().to_le_bytes());
        b[12..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.rcv_nxt.to_le_bytes());
        b[20..24].copy_from_slice(&self.ts_offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.ts_recent.to_le_bytes());
        b[28..30].copy_from_slice(&self.window.to_le_bytes());
        b[30] = self.flags;
        b[31] = self.wscale;
        b[32..34].copy_from_slice(&self.mss.to_le_bytes());
        b[34] = u8::from(self.reuseaddr);
        b[36..40].copy_from_slice(&self.snd_wnd.to_le_bytes());
        if let Some(a) = self.slab {
            b[40..44].copy_from_slice(&(a.slab + 1).to_le_bytes());
            b[44..48].copy_from_slice(&a.head.to_le_bytes());
            b[48..52].copy_from_slice(&a.modulus.to_le_bytes());
        }
        b[52..56].copy_from_slice(&self.snd_una.to_le_bytes());
        b[56..60].copy_from_slice(&self.snd_max.to_le_bytes());
    }

    fn read(b: &[u8]) -> Entry {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Entry {
            local: SocketAddrV4::new(Ipv4Addr::new(b[0], b[1], b[2], b[3]), u16_at(8)),
            remote: SocketAddrV4::new(Ipv4Addr::new(b[4], b[5], b[6], b[7]), u16_at(10)),
            seq: u32_at(12),
            rcv_nxt: u32_at(16),
            ts_offset: u32_at(20),
            ts_recent: u32_at(24),
            window: u16_at(28),
            flags: b[30],
            wscale: b[31],
            mss: u16_at(32),
            snd_wnd: u32_at(36),
            reuseaddr: b[34] != 0,
            snd_una: u32_at(52),
            snd_max: u32_at(56),
            slab: (u32_at(40) != 0).then(|| nanowire_tcp::buffer::SlabAt {
                slab: u32_at(40) - 1,
                head: u32_at(44),
                modulus: u32_at(48),
            }),
        }
    }
}

// ------------------------------------------------------------ the process

/// The process's table (one per engine on the service).
pub struct ConnTable {
    fd: OwnedFd,
    base: *mut u8,
    /// Regions in use (bit per region).
    used: Mutex<u64>,
    /// Free slabs (last freed on top) and the next never used.
    slabs: Mutex<(Vec<u32>, u32)>,
    /// The process that made the table: a forked child (which shares the
    /// mapping) takes no slab from it. Compared with the registry's cached
    /// pid (reset in a forked child), not a getpid per connection
    /// (`tcp_churn engine_start_and_connects_make_no_avoidable_syscalls`).
    pid: u32,
    /// Send rings that got the heap instead of a slab, by reason
    /// (index: `SlabMiss as usize`).
    missed: [std::sync::atomic::AtomicU64; 3],
}

// SAFETY: the mapping lives as long as the table; each region's entries
// and header are written only by the holder of its `Region` (one TCP stack,
// under its lock); `used` is behind a mutex.
unsafe impl Send for ConnTable {}
// SAFETY: as above.
unsafe impl Sync for ConnTable {}

impl ConnTable {
    /// A new table: a memfd of fixed (sealed) size, mapped shared.
    pub fn create() -> Result<ConnTable, String> {
        let fd = rustix::fs::memfd_create(
            "nanowire-tcp-conns",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| format!("connection table: memfd_create: {e}"))?;
        rustix::fs::ftruncate(&fd, TABLE_BYTES as u64)
            .map_err(|e| format!("connection table: ftruncate: {e}"))?;
        // The size cannot change any more (the service reads with pread
        // anyway, and checks the size it was given).
        let _ = rustix::fs::fcntl_add_seals(
            &fd,
            rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW,
        );
        // SAFETY: a fresh shared mapping of the whole memfd, which has
        // TABLE_BYTES bytes and cannot shrink (sealed); unmapped in Drop.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                TABLE_BYTES,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| format!("connection table: mmap: {e}"))?;
        Ok(ConnTable {
            fd,
            base: base.cast(),
            used: Mutex::new(0),
            slabs: Mutex::new((Vec::new(), 0)),
            pid: crate::xdp::registry::pid(),
            missed: Default::default(),
        })
    }

    pub fn fd(&self) -> rustix::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A free region, if any (`None`: this stack's connections are not
    /// published; the service then cannot end them at a death).
    pub fn region(self: &std::sync::Arc<Self>) -> Option<Region> {
        let mut u = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let i = (!*u).trailing_zeros() as usize;
        if i >= REGIONS {
            return None;
        }
        *u |= 1 << i;
        Some(Region {
            table: self.clone(),
            idx: i,
            high: 0,
        })
    }

    fn header(&self, idx: usize, word: usize) -> &AtomicU32 {
        // SAFETY: the header of region idx < REGIONS lies inside the
        // mapping (REGIONS * HEADER <= ENTRIES_AT), 4-byte aligned
        // (page-aligned base, HEADER and the word offset multiples of 4);
        // only atomics touch it.
        unsafe { &*(self.base.add(idx * HEADER + 4 * word) as *const AtomicU32) }
    }

    /// Entry `slot` of region `idx`.
    fn entry(&self, idx: usize, slot: usize) -> *mut [u8; ENTRY] {
        debug_assert!(idx < REGIONS && slot < PER_REGION);
        // SAFETY: ENTRIES_AT + (idx * PER_REGION + slot + 1) * ENTRY <=
        // TABLE_BYTES for idx < REGIONS, slot < PER_REGION (the callers
        // check both).
        unsafe {
            self.base
                .add(ENTRIES_AT + (idx * PER_REGION + slot) * ENTRY)
                .cast()
        }
    }
}

use nanowire_tcp::buffer::SlabMiss;

impl nanowire_tcp::buffer::Slabs for ConnTable {
    fn slab_bytes(&self) -> usize {
        SLAB_BYTES
    }

    fn take(&self) -> Result<(u32, std::ptr::NonNull<u8>), SlabMiss> {
        if crate::xdp::registry::pid() != self.pid {
            return Err(SlabMiss::NotOwner);
        }
        let mut s = self.slabs.lock().unwrap_or_else(|e| e.into_inner());
        let i = match s.0.pop() {
            Some(i) => i,
            None if (s.1 as usize) < SLABS => {
                s.1 += 1;
                s.1 - 1
            }
            None => return Err(SlabMiss::NoneFree),
        };
        // SAFETY: slab i < SLABS lies inside the mapping (TABLE_BYTES =
        // ARENA_AT + SLABS * SLAB_BYTES); it is given to one ring until
        // `give`.
        let p = unsafe { self.base.add(ARENA_AT + i as usize * SLAB_BYTES) };
        std::ptr::NonNull::new(p)
            .map(|p| (i, p))
            .ok_or(SlabMiss::NoneFree)
    }

    fn missed(&self, why: SlabMiss) {
        self.missed[why as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn give(&self, idx: u32) {
        self.slabs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .push(idx);
    }
}

/// The bytes of `e` from `snd_una` to `seq` (the unacknowledged and the
/// unsent), read from its slab in table `fd` (`None`: none, or a read
/// that failed: the end then is what it was without them).
pub fn unacked(fd: &OwnedFd, e: &Entry) -> Option<Vec<u8>> {
    let a = e.slab?;
    let n = e.seq.wrapping_sub(e.snd_una) as usize;
    let m = a.modulus as usize;
    if a.slab as usize >= SLABS || m > SLAB_BYTES || n > m || a.head as usize >= m.max(1) {
        return None;
    }
    let at = (ARENA_AT + a.slab as usize * SLAB_BYTES) as u64;
    let mut out = vec![0u8; n];
    let first = n.min(m - a.head as usize);
    let ok = |r: rustix::io::Result<usize>, want: usize| r.ok() == Some(want);
    if !ok(
        rustix::io::pread(fd, &mut out[..first], at + u64::from(a.head)),
        first,
    ) || !ok(rustix::io::pread(fd, &mut out[first..], at), n - first)
    {
        return None;
    }
    Some(out)
}

impl Drop for ConnTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, no reference into it left
        // (every Region holds an Arc of the table).
        unsafe {
            let _ = rustix::mm::munmap(self.base.cast(), TABLE_BYTES);
        }
    }
}

/// One TCP stack's region of the table.
pub struct Region {
    table: std::sync::Arc<ConnTable>,
    idx: usize,
    /// Entries below this may be live (the header's count).
    high: usize,
}

impl Region {
    /// The table's slabs, for the stack's send rings (`set_send_slabs`).
    pub fn slabs(&self) -> nanowire_tcp::buffer::SendSlabs {
        nanowire_tcp::buffer::SendSlabs(self.table.clone())
    }

    /// The table's send rings that got the heap instead of a slab, by
    /// reason (the whole table's: every region of the engine).
    pub fn slab_misses(&self) -> [(SlabMiss, u64); 3] {
        let m = &self.table.missed;
        std::array::from_fn(|i| {
            (
                SlabMiss::ALL[i],
                m[i].load(std::sync::atomic::Ordering::Relaxed),
            )
        })
    }

    /// Write the changed entries (`None`: the slot holds nothing to end);
    /// only bytes that differ are stored. Returns how many could not be
    /// published (a slot beyond `PER_REGION`).
    pub fn publish(&mut self, changes: impl FnOnce(&mut dyn FnMut(u32, Option<Entry>))) -> usize {
        let t = &*self.table;
        let seq = t.header(self.idx, 0);
        let mut left = 0usize;
        let mut opened = false;
        let mut high = self.high;
        changes(&mut |slot, e| {
            let slot = slot as usize;
            if slot >= PER_REGION {
                left += usize::from(e.is_some());
                return;
            }
            if e.is_none() && slot >= high {
                return;
            }
            let mut b = [0u8; ENTRY];
            if let Some(e) = e {
                e.write(&mut b);
            }
            // Compared and stored as 8-byte words (a volatile byte array
            // is read and written a byte at a time: 48 loads and stores).
            let b: [u64; ENTRY / 8] = std::array::from_fn(|i| {
                u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap())
            });
            let at = t.entry(self.idx, slot).cast::<[u64; ENTRY / 8]>();
            // SAFETY: `at` is inside the mapping (slot < PER_REGION, idx <
            // REGIONS) and 8-byte aligned (page-aligned base, ENTRIES_AT
            // and ENTRY multiples of 8); this region is written only
            // through `self`, and read by another process only after this
            // one died.
            let old = unsafe { std::ptr::read_volatile(at) };
            // Word by word, inline (an array `==` was a call to libc's
            // memcmp on each publish).
            if old.iter().zip(&b).fold(0, |d, (x, y)| d | (x ^ y)) == 0 {
                return;
            }
            if !opened {
                opened = true;
                // One writer (this region's stack, under its lock), read
                // only after its death: a load and a store, not a locked
                // read-modify-write (two of those took half of this
                // function's samples in a TCP ping-pong). The fence keeps the
                // entry's stores after the odd word.
                seq.store(
                    seq.load(Ordering::Relaxed).wrapping_add(1),
                    Ordering::Relaxed,
                );
                std::sync::atomic::fence(Ordering::Release);
            }
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(at, b) };
            high = high.max(slot + 1);
        });
        if high != self.high {
            self.high = high;
            t.header(self.idx, 1).store(high as u32, Ordering::Release);
        }
        if opened {
            seq.store(
                seq.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Release,
            );
        }
        left
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let high = self.high;
        self.publish(|f: &mut dyn FnMut(u32, Option<Entry>)| {
            for s in 0..high {
                f(s as u32, None);
            }
        });
        let mut u = self.table.used.lock().unwrap_or_else(|e| e.into_inner());
        *u &= !(1u64 << self.idx);
    }
}

// ------------------------------------------------------------ the service

/// Every live entry of a dead process's table (read with pread; a short or
/// failed read gives what was read).
pub fn read_all(fd: &OwnedFd) -> Vec<Entry> {
    let mut hdr = vec![0u8; REGIONS * HEADER];
    if rustix::io::pread(fd, &mut hdr, 0).ok() != Some(hdr.len()) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for r in 0..REGIONS {
        let h = &hdr[r * HEADER..r * HEADER + 8];
        let n = (u32::from_ne_bytes([h[4], h[5], h[6], h[7]]) as usize).min(PER_REGION);
        if n == 0 {
            continue;
        }
        let mut b = vec![0u8; n * ENTRY];
        let off = (ENTRIES_AT + r * PER_REGION * ENTRY) as u64;
        let got = rustix::io::pread(fd, &mut b, off).unwrap_or(0);
        out.extend(
            b[..got - got % ENTRY]
                .chunks_exact(ENTRY)
                .map(Entry::read)
                .filter(|e| e.flags & F_LIVE != 0),
        );
    }
    out
}

/// Send the segment that ends `e` through `raw` (an IPPROTO_RAW socket:
/// the kernel routes it and resolves the next hop).
pub fn send_end(raw: rustix::fd::BorrowedFd<'_>, e: &Entry, now_ms: u32) -> rustix::io::Result<()> {
    let seg = segment(e, now_ms);
    let dst = SocketAddrV4::new(*e.remote.ip(), 0);
    rustix::net::sendto(raw, &seg, rustix::net::SendFlags::empty(), &dst).map(|_| ())
}

/// How a dead process's connection was ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Handed to the kernel (TCP_REPAIR), which sends the FIN and
    /// finishes the connection: retransmissions, FIN-WAIT-2, TIME-WAIT.
    Repaired,
    /// One FIN through the raw socket (no repair possible).
    Fin,
    Rst,
    /// Nothing could be sent.
    Failed,
    /// Nothing sent: FIN-WAIT-2 (our FIN acknowledged), and the kernel
    /// could not take it over.
    Left,
}

/// Ends a dead process's connections (the service's, the warden's): the
/// kernel takes over each one whose end is a FIN (`repair_take`), as it
/// finishes a closed socket of its own; the others get their one segment
/// through the raw socket (`send_end`). Without CAP_NET_ADMIN every FIN
/// is the one segment, and `note` says so (once). In two steps
/// (`hold`, then `finish`), so that the caller can give the connection's
/// segments to the kernel in between: then the kernel has a socket for
/// the 4-tuple before any segment of the peer reaches it.
pub struct Ender {
    raw: OwnedFd,
    repair: bool,
    /// Why connections are not handed to the kernel, for the caller to
    /// say once (taken).
    pub note: Option<String>,
}

/// A dead process's connection between `Ender::hold` and `Ender::finish`.
pub enum Ending {
    /// A kernel socket holds it: repaired, out of repair mode, not closed.
    Held(OwnedFd, Entry),
    /// Its one raw segment (or nothing: `Ended::Left`) is still to come.
    Raw(Entry),
}

impl Ending {
    pub fn entry(&self) -> &Entry {
        match self {
            Ending::Held(_, e) | Ending::Raw(e) => e,
        }
    }
}

impl Ender {
    /// With a raw IPv4 socket (CAP_NET_RAW).
    pub fn open() -> rustix::io::Result<Ender> {
        let raw = rustix::net::socket_with(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::RAW,
            rustix::net::SocketFlags::CLOEXEC,
            Some(rustix::net::ipproto::RAW),
        )?;
        Ok(Ender {
            raw,
            repair: std::env::var_os("NANOWIRE_TCP_ORPHANS").is_none_or(|v| v != "0"),
            note: None,
        })
    }

    /// The raw socket (for `time_wait_take`), unless connections are not
    /// handed to the kernel (`NANOWIRE_TCP_ORPHANS=0`).
    pub fn raw_for_repair(&self) -> Option<rustix::fd::BorrowedFd<'_>> {
        self.repair.then(|| self.raw.as_fd())
    }

    /// End `e` at once (`now_ms`: CLOCK_MONOTONIC in ms, the process's
    /// clock without the connection's offset): `hold`, then `finish`.
    pub fn end(&mut self, e: &Entry, data: Option<Vec<u8>>, now_ms: u32) -> Ended {
        let h = self.hold(*e, data, now_ms);
        self.finish(h, now_ms)
    }

    /// The first step: a FIN end the kernel can take (`Entry::repairable`)
    /// gets its kernel socket (`repair_take`) with `data`, the bytes from
    /// `snd_una` (`unacked`), in its send queue; nothing is sent yet but
    /// the kernel's window probe (and data never sent before). Without
    /// the bytes (not readable, or no repair), the end is as if they were
    /// on the heap: a RST when some were never sent, else one FIN.
    pub fn hold(&mut self, mut e: Entry, data: Option<Vec<u8>>, now_ms: u32) -> Ending {
        let data = data.filter(|_| self.repair && e.slab.is_some());
        if data.is_none() && e.slab.take().is_some() && e.snd_max != e.seq {
            e.flags |= F_RST;
            e.seq = e.snd_max;
        }
        if self.repair && e.repairable() {
            match repair_take(&e, data.as_deref().unwrap_or_default(), now_ms) {
                Ok(s) => return Ending::Held(s, e),
                Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
                    self.repair = false;
                    self.note = Some(format!(
                        "a dead process's TCP connections get one FIN each, not handed to the kernel (no retransmission, no TIME-WAIT): {err}"
                    ));
                }
                // This one only (its 4-tuple in use, ...): the one FIN,
                // said.
                Err(err) => {
                    self.note = Some(format!(
                        "{} -> {}: not handed to the kernel (one FIN instead): {err}",
                        e.local, e.remote
                    ));
                }
            }
        }
        Ending::Raw(e)
    }

    /// The second step, once the peer's segments reach the kernel: a held
    /// connection is closed (`repair_close`: the kernel sends the FIN), the
    /// others get their segment.
    pub fn finish(&mut self, h: Ending, now_ms: u32) -> Ended {
        let e = match h {
            Ending::Held(s, e) => {
                repair_close(self.raw.as_fd(), s, &e);
                return Ended::Repaired;
            }
            Ending::Raw(e) => e,
        };
        if e.flags & F_FIN_ACKED != 0 && !e.rst() {
            return Ended::Left;
        }
        match send_end(self.raw.as_fd(), &e, now_ms) {
            Ok(()) if e.rst() => Ended::Rst,
            Ok(()) => Ended::Fin,
            Err(_) => Ended::Failed,
        }
    }
}

/// A kernel socket holding connection `e`: in repair mode (CAP_NET_ADMIN)
/// at the entry's sequence numbers, options, windows and timestamp clock,
/// bound and connected to its 4-tuple (no SYN in repair mode), out of
/// repair mode (the kernel sends a window probe, which the peer answers).
/// From here the kernel has a connection for the 4-tuple: the caller gives
/// it the peer's segments, then `repair_close`. On an error the socket is
/// closed in repair mode (nothing sent).
///
/// `data` (the bytes from `snd_una` to `seq`, when `e.slab` says where
/// they were) goes into the send queue: the part the process had sent as
/// sent (the kernel retransmits it on its RTO), the rest sent normally
/// after repair mode, as the fork hand-over fills it; the close then puts
/// the FIN after them, as the kernel's close of a socket with a send queue.
pub fn repair_take(e: &Entry, data: &[u8], now_ms: u32) -> std::io::Result<OwnedFd> {
    use crate::repair::{self, libc_setsockopt as f};
    use rustix::fd::AsRawFd;
    let with_data = e.slab.is_some() && !data.is_empty();
    let snd = if with_data { e.snd_una } else { e.seq };
    let s = repaired(e, e.rcv_before_fin(), snd, now_ms)?;
    let fd = s.as_raw_fd();
    let sent = (e.snd_max.wrapping_sub(e.snd_una) as usize).min(data.len());
    if with_data {
        // Room for all of it at once (MSG_DONTWAIT below never waits).
        repair::setopt(
            f,
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            &((2 * data.len() + (64 << 10)).min(i32::MAX as usize) as i32),
            "SO_SNDBUFFORCE",
        )?;
        send_all(&s, &data[..sent])?;
    }
    repair::mode(f, fd, false)?;
    repair::reuse_again(f, fd, e.reuseaddr)?;
    if with_data {
        send_all(&s, &data[sent..])?;
    }
    Ok(s)
}

/// All of `data` into `s`'s send queue, without waiting.
fn send_all(s: &OwnedFd, data: &[u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        let n = rustix::net::send(s, &data[off..], rustix::net::SendFlags::DONTWAIT)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        off += n;
    }
    Ok(())
}

/// A kernel socket at `e`'s numbers with the receive queue at `rcv`, still
/// in repair mode with the send queue selected (closed in repair mode on
/// an error: nothing sent).
fn repaired(e: &Entry, rcv: u32, snd: u32, now_ms: u32) -> std::io::Result<OwnedFd> {
    use crate::repair::{self, libc_setsockopt as f};
    use rustix::fd::AsRawFd;
    let s = rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    let fd = s.as_raw_fd();
    repair::mode(f, fd, true)?;
    repair::queue_seqs(f, fd, rcv, snd)?;
    rustix::net::bind(&s, &e.local)?;
    rustix::net::connect(&s, &e.remote)?;
    let ws = e.flags & F_WS != 0;
    let ts = e.flags & F_TS != 0;
    repair::options(
        f,
        fd,
        u32::from(e.mss),
        ws.then_some((e.wscale & 15, e.wscale >> 4)),
        e.flags & F_SACK != 0,
        ts,
    )?;
    let rcv_wnd = u32::from(e.window) << if ws { e.wscale >> 4 } else { 0 };
    let w = repair::Window {
        snd_wl1: rcv,
        snd_wnd: e.snd_wnd,
        max_window: e.snd_wnd,
        rcv_wnd,
        rcv_wup: rcv,
    };
    repair::window(f, fd, &w)?;
    if ts {
        repair::timestamp(f, fd, now_ms.wrapping_add(e.ts_offset))?;
    }
    Ok(s)
}

/// Hand connection `e`, in TIME-WAIT in an exiting process's engine
/// (`TcpStack::time_wait_ends`: `e.seq` is our FIN's, `e.rcv_nxt` counts
/// the peer's), to the kernel for the `left_s` seconds its wait has left,
/// without a segment on the wire: a kernel socket in repair mode at those
/// numbers, `shutdown` (with the send queue selected the kernel counts the
/// FIN as sent without sending it: FIN-WAIT-1), repair mode off without
/// the window probe, the peer's ACK of our FIN shown through `raw` (a
/// packet from the peer to our own address: FIN-WAIT-2), then closed: the
/// kernel keeps a closed FIN-WAIT-2 socket as a time-wait socket (its
/// FIN-WAIT-2 substate, `TCP_LINGER2` long), which answers a retransmitted
/// FIN (or any old segment) with an ACK, as the kernel's TIME-WAIT does,
/// and keeps the 4-tuple. Without it the kernel resets such a segment once
/// the process is gone (its engine's TIME-WAIT went with it). On an error
/// the socket is closed in repair mode (nothing sent).
pub fn time_wait_take(
    raw: rustix::fd::BorrowedFd<'_>,
    e: &Entry,
    now_ms: u32,
    left_s: u32,
) -> std::io::Result<()> {
    use crate::repair::{self, libc_setsockopt as f};
    use rustix::fd::AsRawFd;
    let s = repaired(e, e.rcv_nxt, e.seq, now_ms)?;
    let fd = s.as_raw_fd();
    rustix::net::shutdown(&s, rustix::net::Shutdown::Write)?;
    // The kernel's bound is tcp_fin_timeout (60 s, its TIME-WAIT) and at
    // least 3.5 RTOs; 0 would mean that default.
    repair::setopt(
        f,
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_LINGER2,
        &(left_s.clamp(1, 60) as i32),
        "TCP_LINGER2",
    )?;
    repair::off_without_probe(f, fd)?;
    // Before the close that makes the time-wait socket (it copies the flag).
    repair::reuse_again(f, fd, e.reuseaddr)?;
    let tuple = nanowire_tcp::FourTuple {
        local: e.local,
        remote: e.remote,
    };
    let ts = (e.flags & F_TS != 0).then_some(e.ts_recent);
    let ack = nanowire_tcp::peer_packet(&tuple, e.rcv_nxt, e.seq.wrapping_add(1), ts, false);
    let dst = SocketAddrV4::new(*e.local.ip(), 0);
    let shown = rustix::net::sendto(raw, &ack, rustix::net::SendFlags::empty(), &dst)
        .map_err(std::io::Error::from)
        .and_then(|_| fin_wait_2(fd));
    if shown.is_err() {
        // Not FIN-WAIT-2: closed now it would retransmit our FIN. Back in
        // repair mode, the close sends nothing.
        let _ = repair::mode(f, fd, true);
    }
    shown
}

/// Wait (up to 100 ms; the packet through the raw socket is usually taken
/// in before its sendto returns) until `fd` is in FIN-WAIT-2.
fn fin_wait_2(fd: libc::c_int) -> std::io::Result<()> {
    const TCP_FIN_WAIT2: u8 = 5;
    for _ in 0..100 {
        let mut info = [0u8; 8];
        let mut len = info.len() as libc::socklen_t;
        // SAFETY: `info` has `len` writable bytes; the kernel writes at
        // most that many (struct tcp_info's first byte is the state).
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if info[0] == TCP_FIN_WAIT2 {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the peer's ACK was not taken in",
    ))
}

/// Close a connection `repair_take` made: shown the peer's FIN if it had
/// come (through `raw`, as a packet from the peer: TCP_REPAIR cannot set
/// CLOSE-WAIT), and closed: the kernel sends the FIN, retransmits it, and
/// keeps the orphan through FIN-WAIT-2 or LAST-ACK and TIME-WAIT,
/// answering the peer's late segments.
pub fn repair_close(raw: rustix::fd::BorrowedFd<'_>, s: OwnedFd, e: &Entry) {
    if e.flags & F_PEER_FIN != 0 {
        let tuple = nanowire_tcp::FourTuple {
            local: e.local,
            remote: e.remote,
        };
        let ts = (e.flags & F_TS != 0).then_some(e.ts_recent);
        // It acknowledges what the peer had acknowledged (the bytes from
        // snd_una are in the kernel's send queue).
        let acked = if e.slab.is_some() { e.snd_una } else { e.seq };
        let fin = nanowire_tcp::peer_fin_packet(&tuple, e.rcv_before_fin(), acked, ts);
        // Delivered locally (to our own address), never on the wire;
        // processed before the close below (looked for: the socket reads
        // the end of the stream), so the kernel goes CLOSE-WAIT, LAST-ACK.
        let dst = SocketAddrV4::new(*e.local.ip(), 0);
        if rustix::net::sendto(raw, &fin, rustix::net::SendFlags::empty(), &dst).is_ok() {
            let mut p = [rustix::event::PollFd::new(
                &s,
                rustix::event::PollFlags::RDHUP,
            )];
            let t = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            let _ = rustix::event::poll(&mut p, Some(&t));
        }
    }
    // The kernel's close of an ESTABLISHED or CLOSE-WAIT socket: the FIN.
    drop(s);
}

/// The segment that ends `e` (IPv4 header + TCP), for a raw IPPROTO_RAW
/// socket (the kernel fills the IP checksum and routes it): FIN|ACK, with
/// the timestamps when negotiated (the peer's PAWS check passes: the
/// process's clock is CLOCK_MONOTONIC in ms plus the connection's offset,
/// `now_ms` here), or RST|ACK without options (as Linux's resets; PAWS does
/// not apply to a RST).
pub fn segment(e: &Entry, now_ms: u32) -> Vec<u8> {
    let rst = e.rst();
    let ts = e.flags & F_TS != 0 && !rst;
    let tcp_len = if ts { 32 } else { 20 };
    let mut p = vec![0u8; 20 + tcp_len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = nanowire_tcp::DEFAULT_TTL;
    p[9] = 6;
    p[12..16].copy_from_slice(&e.local.ip().octets());
    p[16..20].copy_from_slice(&e.remote.ip().octets());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&e.local.port().to_be_bytes());
    t[2..4].copy_from_slice(&e.remote.port().to_be_bytes());
    t[4..8].copy_from_slice(&e.seq.to_be_bytes());
    t[8..12].copy_from_slice(&e.rcv_nxt.to_be_bytes());
    t[12] = ((tcp_len / 4) as u8) << 4;
    t[13] = if rst { 0x14 } else { 0x11 }; // RST|ACK or FIN|ACK
    let win = if rst { 0 } else { e.window };
    t[14..16].copy_from_slice(&win.to_be_bytes());
    if ts {
        t[20] = 1;
        t[21] = 1;
        t[22] = 8;
        t[23] = 10;
        t[24..28].copy_from_slice(&now_ms.wrapping_add(e.ts_offset).to_be_bytes());
        t[28..32].copy_from_slice(&e.ts_recent.to_be_bytes());
    }
    nanowire_wire::tcp::fill_checksum(t, *e.local.ip(), *e.remote.ip());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(flags: u8) -> Entry {
        Entry {
            local: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 5001),
            remote: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 40000),
            seq: 1000,
            rcv_nxt: 2000,
            ts_offset: 7,
            ts_recent: 99,
            window: 512,
            flags: F_LIVE | flags,
            mss: 1460,
            wscale: 7 | (9 << 4),
            snd_wnd: 65536,
            reuseaddr: true,
            snd_una: 900,
            snd_max: 950,
            slab: None,
        }
    }

    #[test]
    fn a_send_ring_in_a_slab_is_read_back_from_the_table_in_stream_order() {
        use nanowire_tcp::buffer::{Ring, SendSlabs};
        let t = std::sync::Arc::new(ConnTable::create().unwrap());
        let mut region = t.region().unwrap();
        let mut r = Ring::new(8192);
        r.use_slabs(Some(region.slabs()));
        // Written, part consumed (acknowledged), written again past the
        // storage's end: the content wraps.
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(r.push(&data[..6000]), 6000);
        r.consume(5000);
        assert_eq!(r.push(&data[6000..]), 2192);
        let at = r.slab_at().expect("storage in a slab");
        assert_eq!((at.slab, at.head, at.modulus), (0, 5000, 8192));
        let mut e = entry(F_TS);
        e.snd_una = 5000;
        e.snd_max = 6000;
        e.seq = 5000 + r.len() as u32;
        e.slab = Some(at);
        assert_eq!(publish(&mut region, &[(0, Some(e))]), 0);
        let back = read_all(&t.fd);
        assert_eq!(back, vec![e]);
        assert!(back[0].repairable(), "a FIN after the bytes");
        assert_eq!(unacked(&t.fd, &back[0]).unwrap(), &data[5000..]);
        // Given back when the ring goes, and taken again (last freed first);
        // a second ring takes the next slab.
        drop(r);
        let mut a = Ring::new(4096);
        a.use_slabs(Some(SendSlabs(t.clone())));
        a.push(b"x");
        let mut b = Ring::new(4096);
        b.use_slabs(Some(region.slabs()));
        b.push(b"y");
        assert_eq!(a.slab_at().map(|s| s.slab), Some(0));
        assert_eq!(b.slab_at().map(|s| s.slab), Some(1));
        // Larger than a slab: the heap, counted once with its reason
        // (the ring grows on the heap several times).
        let mut big = Ring::new(2 * SLAB_BYTES);
        big.use_slabs(Some(region.slabs()));
        big.push(&[0u8; 1]);
        big.push(&vec![0u8; SLAB_BYTES + 10]);
        assert!(big.slab_at().is_none());
        let misses = |r: &Region| r.slab_misses().map(|(_, n)| n);
        assert_eq!(misses(&region), [1, 0, 0]);
        // Every slab in use: the next ring is on the heap, "none free".
        let held: Vec<Ring> = (2..SLABS)
            .map(|_| {
                let mut r = Ring::new(4096);
                r.use_slabs(Some(region.slabs()));
                r.push(b"z");
                r
            })
            .collect();
        assert!(held.iter().all(|r| r.slab_at().is_some()));
        let mut late = Ring::new(4096);
        late.use_slabs(Some(region.slabs()));
        late.push(b"w");
        assert!(late.slab_at().is_none());
        assert_eq!(misses(&region), [1, 1, 0]);
    }

    fn publish(r: &mut Region, changes: &[(u32, Option<Entry>)]) -> usize {
        r.publish(|f| {
            for (s, e) in changes {
                f(*s, *e);
            }
        })
    }

    #[test]
    fn published_entries_read_back_by_slot_and_a_dropped_region_is_empty() {
        let t = std::sync::Arc::new(ConnTable::create().unwrap());
        let mut a = t.region().unwrap();
        let mut b = t.region().unwrap();
        let (e1, e2) = (entry(0), entry(F_TS | F_RST));
        assert_eq!(publish(&mut a, &[(3, Some(e1))]), 0);
        assert_eq!(publish(&mut b, &[(0, Some(e2)), (1, Some(e1))]), 0);
        assert_eq!(read_all(&t.fd), vec![e1, e2, e1]);
        // A slot emptied; an unchanged entry rewritten (no change).
        assert_eq!(publish(&mut b, &[(0, None), (1, Some(e1))]), 0);
        assert_eq!(read_all(&t.fd), vec![e1, e1]);
        // Sequence words even (no batch open), bumped only by real changes.
        let seq = |r: usize| t.header(r, 0).load(Ordering::Acquire);
        let before = seq(b.idx);
        assert_eq!(publish(&mut b, &[(1, Some(e1))]), 0);
        assert_eq!(seq(b.idx), before);
        assert_eq!(before % 2, 0);
        drop(b);
        assert_eq!(read_all(&t.fd), vec![e1]);
        // Beyond the region: counted, not written.
        assert_eq!(publish(&mut a, &[(PER_REGION as u32, Some(e1))]), 1);
        assert_eq!(read_all(&t.fd), vec![e1]);
        drop(a);
        assert!(read_all(&t.fd).is_empty());
    }

    #[test]
    fn segments_carry_fin_or_rst_and_a_valid_checksum() {
        for (flags, bits, len) in [(F_TS, 0x11, 52), (0, 0x11, 40), (F_TS | F_RST, 0x14, 40)] {
            let p = segment(&entry(flags), 5);
            assert_eq!(p.len(), len);
            assert_eq!(p[33], bits);
            assert_eq!(&p[24..28], &1000u32.to_be_bytes());
            assert_eq!(&p[28..32], &2000u32.to_be_bytes());
            // The checksum over the pseudo-header and segment folds to 0.
            let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
            let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
            let pseudo = nanowire_wire::checksum::pseudo_header(src, dst, 6, (len - 20) as u16);
            let sum = nanowire_wire::checksum::accumulate(pseudo, &p[20..]);
            assert_eq!(nanowire_wire::checksum::fold(sum), 0xffff);
        }
        // TSval: the process's clock plus the connection's offset.
        let p = segment(&entry(F_TS), 5);
        assert_eq!(&p[44..48], &12u32.to_be_bytes());
        assert_eq!(&p[48..52], &99u32.to_be_bytes());
    }
}
