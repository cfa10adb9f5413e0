//! Fixed-capacity byte rings (allocated once per connection, sized from
//! SO_SNDBUF/SO_RCVBUF) and the out-of-order assembler of the receive side.

/// A byte ring. Bytes `[0, len)` are the content; the free space after it can
/// be written out of order (`write_at`) and later committed (`commit`).
///
/// `cap` is the ring's capacity (the socket buffer size the window is
/// computed from); the storage behind it is allocated as bytes are written:
/// nothing until the first write, then a power of two (at least
/// [`MIN_STORAGE`]) that covers the farthest byte written, doubled as
/// needed, and at most `cap`. A request/response connection of a few
/// hundred bytes each way so touches 4 KiB per direction, where storage
/// of the full capacity (256 KiB each way by default) cost zeroing or page
/// faults of half a MiB per connection (issue 21, churn). The storage's
/// length is the ring's modulus; growing it relinearises from the head.
#[derive(Debug)]
pub struct Ring {
    buf: Store,
    cap: usize,
    head: usize,
    len: usize,
    /// Where a send ring's storage comes from instead of the heap (issue
    /// 24: memory the engine service can read after the process died).
    slabs: Option<SendSlabs>,
}

/// Fixed-size slabs of memory another process can read after this one
/// died (the engine service's connection table: the bytes a killed
/// process wrote but the peer had not acknowledged are delivered from
/// there). A send ring takes one at its first write and gives it back when
/// dropped; none free (or a ring that grew beyond one): the heap, counted
/// by the slabs' owner with its reason ([`SlabMiss`], [`Slabs::missed`]).
pub trait Slabs: Send + Sync {
    /// Bytes per slab.
    fn slab_bytes(&self) -> usize;
    /// A free slab: its index and address (valid until given back), or
    /// why there is none for this caller.
    fn take(&self) -> Result<(u32, std::ptr::NonNull<u8>), SlabMiss>;
    fn give(&self, idx: u32);
    /// A ring that wanted a slab got heap storage (counted once per ring).
    fn missed(&self, why: SlabMiss);
}

/// Why a send ring that wanted a slab is on the heap (its unsent and
/// unacknowledged bytes are then not delivered after a kill -9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlabMiss {
    /// Its send buffer (the ring's capacity) is larger than a slab.
    TooLarge,
    /// Every slab is in use.
    NoneFree,
    /// The slabs are another process's (a forked child's copy of its
    /// parent's engine).
    NotOwner,
}

impl SlabMiss {
    /// Every reason, in discriminant order (`why as usize` indexes it).
    pub const ALL: [SlabMiss; 3] = [SlabMiss::TooLarge, SlabMiss::NoneFree, SlabMiss::NotOwner];
}

/// A shared [`Slabs`] (Debug for the rings that hold it).
#[derive(Clone)]
pub struct SendSlabs(pub std::sync::Arc<dyn Slabs>);

impl std::fmt::Debug for SendSlabs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SendSlabs")
    }
}

/// A ring's storage: heap bytes (pooled when dropped) or a slab.
struct Store {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    slab: Option<(u32, SendSlabs)>,
}

// SAFETY: a Store owns its bytes (a leaked box, or a slab taken for it
// alone until its Drop gives it back).
unsafe impl Send for Store {}
// SAFETY: as above; shared access is read-only through Deref.
unsafe impl Sync for Store {}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Store({}, slab {:?})",
            self.len,
            self.slab.as_ref().map(|s| s.0)
        )
    }
}

impl Default for Store {
    fn default() -> Store {
        Store::heap(Box::default())
    }
}

impl Store {
    fn heap(b: Box<[u8]>) -> Store {
        let len = b.len();
        let ptr = Box::into_raw(b).cast::<u8>();
        Store {
            // SAFETY: Box::into_raw never gives null.
            ptr: unsafe { std::ptr::NonNull::new_unchecked(ptr) },
            len,
            slab: None,
        }
    }
}

