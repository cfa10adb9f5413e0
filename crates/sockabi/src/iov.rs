//! iovec arrays as the kernel imports them (`lib/iov_iter.c`,
//! `net/socket.c`): the count limit, the per-segment checks, the clamped
//! total, and the plan for scattering a datagram over the segments.

use crate::Errno;
use crate::space::UserSpace;

/// The kernel's limit on iovec entries per call (`UIO_MAXIOV`).
pub const UIO_MAXIOV: usize = 1024;

/// The most one read/write-family call moves (`MAX_RW_COUNT`: `INT_MAX`
/// rounded down to a page); longer totals are silently clamped.
pub const MAX_RW_COUNT: usize = (i32::MAX as usize) & !4095;

/// The largest UDP payload over IPv4 (65535 - 20 - 8).
pub const UDP_MAX_PAYLOAD: usize = 65507;

/// One iovec as numbers: `iov_base` as an address, `iov_len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Seg {
    pub base: usize,
    pub len: usize,
}

/// Which family of call imports the array: the errno for too many
/// entries differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// sendmsg/recvmsg/sendmmsg/recvmmsg: `__copy_msghdr` says EMSGSIZE.
    Msg,
    /// readv/writev: `iovec_from_user` says EINVAL.
    Vec,
}

/// The count check, made before the array is read at all. `n` is the
/// caller's count as the kernel sees it (readv's negative `int` becomes a
/// huge unsigned number, as there).
pub fn check_count(n: usize, call: Call) -> Result<(), Errno> {
    if n > UIO_MAXIOV {
        return Err(match call {
            Call::Msg => libc::EMSGSIZE,
            Call::Vec => libc::EINVAL,
        });
    }
    Ok(())
}

/// `import_iovec` over an array the caller could read: every length must
/// be non-negative as a `ssize_t` (EINVAL, checked over the whole array
/// first, as the kernel copies it), every range must lie in user space
/// (EFAULT). Returns the total, clamped to [`MAX_RW_COUNT`].
pub fn import<I>(segs: I, space: &UserSpace) -> Result<usize, Errno>
where
    I: IntoIterator<Item = Seg>,
    I::IntoIter: Clone,
{
    let segs = segs.into_iter();
    if segs.clone().any(|s| s.len > isize::MAX as usize) {
        return Err(libc::EINVAL);
    }
    let mut total = 0usize;
    for s in segs {
        if !space.access_ok(s.base, s.len) {
            return Err(libc::EFAULT);
        }
        total += s.len.min(MAX_RW_COUNT - total);
    }
    Ok(total)
}

/// The segments' lengths as the kernel clamps them (the first ones keep
/// theirs; the one that crosses [`MAX_RW_COUNT`] is cut, later ones are 0).
pub fn clamped_lens(segs: &[Seg]) -> impl Iterator<Item = usize> + '_ {
    clamped_lens_of(segs.iter().copied())
}

/// [`clamped_lens`] over any sequence of segments.
pub fn clamped_lens_of(segs: impl IntoIterator<Item = Seg>) -> impl Iterator<Item = usize> {
    let mut total = 0usize;
    segs.into_iter().map(move |s| {
        let n = s.len.min(MAX_RW_COUNT - total);
        total += n;
        n
    })
}

/// One copy of a scatter: `len` bytes from `src_off` of the data into
/// segment `seg` (from its start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub seg: usize,
    pub src_off: usize,
    pub len: usize,
}

/// Where `n` bytes of data go over segments of lengths `lens`, in order,
/// skipping empty ones; stops when the data or the segments run out.
pub fn scatter(lens: impl IntoIterator<Item = usize>, n: usize) -> impl Iterator<Item = Piece> {
    let mut off = 0usize;
    lens.into_iter()
        .enumerate()
        .take_while(move |_| off < n)
        .filter_map(move |(seg, len)| {
            let k = len.min(n - off);
            let p = Piece {
                seg,
                src_off: off,
                len: k,
            };
            off += k;
            (k > 0).then_some(p)
        })
}

/// The chunks a stream send gathers the segments into: consecutive runs
/// of at most `chunk` bytes (a segment longer than `chunk` is split).
/// Each item is a list of pieces (`src_off` is the offset in the segment)
/// that together fill one chunk; nothing is allocated by the caller's
/// lengths beyond `chunk`.
pub fn gather_chunks(segs: &[Seg], chunk: usize) -> GatherChunks<'_> {
    GatherChunks {
        segs,
        seg: 0,
        off: 0,
        chunk: chunk.max(1),
    }
}

/// Iterator of [`gather_chunks`]: yields one chunk at a time as
/// (first segment, offset in it, bytes) triples through [`GatherChunks::next_chunk`].
pub struct GatherChunks<'a> {
    segs: &'a [Seg],
    seg: usize,
    off: usize,
    chunk: usize,
}

