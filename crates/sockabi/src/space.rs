//! Is an address range user memory the call may copy to or from?
//!
//! The kernel answers EFAULT when a copy from or to user memory faults;
//! a user-space engine that copied blindly would die of SIGSEGV instead.
//! [`UserSpace::access_ok`] is the kernel's cheap range check;
//! [`Maps`] reads `/proc/self/maps` text to say whether a range is mapped
//! with the access a copy needs; [`RangeCache`] remembers the mappings a
//! thread's buffers were found in, so that the check costs a few compares
//! on the hot path (the shim invalidates it when the process unmaps or
//! re-protects memory).

/// What a copy needs of the caller's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The kernel would copy from it (send).
    Read,
    /// The kernel would copy to it (receive).
    Write,
}

impl Access {
    fn bit(self) -> u8 {
        match self {
            Access::Read => 1,
            Access::Write => 2,
        }
    }
}

/// The user part of the address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserSpace {
    /// One past the highest user address.
    pub top: usize,
}

impl UserSpace {
    /// x86-64 with 4-level page tables (`TASK_SIZE_MAX`).
    pub const X86_64_4LEVEL: UserSpace = UserSpace {
        top: 0x7fff_ffff_f000,
    };
    /// x86-64 with 5-level page tables.
    pub const X86_64_5LEVEL: UserSpace = UserSpace {
        top: 0x00ff_ffff_ffff_f000,
    };
    /// The widest 64-bit user space (a bound that never refuses a valid
    /// address on any 64-bit Linux).
    pub const LINUX_64: UserSpace = UserSpace { top: 1 << 56 };

    /// The user space of an x86-64 process whose stack is at `stack`: 5-level
    /// page tables put the stack above the 4-level limit.
    pub fn x86_64_for_stack(stack: usize) -> UserSpace {
        if stack >= Self::X86_64_4LEVEL.top {
            Self::X86_64_5LEVEL
        } else {
            Self::X86_64_4LEVEL
        }
    }

    /// The kernel's `access_ok(base, len)`: the range does not wrap and
    /// ends in user space. A null base passes (the copy decides).
    pub fn access_ok(&self, base: usize, len: usize) -> bool {
        match base.checked_add(len) {
            Some(end) => end <= self.top,
            None => false,
        }
    }
}

/// One line of `/proc/self/maps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: usize,
    pub end: usize,
    pub read: bool,
    pub write: bool,
}

impl Vma {
    fn allows(&self, a: Access) -> bool {
        match a {
            Access::Read => self.read,
            Access::Write => self.write,
        }
    }
}

fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0usize;
    for &c in s {
        let d = (c as char).to_digit(16)?;
        v = v << 4 | d as usize;
    }
    Some(v)
}

/// Parse `start-end perms ...` (`None` for anything else).
pub fn parse_line(line: &[u8]) -> Option<Vma> {
    let mut f = line.split(|&c| c == b' ').filter(|f| !f.is_empty());
    let range = f.next()?;
    let perms = f.next()?;
    let dash = range.iter().position(|&c| c == b'-')?;
    let start = hex(&range[..dash])?;
    let end = hex(&range[dash + 1..])?;
    if end <= start || perms.len() < 2 {
        return None;
    }
    Some(Vma {
        start,
        end,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
    })
}

/// The text of `/proc/self/maps` (lines in address order).
pub struct Maps<'a>(pub &'a [u8]);

/// What [`covering_by`] asks of each address: the mapping that contains
/// it (the kernel's PROCMAP_QUERY answers that without the text of
/// `/proc/self/maps`), `None` if none does.
pub type Query<'q> = &'q mut dyn FnMut(usize) -> Option<Vma>;

/// [`Maps::covering`] asked one mapping at a time: the run of adjacent
/// mappings that allow `a` from the one containing `base` through the end
/// of `[base, base + len)` (`len` 0 counts as 1 byte), extended over up to
/// `MORE` further adjacent ones (a growing heap), or `None` if some byte
/// is unmapped or lacks the access. At most `base`'s mapping, the ones the
/// range spans and `MORE` more are asked for.
pub fn covering_by(base: usize, len: usize, a: Access, query: Query) -> Option<(usize, usize)> {
    const MORE: usize = 4;
    let end = base.checked_add(len.max(1))?;
    let first = query(base).filter(|v| v.start <= base && base < v.end && v.allows(a))?;
    let (start, mut stop) = (first.start, first.end);
    while stop < end {
        let v = query(stop).filter(|v| v.start == stop && v.end > stop && v.allows(a))?;
        stop = v.end;
    }
    for _ in 0..MORE {
        match query(stop) {
            Some(v) if v.start == stop && v.end > stop && v.allows(a) => stop = v.end,
            _ => break,
        }
    }
    Some((start, stop))
}