impl std::ops::Deref for Store {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` are this store's (see Send).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Store {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref; `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        match self.slab.take() {
            Some((idx, s)) => s.0.give(idx),
            None => {
                let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
                // SAFETY: made by `Store::heap` from this box.
                pool_put(unsafe { Box::from_raw(raw) });
            }
        }
    }
}

/// Where a send ring's content lies in its slab: (slab, head, storage
/// length: the modulus). `None`: on the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabAt {
    pub slab: u32,
    pub head: u32,
    pub modulus: u32,
}

/// Smallest storage a ring allocates (one page).
pub const MIN_STORAGE: usize = 4096;

/// Ring storage of finished connections, kept for the next ones (the
/// allocator hands freed big blocks back to the kernel, and a fresh block
/// costs page faults or zeroing). At most [`POOL_BYTES`] are kept. Only a
/// ring's content (`[0, len)`, bytes it wrote) is ever read, so reused
/// storage is not cleared.
static POOL: std::sync::Mutex<Vec<Box<[u8]>>> = std::sync::Mutex::new(Vec::new());
/// Bytes of idle ring storage kept per process at most.
pub const POOL_BYTES: usize = 4 << 20;

fn pool_put(buf: Box<[u8]>) {
    if buf.is_empty() {
        return;
    }
    // try_lock: never wait here (nor deadlock in a forked child).
    if let Ok(mut p) = POOL.try_lock() {
        let held: usize = p.iter().map(|b| b.len()).sum();
        if held + buf.len() <= POOL_BYTES {
            p.push(buf);
        }
    }
}

fn pool_take(size: usize) -> Box<[u8]> {
    POOL.try_lock()
        .ok()
        .and_then(|mut p| {
            let i = p.iter().position(|b| b.len() == size)?;
            Some(p.swap_remove(i))
        })
        .unwrap_or_else(|| vec![0u8; size].into_boxed_slice())
}

impl Ring {
    /// A ring of `capacity` bytes (no storage until the first write).
    pub fn new(capacity: usize) -> Ring {
        Ring {
            buf: Store::default(),
            cap: capacity,
            head: 0,
            len: 0,
            slabs: None,
        }
    }

    /// Take storage from `slabs` (a send ring's), from its next growth on.
    pub fn use_slabs(&mut self, slabs: Option<SendSlabs>) {
        self.slabs = slabs;
    }

    /// An empty ring of `capacity` bytes with the same storage source.
    pub fn renew(&mut self, capacity: usize) {
        let slabs = self.slabs.take();
        *self = Ring::new(capacity);
        self.slabs = slabs;
    }

    /// Where the content lies when the storage is a slab.
    pub fn slab_at(&self) -> Option<SlabAt> {
        let (slab, _) = self.buf.slab.as_ref()?;
        Some(SlabAt {
            slab: *slab,
            head: self.head as u32,
            modulus: self.buf.len as u32,
        })
    }

    /// Storage for `size` bytes: a slab when this ring takes them, one is
    /// free and the ring's capacity fits one, else the heap (counted when
    /// a slab was wanted).
    fn storage_for(&self, size: usize) -> Store {
        if let Some(s) = &self.slabs {
            let got = if size <= s.0.slab_bytes() && self.cap <= s.0.slab_bytes() {
                s.0.take()
            } else {
                Err(SlabMiss::TooLarge)
            };
            match got {
                Ok((idx, ptr)) => {
                    return Store {
                        ptr,
                        len: size,
                        slab: Some((idx, s.clone())),
                    };
                }
                // Once per ring: its first storage (a ring larger than a
                // slab grows on the heap again and again).
                Err(why) if self.buf.is_empty() => s.0.missed(why),
                Err(_) => {}
            }
        }
        Store::heap(pool_take(size))
    }

    /// Bytes of storage allocated (at most the capacity).
    pub fn storage(&self) -> usize {
        self.buf.len()
    }