impl GatherChunks<'_> {
    /// The next chunk's pieces, pushed into `out` (cleared first; at most
    /// one entry per segment it touches). Returns the chunk's byte count
    /// (0: no more data).
    pub fn next_chunk(&mut self, out: &mut Vec<Piece>) -> usize {
        out.clear();
        let mut got = 0;
        while got < self.chunk && self.seg < self.segs.len() {
            let s = self.segs[self.seg];
            let left = s.len - self.off;
            if left == 0 {
                self.seg += 1;
                self.off = 0;
                continue;
            }
            let k = left.min(self.chunk - got);
            out.push(Piece {
                seg: self.seg,
                src_off: self.off,
                len: k,
            });
            got += k;
            self.off += k;
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SP: UserSpace = UserSpace::LINUX_64;

    fn seg(base: usize, len: usize) -> Seg {
        Seg { base, len }
    }

    #[test]
    fn count_limit_is_emsgsize_for_msg_and_einval_for_vec() {
        assert_eq!(check_count(1024, Call::Msg), Ok(()));
        assert_eq!(check_count(1025, Call::Msg), Err(libc::EMSGSIZE));
        assert_eq!(check_count(2000, Call::Vec), Err(libc::EINVAL));
        assert_eq!(check_count(0, Call::Vec), Ok(()));
        // readv(fd, iov, -1): the int seen as unsigned.
        assert_eq!(check_count(-1i64 as usize, Call::Vec), Err(libc::EINVAL));
    }

    #[test]
    fn negative_length_is_einval_even_after_a_bad_range() {
        let segs = [seg(usize::MAX - 10, 100), seg(0x1000, usize::MAX)];
        assert_eq!(import(segs, &SP), Err(libc::EINVAL));
    }

    #[test]
    fn range_past_user_space_is_efault() {
        assert_eq!(import([seg(usize::MAX - 10, 100)], &SP), Err(libc::EFAULT));
        assert_eq!(
            import([seg(0x1000, 0), seg(1 << 63, 1)], &SP),
            Err(libc::EFAULT)
        );
    }

    #[test]
    fn a_terabyte_segment_is_legal_and_clamped() {
        let t = import([seg(0x10000, 1 << 40)], &SP).unwrap();
        assert_eq!(t, MAX_RW_COUNT);
        let lens: Vec<usize> = clamped_lens(&[seg(0, 1 << 40), seg(0, 5)]).collect();
        assert_eq!(lens, vec![MAX_RW_COUNT, 0]);
    }

    #[test]
    fn null_base_passes_import_the_copy_decides() {
        // access_ok(NULL, n) is true: EFAULT comes when bytes are copied.
        assert_eq!(import([seg(0, 100)], &SP), Ok(100));
    }

    #[test]
    fn scatter_fills_segments_in_order_skipping_empty_ones() {
        let p: Vec<Piece> = scatter([3, 0, 4, 10], 9).collect();
        assert_eq!(
            p,
            vec![
                Piece {
                    seg: 0,
                    src_off: 0,
                    len: 3
                },
                Piece {
                    seg: 2,
                    src_off: 3,
                    len: 4
                },
                Piece {
                    seg: 3,
                    src_off: 7,
                    len: 2
                },
            ]
        );
        assert_eq!(scatter([5], 0).count(), 0);
        assert_eq!(scatter(Vec::<usize>::new(), 5).count(), 0);
        let total: usize = scatter([2, 2], 100).map(|p| p.len).sum();
        assert_eq!(total, 4);
    }

    #[test]
    fn gather_chunks_split_and_join_segments_within_the_bound() {
        let segs = [seg(0, 3), seg(0, 0), seg(0, 10), seg(0, 1)];
        let mut g = gather_chunks(&segs, 4);
        let mut out = Vec::new();
        let mut sizes = Vec::new();
        loop {
            let n = g.next_chunk(&mut out);
            if n == 0 {
                break;
            }
            assert!(n <= 4);
            assert_eq!(out.iter().map(|p| p.len).sum::<usize>(), n);
            sizes.push(n);
        }
        assert_eq!(sizes, vec![4, 4, 4, 2]);
        let big = [seg(0, 1 << 40)];
        let mut g = gather_chunks(&big, 1 << 16);
        assert_eq!(g.next_chunk(&mut out), 1 << 16);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn totals_clamp_across_many_segments() {
        let segs = vec![seg(0x1000, 1 << 30); 4];
        assert_eq!(import(segs.iter().copied(), &SP), Ok(MAX_RW_COUNT));
        let lens: Vec<usize> = clamped_lens(&segs).collect();
        assert_eq!(lens.iter().sum::<usize>(), MAX_RW_COUNT);
        assert_eq!(lens[3], 0);
    }

    #[test]
    fn empty_arrays_import_to_zero() {
        assert_eq!(import(std::iter::empty(), &SP), Ok(0));
        assert_eq!(import([seg(0, 0), seg(0, 0)], &SP), Ok(0));
        assert_eq!(scatter([0, 0], 10).count(), 0);
    }
}
