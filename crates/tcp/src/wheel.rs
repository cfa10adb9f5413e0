//! The stack's timer queue: one entry per connection (the earliest
//! deadline it armed), in a hierarchical timing wheel.
//!
//! Time is cut in ticks of 2^16 ns (65.5 µs); 8 levels of 64 slots cover
//! every u64 deadline (16 + 8 × 6 bits), a slot of level L spans 64^L
//! ticks. An entry is linked (an intrusive doubly linked list through
//! `nodes`, indexed by the connection's slot number) into the level of the
//! highest 6-bit digit in which its tick differs from the wheel's
//! (`elapsed`) and the slot of that digit; a slot of a level above 0 is
//! moved down (cascaded) when the wheel's time enters it. So arming,
//! re-arming and cancelling are O(1) (an unlink and a link, no stale
//! entry left behind as a heap's lazy deletion leaves one), and a
//! connection's timer is moved at most 7 times in its life (a TIME-WAIT's
//! 60 s: 3).
//!
//! Deadlines are kept exact: a level-0 slot (one tick) fires only the
//! entries whose deadline has come (the others stay for a later poll in
//! the same tick), so nothing fires early, and nothing fires later than
//! the first poll at or after its deadline, as with the heap. Every entry
//! of level 0 is earlier than every entry of level 1, and so on, and the
//! slots of a level are in time order from the wheel's digit on: the
//! earliest entry is in the first occupied slot of the lowest occupied
//! level, whose smallest deadline each slot keeps (`min`, lowered by a
//! link, recomputed when the slot is walked; an unlink leaves it as a
//! lower bound). `next` caches it for [`Wheel::next_deadline`] and the
//! poll's early return.

const TICK_SHIFT: u32 = 16;
const BITS: u32 = 6;
const SLOTS: usize = 1 << BITS;
const LEVELS: usize = 8;
const NIL: u32 = u32::MAX;
const UNLINKED: u16 = u16::MAX;

#[derive(Clone, Copy)]
struct Node {
    deadline: u64,
    prev: u32,
    next: u32,
    /// level * SLOTS + slot, or `UNLINKED`.
    bucket: u16,
}

const FREE: Node = Node {
    deadline: 0,
    prev: NIL,
    next: NIL,
    bucket: UNLINKED,
};

struct Level {
    /// Bit s: slot s holds entries.
    occupied: u64,
    head: [u32; SLOTS],
    /// A lower bound of the deadlines in each occupied slot (exact unless
    /// an entry was unlinked since the slot was last walked).
    min: [u64; SLOTS],
}

const EMPTY: Level = Level {
    occupied: 0,
    head: [NIL; SLOTS],
    min: [u64::MAX; SLOTS],
};

pub(crate) struct Wheel {
    nodes: Vec<Node>,
    levels: Box<[Level; LEVELS]>,
    /// The wheel's time, in ticks: every slot before it is empty.
    elapsed: u64,
    /// At or below every armed deadline (`u64::MAX`: none armed).
    next: u64,
    len: usize,
}

impl Wheel {
    pub(crate) fn new(capacity: usize) -> Wheel {
        Wheel {
            nodes: Vec::with_capacity(capacity),
            levels: Box::new([EMPTY; LEVELS]),
            elapsed: 0,
            next: u64::MAX,
            len: 0,
        }
    }

    /// Entries armed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The deadline `idx` is armed at.
    #[cfg(test)]
    pub(crate) fn armed(&self, idx: u32) -> Option<u64> {
        self.nodes
            .get(idx as usize)
            .filter(|n| n.bucket != UNLINKED)
            .map(|n| n.deadline)
    }