    /// Storage for the first `need` bytes from the head (`need` ≤ the
    /// capacity): keeps the content and whatever was written past it at the
    /// same offsets from the head. One copy of the old storage.
    #[cold]
    fn reserve(&mut self, need: usize) {
        let size = match &self.slabs {
            // A slab at once: its pages are touched as written.
            Some(s) if self.cap <= s.0.slab_bytes() => self.cap,
            _ if need > self.cap / 2 => self.cap,
            _ => need.next_power_of_two().max(MIN_STORAGE).min(self.cap),
        };
        let mut next = self.storage_for(size);
        let old = self.buf.len();
        let tail = old - self.head;
        next[..tail].copy_from_slice(&self.buf[self.head..]);
        next[tail..old].copy_from_slice(&self.buf[..self.head]);
        self.buf = next;
        self.head = 0;
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn free(&self) -> usize {
        self.cap - self.len
    }

    /// The two slices holding `[off, off+n)` of the ring's index space
    /// (may reach into the free area). `off + n` must be ≤ the storage.
    fn span(&self, off: usize, n: usize) -> (usize, usize, usize) {
        let cap = self.buf.len();
        // head < cap and off ≤ cap: one conditional subtract, no division.
        let mut start = self.head + off;
        if start >= cap {
            start -= cap;
        }
        let first = n.min(cap - start);
        (start, first, n - first)
    }

    /// Append as much of `data` as fits; returns the count.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        self.write_at(0, &data[..n]);
        self.len += n;
        n
    }

    /// Copy `data` to `off` bytes past the end of the content (into the free
    /// area), clipped to the capacity. Returns the count written.
    pub fn write_at(&mut self, off: usize, data: &[u8]) -> usize {
        if off >= self.free() {
            return 0;
        }
        let n = data.len().min(self.free() - off);
        if n == 0 {
            return 0;
        }
        let end = self.len + off + n;
        if end > self.buf.len() {
            self.reserve(end);
        }
        let (s, a, b) = self.span(self.len + off, n);
        self.buf[s..s + a].copy_from_slice(&data[..a]);
        self.buf[..b].copy_from_slice(&data[a..n]);
        n
    }

    /// [`Ring::write_at`] for a payload in pieces, each copied straight
    /// from where it lies.
    pub fn write_payload(&mut self, off: usize, data: &crate::payload::Payload) -> usize {
        if let Some(s) = data.single() {
            return self.write_at(off, s);
        }
        let mut n = 0;
        for c in data.chunks() {
            let k = self.write_at(off + n, c);
            n += k;
            if k < c.len() {
                break;
            }
        }
        n
    }

    /// Grow to `capacity` bytes (no-op unless larger), keeping the content
    /// and whatever was written past it (out-of-order bytes) at the same
    /// offsets from the front. The storage grows as bytes are written.
    pub fn grow(&mut self, capacity: usize) {
        self.cap = self.cap.max(capacity);
    }

    /// Make `n` bytes written past the end part of the content.
    pub fn commit(&mut self, n: usize) {
        // Written bytes lie in the storage (write_at reserved it).
        let n = n.min(self.free());
        debug_assert!(
            self.len + n <= self.buf.len(),
            "commit past what was written"
        );
        self.len += n.min(self.buf.len() - self.len);
    }

    /// Copy up to `out.len()` bytes starting `off` into the content.
    pub fn peek(&self, off: usize, out: &mut [u8]) -> usize {
        if off >= self.len {
            return 0;
        }
        let n = out.len().min(self.len - off);
        let (s, a, b) = self.span(off, n);
        out[..a].copy_from_slice(&self.buf[s..s + a]);
        out[a..n].copy_from_slice(&self.buf[..b]);
        n
    }

    /// Drop `n` bytes from the front.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        if self.buf.is_empty() {
            return;
        }
        self.head += n;
        if self.head >= self.buf.len() {
            self.head -= self.buf.len();
        }
        // The head is not reset when empty: out-of-order bytes may already
        // sit past the end (see `rewind`).
        self.len -= n;
    }

    /// Empty and nothing written past the end (the owner knows): start
    /// again at the front, so a ping-pong stream keeps using the same few
    /// cache lines instead of walking the whole ring cold.
    pub fn rewind(&mut self) {
        debug_assert_eq!(self.len, 0);
        self.head = 0;
    }

    /// Read and consume.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let n = self.peek(0, out);
        self.consume(n);
        n
    }
}

