//! nanowire-probe: where one message's time goes on its way through the
//! shim, the engine and the TCP stack. The marks record only with the
//! feature `on` (the shim's feature `probe`; `scripts/probe.py` builds it
//! so). Without it every function here is an empty inline function and no
//! mark costs anything; the crate depends on nothing, so every crate of the
//! path (xdp, tcp, stack, preload) can mark.
//!
//! A message's clock starts when a frame is first seen on an RX ring
//! ([`seen`]: a lock-free look that finds a descriptor, or a poll that
//! finds some); each [`mark`] on the way records the TSC's distance from
//! that sighting (the first time the mark is passed in this message); the
//! TX kick that sends the answer ([`kick`]) ends it. The next sighting
//! files the message's distances; every [`REPORT_EVERY`] messages the
//! process writes one line on stderr:
//!
//! ```text
//! PROBE pid 1234 n 100000 found 9 desc_read 15 rx_taken 28 ... kick 286
//! ```
//!
//! each mark's median distance from the sighting in ns (the TSC's rate
//! measured against the monotonic clock over the samples), ordered by
//! that median, marks passed in fewer than half the messages left out.
//! [`Mark`] names them (each where it is in the code: `grep
//! 'Mark::NAME'`). Each mark costs an RDTSC and a few loads
//! (~8 ns here): a step's distance includes the marks inside it.
//!
//! Unserialised, a mark's RDTSC may run before the instructions ahead of
//! it complete (out of order): a miss shows in a later step. The feature
//! `serial` puts an LFENCE before each (`scripts/probe.py --serial`).
//!
//! One message at a time per process: made for a single-threaded
//! ping-pong (sockperf), whose one thread takes each message from the ring
//! to its answer. The state is process-wide (relaxed atomics, no lock on
//! the path); a second thread's marks would land in the same message.

/// The marks, in the order a frame meets them (the report orders them by
/// their medians): `$name = "report name": what was just passed`.
macro_rules! marks {
    ($($name:ident = $s:literal: $doc:literal,)*) => {
        /// A point on a message's way (see the module's doc).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Mark {
            $(#[doc = $doc] $name,)*
        }

        /// Each [`Mark`]'s name in the report, by its index.
        pub const NAMES: &[&str] = &[$($s,)*];
    };
}

marks! {
    StackLocked = "stack_locked": "a TCP receive attempt took its stack's lock",
    PollIn = "poll_in": "the RX path's poll begins (the RX lock held)",
    Refilled = "refilled": "the poll gave dropped frames back to the fill ring",
    Found = "found": "the poll found descriptors on the RX ring",
    DescRead = "desc_read": "the poll read a descriptor",
    RxTaken = "rx_taken": "the descriptor's frame left the fill accounting",
    FrameTaken = "frame_taken": "the frame is an owned RxFrame",
    Handled = "handled": "the RX path's handling of the frame begins",
    Counted = "counted": "the frame counted (rx_frames)",
    ClassifyIn = "classify_in": "past the other-host test: classify begins",
    L4 = "l4": "classify: the IPv4 header checked, UDP or TCP next",
    Classified = "classified": "classify done",
    Delivered = "delivered": "demultiplexed to this socket, handed to its taker",
    TcpInputIn = "tcp_input_in": "the TCP segment goes into the stack",
    TcpParsed = "tcp_parsed": "the stack parsed the segment's header",
    TcpFound = "tcp_found": "the stack found the segment's connection",
    TcpAcked = "tcp_acked": "header prediction: the ACK taken",
    TcpWindow = "tcp_window": "header prediction: the send window updated",
    TcpCopied = "tcp_copied": "the data copied into the waiting reader's buffer",
    TcpSpace = "tcp_space": "the receive space adjusted after a direct read",
    TcpDataTaken = "tcp_data_taken": "header prediction: the data taken (the reader's buffer or the ring)",
    TcpConnDone = "tcp_conn_done": "the connection's input done (its settle next)",
    TcpInputOut = "tcp_input_out": "the stack took the segment in",
    TimersRun = "timers_run": "the TCP turn's timers ran",
    TurnTail = "turn_tail": "the TCP turn's accept signals and holds done (its ends next)",
    TurnDone = "turn_done": "the TCP receive's turn returned",
    UdpUnlocked = "udp_unlocked": "a UDP receive left the RX lock with its datagram",
    UdpCopied = "udp_copied": "the datagram copied to the program (and its address)",
    RecvReturns = "recv_returns": "the interposed recvfrom returns to the program",
    SendEntered = "send_entered": "the program called the interposed sendto",
    UdpSendIn = "udp_send_in": "a UDP send reached the engine socket",
    UdpTxLocked = "udp_tx_locked": "the UDP send took the TX lock",
    UdpFrame = "udp_frame": "a TX frame for the datagram",
    UdpBuilt = "udp_built": "the datagram's headers and payload written into the frame",
    SendOnce = "send_once": "a TCP send attempt begins",
    SendLocked = "send_locked": "the TCP send took its stack's lock",
    InputTaken = "input_taken": "the TCP send took in what arrived",
    Queued = "queued": "the TCP send's bytes are in the send ring",
    Clock = "clock": "the TCP send read the TSC",
    EndsPublished = "ends_published": "the connection ends published before the segment",
    FrameFor = "frame_for": "a TX frame for the TCP segment",
    SegmentBuilt = "segment_built": "the TCP segment written into the frame",
    Submitted = "submitted": "the TX ring's producer index about to move",
}

