//! A received segment's payload in one or several pieces.
//!
//! A multi-buffer AF_XDP packet (a GSO/GRO super-frame of up to 64 KiB)
//! arrives in up to a few dozen buffers. The stack copies such a payload
//! into the connection's receive ring piece by piece, straight out of the
//! buffers: it is never gathered into one contiguous copy first.

use nanowire_wire::checksum;

/// The bytes `[start, start + len)` of the concatenation of `head` and
/// `rest`.
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a> {
    head: &'a [u8],
    rest: &'a [&'a [u8]],
    start: usize,
    len: usize,
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    fn from(s: &'a [u8]) -> Payload<'a> {
        Payload {
            head: s,
            rest: &[],
            start: 0,
            len: s.len(),
        }
    }
}

impl<'a> Payload<'a> {
    /// `head` followed by every piece of `rest`.
    pub fn new(head: &'a [u8], rest: &'a [&'a [u8]]) -> Payload<'a> {
        let len = head.len() + rest.iter().map(|p| p.len()).sum::<usize>();
        Payload {
            head,
            rest,
            start: 0,
            len,
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Without its first `n` bytes.
    pub fn skip(self, n: usize) -> Payload<'a> {
        let n = n.min(self.len);
        Payload {
            start: self.start + n,
            len: self.len - n,
            ..self
        }
    }

    /// Its first `n` bytes at most.
    pub fn take(self, n: usize) -> Payload<'a> {
        Payload {
            len: self.len.min(n),
            ..self
        }
    }

    /// The payload's bytes, piece by piece, in order (no empty piece).
    pub fn chunks(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let (mut skip, mut left) = (self.start, self.len);
        std::iter::once(self.head)
            .chain(self.rest.iter().copied())
            .filter_map(move |p| {
                if left == 0 {
                    return None;
                }
                if skip >= p.len() {
                    skip -= p.len();
                    return None;
                }
                let s = &p[skip..];
                skip = 0;
                let s = &s[..s.len().min(left)];
                left -= s.len();
                Some(s)
            })
    }

    /// The bytes as one slice when they lie in one piece (every segment up
    /// to the MTU): the per-segment copies take it without the piece walk.
    #[inline]
    pub fn single(&self) -> Option<&'a [u8]> {
        self.rest
            .is_empty()
            .then(|| &self.head[self.start..self.start + self.len])
    }

    /// Copy into `out` (exactly `len` bytes long).
    #[inline]
    pub fn copy_to(&self, out: &mut [u8]) {
        match self.single() {
            Some(s) => out[..s.len()].copy_from_slice(s),
            None => self.copy_pieces(out),
        }
    }

    /// [`Payload::copy_to`] piece by piece.
    #[inline(never)]
    fn copy_pieces(&self, out: &mut [u8]) {
        let mut at = 0;
        for c in self.chunks() {
            out[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
    }

    /// The ones' complement sum of the bytes (as 16-bit big-endian words
    /// of the whole, whatever the pieces' lengths) added to `sum`.
    pub fn accumulate(&self, sum: u32) -> u32 {
        let mut s = sum;
        let mut odd = false;
        for c in self.chunks() {
            let part = u32::from(checksum::fold(checksum::accumulate(0, c)));
            // A piece that starts at an odd offset pairs its bytes the
            // other way round: its sum byte-swapped (RFC 1071 2(B)).
            let part = if odd {
                u32::from((part as u16).swap_bytes())
            } else {
                part
            };
            s = u32::from(checksum::fold(s + part));
            odd ^= c.len() % 2 == 1;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(p: &Payload) -> Vec<u8> {
        let mut v = vec![0u8; p.len()];
        p.copy_to(&mut v);
        v
    }

    #[test]
    fn pieces_skip_and_take_like_one_slice() {
        let whole: Vec<u8> = (0..100u8).collect();
        let rest: [&[u8]; 3] = [&whole[7..30], &whole[30..31], &whole[31..100]];
        let p = Payload::new(&whole[..7], &rest);
        assert_eq!(p.len(), 100);
        assert_eq!(flat(&p), whole);
        for a in [0, 1, 6, 7, 8, 30, 31, 50, 99, 100] {
            for n in [0, 1, 5, 23, 100] {
                let q = p.skip(a).take(n);
                let want = &whole[a..(a + n).min(100)];
                assert_eq!(flat(&q), want, "skip {a} take {n}");
                assert_eq!(q.len(), want.len());
                assert!(q.chunks().all(|c| !c.is_empty()));
            }
        }
    }

    #[test]
    fn one_piece_skips_takes_and_copies_like_its_slice() {
        let whole: Vec<u8> = (0..100u8).collect();
        let p = Payload::from(&whole[..]);
        for a in [0, 1, 50, 99, 100] {
            for n in [0, 1, 5, 100] {
                let q = p.skip(a).take(n);
                let want = &whole[a..(a + n).min(100)];
                assert_eq!(q.single(), Some(want), "skip {a} take {n}");
                assert_eq!(flat(&q), want, "skip {a} take {n}");
                let mut ring = crate::buffer::Ring::new(256);
                assert_eq!(ring.write_payload(0, &q), want.len());
                ring.commit(want.len());
                let mut back = vec![0u8; want.len()];
                assert_eq!(ring.peek(0, &mut back), want.len());
                assert_eq!(back, want);
            }
        }
        let rest: [&[u8]; 1] = [&whole[10..]];
        assert_eq!(Payload::new(&whole[..10], &rest).single(), None);
    }

    #[test]
    fn checksum_over_odd_pieces_is_the_checksum_of_the_whole() {
        let whole: Vec<u8> = (0..301u32).map(|i| (i * 37 + 11) as u8).collect();
        let want = checksum::fold(checksum::accumulate(0x1234, &whole));
        for cuts in [[1usize, 2, 3], [3, 100, 101], [2, 4, 300], [0, 150, 151]] {
            let rest: [&[u8]; 3] = [
                &whole[cuts[0]..cuts[1]],
                &whole[cuts[1]..cuts[2]],
                &whole[cuts[2]..],
            ];
            let p = Payload::new(&whole[..cuts[0]], &rest);
            assert_eq!(checksum::fold(p.accumulate(0x1234)), want, "cuts {cuts:?}");
        }
    }
}