/// Received payload kept in the memory it arrived in (a receive frame, or
/// the frames of a multi-buffer packet) instead of being copied into the
/// receive ring: read in place by the application's `recv`, and given back
/// (to the fill ring) when dropped. See [`RxQueue`].
pub trait HeldBytes: Send {
    /// Bytes held.
    fn len(&self) -> usize;
    /// True when nothing is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy `[at, at + out.len())`, clipped to the bytes held, into `out`;
    /// returns the count.
    fn copy_out(&self, at: usize, out: &mut [u8]) -> usize;
}

/// One held segment: bytes `[at, end)` of `body` are unread.
struct HeldSeg {
    body: Box<dyn HeldBytes>,
    at: usize,
    end: usize,
    /// Receive memory it pins (frames × frame size).
    truesize: usize,
}

/// A run of the receive queue, in stream order.
enum Run {
    /// A segment kept in its frame.
    Held(HeldSeg),
    /// The next `n` bytes of the ring's content.
    Ring(usize),
}

/// A connection's receive queue: runs of in-order bytes, oldest first,
/// each either kept in the frames they arrived in (`Run::Held`) or copied
/// into the byte ring (`Run::Ring`: the ring's content is the copied runs
/// back to back, in stream order).
///
/// Offsets given to `write_at` and `commit` count from the end of the whole
/// content (`rcv_nxt`) and address the ring right after its content: held
/// runs take no ring space, and a frame is held only for in-order data with
/// no out-of-order bytes waiting (the caller checks the assembler), so the
/// bytes past the ring's content are always those following `rcv_nxt`;
/// `commit` appends them as a ring run after whatever was held.
///
/// Bounds: `len()` (held plus ring bytes) never exceeds the capacity, the
/// window the connection announces (the caller holds or writes only what
/// fits [`RxQueue::free`]); the memory held frames pin (`truesize`) never
/// exceeds twice the capacity ([`RxQueue::can_hold`]; Linux charges
/// truesize against a receive buffer it sizes at twice SO_RCVBUF), so a
/// connection of many small segments falls back to copying rather than
/// pinning frames; the engine's budget over all connections bounds the
/// rest (stack xdp/tcp.rs).
pub struct RxQueue {
    runs: std::collections::VecDeque<Run>,
    held_bytes: usize,
    held_segments: usize,
    held_truesize: usize,
    ring: Ring,
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxQueue")
            .field("runs", &self.runs.len())
            .field("held_segments", &self.held_segments)
            .field("held_bytes", &self.held_bytes)
            .field("held_truesize", &self.held_truesize)
            .field("ring", &self.ring)
            .finish()
    }
}