    /// At or before the earliest armed deadline (early only after a
    /// cancel: never late).
    #[inline]
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        (self.len > 0).then_some(self.next)
    }

    /// Arm `idx` at `deadline`, replacing what it had armed.
    pub(crate) fn arm(&mut self, idx: u32, deadline: u64) {
        let i = idx as usize;
        if i >= self.nodes.len() {
            self.nodes.resize(i + 1, FREE);
        }
        if self.nodes[i].bucket == UNLINKED {
            self.len += 1;
        } else {
            self.unlink(idx);
        }
        self.link(idx, deadline);
        self.next = self.next.min(deadline);
    }

    /// Disarm `idx` (nothing if it is not armed).
    pub(crate) fn cancel(&mut self, idx: u32) {
        let Some(n) = self.nodes.get(idx as usize).copied() else {
            return;
        };
        if n.bucket == UNLINKED {
            return;
        }
        self.unlink(idx);
        self.len -= 1;
        if n.deadline == self.next {
            self.next = self.first_min();
        }
    }

    /// May an entry be due at `now` (the poll's early return)?
    #[inline]
    pub(crate) fn is_due(&self, now: u64) -> bool {
        now >= self.next
    }

    /// Unlink every entry due at `now` into `out` as (deadline, idx), in
    /// no particular order.
    pub(crate) fn expire(&mut self, now: u64, out: &mut Vec<(u64, u32)>) {
        if !self.is_due(now) {
            return;
        }
        let now_t = now >> TICK_SHIFT;
        while let Some((l, s)) = self.first() {
            let shift = l as u32 * BITS;
            let block = !((1u64 << (shift + BITS)) - 1);
            let start = ((self.elapsed & block) | ((s as u64) << shift)).max(self.elapsed);
            if l == 0 {
                if self.levels[0].min[s] > now {
                    break;
                }
                self.elapsed = start;
                let mut i = self.levels[0].head[s];
                let mut rest = u64::MAX;
                while i != NIL {
                    let n = self.nodes[i as usize];
                    if n.deadline <= now {
                        self.unlink(i);
                        self.len -= 1;
                        out.push((n.deadline, i));
                    } else {
                        rest = rest.min(n.deadline);
                    }
                    i = n.next;
                }
                if self.levels[0].occupied & (1 << s) != 0 {
                    // Entries later in this tick: nothing after them is due.
                    self.levels[0].min[s] = rest;
                    break;
                }
            } else {
                if start > now_t {
                    break;
                }
                // The wheel's time enters the slot: its entries move down.
                self.elapsed = start;
                let lvl = &mut self.levels[l];
                let mut i = lvl.head[s];
                lvl.head[s] = NIL;
                lvl.occupied &= !(1 << s);
                while i != NIL {
                    let n = self.nodes[i as usize];
                    self.link(i, n.deadline);
                    i = n.next;
                }
            }
        }
        // Safe: every slot that starts at or before `now_t` was walked
        // above, or is the level-0 slot of `now_t` itself.
        self.elapsed = self.elapsed.max(now_t);
        self.next = self.first_min();
    }

    /// The first occupied slot of the lowest occupied level: it holds the
    /// earliest deadline.
    #[inline]
    fn first(&self) -> Option<(usize, usize)> {
        self.levels.iter().enumerate().find_map(|(l, lvl)| {
            (lvl.occupied != 0).then(|| {
                debug_assert_eq!(
                    lvl.occupied & ((1u64 << ((self.elapsed >> (l as u32 * BITS)) & 63)) - 1),
                    0,
                    "no slot before the wheel's time"
                );
                (l, lvl.occupied.trailing_zeros() as usize)
            })
        })
    }

    fn first_min(&self) -> u64 {
        self.first()
            .map_or(u64::MAX, |(l, s)| self.levels[l].min[s])
    }

    fn link(&mut self, idx: u32, deadline: u64) {
        let t = (deadline >> TICK_SHIFT).max(self.elapsed);
        let x = (t ^ self.elapsed) | (SLOTS as u64 - 1);
        let l = ((63 - x.leading_zeros()) / BITS) as usize;
        let s = ((t >> (l as u32 * BITS)) & (SLOTS as u64 - 1)) as usize;
        let lvl = &mut self.levels[l];
        let head = lvl.head[s];
        if lvl.occupied & (1 << s) == 0 {
            lvl.occupied |= 1 << s;
            lvl.min[s] = deadline;
        } else {
            lvl.min[s] = lvl.min[s].min(deadline);
        }
        lvl.head[s] = idx;
        if head != NIL {
            self.nodes[head as usize].prev = idx;
        }
        self.nodes[idx as usize] = Node {
            deadline,
            prev: NIL,
            next: head,
            bucket: (l * SLOTS + s) as u16,
        };
    }

    fn unlink(&mut self, idx: u32) {
        let n = self.nodes[idx as usize];
        let (l, s) = (n.bucket as usize / SLOTS, n.bucket as usize % SLOTS);
        if n.prev != NIL {
            self.nodes[n.prev as usize].next = n.next;
        } else {
            self.levels[l].head[s] = n.next;
            if n.next == NIL {
                self.levels[l].occupied &= !(1 << s);
            }
        }
        if n.next != NIL {
            self.nodes[n.next as usize].prev = n.prev;
        }
        self.nodes[idx as usize].bucket = UNLINKED;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    const TICK: u64 = 1 << TICK_SHIFT;

    /// A reference: the heap with lazy deletion the stack had, one live
    /// deadline per index.
    #[derive(Default)]
    struct Heap {
        heap: BinaryHeap<Reverse<(u64, u32)>>,
        armed: std::collections::HashMap<u32, u64>,
    }

    impl Heap {
        fn arm(&mut self, idx: u32, d: u64) {
            self.armed.insert(idx, d);
            self.heap.push(Reverse((d, idx)));
        }
        fn cancel(&mut self, idx: u32) {
            self.armed.remove(&idx);
        }
        fn next(&mut self) -> Option<u64> {
            while let Some(&Reverse((t, i))) = self.heap.peek() {
                if self.armed.get(&i) == Some(&t) {
                    return Some(t);
                }
                self.heap.pop();
            }
            None
        }
        fn expire(&mut self, now: u64) -> Vec<(u64, u32)> {
            let mut out = Vec::new();
            while let Some(t) = self.next()
                && t <= now
            {
                let Reverse((t, i)) = self.heap.pop().expect("peeked");
                self.armed.remove(&i);
                out.push((t, i));
            }
            out
        }
    }

    fn expire(w: &mut Wheel, now: u64) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        w.expire(now, &mut out);
        out.sort_unstable();
        out
    }

    /// xorshift: deterministic pseudo-random numbers.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn fires_at_the_deadline_never_before() {
        let mut w = Wheel::new(4);
        let t0 = 5 * TICK + 123;
        w.arm(1, t0 + 1_000);
        assert_eq!(w.next_deadline(), Some(t0 + 1_000));
        assert!(expire(&mut w, t0 + 999).is_empty());
        assert_eq!(w.next_deadline(), Some(t0 + 1_000));
        assert_eq!(expire(&mut w, t0 + 1_000), vec![(t0 + 1_000, 1)]);
        assert_eq!(w.next_deadline(), None);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn two_deadlines_in_one_tick_fire_apart() {
        let mut w = Wheel::new(4);
        let base = 1000 * TICK;
        w.arm(0, base + 10);
        w.arm(1, base + 20);
        assert!(expire(&mut w, base + 9).is_empty());
        assert_eq!(expire(&mut w, base + 15), vec![(base + 10, 0)]);
        assert_eq!(w.next_deadline(), Some(base + 20));
        assert!(expire(&mut w, base + 19).is_empty());
        assert_eq!(expire(&mut w, base + 20), vec![(base + 20, 1)]);
    }

    #[test]
    fn rearm_moves_the_one_entry_earlier_or_later() {
        let mut w = Wheel::new(4);
        w.arm(3, 10 * crate::NS_PER_S);
        w.arm(3, 5 * crate::NS_PER_S);
        assert_eq!(w.len(), 1);
        assert_eq!(w.next_deadline(), Some(5 * crate::NS_PER_S));
        w.arm(3, 7 * crate::NS_PER_S);
        assert_eq!(w.armed(3), Some(7 * crate::NS_PER_S));
        // The cache may be early after a move later, never late; a poll
        // at the early time fires nothing and makes it exact.
        let early = w.next_deadline().expect("armed");
        assert!(early <= 7 * crate::NS_PER_S);
        assert!(expire(&mut w, early).is_empty() || early == 7 * crate::NS_PER_S);
        assert!(expire(&mut w, 7 * crate::NS_PER_S - 1).is_empty());
        assert_eq!(w.next_deadline(), Some(7 * crate::NS_PER_S));
        assert_eq!(
            expire(&mut w, 8 * crate::NS_PER_S),
            vec![(7 * crate::NS_PER_S, 3)]
        );
    }

    #[test]
    fn cancel_leaves_nothing_behind() {
        let mut w = Wheel::new(4);
        w.arm(0, 100 * TICK);
        w.arm(1, 200 * TICK);
        w.cancel(0);
        w.cancel(0);
        w.cancel(9);
        assert_eq!(w.len(), 1);
        assert_eq!(w.next_deadline(), Some(200 * TICK));
        w.cancel(1);
        assert_eq!(w.next_deadline(), None);
        assert!(expire(&mut w, u64::MAX).is_empty());
    }

    #[test]
    fn far_deadlines_beyond_one_turn_of_every_level() {
        let mut w = Wheel::new(8);
        let now = 3 * crate::NS_PER_S;
        let far = [
            now + 60 * crate::NS_PER_S,       // TIME-WAIT
            now + 2 * 3600 * crate::NS_PER_S, // keepalive
            now + 40 * 24 * 3600 * crate::NS_PER_S,
            u64::MAX - 1,
            u64::MAX,
        ];
        for (i, &d) in far.iter().enumerate() {
            w.arm(i as u32, d);
        }
        assert_eq!(w.next_deadline(), Some(far[0]));
        for (i, &d) in far.iter().enumerate() {
            assert!(expire(&mut w, d - 1).is_empty(), "deadline {i} early");
            assert_eq!(w.next_deadline(), Some(d));
            assert_eq!(expire(&mut w, d), vec![(d, i as u32)]);
        }
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn a_deadline_in_the_past_fires_at_the_next_poll() {
        let mut w = Wheel::new(4);
        assert!(expire(&mut w, 50 * TICK).is_empty());
        w.arm(2, 10 * TICK);
        assert_eq!(w.next_deadline(), Some(10 * TICK));
        assert_eq!(expire(&mut w, 50 * TICK), vec![(10 * TICK, 2)]);
    }

    /// 20,000 connections in TIME-WAIT (one a millisecond over 20 s, each
    /// expiring 60 s after it entered), as a worker of the nginx row
    /// holds: each fires once, at its deadline, at the poll the heap
    /// fires it at.
    #[test]
    fn time_wait_expiry_of_many_connections() {
        let ms = crate::NS_PER_MS;
        let tw = 60 * crate::NS_PER_S;
        let mut w = Wheel::new(20_000);
        let mut h = Heap::default();
        let mut fired = 0;
        let mut now = 0;
        for i in 0..20_000u32 {
            now = u64::from(i) * ms + 17;
            assert_eq!(expire(&mut w, now), h.expire(now));
            w.arm(i, now + tw);
            h.arm(i, now + tw);
        }
        assert_eq!(w.len(), 20_000);
        while let Some(d) = h.next() {
            // The sleeper's schedule: poll at the next deadline.
            let n = w.next_deadline().expect("armed");
            assert!(n <= d, "never late");
            now = now.max(n);
            let got = expire(&mut w, now);
            assert_eq!(got, h.expire(now));
            fired += got.len();
            for &(t, _) in &got {
                assert!(t <= now);
            }
        }
        assert_eq!(fired, 20_000);
        assert_eq!(w.len(), 0);
        assert_eq!(w.next_deadline(), None);
    }

    /// Random arms, re-arms, cancels and polls of many connections: the
    /// wheel fires what the heap fires, at the same polls, and its next
    /// deadline is never after the heap's.
    #[test]
    fn matches_the_heap_under_random_churn() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut w = Wheel::new(512);
        let mut h = Heap::default();
        let mut now = 1_000_000u64;
        let scales = [
            1_000,
            50_000,
            TICK,
            40 * crate::NS_PER_MS,
            crate::NS_PER_S,
            60 * crate::NS_PER_S,
            7200 * crate::NS_PER_S,
        ];
        for step in 0..200_000 {
            let idx = rng.below(512) as u32;
            match rng.below(10) {
                0..=4 => {
                    let scale = scales[rng.below(scales.len() as u64) as usize];
                    let d = now + rng.below(scale);
                    w.arm(idx, d);
                    h.arm(idx, d);
                }
                5 => {
                    w.cancel(idx);
                    h.cancel(idx);
                }
                _ => {
                    let scale = scales[rng.below(4) as usize];
                    now += rng.below(scale);
                    if rng.below(8) == 0
                        && let Some(n) = w.next_deadline()
                    {
                        now = now.max(n);
                    }
                    assert_eq!(expire(&mut w, now), h.expire(now), "step {step}");
                }
            }
            match (w.next_deadline(), h.next()) {
                (Some(a), Some(b)) => assert!(a <= b, "step {step}: {a} after {b}"),
                (None, None) => {}
                (a, b) => panic!("step {step}: {a:?} vs {b:?}"),
            }
            assert_eq!(w.len(), h.armed.len());
        }
        now = u64::MAX;
        assert_eq!(expire(&mut w, now), h.expire(now));
        assert_eq!(w.len(), 0);
    }
}