impl Maps<'_> {
    pub fn vmas(&self) -> impl Iterator<Item = Vma> + '_ {
        self.0.split(|&c| c == b'\n').filter_map(parse_line)
    }

    /// The largest run of adjacent mappings that allow `a` and contain
    /// `[base, base + len)` (`len` 0 counts as 1 byte), or `None` if some
    /// byte of the range is unmapped or lacks the access.
    pub fn covering(&self, base: usize, len: usize, a: Access) -> Option<(usize, usize)> {
        let end = base.checked_add(len.max(1))?;
        let mut run: Option<(usize, usize)> = None;
        let mut covered = false;
        for v in self.vmas() {
            let adjacent = run.is_some_and(|(_, e)| e == v.start);
            if covered {
                // Extend the answer over adjacent mappings (a growing heap).
                if !adjacent || !v.allows(a) {
                    break;
                }
            } else if v.start >= end {
                return None;
            }
            if !v.allows(a) {
                run = None;
                continue;
            }
            run = match run {
                Some((s, _)) if adjacent => Some((s, v.end)),
                _ => Some((v.start, v.end)),
            };
            covered = run.is_some_and(|(s, e)| s <= base && e >= end);
        }
        if covered { run } else { None }
    }
}

/// A thread's memory of mappings its buffers were found in, valid while
/// the process's mapping epoch (bumped by munmap/mprotect) is unchanged.
#[derive(Clone, Debug, Default)]
pub struct RangeCache {
    ent: [(usize, usize, u8); 8],
    next: usize,
    epoch: u64,
    /// The last set of ranges [`RangeCache::hit_all`] found, per access
    /// (read, write): a program that sends from and receives into the same
    /// buffers call after call is answered by a few compares.
    memo: [Memo; 2],
}

/// Ranges all found at `epoch` (`n` of them; n == 0: none remembered).
#[derive(Clone, Copy, Debug, Default)]
struct Memo {
    epoch: u64,
    n: usize,
    r: [(usize, usize); MEMO_RANGES],
}

/// Ranges of one call a memo holds (buffer, address, address length).
const MEMO_RANGES: usize = 3;

impl RangeCache {
    pub const fn new() -> RangeCache {
        RangeCache {
            ent: [(0, 0, 0); 8],
            next: 0,
            epoch: 0,
            memo: [Memo {
                epoch: 0,
                n: 0,
                r: [(0, 0); MEMO_RANGES],
            }; 2],
        }
    }

    /// Are all of `ranges` (base, len; a zero length always is) inside
    /// remembered mappings with access `a` at `epoch`? As [`RangeCache::hit`]
    /// for each, with the last set found per access remembered: the same
    /// ranges again at the same epoch are found by comparing them (a
    /// mapping found at an epoch stays so until the epoch changes, whether
    /// or not its entry was since replaced by another).
    #[inline(always)]
    pub fn hit_all<const N: usize>(
        &mut self,
        epoch: u64,
        ranges: &[(usize, usize); N],
        a: Access,
    ) -> bool {
        let m = &self.memo[usize::from(a.bit() >> 1)];
        if N <= MEMO_RANGES && m.n == N && m.epoch == epoch && m.r[..N] == ranges[..] {
            return true;
        }
        self.hit_all_slow(epoch, ranges, a)
    }

    #[inline(never)]
    fn hit_all_slow(&mut self, epoch: u64, ranges: &[(usize, usize)], a: Access) -> bool {
        if !ranges
            .iter()
            .all(|&(base, len)| len == 0 || self.hit(epoch, base, len, a))
        {
            return false;
        }
        if (1..=MEMO_RANGES).contains(&ranges.len()) {
            let m = &mut self.memo[usize::from(a.bit() >> 1)];
            m.epoch = epoch;
            m.n = ranges.len();
            m.r[..ranges.len()].copy_from_slice(ranges);
        }
        true
    }

    /// Is `[base, base+len)` inside a remembered mapping with access `a`
    /// (and the epoch still `epoch`)?
    #[inline]
    pub fn hit(&self, epoch: u64, base: usize, len: usize, a: Access) -> bool {
        self.covering(epoch, base, len, a).is_some()
    }