impl RxQueue {
    /// A queue of `capacity` bytes (nothing allocated yet).
    pub fn new(capacity: usize) -> RxQueue {
        RxQueue {
            runs: std::collections::VecDeque::new(),
            held_bytes: 0,
            held_segments: 0,
            held_truesize: 0,
            ring: Ring::new(capacity),
        }
    }

    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }
    /// Unread bytes (held and in the ring).
    pub fn len(&self) -> usize {
        self.held_bytes + self.ring.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn free(&self) -> usize {
        self.capacity().saturating_sub(self.len())
    }
    /// Bytes of ring storage allocated.
    pub fn storage(&self) -> usize {
        self.ring.storage()
    }
    /// Unread bytes kept in their frames.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }
    /// Segments kept in their frames.
    pub fn held_segments(&self) -> usize {
        self.held_segments
    }
    /// Memory the held segments pin.
    pub fn held_truesize(&self) -> usize {
        self.held_truesize
    }

    /// Whether a segment pinning `truesize` bytes may be held now: the held
    /// frames stay within twice the capacity. (The caller checks that the
    /// data is in order with no out-of-order bytes waiting.)
    pub fn can_hold(&self, truesize: usize) -> bool {
        self.held_truesize + truesize <= 2 * self.capacity()
    }

    /// Append bytes `[at, end)` of `body` as in-order content (the caller
    /// checked [`RxQueue::can_hold`], the order, and that they fit
    /// [`RxQueue::free`]).
    pub fn hold(&mut self, body: Box<dyn HeldBytes>, at: usize, end: usize, truesize: usize) {
        debug_assert!(at < end && end <= body.len());
        debug_assert!(end - at <= self.free());
        self.held_bytes += end - at;
        self.held_segments += 1;
        self.held_truesize += truesize;
        self.runs.push_back(Run::Held(HeldSeg {
            body,
            at,
            end,
            truesize,
        }));
    }

    /// Copy `data` to `off` bytes past the end of the content (out of
    /// order, or before a `commit`), clipped to the free space.
    pub fn write_at(&mut self, off: usize, data: &[u8]) -> usize {
        let room = self.free().saturating_sub(off);
        self.ring.write_at(off, &data[..data.len().min(room)])
    }

    /// [`RxQueue::write_at`] for a payload in pieces.
    pub fn write_payload(&mut self, off: usize, data: &crate::payload::Payload) -> usize {
        let room = self.free().saturating_sub(off);
        self.ring.write_payload(off, &data.take(room))
    }

    /// Make `n` bytes written past the end part of the content: a ring run
    /// after whatever came before.
    pub fn commit(&mut self, n: usize) {
        let before = self.ring.len();
        self.ring.commit(n.min(self.free()));
        let k = self.ring.len() - before;
        if k == 0 {
            return;
        }
        match self.runs.back_mut() {
            Some(Run::Ring(r)) => *r += k,
            _ => self.runs.push_back(Run::Ring(k)),
        }
    }

    /// Grow the capacity (autotuning).
    pub fn grow(&mut self, capacity: usize) {
        self.ring.grow(capacity);
    }

    /// Empty, nothing past the end (the owner knows): see [`Ring::rewind`].
    pub fn rewind(&mut self) {
        debug_assert!(self.runs.is_empty());
        self.ring.rewind();
    }

    /// Copy up to `out.len()` bytes starting `off` into the content.
    pub fn peek(&self, mut off: usize, out: &mut [u8]) -> usize {
        let (mut n, mut ring_at) = (0, 0);
        for r in &self.runs {
            if n == out.len() {
                break;
            }
            let len = match r {
                Run::Held(h) => h.end - h.at,
                Run::Ring(k) => *k,
            };
            if off >= len {
                off -= len;
                if let Run::Ring(k) = r {
                    ring_at += k;
                }
                continue;
            }
            let k = (len - off).min(out.len() - n);
            n += match r {
                Run::Held(h) => h.body.copy_out(h.at + off, &mut out[n..n + k]),
                Run::Ring(len) => {
                    let got = self.ring.peek(ring_at + off, &mut out[n..n + k]);
                    ring_at += len;
                    got
                }
            };
            off = 0;
        }
        n
    }

    /// Drop `n` bytes from the front: held segments read to their end go
    /// (their frames back to the fill ring), ring runs give their bytes
    /// back to the ring.
    pub fn consume(&mut self, mut n: usize) {
        while n > 0
            && let Some(r) = self.runs.front_mut()
        {
            match r {
                Run::Held(h) => {
                    let len = h.end - h.at;
                    if n < len {
                        h.at += n;
                        self.held_bytes -= n;
                        return;
                    }
                    n -= len;
                    self.held_bytes -= len;
                    self.held_segments -= 1;
                    self.held_truesize -= h.truesize;
                }
                Run::Ring(k) => {
                    let c = n.min(*k);
                    self.ring.consume(c);
                    n -= c;
                    *k -= c;
                    if *k > 0 {
                        return;
                    }
                }
            }
            self.runs.pop_front();
        }
    }

    /// Read and consume. Empty (a spinning reader's every idle turn): one
    /// look, not a walk of the runs.
    #[inline]
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        if self.runs.is_empty() {
            return 0;
        }
        let n = self.peek(0, out);
        self.consume(n);
        n
    }
}

/// Most out-of-order holes tracked; a segment that would need more is dropped
/// (and counted) — the sender retransmits it.
pub const MAX_RANGES: usize = 8;

