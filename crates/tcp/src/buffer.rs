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
    buf: Box<[u8]>,
    cap: usize,
    head: usize,
    len: usize,
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

impl Drop for Ring {
    fn drop(&mut self) {
        pool_put(std::mem::take(&mut self.buf));
    }
}

impl Ring {
    /// A ring of `capacity` bytes (no storage until the first write).
    pub fn new(capacity: usize) -> Ring {
        Ring {
            buf: Box::default(),
            cap: capacity,
            head: 0,
            len: 0,
        }
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
        let size = if need > self.cap / 2 {
            self.cap
        } else {
            need.next_power_of_two().max(MIN_STORAGE).min(self.cap)
        };
        let mut next = pool_take(size);
        let old = self.buf.len();
        let tail = old - self.head;
        next[..tail].copy_from_slice(&self.buf[self.head..]);
        next[tail..old].copy_from_slice(&self.buf[..self.head]);
        pool_put(std::mem::replace(&mut self.buf, next));
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

    #[test]
    fn ring_wraps() {
        let mut r = Ring::new(8);
        assert_eq!(r.push(b"abcdef"), 6);
        let mut o = [0u8; 4];
        assert_eq!(r.read(&mut o), 4);
        assert_eq!(&o, b"abcd");
        assert_eq!(r.push(b"ghijklmn"), 6);
        assert_eq!(r.len(), 8);
        let mut o = [0u8; 8];
        assert_eq!(r.peek(1, &mut o), 7);
        assert_eq!(&o[..7], b"fghijkl");
        assert_eq!(r.read(&mut o), 8);
        assert_eq!(&o, b"efghijkl");
    }

    #[test]
    fn an_emptied_ring_rewinds_to_the_front() {
        let mut r = Ring::new(8);
        r.push(b"abcde");
        let mut o = [0u8; 5];
        assert_eq!(r.read(&mut o), 5);
        r.rewind();
        // Wraps no more: the next 8 bytes fit in one piece from the front.
        assert_eq!(r.push(b"ABCDEFGH"), 8);
        assert_eq!(r.span(0, 8), (0, 8, 0));
        let mut o = [0u8; 8];
        assert_eq!(r.read(&mut o), 8);
        assert_eq!(&o, b"ABCDEFGH");
    }

    #[test]
    fn ring_out_of_order_then_commit() {
        let mut r = Ring::new(10);
        r.push(b"ab");
        r.consume(2);
        assert_eq!(r.write_at(3, b"DEFGHIJKLMN"), 7);
        assert_eq!(r.write_at(0, b"abc"), 3);
        r.commit(10);
        let mut o = [0u8; 10];
        assert_eq!(r.read(&mut o), 10);
        assert_eq!(&o, b"abcDEFGHIJ");
    }

    #[test]
    fn a_grown_ring_keeps_content_and_out_of_order_bytes() {
        let mut r = Ring::new(8);
        r.push(b"abcdef");
        let mut o = [0u8; 5];
        r.read(&mut o);
        r.push(b"ghij"); // wraps: content "fghij", head 5
        assert_eq!(r.write_at(1, b"LM"), 2); // out of order, past the end
        r.grow(20);
        assert_eq!(r.capacity(), 20);
        assert_eq!(r.len(), 5);
        r.write_at(0, b"k");
        r.commit(3);
        let mut o = [0u8; 8];
        assert_eq!(r.read(&mut o), 8);
        assert_eq!(&o, b"fghijkLM");
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
