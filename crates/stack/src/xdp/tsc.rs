//! The send path's clock: the CPU's time-stamp counter, extrapolated from
//! the last `CLOCK_MONOTONIC` reading.
//!
//! A TCP send reads the clock before its segment is built (the timestamp
//! option, the RTT sample's start, the retransmission deadline). Through
//! the vDSO that is an ordered TSC read plus the conversion, ~25-35 ns on
//! this project's VMs; a plain `rdtsc` is ~10-14 ns (docs/benchmarks.md,
//! "Session 22: TCP per message, the clock reads"). [`TscClock`] reads the
//! TSC and converts it with a rate it measured itself between two clock
//! readings at least [`CALIB_NS`] apart, for at most [`SPAN_NS`] after a
//! real reading (the "base"); past that, before it is calibrated, or when
//! the TSC is not where the base left it (an earlier value: another CPU's
//! counter), it reads the clock and takes that as the new base. At each
//! new base it checks its own extrapolation against the clock and turns
//! itself off for good when it was off by more than [`MAX_ERR_NS`] (a TSC
//! that does not tick with the monotonic clock: an unstable host, or a
//! clock stepped), so the time it gives is within that of the clock, as
//! in Linux's TCP, whose clock (`tcp_clock_ns`) is the TSC too. The
//! stack's own clock never goes back whatever it is given (`TcpStack`
//! keeps the latest).

/// How long after a clock reading its TSC extrapolation is used.
pub(crate) const SPAN_NS: u64 = 1_000_000;
/// The shortest interval between two clock readings a rate is measured
/// over (their readings' own spread, tens of ns, is then < 10 ppm).
pub(crate) const CALIB_NS: u64 = 10_000_000;
/// The most an extrapolation may be off at the next reading before the
/// clock turns itself off.
pub(crate) const MAX_ERR_NS: u64 = 20_000;

/// See the module doc. One per TCP stack (`Core`), used under its lock.
#[derive(Debug, Default)]
pub(crate) struct TscClock {
    off: bool,
    base_tsc: u64,
    base_ns: u64,
    /// ns per tick, 32.32 fixed point (0: not calibrated yet).
    mult: u64,
    /// Ticks a base is good for (0: not calibrated yet).
    span: u64,
    /// The reading the next rate is measured from.
    calib_tsc: u64,
    calib_ns: u64,
}

impl TscClock {
    /// The monotonic clock in ns: extrapolated from the TSC when it can,
    /// else `read()` (`CLOCK_MONOTONIC`).
    #[inline]
    pub(crate) fn now(&mut self, read: impl FnOnce() -> u64) -> u64 {
        if self.off {
            return read();
        }
        self.at(rdtsc(), read)
    }

    /// [`TscClock::now`] with the TSC at `t`.
    #[inline]
    pub(crate) fn at(&mut self, t: u64, read: impl FnOnce() -> u64) -> u64 {
        let d = t.wrapping_sub(self.base_tsc);
        if d < self.span {
            return self.base_ns + ((u128::from(d) * u128::from(self.mult)) >> 32) as u64;
        }
        self.rebase(t, read())
    }

    /// A real reading `ns` at TSC `t`: the new base, and the rate measured
    /// again when the last measure's reading is far enough back.
    #[cold]
    #[inline(never)]
    fn rebase(&mut self, t: u64, ns: u64) -> u64 {
        let d = t.wrapping_sub(self.base_tsc);
        if self.mult != 0 && d < (1 << 62) {
            // How far the extrapolation from the last base would be off
            // now (over a gap of any length, with 1000 ppm of it for the
            // clock's own slewing: a TSC that stopped, jumped or runs at
            // another rate shows here). A counter behind the base (another CPU's)
            // only makes this a new base.
            let est = self
                .base_ns
                .saturating_add(((u128::from(d) * u128::from(self.mult)) >> 32) as u64);
            let slack = MAX_ERR_NS + ns.saturating_sub(self.base_ns) / 1_000;
            if est.abs_diff(ns) > slack {
                self.off = true;
                return ns;
            }
        }
        let (dt, dn) = (
            t.wrapping_sub(self.calib_tsc),
            ns.wrapping_sub(self.calib_ns),
        );
        if self.calib_ns == 0 || dt > (1 << 62) || dn > (1 << 62) {
            // The first reading, or one before the last (another CPU's
            // counter): measure from here.
            (self.calib_tsc, self.calib_ns) = (t, ns);
        } else if dn >= CALIB_NS && dt > 0 {
            let mult = (u128::from(dn) << 32) / u128::from(dt);
            if mult > 0 && mult < u128::from(u64::MAX) {
                self.mult = mult as u64;
                self.span = ((u128::from(SPAN_NS) << 32) / mult).min(u128::from(u64::MAX)) as u64;
            }
            (self.calib_tsc, self.calib_ns) = (t, ns);
        }
        (self.base_tsc, self.base_ns) = (t, ns);
        ns
    }