    /// The mapping epoch the remembered ranges hold at (0: none yet).
    #[inline(always)]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The mappings changed only in `changed` (start, end) between this
    /// cache's epoch and `epoch` (each munmap/mprotect since, in any
    /// order): the remembered ranges that overlap none of them still hold
    /// and are kept, at `epoch`; the others, and the memos, are forgotten.
    /// A range is a whole run of mappings, so a change anywhere in it
    /// forgets all of it.
    pub fn catch_up(&mut self, epoch: u64, changed: &[(usize, usize)]) {
        for x in &mut self.ent {
            if changed.iter().any(|&(s, e)| s < x.1 && x.0 < e) {
                *x = (0, 0, 0);
            }
        }
        self.memo = [Memo::default(); 2];
        self.epoch = epoch;
    }

    /// The remembered range (start, end) with access `a` at `epoch` that
    /// holds `[base, base+len)`, if any.
    pub fn covering(
        &self,
        epoch: u64,
        base: usize,
        len: usize,
        a: Access,
    ) -> Option<(usize, usize)> {
        if epoch != self.epoch {
            return None;
        }
        let end = base.checked_add(len)?;
        let b = a.bit();
        self.ent
            .iter()
            .find(|&&(s, e, bits)| bits & b != 0 && s <= base && end <= e && s < e)
            .map(|&(s, e, _)| (s, e))
    }

    /// Remember `[start, end)` as allowing `a` at `epoch` (a new epoch
    /// forgets everything remembered before).
    pub fn insert(&mut self, epoch: u64, start: usize, end: usize, a: Access) {
        if epoch != self.epoch {
            self.ent = [(0, 0, 0); 8];
            self.epoch = epoch;
            self.next = 0;
        }
        if let Some(x) = self.ent.iter_mut().find(|x| x.0 == start && x.1 == end) {
            x.2 |= a.bit();
            return;
        }
        self.ent[self.next] = (start, end, a.bit());
        self.next = (self.next + 1) % self.ent.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`covering_by`] over a list of mappings, counting the questions.
    fn by_list(
        vmas: &[Vma],
        base: usize,
        len: usize,
        a: Access,
    ) -> (Option<(usize, usize)>, usize) {
        let mut asked = 0;
        let mut q = |at: usize| {
            asked += 1;
            vmas.iter().copied().find(|v| v.start <= at && at < v.end)
        };
        (covering_by(base, len, a, &mut q), asked)
    }

    #[test]
    fn covering_by_query_agrees_with_the_text() {
        let rw = |start, end| Vma {
            start,
            end,
            read: true,
            write: true,
        };
        let ro = |start, end| Vma {
            start,
            end,
            read: true,
            write: false,
        };
        // A heap in three adjacent pieces, a hole, a read-only mapping.
        let vmas = [
            rw(0x1000, 0x3000),
            rw(0x3000, 0x5000),
            rw(0x5000, 0x6000),
            ro(0x8000, 0x9000),
        ];
        // Inside one piece: the run through the adjacent ones.
        assert_eq!(
            by_list(&vmas, 0x1100, 0x10, Access::Write).0,
            Some((0x1000, 0x6000))
        );
        // Across two pieces.
        assert_eq!(
            by_list(&vmas, 0x2f00, 0x200, Access::Write).0,
            Some((0x1000, 0x6000))
        );
        // Into the hole, out of user-mapped memory, read-only for a write.
        assert_eq!(by_list(&vmas, 0x5f00, 0x200, Access::Read).0, None);
        assert_eq!(by_list(&vmas, 0x7000, 1, Access::Read).0, None);
        assert_eq!(by_list(&vmas, 0x8100, 4, Access::Write).0, None);
        assert_eq!(
            by_list(&vmas, 0x8100, 4, Access::Read).0,
            Some((0x8000, 0x9000))
        );
        // A range that wraps.
        assert_eq!(by_list(&vmas, usize::MAX, 2, Access::Read).0, None);
        // Every answer is one the text gives too (its run may start lower).
        let text = "0000000000001000-0000000000003000 rw-p 00000000 00:00 0\n\
                    0000000000003000-0000000000005000 rw-p 00000000 00:00 0\n\
                    0000000000005000-0000000000006000 rw-p 00000000 00:00 0\n\
                    0000000000008000-0000000000009000 r--p 00000000 00:00 0\n";
        for (base, len, a) in [
            (0x1100, 0x10, Access::Write),
            (0x2f00, 0x200, Access::Write),
            (0x8100, 4, Access::Read),
        ] {
            assert_eq!(
                Maps(text.as_bytes()).covering(base, len, a),
                by_list(&vmas, base, len, a).0
            );
        }
        // Bounded questions on a long run of adjacent pieces.
        let many: Vec<Vma> = (0..100)
            .map(|i| rw(0x1000 * (i + 1), 0x1000 * (i + 2)))
            .collect();
        let (r, asked) = by_list(&many, 0x1100, 0x10, Access::Read);
        assert_eq!(r, Some((0x1000, 0x6000)));
        assert_eq!(asked, 5);
    }

