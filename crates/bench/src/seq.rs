//! Sequence-gap accounting, as sockperf does it: every client message carries
//! a sequence number that grows by one per message, so the receiver can count
//! what went missing, what came twice and what came late.

use serde::Serialize;

/// How far back (in sequence numbers) duplicates and late arrivals are told apart.
const WINDOW: u64 = 4096;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SeqCounts {
    /// Distinct messages received.
    pub received: u64,
    /// Sequence numbers never seen (a gap not filled later).
    pub dropped: u64,
    /// Messages whose sequence number had already been seen.
    pub duplicated: u64,
    /// Messages that arrived after a higher sequence number (they filled a gap).
    pub out_of_order: u64,
}

/// Tracks one sender's sequence numbers.
#[derive(Debug, Clone)]
pub struct SeqTracker {
    /// Next expected sequence number; `None` before the first message.
    next: Option<u64>,
    /// Bit `s % WINDOW` set when `s` (within WINDOW below `next`) was seen.
    seen: Vec<u64>,
    pub counts: SeqCounts,
}

/// What one observation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    InOrder,
    /// Arrived after skipping this many sequence numbers.
    AfterGap(u64),
    Duplicate,
    /// Late: filled an earlier gap.
    Late,
    /// Too old to tell duplicate from late; counted as out of order.
    Stale,
}

impl Default for SeqTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl SeqTracker {
    pub fn new() -> SeqTracker {
        SeqTracker {
            next: None,
            seen: vec![0; (WINDOW / 64) as usize],
            counts: SeqCounts::default(),
        }
    }

    fn bit(&self, s: u64) -> bool {
        let i = (s % WINDOW) as usize;
        self.seen[i / 64] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, s: u64, v: bool) {
        let i = (s % WINDOW) as usize;
        if v {
            self.seen[i / 64] |= 1 << (i % 64);
        } else {
            self.seen[i / 64] &= !(1 << (i % 64));
        }
    }

    pub fn observe(&mut self, seq: u64) -> Seen {
        let Some(next) = self.next else {
            self.next = Some(seq.wrapping_add(1));
            self.set(seq, true);
            self.counts.received += 1;
            return Seen::InOrder;
        };
        if seq >= next {
            let gap = seq - next;
            // Forget what falls out of the window: clear the bits of the
            // skipped numbers (at most WINDOW of them).
            let clear_from = if gap >= WINDOW {
                seq - WINDOW + 1
            } else {
                next
            };
            for s in clear_from..seq {
                self.set(s, false);
            }
            self.set(seq, true);
            self.next = Some(seq + 1);
            self.counts.received += 1;
            self.counts.dropped += gap;
            if gap == 0 {
                Seen::InOrder
            } else {
                Seen::AfterGap(gap)
            }
        } else if next - seq > WINDOW {
            self.counts.out_of_order += 1;
            Seen::Stale
        } else if self.bit(seq) {
            self.counts.duplicated += 1;
            Seen::Duplicate
        } else {
            self.set(seq, true);
            self.counts.received += 1;
            self.counts.out_of_order += 1;
            self.counts.dropped = self.counts.dropped.saturating_sub(1);
            Seen::Late
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_dups_late() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(10), Seen::InOrder);
        assert_eq!(t.observe(11), Seen::InOrder);
        assert_eq!(t.observe(14), Seen::AfterGap(2));
        assert_eq!(t.counts.dropped, 2);
        assert_eq!(t.observe(12), Seen::Late);
        assert_eq!(t.counts.dropped, 1);
        assert_eq!(t.observe(12), Seen::Duplicate);
        assert_eq!(t.observe(14), Seen::Duplicate);
        assert_eq!(
            t.counts,
            SeqCounts {
                received: 4,
                dropped: 1,
                duplicated: 2,
                out_of_order: 1
            }
        );
        // a huge jump forgets the window
        assert_eq!(t.observe(100_000), Seen::AfterGap(100_000 - 15));
        assert_eq!(t.observe(13), Seen::Stale);
        assert_eq!(t.observe(99_999), Seen::Late);
    }
}