/// Byte ranges received beyond `rcv_nxt`, as offsets from it, sorted,
/// disjoint and non-adjacent.
#[derive(Debug, Default, Clone)]
pub struct Assembler {
    ranges: [(u32, u32); MAX_RANGES],
    n: usize,
    /// Index of the range that holds the most recent segment (first SACK block).
    recent: usize,
}

impl Assembler {
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges[..self.n]
    }
    pub fn recent(&self) -> usize {
        self.recent
    }
    pub fn clear(&mut self) {
        self.n = 0;
        self.recent = 0;
    }

    /// Record `[start, end)`. False (nothing changed) when it would need more
    /// than `MAX_RANGES` ranges.
    pub fn add(&mut self, start: u32, end: u32) -> bool {
        if start >= end {
            return true;
        }
        // First range whose end reaches start (touching merges).
        let mut i = 0;
        while i < self.n && self.ranges[i].1 < start {
            i += 1;
        }
        // Ranges [i, j) overlap or touch [start, end].
        let mut j = i;
        while j < self.n && self.ranges[j].0 <= end {
            j += 1;
        }
        if i == j {
            if self.n == MAX_RANGES {
                return false;
            }
            self.ranges.copy_within(i..self.n, i + 1);
            self.ranges[i] = (start, end);
            self.n += 1;
        } else {
            let s = start.min(self.ranges[i].0);
            let e = end.max(self.ranges[j - 1].1);
            self.ranges[i] = (s, e);
            self.ranges.copy_within(j..self.n, i + 1);
            self.n -= j - i - 1;
        }
        self.recent = i;
        true
    }

    /// `rcv_nxt` moved forward by `n` (in-order data of length n arrived at
    /// offset 0). Returns how many bytes in total are now contiguous from the
    /// old offset 0 (≥ n), and rebases the remaining ranges.
    pub fn advance(&mut self, n: u32) -> u32 {
        if self.n == 0 {
            // In-order data with no holes (the common case): nothing to merge.
            self.recent = 0;
            return n;
        }
        if n == 0 && self.ranges[0].0 > 0 {
            return 0;
        }
        let ok = self.add(0, n);
        debug_assert!(ok, "a range starting at 0 always merges or fits");
        let total = if self.n > 0 && self.ranges[0].0 == 0 {
            let t = self.ranges[0].1;
            self.ranges.copy_within(1..self.n, 0);
            self.n -= 1;
            t
        } else {
            n
        };
        for r in &mut self.ranges[..self.n] {
            r.0 -= total;
            r.1 -= total;
        }
        self.recent = self.recent.min(self.n.saturating_sub(1));
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a read of at most `n` bytes into a buffer gave (`read` returns
    /// how many it wrote).
    fn got(n: usize, read: impl FnOnce(&mut [u8]) -> usize) -> Vec<u8> {
        let mut o = vec![0u8; n];
        let k = read(&mut o);
        o.truncate(k);
        o
    }

    #[test]
    fn ring_wraps() {
        let mut r = Ring::new(8);
        assert_eq!(r.push(b"abcdef"), 6);
        assert_eq!(got(4, |o| r.read(o)), b"abcd");
        assert_eq!(r.push(b"ghijklmn"), 6);
        assert_eq!(r.len(), 8);
        assert_eq!(got(8, |o| r.peek(1, o)), b"fghijkl");
        assert_eq!(got(8, |o| r.read(o)), b"efghijkl");
    }

    #[test]
    fn an_emptied_ring_rewinds_to_the_front() {
        let mut r = Ring::new(8);
        r.push(b"abcde");
        assert_eq!(got(5, |o| r.read(o)), b"abcde");
        r.rewind();
        // Wraps no more: the next 8 bytes fit in one piece from the front.
        assert_eq!(r.push(b"ABCDEFGH"), 8);
        assert_eq!(r.span(0, 8), (0, 8, 0));
        assert_eq!(got(8, |o| r.read(o)), b"ABCDEFGH");
    }

    #[test]
    fn ring_out_of_order_then_commit() {
        let mut r = Ring::new(10);
        r.push(b"ab");
        r.consume(2);
        assert_eq!(r.write_at(3, b"DEFGHIJKLMN"), 7);
        assert_eq!(r.write_at(0, b"abc"), 3);
        r.commit(10);
        assert_eq!(got(10, |o| r.read(o)), b"abcDEFGHIJ");
    }

    #[test]
    fn a_grown_ring_keeps_content_and_out_of_order_bytes() {
        let mut r = Ring::new(8);
        r.push(b"abcdef");
        assert_eq!(got(5, |o| r.read(o)), b"abcde");
        r.push(b"ghij"); // wraps: content "fghij", head 5
        assert_eq!(r.write_at(1, b"LM"), 2); // out of order, past the end
        r.grow(20);
        assert_eq!(r.capacity(), 20);
        assert_eq!(r.len(), 5);
        r.write_at(0, b"k");
        r.commit(3);
        assert_eq!(got(8, |o| r.read(o)), b"fghijkLM");
        assert_eq!(r.push(&[b'z'; 20]), 20, "the whole new capacity is usable");
    }

    #[test]
    fn storage_follows_what_is_written() {
        let mut r = Ring::new(256 * 1024);
        assert_eq!(r.storage(), 0, "nothing allocated before the first write");
        assert_eq!(r.free(), 256 * 1024);
        r.push(&[1u8; 100]);
        assert_eq!(r.storage(), MIN_STORAGE);
        // Wrap inside the small storage, then out-of-order bytes far past
        // the end: the storage grows, content and offsets kept.
        let mut o = vec![0u8; 100];
        r.read(&mut o);
        r.push(&[2u8; 4000]);
        r.push(b"tail");
        assert_eq!(r.storage(), MIN_STORAGE, "content wraps in the storage");
        assert_eq!(r.write_at(10_000, b"far"), 3);
        assert_eq!(r.storage(), 16384);
        assert_eq!(r.write_at(0, &[3u8; 10_000]), 10_000);
        r.commit(10_003);
        assert_eq!(r.len(), 4004 + 10_003);
        let mut all = vec![0u8; r.len()];
        assert_eq!(r.read(&mut all), 14_007);
        assert!(all[..4000].iter().all(|&b| b == 2));
        assert_eq!(&all[4000..4004], b"tail");
        assert!(all[4004..14_004].iter().all(|&b| b == 3));
        assert_eq!(&all[14_004..], b"far");
        // More than half the capacity: the storage is the capacity.
        r.push(&vec![4u8; 200 * 1024]);
        assert_eq!(r.storage(), 256 * 1024);
        assert_eq!(r.push(&vec![5u8; 100 * 1024]), 56 * 1024);
    }

    /// A held body over a copy of `data` that counts itself in `live`
    /// while it exists.
    struct Body(Vec<u8>, std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl Body {
        fn boxed(data: &[u8], live: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Box<Body> {
            live.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Box::new(Body(data.to_vec(), live.clone()))
        }
    }
    impl HeldBytes for Body {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn copy_out(&self, at: usize, out: &mut [u8]) -> usize {
            let s = self.0.get(at..).unwrap_or(&[]);
            let n = s.len().min(out.len());
            out[..n].copy_from_slice(&s[..n]);
            n
        }
    }
    impl Drop for Body {
        fn drop(&mut self) {
            self.1.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn live() -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
        std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0))
    }
    fn count(l: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> usize {
        l.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn held_segments_read_in_order_before_the_ring_and_are_released_when_read() {
        let l = live();
        let mut q = RxQueue::new(64);
        assert!(q.can_hold(20));
        // Bytes 2..8 of the first body, all of the second.
        q.hold(Body::boxed(b"xxabcdefyy", &l), 2, 8, 20);
        q.hold(Body::boxed(b"ghij", &l), 0, 4, 20);
        assert_eq!((q.len(), q.held_bytes(), q.held_segments()), (10, 10, 2));
        assert_eq!(q.free(), 54, "held bytes count against the window");
        // Out of order past the end, then the hole filled: the ring
        // follows the held bytes.
        assert_eq!(q.write_at(3, b"nop"), 3);
        assert_eq!(q.write_at(0, b"klm"), 3);
        q.commit(6);
        // Held again after the ring run, then a second ring run: runs
        // interleave in stream order, the ring holds only copied bytes.
        assert!(q.can_hold(20));
        q.hold(Body::boxed(b"qrs", &l), 0, 3, 20);
        assert_eq!(q.write_at(0, b"tu"), 2);
        q.commit(2);
        assert_eq!(q.len(), 21);
        assert_eq!(q.held_segments(), 3);
        // MSG_PEEK anywhere: across bodies and ring runs.
        assert_eq!(got(21, |o| q.peek(0, o)), b"abcdefghijklmnopqrstu");
        assert_eq!(got(5, |o| q.peek(4, o)), b"efghi");
        assert_eq!(got(5, |o| q.peek(9, o)), b"jklmn");
        assert_eq!(got(5, |o| q.peek(14, o)), b"opqrs");
        assert_eq!(got(5, |o| q.peek(18, o)), b"stu");
        assert_eq!(count(&l), 3, "peeking releases nothing");
        // Reads in odd pieces: a body goes when its last byte is read.
        assert_eq!(got(3, |o| q.read(o)), b"abc");
        assert_eq!(count(&l), 3);
        assert_eq!(got(4, |o| q.read(o)), b"defg");
        assert_eq!(count(&l), 2, "the first body was read to its end");
        assert_eq!(q.held_truesize(), 40);
        assert_eq!(got(10, |o| q.read(o)), b"hijklmnopq");
        assert_eq!(count(&l), 1);
        assert_eq!(got(16, |o| q.read(o)), b"rstu");
        assert_eq!(count(&l), 0);
        assert_eq!((q.len(), q.held_bytes(), q.held_truesize()), (0, 0, 0));
        q.rewind();
        assert!(q.can_hold(20));
    }

    #[test]
    fn held_memory_is_bounded_by_twice_the_capacity() {
        let l = live();
        let mut q = RxQueue::new(1000);
        let mut held = 0;
        while q.can_hold(300) {
            q.hold(Body::boxed(&[7u8; 10], &l), 0, 10, 300);
            held += 1;
        }
        assert_eq!(held, 6, "6 x 300 <= 2 x 1000 < 7 x 300");
        assert_eq!(q.held_truesize(), 1800);
        assert!(q.can_hold(200));
        assert!(!q.can_hold(201));
        // Writes are clipped to the window left by held bytes.
        assert_eq!(q.free(), 940);
        assert_eq!(q.write_at(900, &[1u8; 100]), 40);
        // Consuming everything at once (close with unread data) releases
        // every frame.
        q.consume(q.len());
        assert_eq!(count(&l), 0);
        assert_eq!(q.held_truesize(), 0);
        // Dropping a queue releases what it held.
        q.hold(Body::boxed(&[1u8; 10], &l), 0, 10, 300);
        drop(q);
        assert_eq!(count(&l), 0);
    }

    #[test]
    fn assembler_merges_and_advances() {
        let mut a = Assembler::default();
        assert!(a.add(10, 20));
        assert!(a.add(30, 40));
        assert!(a.add(20, 30));
        assert_eq!(a.ranges(), &[(10, 40)]);
        assert!(a.add(50, 60));
        assert_eq!(a.advance(5), 5);
        assert_eq!(a.ranges(), &[(5, 35), (45, 55)]);
        assert_eq!(a.advance(5), 35);
        assert_eq!(a.ranges(), &[(10, 20)]);
        for i in 0..7 {
            assert!(a.add(100 + i * 10, 105 + i * 10));
        }
        assert!(!a.add(500, 501));
        assert!(a.add(0, 1000));
        assert_eq!(a.ranges(), &[(0, 1000)]);
        // In-order data spanning several ranges swallows all of them.
        let mut a = Assembler::default();
        a.add(5, 10);
        a.add(20, 30);
        a.add(40, 50);
        assert_eq!(a.advance(25), 30);
        assert_eq!(a.ranges(), &[(10, 20)]);
    }
}
