//! IPv4 reassembly for the fragments the steering program redirects: those
//! of the engine's TCP flows (issue 20, finding 8). The kernel has no
//! socket for an engine connection, so a fragmented segment reassembled
//! there would be answered with RST; here it is reassembled and goes
//! through the receive path as one more frame.
//!
//! Bounded like the kernel's (net/ipv4/ip_fragment.c): datagrams keyed by
//! (source, destination, IP id, protocol); at most [`MAX_DATAGRAMS`] in
//! progress and [`MAX_BYTES`] buffered (the oldest goes to make room), at
//! most [`MAX_FRAGS`] fragments per datagram, [`TIMEOUT_NS`] to complete.
//! Overlapping fragments drop the whole datagram (RFC 5722, as Linux); an
//! exact duplicate is dropped alone. Every fragment frame ends counted once:
//! merged into a datagram (`rx_frag_merged`) or dropped under its reason
//! (`drop_frag_timeout`, `drop_frag_overlap`, `drop_frag_too_many`, or
//! `drop_fragment` for a malformed one), so the receive identity becomes
//! `rx_frames = rx_packets + drops + rx_frag_merged` (a reassembled
//! datagram counts as one more frame) once nothing is held.
//!
//! No allocation unless fragments arrive: a datagram's buffer grows to its
//! highest fragment end (at most 64 KiB).

use nanowire_wire::{EthernetFrame, Ipv4Packet, checksum};

use super::tx::ETH_HDR;

/// Time a datagram has to complete (Linux's ipfrag_time).
pub const TIMEOUT_NS: u64 = 30_000_000_000;
/// Datagrams in progress at once.
pub const MAX_DATAGRAMS: usize = 64;
/// Bytes buffered over all datagrams (Linux's ipfrag_high_thresh).
pub const MAX_BYTES: usize = 4 << 20;
/// Fragments per datagram (a 64 KiB datagram in 1 KiB fragments).
pub const MAX_FRAGS: usize = 64;

/// A monotonic clock for the timeouts (ns since the first call).
pub fn mono_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// What happened to fragment frames (counted by the caller on the stats
/// page; each field is a number of frames).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub merged: u64,
    pub timeout: u64,
    pub overlap: u64,
    pub too_many: u64,
    pub malformed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    src: [u8; 4],
    dst: [u8; 4],
    id: u16,
    proto: u8,
}

struct Datagram {
    key: Key,
    born: u64,
    /// Ethernet + IPv4 header of the first fragment (empty until it came).
    head: Vec<u8>,
    /// Payload bytes received, at their offsets.
    data: Vec<u8>,
    /// Received payload ranges [start, end), sorted and disjoint.
    ranges: Vec<(usize, usize)>,
    /// Payload length, known from the fragment without MF.
    end: Option<usize>,
    /// Fragment frames held.
    frames: u64,
}

impl Datagram {
    fn bytes(&self) -> usize {
        self.head.len() + self.data.len()
    }
    fn complete(&self) -> bool {
        !self.head.is_empty() && self.end.is_some_and(|e| self.ranges == [(0, e)])
    }
}

pub struct Reassembly {
    list: Vec<Datagram>,
    bytes: usize,
    tally: Tally,
}

impl Default for Reassembly {
    fn default() -> Self {
        Reassembly::new()
    }
}

impl Reassembly {
    pub fn new() -> Reassembly {
        Reassembly {
            list: Vec::new(),
            bytes: 0,
            tally: Tally::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Datagrams in progress.
    pub fn datagrams(&self) -> usize {
        self.list.len()
    }

    /// Bytes buffered (headers and payloads).
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }

    /// Fragment frames held (not yet merged or dropped).
    pub fn held_frames(&self) -> u64 {
        self.list.iter().map(|d| d.frames).sum()
    }

    /// Frames counted since the last call.
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }

