//! nanowire-tap: what an xdp engine receives and sends, copied for
//! `nanowire capture` through lossy single-producer/single-consumer rings in
//! shared memory.
//!
//! Each engine creates one tap file, `/dev/shm/nanowire-tap/<pid>-<n>.tap`,
//! when it opens: a header page and two rings (received, sent). The file is
//! sparse: until a capture attaches, only the header page uses memory.
//!
//! * The engine holds one [`TapWriter`] per direction, each driven under the
//!   lock of its path (RX lock, TX lock), so each ring has one producer.
//!   With no capture attached [`TapWriter::record`] is one relaxed load and
//!   one predictable branch. Attached, it stamps the frame (`CLOCK_REALTIME`,
//!   the clock of the kernel's packet-tap stamps) and copies it into the
//!   ring, or, when the ring is full, counts a dropped copy and goes on: a
//!   capture that cannot keep up never slows or drops the engine's traffic.
//! * `nanowire capture` finds the taps with [`list`], attaches one
//!   [`TapReader`] per tap (at most one reader per tap: the header's
//!   `attached` word holds its pid) and drains both rings.
//!
//! Safety of the files: as root, the directory is created 0755 and used
//! only if it is a real directory (not a symlink) owned by us and writable
//! by nobody else; tap files are created `O_CREAT|O_EXCL|O_NOFOLLOW` with
//! mode 0600; readers open them `O_NOFOLLOW` and check type and owner.
//! When the directory cannot be used the engine gets an anonymous mapping
//! that no capture can attach to (the tap is then simply unavailable).
//!
//! The producer never trusts what a reader wrote: every index it computes
//! is reduced modulo the ring size, and a reader that moved its position
//! inconsistently only makes the producer drop (counted). The reader
//! bound-checks every record header the same way.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Directory of the tap files.
pub const DIR: &str = "/dev/shm/nanowire-tap";
const MAGIC: u64 = u64::from_le_bytes(*b"NWTAP001");
const HDR: usize = 4096;
/// Bytes of each ring (one received, one sent). Power of two.
pub const RING_BYTES: usize = 4 << 20;
const FILE_BYTES: usize = HDR + 2 * RING_BYTES;
/// Largest frame copied whole; longer ones are truncated (orig_len kept).
pub const MAX_COPY: usize = 65536 + 64;
const REC_HDR: usize = 16;
const PAD: u32 = u32::MAX;

// Header layout (byte offsets).
const O_MAGIC: usize = 0;
const O_PID: usize = 8;
const O_NETNS: usize = 16;
const O_IFNAME_LEN: usize = 24;
const O_IFNAME: usize = 32; // 32 bytes
const O_ATTACHED: usize = 128;
/// Ring control block of ring `r`: head (+0), tail (+64, its own cache
/// line), copies dropped (+128), copies made (+136).
const fn o_ring(r: usize) -> usize {
    256 + r * 256
}

/// Which way a frame went, seen from the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Rx = 0,
    Tx = 1,
}

impl Dir {
    pub fn as_str(self) -> &'static str {
        match self {
            Dir::Rx => "in",
            Dir::Tx => "out",
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Nanoseconds since the Unix epoch (`CLOCK_REALTIME`).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The calling thread's network namespace (inode of its ns file).
pub fn netns_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// A mapping of one tap file (or anonymous memory when no file could be made).
struct Map {
    ptr: *mut u8,
    /// The file and the process that created it: removed on drop, but only
    /// by that process (a forked child dropping its inherited copy of an
    /// engine must not remove the parent's tap).
    owned_path: Option<(PathBuf, u32)>,
}

// SAFETY: the mapping is shared memory accessed only through atomics (the
// header and ring control words) and through the SPSC protocol (ring data:
// a byte range is written by the producer only while the consumer does not
// read it, and the publishing head/tail stores are Release/Acquire).
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

impl Map {
    fn mmap(fd: Option<&OwnedFd>) -> io::Result<Map> {
        let (flags, raw) = match fd {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping of FILE_BYTES of a file at least that long
        // (checked by the callers) or of anonymous memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Map {
            ptr: p.cast(),
            owned_path: None,
        })
    }

    #[inline]
    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= HDR);
        // SAFETY: `off` is one of the 8-aligned header offsets above, inside
        // the mapping, which lives as long as `self`.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    #[inline]
    fn ring(&self, r: usize) -> *mut u8 {
        // SAFETY: ring r lies at HDR + r * RING_BYTES inside the mapping.
        unsafe { self.ptr.add(HDR + r * RING_BYTES) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        if let Some((p, pid)) = &self.owned_path
            && *pid == std::process::id()
        {
            let _ = std::fs::remove_file(p);
        }
        // SAFETY: ptr maps FILE_BYTES, unmapped once here.
        unsafe { libc::munmap(self.ptr.cast(), FILE_BYTES) };
    }
}

fn cstr(p: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn lstat(p: &Path) -> io::Result<libc::stat> {
    let c = cstr(p)?;
    // SAFETY: zeroed stat is valid; lstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, st writable.
    cvt(unsafe { libc::lstat(c.as_ptr(), &mut st) })?;
    Ok(st)
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Check `dir` is a real directory owned by `uid` (or root) that nobody else
/// may write.
fn check_dir(dir: &Path, owners: &[u32]) -> io::Result<u32> {
    let st = lstat(dir)?;
    let bad = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} {why}; refusing to use it", dir.display()),
        ))
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return bad("is not a directory (a symlink?)");
    }
    if !owners.contains(&st.st_uid) {
        return bad(&format!("is owned by uid {}", st.st_uid));
    }
    if st.st_mode & 0o022 != 0 {
        return bad("is writable by group or others");
    }
    Ok(st.st_uid)
}