    #[test]
    fn hit_all_remembers_the_last_set_per_access_and_epoch() {
        let mut c = RangeCache::new();
        c.insert(5, 0x1000, 0x3000, Access::Write);
        let set = [(0x1000, 16), (0x2000, 0), (0x2ff0, 16)];
        assert!(c.hit_all(5, &set, Access::Write));
        assert!(c.hit_all(5, &set, Access::Write), "memo");
        assert!(!c.hit_all(5, &set, Access::Read), "other access");
        assert!(!c.hit_all(6, &set, Access::Write), "new epoch");
        assert!(
            !c.hit_all(5, &[(0x2ff0, 17)], Access::Write),
            "past the end"
        );
        // The memo of epoch 5 does not answer for epoch 6 after a refill.
        c.insert(6, 0x1000, 0x2000, Access::Write);
        assert!(!c.hit_all(6, &set, Access::Write));
        assert!(c.hit_all(6, &[(0x1000, 16)], Access::Write));
        // Zero-length ranges anywhere; an empty set.
        assert!(c.hit_all(6, &[(0, 0)], Access::Write));
        assert!(c.hit_all(6, &[], Access::Write));
    }

    const MAPS: &[u8] = b"\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
00651000-00652000 r--p 00051000 08:02 173521      /usr/bin/dbus-daemon
00652000-00655000 rw-p 00052000 08:02 173521      /usr/bin/dbus-daemon
00e03000-00e24000 rw-p 00000000 00:00 0           [heap]
00e24000-011f7000 rw-p 00000000 00:00 0           [heap]
7f0000000000-7f0000001000 ---p 00000000 00:00 0
7fff2a000000-7fff2a021000 rw-p 00000000 00:00 0   [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]
";

    #[test]
    fn access_ok_is_the_kernels_range_check() {
        let s = UserSpace::LINUX_64;
        assert!(s.access_ok(0, 100));
        assert!(s.access_ok(0x1000, 1 << 40));
        assert!(!s.access_ok(usize::MAX, 2));
        assert!(!s.access_ok(1 << 63, 0));
        assert!(s.access_ok(0x1000, 0));
        let x = UserSpace::x86_64_for_stack(0x7ffd_1234_0000);
        assert_eq!(x, UserSpace::X86_64_4LEVEL);
        // A terabyte from a stack address runs past TASK_SIZE_MAX.
        assert!(!x.access_ok(0x7ffd_1234_0000, 1 << 40));
        assert!(x.access_ok(0x5555_0000_0000, 1 << 40));
        assert_eq!(
            UserSpace::x86_64_for_stack(0xff_fffe_0000_0000),
            UserSpace::X86_64_5LEVEL
        );
    }

    #[test]
    fn lines_parse_with_permissions() {
        let v: Vec<Vma> = Maps(MAPS).vmas().collect();
        assert_eq!(v.len(), 8);
        assert_eq!(
            v[1],
            Vma {
                start: 0x651000,
                end: 0x652000,
                read: true,
                write: false
            }
        );
        assert!(parse_line(b"garbage").is_none());
        assert!(parse_line(b"10-5 rw-p").is_none());
        assert!(parse_line(b"zz-ff rw-p").is_none());
    }