    fn remove(&mut self, i: usize) -> Datagram {
        let d = self.list.swap_remove(i);
        self.bytes -= d.bytes();
        d
    }

    /// Drop datagrams older than TIMEOUT_NS.
    pub fn expire(&mut self, now: u64) {
        let mut i = 0;
        while i < self.list.len() {
            if now.saturating_sub(self.list[i].born) >= TIMEOUT_NS {
                let d = self.remove(i);
                self.tally.timeout += d.frames;
            } else {
                i += 1;
            }
        }
    }

    /// One fragment frame (Ethernet first; its IPv4 header checksum and
    /// options were checked by `classify`). Returns the reassembled frame
    /// when this fragment completes its datagram.
    pub fn push(&mut self, frame: &[u8], now: u64) -> Option<Vec<u8>> {
        self.expire(now);
        let Some((key, hl, off, payload, more)) = parse(frame) else {
            self.tally.malformed += 1;
            return None;
        };
        let (start, stop) = (off, off + payload.len());
        if let Some(i) = self.list.iter().position(|d| d.key == key) {
            let d = &self.list[i];
            // An exact duplicate goes alone; any other overlap, a length
            // that disagrees with the last fragment, or one fragment too
            // many takes the datagram with it.
            if d.ranges.contains(&(start, stop)) {
                self.tally.overlap += 1;
                return None;
            }
            let overlaps = d.ranges.iter().any(|&(a, b)| start < b && a < stop);
            let bad_end = match (more, d.end) {
                (false, Some(e)) => e != stop,
                (false, None) => d.ranges.iter().any(|&(_, b)| b > stop),
                (true, Some(e)) => stop > e,
                (true, None) => false,
            };
            if overlaps || bad_end {
                let d = self.remove(i);
                self.tally.overlap += d.frames + 1;
                return None;
            }
            if d.frames as usize >= MAX_FRAGS {
                let d = self.remove(i);
                self.tally.too_many += d.frames + 1;
                return None;
            }
        }
        // Room: the oldest other datagrams go (Linux evicts likewise).
        loop {
            let pos = self.list.iter().position(|d| d.key == key);
            let have = pos.map_or(0, |i| self.list[i].data.len());
            let grow = stop.saturating_sub(have) + if off == 0 { ETH_HDR + hl } else { 0 };
            let full = pos.is_none() && self.list.len() >= MAX_DATAGRAMS;
            if !full && self.bytes + grow <= MAX_BYTES {
                break;
            }
            let Some(j) = (0..self.list.len())
                .filter(|&j| self.list[j].key != key)
                .min_by_key(|&j| self.list[j].born)
            else {
                break;
            };
            let d = self.remove(j);
            self.tally.too_many += d.frames;
        }
        let i = match self.list.iter().position(|d| d.key == key) {
            Some(i) => i,
            None => {
                self.list.push(Datagram {
                    key,
                    born: now,
                    head: Vec::new(),
                    data: Vec::new(),
                    ranges: Vec::new(),
                    end: None,
                    frames: 0,
                });
                self.list.len() - 1
            }
        };
        let d = &mut self.list[i];
        let before = d.bytes();
        if off == 0 {
            d.head = frame[..ETH_HDR + hl].to_vec();
        }
        if d.data.len() < stop {
            d.data.reserve_exact(stop - d.data.len());
            d.data.resize(stop, 0);
        }
        d.data[start..stop].copy_from_slice(payload);
        if !more {
            d.end = Some(stop);
        }
        let at = d.ranges.partition_point(|&(a, _)| a < start);
        d.ranges.insert(at, (start, stop));
        // Merge touching neighbours.
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(d.ranges.len());
        for &(a, b) in &d.ranges {
            match merged.last_mut() {
                Some(last) if last.1 == a => last.1 = b,
                _ => merged.push((a, b)),
            }
        }
        d.ranges = merged;
        d.frames += 1;
        self.bytes += d.bytes() - before;
        if !self.list[i].complete() {
            return None;
        }
        let d = self.remove(i);
        self.tally.merged += d.frames;
        let end = d.end.expect("complete");
        let mut out = d.head;
        out.extend_from_slice(&d.data[..end]);
        let ip = &mut out[ETH_HDR..];
        let total = (hl + end) as u16;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[6] &= 0x40; // keep DF, clear MF and the offset
        ip[7] = 0;
        ip[10] = 0;
        ip[11] = 0;
        let sum = !checksum::fold(checksum::accumulate(0, &ip[..hl]));
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        Some(out)
    }
}