static NEXT: AtomicU32 = AtomicU32::new(0);

fn create_file(pid: u32) -> io::Result<(OwnedFd, PathBuf)> {
    let dir = Path::new(DIR);
    match std::fs::create_dir(dir) {
        Ok(()) => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_dir(dir, &[euid()])?;
    remove_dead();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{pid}-{n}.tap"));
    let c = cstr(&path)?;
    let open = || {
        // SAFETY: c is NUL-terminated; the flags refuse symlinks and any
        // existing file.
        cvt(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        })
    };
    let raw = match open() {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            // A file of an earlier process with our pid (killed hard): the
            // directory is ours alone, so it is safe to replace.
            std::fs::remove_file(&path)?;
            open()?
        }
        Err(e) => return Err(e),
    };
    // SAFETY: raw is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on our own descriptor.
    if let Err(e) = cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), FILE_BYTES as libc::off_t) }) {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok((fd, path))
}

/// Create an engine's tap (see the crate docs) and return its two writers
/// (received, sent) and the tap file's path (`None`: no file could be made,
/// with the reason; the writers then never record).
pub fn create(pid: u32, iface: &str) -> (TapWriter, TapWriter, Result<PathBuf, String>) {
    let made = create_file(pid).and_then(|(fd, path)| match Map::mmap(Some(&fd)) {
        Ok(mut m) => {
            m.owned_path = Some((path.clone(), std::process::id()));
            Ok((m, path))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    });
    let (map, res) = match made {
        Ok((m, p)) => (m, Ok(p)),
        Err(e) => (
            Map::mmap(None).expect("anonymous mmap of the capture tap"),
            Err(format!("capture tap unavailable: {e}")),
        ),
    };
    let name = iface.as_bytes();
    let len = name.len().min(32);
    // SAFETY: header bytes O_IFNAME..O_IFNAME+32 lie in the mapping; no
    // reader trusts the header before MAGIC is stored (Release) below.
    unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), map.ptr.add(O_IFNAME), len) };
    map.word(O_IFNAME_LEN).store(len as u64, Ordering::Relaxed);
    map.word(O_PID).store(u64::from(pid), Ordering::Relaxed);
    map.word(O_NETNS).store(netns_id(), Ordering::Relaxed);
    map.word(O_MAGIC).store(MAGIC, Ordering::Release);
    let map = Arc::new(map);
    (
        TapWriter {
            map: map.clone(),
            ring: 0,
            next_check: 0,
        },
        TapWriter {
            map,
            ring: 1,
            next_check: 0,
        },
        res,
    )
}

/// The producer side of one ring. One per direction; `&mut self` on every
/// write, so each ring has one producer at a time.
pub struct TapWriter {
    map: Arc<Map>,
    ring: usize,
    /// When (stamp clock, ns) to look next whether the attached capture
    /// is still alive.
    next_check: u64,
}

/// How often an engine with a capture attached looks whether the capture
/// still lives (one `/proc` read per direction).
const HOLDER_CHECK_NS: u64 = 100_000_000;