/// How many marks there are.
pub const MARKS: usize = NAMES.len();

/// Messages between two reports.
pub const REPORT_EVERY: usize = 100_000;

#[cfg(all(feature = "on", target_arch = "x86_64"))]
mod on {
    use super::{MARKS, Mark, NAMES, REPORT_EVERY};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::time::Instant;

    /// A distance as filed: in u32 (u32::MAX means "not passed"; a longer
    /// distance, over a second and a half, is filed as the longest).
    fn filed(d: u64) -> u32 {
        d.min(u64::from(u32::MAX - 1)) as u32
    }

    /// The TSC at this message's sighting (0: none yet).
    static T0: AtomicU64 = AtomicU64::new(0);
    /// Each mark's distance from T0 in this message (0: not passed).
    static AT: [AtomicU64; MARKS] = [const { AtomicU64::new(0) }; MARKS];
    /// The kick's distance (0: not kicked yet).
    static KICK: AtomicU64 = AtomicU64::new(0);

    /// Filed messages: MARKS + 1 distances each (u32::MAX: not passed).
    struct Filed {
        rows: Vec<u32>,
        n: usize,
        /// The TSC and the clock at the first filed message (the rate).
        start: Option<(u64, Instant)>,
    }

    static FILED: Mutex<Filed> = Mutex::new(Filed {
        rows: Vec::new(),
        n: 0,
        start: None,
    });

    /// The TSC, with no memory access of the path moved across it by the
    /// compiler; with the feature `serial`, also after every instruction
    /// before it has completed (LFENCE: a stall is charged to the step it
    /// happens in, not to a later one; each mark then costs more).
    #[inline(always)]
    fn rdtsc() -> u64 {
        use std::sync::atomic::{Ordering::SeqCst, compiler_fence};
        compiler_fence(SeqCst);
        #[cfg(feature = "serial")]
        // SAFETY: LFENCE waits for the instructions before it to complete:
        // no memory access, no side effect beyond the wait.
        unsafe {
            core::arch::x86_64::_mm_lfence()
        };
        // SAFETY: RDTSC reads the time-stamp counter: no memory access,
        // no side effect.
        let t = unsafe { core::arch::x86_64::_rdtsc() };
        compiler_fence(SeqCst);
        t
    }

    /// A frame is on an RX ring: the message's clock starts, unless it
    /// already has (a second look before the take); a message that was
    /// kicked is filed first.
    #[inline]
    pub fn seen() {
        let t0 = T0.load(Relaxed);
        if t0 != 0 && KICK.load(Relaxed) == 0 {
            return;
        }
        if t0 != 0 {
            file();
        }
        T0.store(rdtsc(), Relaxed);
    }