    #[test]
    fn covering_joins_adjacent_mappings_and_needs_the_access() {
        let m = Maps(MAPS);
        // Across the two [heap] mappings.
        assert_eq!(
            m.covering(0xe23ff0, 0x100, Access::Write),
            Some((0xe03000, 0x11f7000))
        );
        // Read-only data: readable, not writable.
        assert!(m.covering(0x651000, 16, Access::Read).is_some());
        assert_eq!(m.covering(0x651000, 16, Access::Write), None);
        // A guard page and unmapped memory.
        assert_eq!(m.covering(0x7f0000000000, 1, Access::Read), None);
        assert_eq!(m.covering(0, 100, Access::Write), None);
        assert_eq!(m.covering(0x11f7000, 1, Access::Write), None);
        // A range running off the end of a mapping into the next (r--).
        assert_eq!(m.covering(0x651ff0, 0x20, Access::Write), None);
        assert!(m.covering(0x651ff0, 0x20, Access::Read).is_some());
        assert_eq!(m.covering(usize::MAX, 2, Access::Read), None);
    }

    #[test]
    fn cache_hits_only_inside_remembered_ranges_of_the_same_epoch() {
        let mut c = RangeCache::new();
        assert!(!c.hit(0, 0x1000, 10, Access::Read));
        c.insert(1, 0x1000, 0x3000, Access::Write);
        assert!(c.hit(1, 0x1000, 0x2000, Access::Write));
        assert!(!c.hit(1, 0x1000, 0x2001, Access::Write));
        assert!(!c.hit(1, 0x1000, 10, Access::Read));
        assert!(!c.hit(2, 0x1000, 10, Access::Write));
        assert!(!c.hit(1, usize::MAX, 10, Access::Write));
        c.insert(1, 0x1000, 0x3000, Access::Read);
        assert!(c.hit(1, 0x1000, 10, Access::Read));
        c.insert(2, 0x9000, 0xa000, Access::Read);
        assert!(!c.hit(2, 0x1000, 10, Access::Read), "new epoch forgets");
        for i in 0..20 {
            c.insert(2, i << 20, (i << 20) + 10, Access::Read);
        }
        assert!(c.hit(2, 19 << 20, 10, Access::Read));
    }

    #[test]
    fn catching_up_forgets_only_the_ranges_a_change_touched() {
        let mut c = RangeCache::new();
        c.insert(3, 0x1000, 0x3000, Access::Write);
        c.insert(3, 0x5000, 0x6000, Access::Read);
        c.insert(3, 0x8000, 0x9000, Access::Read);
        assert!(c.hit_all(3, &[(0x1000, 16)], Access::Write));
        // Unmapped: a page inside the first run, and the page just past
        // the third (touching, not overlapping).
        c.catch_up(5, &[(0x2000, 0x2001), (0x9000, 0xa000)]);
        assert_eq!(c.epoch(), 5);
        assert!(!c.hit(5, 0x1000, 16, Access::Write), "changed inside");
        assert!(
            !c.hit_all(5, &[(0x1000, 16)], Access::Write),
            "memo forgotten"
        );
        assert!(c.hit(5, 0x5000, 0x1000, Access::Read), "untouched");
        assert!(c.hit(5, 0x8000, 0x1000, Access::Read), "adjacent change");
        assert!(!c.hit(3, 0x5000, 16, Access::Read), "the old epoch");
        // Nothing changed at all: everything kept.
        c.catch_up(6, &[]);
        assert!(c.hit(6, 0x5000, 16, Access::Read));
        // An entry forgotten is free for a new one.
        c.insert(6, 0x1000, 0x2000, Access::Write);
        assert!(c.hit(6, 0x1000, 16, Access::Write));
        assert_eq!(
            c.covering(6, 0x1800, 16, Access::Write),
            Some((0x1000, 0x2000))
        );
        assert_eq!(c.covering(6, 0x1800, 16, Access::Read), None);
        assert_eq!(c.covering(7, 0x1800, 16, Access::Write), None);
    }

    #[test]
    fn paths_with_spaces_and_blank_lines_parse() {
        let m = Maps(b"\n1000-2000 rw-p 00000000 00:00 0    /tmp/a file (deleted)\n\n");
        let v: Vec<Vma> = m.vmas().collect();
        assert_eq!(
            v,
            vec![Vma {
                start: 0x1000,
                end: 0x2000,
                read: true,
                write: true
            }]
        );
        assert_eq!(
            m.covering(0x1800, 0x800, Access::Write),
            Some((0x1000, 0x2000))
        );
        assert_eq!(m.covering(0x1800, 0x801, Access::Write), None);
    }

    #[test]
    fn zero_length_ranges_still_need_their_byte_mapped() {
        let m = Maps(MAPS);
        assert!(m.covering(0xe03000, 0, Access::Read).is_some());
        assert_eq!(m.covering(0x1000, 0, Access::Read), None);
    }
}