/// (key, IP header length, payload offset, payload, more fragments), or
/// `None` for a fragment that cannot be reassembled: not TCP, a non-last
/// fragment whose length is not a multiple of 8, or an end beyond what an
/// IPv4 datagram can hold.
fn parse(frame: &[u8]) -> Option<(Key, usize, usize, &[u8], bool)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.protocol() != super::classify::PROTO_TCP || !ip.is_fragment() {
        return None;
    }
    let hl = ip.header_len();
    let off = usize::from(ip.frag_offset());
    let total = usize::from(ip.total_len());
    // The payload out of the frame itself (the views borrow locals).
    let payload = frame.get(ETH_HDR + hl..ETH_HDR + total)?;
    let more = ip.more_fragments();
    if payload.is_empty() || (more && !payload.len().is_multiple_of(8)) {
        return None;
    }
    if hl + off + payload.len() > usize::from(u16::MAX) {
        return None;
    }
    let b = eth.payload();
    let key = Key {
        src: [b[12], b[13], b[14], b[15]],
        dst: [b[16], b[17], b[18], b[19]],
        id: ip.ident(),
        proto: ip.protocol(),
    };
    Some((key, hl, off, payload, more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nanowire_wire::Ipv4Repr;
    use std::net::Ipv4Addr;

    /// A TCP-ish IPv4 datagram of `len` payload bytes cut into fragments of
    /// `step` bytes (a multiple of 8), as Ethernet frames.
    fn fragments(id: u16, len: usize, step: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + (i >> 8)) as u8).collect();
        let mut out = Vec::new();
        let mut off = 0;
        while off < len {
            let n = step.min(len - off);
            let more = off + n < len;
            let mut f = vec![0u8; ETH_HDR + 20 + n];
            f[12] = 0x08;
            let ip = Ipv4Repr {
                src: Ipv4Addr::new(198, 18, 0, 1),
                dst: Ipv4Addr::new(198, 18, 0, 2),
                protocol: 6,
                payload_len: n,
                ttl: 64,
                ident: id,
            };
            ip.emit_fragment(&mut f[ETH_HDR..], off, more);
            f[ETH_HDR + 20..].copy_from_slice(&payload[off..off + n]);
            out.push(f);
            off += n;
        }
        (payload, out)
    }

    fn check_whole(frame: &[u8], payload: &[u8]) {
        let ip = Ipv4Packet::new_checked(&frame[ETH_HDR..]).unwrap();
        assert!(ip.verify_checksum());
        assert!(!ip.is_fragment());
        assert_eq!(ip.payload(), payload);
    }

    /// Push the fragments of `f` in `order` at `at`: each but the last
    /// completes nothing, the last completes the datagram `p`.
    fn reassembles(r: &mut Reassembly, f: &[Vec<u8>], order: &[usize], at: u64, p: &[u8]) {
        let (last, before) = order.split_last().unwrap();
        for &k in before {
            assert!(r.push(&f[k], at).is_none(), "fragment {k} completed it");
        }
        check_whole(&r.push(&f[*last], at).unwrap(), p);
    }

    #[test]
    fn in_order_out_of_order_and_interleaved() {
        let mut r = Reassembly::new();
        let (p, f) = fragments(1, 3000, 1000);
        reassembles(&mut r, &f, &[0, 1, 2], 0, &p);
        assert!(r.is_empty());
        assert_eq!(r.take_tally().merged, 3);
        // Last first, then the middle, then the first.
        let (p, f) = fragments(2, 2500, 800);
        reassembles(&mut r, &f, &[3, 1, 2, 0], 1, &p);
        // Two datagrams interleaved.
        let (pa, fa) = fragments(3, 1600, 800);
        let (pb, fb) = fragments(4, 1600, 800);
        assert!(r.push(&fa[0], 2).is_none());
        assert!(r.push(&fb[1], 2).is_none());
        check_whole(&r.push(&fa[1], 2).unwrap(), &pa);
        check_whole(&r.push(&fb[0], 2).unwrap(), &pb);
        assert_eq!(r.take_tally().merged, 8);
        assert!(r.is_empty() && r.bytes == 0);
    }

    #[test]
    fn duplicates_overlaps_timeouts_and_bounds_are_counted() {
        let mut r = Reassembly::new();
        // An exact duplicate goes alone.
        let (p, f) = fragments(1, 2400, 800);
        reassembles(&mut r, &f, &[0, 0, 1, 2], 0, &p);
        assert_eq!(
            r.take_tally(),
            Tally {
                merged: 3,
                overlap: 1,
                ..Tally::default()
            }
        );
        // An overlap (another cut of the same datagram) drops it whole.
        let (_, f) = fragments(2, 2400, 800);
        let (_, g) = fragments(2, 2400, 1200);
        assert!(r.push(&f[0], 0).is_none());
        assert!(r.push(&g[0], 0).is_none());
        assert!(r.push(&f[2], 0).is_none()); // starts a new datagram
        assert_eq!(r.take_tally().overlap, 2);
        // It times out.
        r.expire(TIMEOUT_NS - 1);
        assert!(!r.is_empty());
        r.expire(TIMEOUT_NS);
        assert!(r.is_empty() && r.bytes == 0);
        assert_eq!(r.take_tally().timeout, 1);
        // More datagrams than allowed: the oldest go.
        for id in 0..(MAX_DATAGRAMS as u16 + 5) {
            let (_, f) = fragments(100 + id, 1600, 800);
            assert!(r.push(&f[0], u64::from(id)).is_none());
        }
        assert_eq!(r.list.len(), MAX_DATAGRAMS);
        assert_eq!(r.take_tally().too_many, 5);
        assert!(r.bytes <= MAX_BYTES);
        // Too many fragments in one datagram.
        let mut r = Reassembly::new();
        let (_, f) = fragments(7, 8 * (2 * MAX_FRAGS + 4), 8);
        // Every other one, so that nothing merges.
        for k in (0..f.len()).step_by(2).take(MAX_FRAGS + 1) {
            r.push(&f[k], 0);
        }
        assert_eq!(r.take_tally().too_many, MAX_FRAGS as u64 + 1);
        assert!(r.is_empty());
    }

    #[test]
    fn malformed_fragments_and_garbage_never_panic() {
        let mut r = Reassembly::new();
        let (_, f) = fragments(9, 1000, 804); // a non-last length not a multiple of 8
        assert!(r.push(&f[0], 0).is_none());
        assert_eq!(r.take_tally().malformed, 1);
        let mut x: u64 = 0x1234_5678;
        for n in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (_, mut f) = fragments(
                (x >> 48) as u16 & 7,
                64 + (x as usize % 3000),
                16 * (1 + (x as usize >> 20) % 100),
            );
            let k = (x as usize >> 8) % f.len();
            let frame = &mut f[k];
            let i = (x as usize >> 32) % frame.len();
            frame[i] ^= (x >> 24) as u8;
            let _ = r.push(frame, n * 1_000_000);
            assert!(r.list.len() <= MAX_DATAGRAMS && r.bytes <= MAX_BYTES);
        }
    }
}