impl TapWriter {
    /// Is a capture attached?
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.map.word(O_ATTACHED).load(Ordering::Relaxed) != 0
    }

    /// Copy `frame` for an attached capture; nothing else when none is
    /// attached (one load, one branch).
    #[inline(always)]
    pub fn record(&mut self, frame: &[u8]) {
        if self.on() {
            self.push(frame, now_ns());
        }
    }

    /// Copy `frame` stamped `ts_ns` into the ring. `false`: the ring was
    /// full and the copy was dropped (counted).
    #[cold]
    #[inline(never)]
    pub fn push(&mut self, frame: &[u8], ts_ns: u64) -> bool {
        let m = &*self.map;
        if ts_ns >= self.next_check || ts_ns.saturating_add(HOLDER_CHECK_NS) < self.next_check {
            // A capture killed with SIGKILL never detaches: stop copying
            // for it once its process (pid and start time) is gone.
            self.next_check = ts_ns.saturating_add(HOLDER_CHECK_NS);
            let a = m.word(O_ATTACHED);
            let cur = a.load(Ordering::Acquire);
            if cur != 0 && !holder_alive(cur) {
                let _ = a.compare_exchange(cur, 0, Ordering::AcqRel, Ordering::Relaxed);
                return false;
            }
        }
        let base = o_ring(self.ring);
        let head = m.word(base);
        let tail = m.word(base + 64);
        let h = head.load(Ordering::Relaxed);
        let t = tail.load(Ordering::Acquire);
        let cap = frame.len().min(MAX_COPY);
        let need = (REC_HDR + cap).next_multiple_of(16);
        let off = (h % RING_BYTES as u64) as usize;
        let contig = RING_BYTES - off;
        let pad = if need > contig { contig } else { 0 };
        let used = h.wrapping_sub(t);
        if used > RING_BYTES as u64 || used as usize + pad + need > RING_BYTES {
            let d = m.word(base + 128);
            d.store(d.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            return false;
        }
        let ring = m.ring(self.ring);
        let mut at = off;
        if pad > 0 {
            // SAFETY: off..off+16 lies in the ring (contig >= 16: offsets
            // are multiples of 16); the consumer does not read beyond head.
            unsafe { std::ptr::write_unaligned(ring.add(off).cast::<u32>(), PAD) };
            at = 0;
        }
        let hdr = [cap as u32, frame.len().min(u32::MAX as usize) as u32];
        // SAFETY: at..at+need lies in the ring (need <= RING_BYTES - at by
        // the checks above) and is free space the consumer does not read
        // until the Release store of head below.
        unsafe {
            let p = ring.add(at);
            std::ptr::write_unaligned(p.cast::<[u32; 2]>(), hdr);
            std::ptr::write_unaligned(p.add(8).cast::<u64>(), ts_ns);
            std::ptr::copy_nonoverlapping(frame.as_ptr(), p.add(REC_HDR), cap);
        }
        head.store(h + (pad + need) as u64, Ordering::Release);
        let n = m.word(base + 136);
        n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        true
    }
}

/// A tap file found by [`list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapInfo {
    pub path: PathBuf,
    pub pid: u32,
    pub iface: String,
    pub netns: u64,
}

fn pid_alive(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// Start time of process `pid` (clock ticks since boot, `/proc/PID/stat`
/// field 22), low 32 bits; `None` if there is no such process.
fn start_time(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // from the last ')'; field 3 (state) is the first after it.
    let rest = &s[s.rfind(')')? + 1..];
    let t: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    Some(t as u32)
}

/// The `attached` word of a capture process: pid in the low 32 bits, its
/// start time's low 32 bits above (so a recycled pid is not taken for it).
fn holder_word(pid: u32) -> u64 {
    u64::from(pid) | u64::from(start_time(pid).unwrap_or(0)) << 32
}

/// Does the capture named by an `attached` word still live? (A start time
/// of 0 is not checked.)
fn holder_alive(w: u64) -> bool {
    let (pid, start) = (w as u32, (w >> 32) as u32);
    match start_time(pid) {
        None => false,
        Some(t) => start == 0 || t == start,
    }
}

/// Open a tap file for reading and writing with every check.
fn open_checked(path: &Path) -> io::Result<(OwnedFd, Map)> {
    let dir_uid = check_dir(Path::new(DIR), &[0, euid()])?;
    let c = cstr(path)?;
    // SAFETY: c is NUL-terminated; O_NOFOLLOW refuses a symlink.
    let raw = cvt(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: zeroed stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open, st writable.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_uid != dir_uid
        || (st.st_size as u64) < FILE_BYTES as u64
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a tap file of uid {dir_uid}", path.display()),
        ));
    }
    let m = Map::mmap(Some(&fd))?;
    if m.word(O_MAGIC).load(Ordering::Acquire) != MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} has no tap header", path.display()),
        ));
    }
    Ok((fd, m))
}