    /// Whether it turned itself off.
    #[cfg(test)]
    pub(crate) fn is_off(&self) -> bool {
        self.off
    }
}

#[inline(always)]
fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC reads the time-stamp counter (no memory access, no
        // side effect); the clock it replaces is the vDSO's clock_gettime,
        // itself an RDTSC.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A TSC at 3 ticks per ns against the clock: (tsc, ns) at `ns`.
    fn tsc_of(ns: u64) -> u64 {
        1_000_000 + ns * 3
    }

    #[test]
    fn reads_the_clock_until_calibrated_then_extrapolates_within_its_span() {
        let mut c = TscClock::default();
        let reads = Cell::new(0);
        let at = |c: &mut TscClock, ns: u64| {
            c.at(tsc_of(ns), || {
                reads.set(reads.get() + 1);
                ns
            })
        };
        // Not calibrated: every call reads.
        assert_eq!(at(&mut c, 1_000_000_000), 1_000_000_000);
        assert_eq!(at(&mut c, 1_000_000_500), 1_000_000_500);
        assert_eq!(reads.get(), 2);
        // CALIB_NS later: the rate is measured at this reading.
        let t0 = 1_000_000_000 + CALIB_NS;
        assert_eq!(at(&mut c, t0), t0);
        assert_eq!(reads.get(), 3);
        // Within SPAN_NS: no reading, the time within a ns.
        for k in [1u64, 999, 123_456, SPAN_NS - 1000] {
            let got = at(&mut c, t0 + k);
            assert!(got.abs_diff(t0 + k) <= 1, "{got} vs {}", t0 + k);
        }
        assert_eq!(reads.get(), 3);
        // Past the span: a reading, the new base.
        assert_eq!(at(&mut c, t0 + SPAN_NS + 5), t0 + SPAN_NS + 5);
        assert_eq!(reads.get(), 4);
        assert!(!c.is_off());
    }

    /// Calibrated by readings at `t0` and `t0 + CALIB_NS` (the base).
    fn calibrated(t0: u64) -> TscClock {
        let mut c = TscClock::default();
        c.at(tsc_of(t0), || t0);
        c.at(tsc_of(t0 + CALIB_NS), || t0 + CALIB_NS);
        c
    }

    #[test]
    fn a_counter_behind_its_base_reads_the_clock() {
        let t0 = 5_000_000_000;
        let mut c = calibrated(t0);
        // Another CPU's counter, 100 ticks behind the base.
        let read = Cell::new(false);
        let got = c.at(tsc_of(t0 + CALIB_NS) - 100, || {
            read.set(true);
            t0 + CALIB_NS + 10
        });
        assert!(read.get(), "read the clock");
        assert_eq!(got, t0 + CALIB_NS + 10);
        assert!(!c.is_off());
    }

    #[test]
    fn a_counter_that_does_not_follow_the_clock_turns_it_off() {
        let t0 = 5_000_000_000;
        let mut c = calibrated(t0);
        // The clock moved 2 ms while the counter says 1.5 ms: off by far
        // more than MAX_ERR_NS at the next reading.
        let t1 = t0 + CALIB_NS + 2 * SPAN_NS;
        let got = c.at(tsc_of(t0 + CALIB_NS + 3 * SPAN_NS / 2), || t1);
        assert_eq!(got, t1);
        assert!(c.is_off());
        // Off: the clock's reading every time, whatever the counter.
        let mut c2 = c;
        assert_eq!(c2.now(|| 42), 42);
    }
}