    /// Mark `m` passed: its distance, the first time in this message.
    #[inline]
    pub fn mark(m: Mark) {
        let i = m as usize;
        let t0 = T0.load(Relaxed);
        if t0 != 0 && KICK.load(Relaxed) == 0 && AT[i].load(Relaxed) == 0 {
            AT[i].store(rdtsc().wrapping_sub(t0).max(1), Relaxed);
        }
    }

    /// The TX kick: the message's end.
    #[inline]
    pub fn kick() {
        let t0 = T0.load(Relaxed);
        if t0 != 0 && KICK.load(Relaxed) == 0 {
            KICK.store(rdtsc().wrapping_sub(t0).max(1), Relaxed);
        }
    }

    #[cold]
    #[inline(never)]
    fn file() {
        let mut f = FILED.lock().unwrap_or_else(|e| e.into_inner());
        if f.rows.is_empty() {
            f.rows = vec![u32::MAX; REPORT_EVERY * (MARKS + 1)];
        }
        if f.start.is_none() {
            f.start = Some((rdtsc(), Instant::now()));
        }
        let at = f.n * (MARKS + 1);
        for (i, a) in AT.iter().enumerate() {
            let d = a.swap(0, Relaxed);
            f.rows[at + i] = if d == 0 { u32::MAX } else { filed(d) };
        }
        f.rows[at + MARKS] = filed(KICK.swap(0, Relaxed));
        f.n += 1;
        if f.n == REPORT_EVERY {
            report(&mut f);
        }
    }

    fn report(f: &mut Filed) {
        let (t, i) = f.start.take().unwrap_or((rdtsc(), Instant::now()));
        let ns = i.elapsed().as_nanos().max(1) as f64;
        let per_ns = rdtsc().wrapping_sub(t) as f64 / ns;
        let mut cols: Vec<(u64, &str)> = Vec::new();
        let mut col = Vec::with_capacity(f.n);
        for m in 0..=MARKS {
            col.clear();
            col.extend(
                (0..f.n)
                    .map(|r| f.rows[r * (MARKS + 1) + m])
                    .filter(|&d| d != u32::MAX),
            );
            if col.len() * 2 < f.n {
                continue;
            }
            let mid = col.len() / 2;
            let med = *col.select_nth_unstable(mid).1;
            let med = (f64::from(med) / per_ns).round() as u64;
            cols.push((med, NAMES.get(m).copied().unwrap_or("kick")));
        }
        cols.sort();
        let line: Vec<String> = cols.iter().map(|(v, n)| format!("{n} {v}")).collect();
        eprintln!(
            "PROBE pid {} n {} {}",
            std::process::id(),
            f.n,
            line.join(" ")
        );
        f.rows.fill(u32::MAX);
        f.n = 0;
    }
}

#[cfg(not(all(feature = "on", target_arch = "x86_64")))]
mod on {
    use super::Mark;

    /// Without the `probe` feature: nothing.
    #[inline(always)]
    pub fn seen() {}

    /// Without the `probe` feature: nothing.
    #[inline(always)]
    pub fn mark(_m: Mark) {}

    /// Without the `probe` feature: nothing.
    #[inline(always)]
    pub fn kick() {}
}

pub use on::{kick, mark, seen};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mark_has_one_name_and_the_names_differ() {
        assert_eq!(NAMES.len(), MARKS);
        assert_eq!(NAMES[Mark::Submitted as usize], "submitted");
        let mut n = NAMES.to_vec();
        n.sort();
        n.dedup();
        assert_eq!(n.len(), MARKS, "a name twice");
        assert!(
            !NAMES.contains(&"kick"),
            "the kick's name is the report's own"
        );
    }

    #[test]
    fn marks_and_kicks_in_any_order_never_panic() {
        // Before a sighting marks and a kick are ignored; after it they
        // record (without the feature every call is empty).
        mark(Mark::Found);
        kick();
        seen();
        mark(Mark::Found);
        kick();
    }
}