fn info_of(path: &Path, m: &Map) -> TapInfo {
    let len = (m.word(O_IFNAME_LEN).load(Ordering::Relaxed) as usize).min(32);
    // SAFETY: header bytes O_IFNAME..O_IFNAME+32 lie in the mapping.
    let name = unsafe { std::slice::from_raw_parts(m.ptr.add(O_IFNAME), len) };
    TapInfo {
        path: path.to_path_buf(),
        pid: m.word(O_PID).load(Ordering::Relaxed) as u32,
        iface: String::from_utf8_lossy(name).into_owned(),
        netns: m.word(O_NETNS).load(Ordering::Relaxed),
    }
}

/// The pid a tap file name `<pid>-<n>.tap` belongs to.
fn pid_of(name: &str) -> Option<u32> {
    name.strip_suffix(".tap")?.split('-').next()?.parse().ok()
}

/// Remove the tap files of processes that died without cleaning up
/// (SIGKILL). Only called by the directory's owner.
fn remove_dead() {
    let Ok(rd) = std::fs::read_dir(DIR) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        if let Some(pid) = pid_of(&e.file_name().to_string_lossy())
            && !pid_alive(pid)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The taps of live engines. Files of dead processes are removed.
pub fn list() -> Vec<TapInfo> {
    let Ok(rd) = std::fs::read_dir(DIR) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.filter_map(|e| e.ok()) {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = pid_of(&name) else {
            continue;
        };
        if !pid_alive(pid) {
            if check_dir(Path::new(DIR), &[euid()]).is_ok() {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if let Ok((_, m)) = open_checked(&path) {
            out.push(info_of(&path, &m));
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// One record read from a tap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub dir: Dir,
    pub ts_ns: u64,
    pub orig_len: usize,
    pub data: &'a [u8],
}

/// The consumer side of one tap (both rings). Attaching sets the tap's
/// `attached` word; dropping the reader clears it and gives the ring memory
/// back (hole punched in the file).
pub struct TapReader {
    /// Our `attached` word.
    me: u64,
    fd: OwnedFd,
    map: Map,
    info: TapInfo,
    drops0: [u64; 2],
    buf: Vec<u8>,
}

impl TapReader {
    /// Attach to the tap at `path`. Fails if another live capture holds it.
    pub fn attach(path: &Path) -> io::Result<TapReader> {
        let (fd, map) = open_checked(path)?;
        let info = info_of(path, &map);
        let me = holder_word(std::process::id());
        let a = map.word(O_ATTACHED);
        loop {
            let cur = a.load(Ordering::Acquire);
            if cur != 0 && cur != me && holder_alive(cur) {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "the engine of pid {} on {} is already being captured by pid {}",
                        info.pid, info.iface, cur as u32
                    ),
                ));
            }
            // Start from an empty ring: skip what an earlier capture left.
            for r in 0..2 {
                let b = o_ring(r);
                let h = map.word(b).load(Ordering::Acquire);
                map.word(b + 64).store(h, Ordering::Release);
            }
            if a.compare_exchange(cur, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break;
            }
        }
        let drops0 = [
            map.word(o_ring(0) + 128).load(Ordering::Relaxed),
            map.word(o_ring(1) + 128).load(Ordering::Relaxed),
        ];
        Ok(TapReader {
            me,
            fd,
            map,
            info,
            drops0,
            buf: Vec::with_capacity(MAX_COPY),
        })
    }

    pub fn info(&self) -> &TapInfo {
        &self.info
    }

    /// Is the engine still there?
    pub fn alive(&self) -> bool {
        pid_alive(self.info.pid)
    }

    /// Copies the engine dropped since we attached because a ring was full.
    pub fn dropped(&self) -> u64 {
        (0..2)
            .map(|r| {
                self.map
                    .word(o_ring(r) + 128)
                    .load(Ordering::Relaxed)
                    .wrapping_sub(self.drops0[r])
            })
            .sum()
    }

    /// Hand every record waiting in ring `dir` to `f`, at most `max`.
    /// Returns how many. A record header that does not make sense (a
    /// misbehaving producer) ends the read and is reported as an error.
    pub fn drain(
        &mut self,
        dir: Dir,
        max: usize,
        mut f: impl FnMut(Record<'_>),
    ) -> io::Result<usize> {
        let b = o_ring(dir as usize);
        let head = self.map.word(b).load(Ordering::Acquire);
        let tail_w = self.map.word(b + 64);
        let mut t = tail_w.load(Ordering::Relaxed);
        let ring = self.map.ring(dir as usize);
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("tap of pid {}: bad record ({why})", self.info.pid),
            )
        };
        let mut n = 0;
        while t != head && n < max {
            if head.wrapping_sub(t) > RING_BYTES as u64 {
                return Err(bad("head out of range"));
            }
            let off = (t % RING_BYTES as u64) as usize;
            if !off.is_multiple_of(16) {
                return Err(bad("misaligned"));
            }
            // SAFETY: off+16 <= RING_BYTES (off is a multiple of 16 below
            // RING_BYTES); the producer published this record (head Acquire).
            let (cap, orig, ts) = unsafe {
                let p = ring.add(off);
                let h = std::ptr::read_unaligned(p.cast::<[u32; 2]>());
                (h[0], h[1], std::ptr::read_unaligned(p.add(8).cast::<u64>()))
            };
            if cap == PAD {
                t += (RING_BYTES - off) as u64;
                continue;
            }
            let cap = cap as usize;
            let need = (REC_HDR + cap).next_multiple_of(16);
            if cap > MAX_COPY || off + need > RING_BYTES {
                return Err(bad("length"));
            }
            self.buf.clear();
            // SAFETY: off+16..off+16+cap lies in the ring (checked above)
            // and was published by the producer before head.
            unsafe {
                let p = ring.add(off + REC_HDR);
                self.buf
                    .extend_from_slice(std::slice::from_raw_parts(p, cap));
            }
            t += need as u64;
            // Give the space back before handing the copy out.
            tail_w.store(t, Ordering::Release);
            f(Record {
                dir,
                ts_ns: ts,
                orig_len: (orig as usize).max(cap),
                data: &self.buf,
            });
            n += 1;
        }
        tail_w.store(t, Ordering::Release);
        Ok(n)
    }
}

impl Drop for TapReader {
    fn drop(&mut self) {
        let _ = self.map.word(O_ATTACHED).compare_exchange(
            self.me,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        // Give the ring pages back; the header stays.
        // SAFETY: fallocate on our descriptor, within the file.
        unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                HDR as libc::off_t,
                (2 * RING_BYTES) as libc::off_t,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer/reader pair over one anonymous mapping (no file).
    fn pair() -> (TapWriter, TapWriter, Arc<Map>) {
        let m = Arc::new(Map::mmap(None).unwrap());
        m.word(O_MAGIC).store(MAGIC, Ordering::Release);
        (
            TapWriter {
                map: m.clone(),
                ring: 0,
                next_check: 0,
            },
            TapWriter {
                map: m.clone(),
                ring: 1,
                next_check: 0,
            },
            m,
        )
    }

    fn drain_map(m: &Map, r: usize) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let b = o_ring(r);
        let head = m.word(b).load(Ordering::Acquire);
        let mut t = m.word(b + 64).load(Ordering::Relaxed);
        while t != head {
            let off = (t % RING_BYTES as u64) as usize;
            // SAFETY: test: records written by push above.
            let (cap, ts) = unsafe {
                let p = m.ring(r).add(off);
                (
                    std::ptr::read_unaligned(p.cast::<u32>()),
                    std::ptr::read_unaligned(p.add(8).cast::<u64>()),
                )
            };
            if cap == PAD {
                t += (RING_BYTES - off) as u64;
                continue;
            }
            // SAFETY: as above.
            let d = unsafe {
                std::slice::from_raw_parts(m.ring(r).add(off + REC_HDR), cap as usize).to_vec()
            };
            out.push((ts, d));
            t += (REC_HDR + cap as usize).next_multiple_of(16) as u64;
        }
        m.word(b + 64).store(t, Ordering::Release);
        out
    }

    #[test]
    fn a_capture_killed_with_sigkill_stops_the_copies() {
        // A real process holds the tap as a capture does (pid and start
        // time in `attached`), then dies by SIGKILL without detaching.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let (mut rx, mut tx, m) = pair();
        m.word(O_ATTACHED)
            .store(holder_word(child.id()), Ordering::Release);
        assert!(rx.on() && tx.on());
        rx.record(b"while the capture lives");
        assert_eq!(drain_map(&m, 0).len(), 1);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // The next copy after the check interval finds the holder dead:
        // nothing copied, the tap detached, and no copy from then on.
        let later = now_ns() + 2 * HOLDER_CHECK_NS;
        assert!(!rx.push(b"after the kill", later));
        assert!(!rx.on() && !tx.on());
        rx.record(b"x");
        tx.record(b"y");
        assert!(drain_map(&m, 0).is_empty() && drain_map(&m, 1).is_empty());
        // A live holder whose pid comes back with another start time (a
        // recycled pid) is not taken for the old capture either.
        let me = std::process::id();
        let stale = u64::from(me) | u64::from(start_time(me).unwrap().wrapping_add(1)) << 32;
        assert!(!holder_alive(stale) && holder_alive(holder_word(me)));
    }

    #[test]
    fn off_costs_nothing_and_records_nothing() {
        let (mut rx, _tx, m) = pair();
        rx.record(b"hello");
        assert_eq!(m.word(o_ring(0)).load(Ordering::Relaxed), 0);
    }

    #[test]
    fn wraps_and_drops_when_full_counted() {
        let (mut rx, mut tx, m) = pair();
        m.word(O_ATTACHED).store(1, Ordering::Relaxed);
        let frame = vec![7u8; 1000];
        let per = (REC_HDR + 1000).next_multiple_of(16);
        let fit = RING_BYTES / per;
        for i in 0..fit {
            assert!(rx.push(&frame, i as u64));
        }
        assert!(!rx.push(&frame, 0), "full");
        assert_eq!(m.word(o_ring(0) + 128).load(Ordering::Relaxed), 1);
        assert_eq!(drain_map(&m, 0).len(), fit);
        // After the drain the writer wraps around (with a pad record).
        for i in 0..fit {
            assert!(rx.push(&frame, i as u64), "after wrap {i}");
        }
        let got = drain_map(&m, 0);
        assert_eq!(got.len(), fit);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, (ts, d))| *ts == i as u64 && d == &frame)
        );
        // The other ring is independent.
        tx.record(b"x");
        assert_eq!(drain_map(&m, 1).len(), 1);
    }

    #[test]
    fn a_bad_tail_never_makes_the_writer_write_out_of_bounds() {
        let (mut rx, _tx, m) = pair();
        m.word(O_ATTACHED).store(1, Ordering::Relaxed);
        m.word(o_ring(0) + 64)
            .store(u64::MAX / 2, Ordering::Relaxed);
        assert!(!rx.push(b"abc", 1));
        assert_eq!(m.word(o_ring(0) + 128).load(Ordering::Relaxed), 1);
    }

    #[test]
    #[ignore = "needs root"]
    fn file_tap_roundtrip_when_root() {
        assert_eq!(euid(), 0, "this test needs root (the tap files are root's)");
        let (mut rx, mut tx, path) = create(std::process::id(), "nwtaptest0");
        let path = path.expect("create the tap file");
        let mine: Vec<_> = list().into_iter().filter(|t| t.path == path).collect();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].iface, "nwtaptest0");
        assert_eq!(mine[0].pid, std::process::id());
        rx.record(b"before");
        let mut r = TapReader::attach(&path).unwrap();
        assert!(rx.on() && tx.on());
        rx.record(b"in-frame");
        tx.record(b"out-frame");
        let mut got = Vec::new();
        r.drain(Dir::Rx, 100, |rec| got.push((rec.dir, rec.data.to_vec())))
            .unwrap();
        r.drain(Dir::Tx, 100, |rec| got.push((rec.dir, rec.data.to_vec())))
            .unwrap();
        assert_eq!(
            got,
            vec![
                (Dir::Rx, b"in-frame".to_vec()),
                (Dir::Tx, b"out-frame".to_vec())
            ]
        );
        assert_eq!(r.dropped(), 0);
        drop(r);
        assert!(!rx.on());
        drop(rx);
        drop(tx);
        assert!(!path.exists(), "the engine removes its tap");
    }
}
