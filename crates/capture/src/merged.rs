//! Tap mode (the default): the kernel's packet taps (an `AF_PACKET`
//! socket) merged in timestamp order with the copies every xdp engine on the
//! interface puts in its capture tap.

use crate::PacketSocket;
use crate::filter::Filter;
use crate::session::{CaptureArgs, STOP, writer};
use nanowire_tap::{Dir, TapReader};
use nanowire_wire::pcapng::PcapngWriter;
use std::collections::BinaryHeap;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a frame waits before it is written, so that a frame of another
/// source stamped earlier but read later can still go before it.
const HOLD_NS: u64 = 100_000_000;
/// How often the tap directory is rescanned for engines that started.
const RESCAN: Duration = Duration::from_millis(200);

pub fn run(a: &CaptureArgs, filter: Filter) -> Result<i32, String> {
    let sock = PacketSocket::open(&a.iface).map_err(|e| format!("capture on {}: {e}", a.iface))?;
    let mut w = writer(a)?;
    let kif = w.add_interface(&a.iface).map_err(|e| e.to_string())?;
    let deadline = a.time.map(|t| Instant::now() + Duration::from_secs_f64(t));
    let mut m = Merge::default();
    let mut taps: Vec<(TapReader, u32)> = Vec::new();
    let mut seen: Vec<std::path::PathBuf> = Vec::new();
    let mut last_scan: Option<Instant> = None;
    let netns = nanowire_tap::netns_id();
    let mut buf = vec![0u8; a.snaplen as usize];
    let (mut dropped_gone, mut from_engines, mut from_kernel) = (0u64, 0u64, 0u64);
    let mut idle = false;
    let mut first_scan = true;
    loop {
        let stop = STOP.load(Ordering::Relaxed)
            || a.count.is_some_and(|c| m.written >= c)
            || deadline.is_some_and(|d| Instant::now() >= d);
        if !a.no_engines && (stop || last_scan.is_none_or(|t| t.elapsed() >= RESCAN)) {
            last_scan = Some(Instant::now());
            for t in nanowire_tap::list() {
                if t.iface != a.iface
                    || t.netns != netns
                    || a.pid.is_some_and(|p| p != t.pid)
                    || seen.contains(&t.path)
                {
                    continue;
                }
                seen.push(t.path.clone());
                match TapReader::attach(&t.path) {
                    Ok(r) => {
                        let id = w
                            .add_interface(&format!("{} (xdp engine, pid {})", a.iface, t.pid))
                            .map_err(|e| e.to_string())?;
                        eprintln!(
                            "nanowire capture: tapping the xdp engine of pid {} on {}",
                            t.pid, a.iface
                        );
                        taps.push((r, id));
                    }
                    Err(e) => eprintln!("nanowire capture: cannot tap pid {}: {e}", t.pid),
                }
            }
            if std::mem::take(&mut first_scan) && taps.is_empty() {
                eprintln!(
                    "nanowire capture: no xdp engine{} on {} yet (engines that start later are tapped when they appear)",
                    a.pid.map(|p| format!(" of pid {p}")).unwrap_or_default(),
                    a.iface
                );
            }
        }
        // Kernel packet taps: wait a little only when the last round found
        // nothing anywhere.
        let mut got = 0usize;
        let mut wait = if idle && !stop {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        };
        for _ in 0..1024 {
            let Some(f) = sock
                .recv(&mut buf, wait)
                .map_err(|e| format!("capture: {e}"))?
            else {
                break;
            };
            wait = Duration::ZERO;
            got += 1;
            if filter.matches(&buf[..f.len]) {
                from_kernel += 1;
                m.push(
                    f.ts_ns,
                    kif,
                    &buf[..f.len],
                    f.orig_len,
                    if f.outgoing { "out" } else { "in" },
                );
            }
        }
        for (t, id) in &mut taps {
            for d in [Dir::Rx, Dir::Tx] {
                let id = *id;
                got += t
                    .drain(d, 4096, |r| {
                        if filter.matches(r.data) {
                            from_engines += 1;
                            m.push(
                                r.ts_ns,
                                id,
                                r.data,
                                r.orig_len,
                                match r.dir {
                                    Dir::Rx => "in, xdp engine",
                                    Dir::Tx => "out, xdp engine",
                                },
                            );
                        }
                    })
                    .map_err(|e| format!("capture: {e}"))?;
            }
        }
        // Engines that exited: keep their last copies, then let go.
        taps.retain(|(t, _)| {
            let keep = t.alive();
            if !keep {
                dropped_gone += t.dropped();
            }
            keep
        });
        idle = got == 0;
        if stop {
            m.emit_all(&mut w, a.count)?;
            break;
        }
        m.emit_until(
            &mut w,
            nanowire_tap::now_ns().saturating_sub(HOLD_NS),
            a.count,
        )?;
    }
    w.flush().map_err(|e| e.to_string())?;
    let dropped: u64 = dropped_gone + taps.iter().map(|(t, _)| t.dropped()).sum::<u64>();
    eprintln!(
        "nanowire capture: {} frames written to {} ({from_kernel} from the kernel's packet taps, {from_engines} from xdp engines); {dropped} engine copies dropped (capture too slow){}",
        m.written,
        a.write.display(),
        if m.late > 0 {
            format!(
                "; {} frames arrived later than the {} ms reorder window and are out of order",
                m.late,
                HOLD_NS / 1_000_000
            )
        } else {
            String::new()
        }
    );
    Ok(0)
}

/// A frame waiting in the reorder window.
struct Pending {
    ts: u64,
    seq: u64,
    ifid: u32,
    orig_len: usize,
    note: &'static str,
    data: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.ts, self.seq) == (o.ts, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    /// Reversed: the heap's top is the earliest frame.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.ts, o.seq).cmp(&(self.ts, self.seq))
    }
}

/// Merges the sources in timestamp order (ties: arrival order).
#[derive(Default)]
struct Merge {
    heap: BinaryHeap<Pending>,
    seq: u64,
    last_ts: u64,
    written: u64,
    late: u64,
}

impl Merge {
    fn push(&mut self, ts: u64, ifid: u32, data: &[u8], orig_len: usize, note: &'static str) {
        self.seq += 1;
        self.heap.push(Pending {
            ts,
            seq: self.seq,
            ifid,
            orig_len,
            note,
            data: data.to_vec(),
        });
    }

    fn emit_until<W: Write>(
        &mut self,
        w: &mut PcapngWriter<W>,
        until: u64,
        count: Option<u64>,
    ) -> Result<(), String> {
        while let Some(p) = self.heap.peek()
            && p.ts <= until
            && count.is_none_or(|c| self.written < c)
        {
            let p = self.heap.pop().expect("peeked");
            if p.ts < self.last_ts {
                self.late += 1;
            }
            self.last_ts = self.last_ts.max(p.ts);
            w.write_packet(p.ifid, p.ts, &p.data, p.orig_len, Some(p.note))
                .map_err(|e| e.to_string())?;
            self.written += 1;
        }
        Ok(())
    }

    fn emit_all<W: Write>(
        &mut self,
        w: &mut PcapngWriter<W>,
        count: Option<u64>,
    ) -> Result<(), String> {
        self.emit_until(w, u64::MAX, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory capture with one interface.
    fn writer() -> (PcapngWriter<Vec<u8>>, u32) {
        let mut w = PcapngWriter::new(Vec::new(), "t", 65535).unwrap();
        let i = w.add_interface("x").unwrap();
        (w, i)
    }

    #[test]
    fn merge_orders_by_timestamp_and_counts_late_frames() {
        let (mut w, i) = writer();
        let mut m = Merge::default();
        m.push(30, i, &[3], 1, "in");
        m.push(10, i, &[1], 1, "in");
        m.push(20, i, &[2], 1, "out");
        m.emit_until(&mut w, 25, None).unwrap();
        assert_eq!(m.written, 2);
        m.push(15, i, &[9], 1, "in"); // later than the window
        m.emit_all(&mut w, None).unwrap();
        assert_eq!(m.late, 1);
        let p = nanowire_wire::pcapng::read_packets(&w.into_inner()).unwrap();
        let ts: Vec<u64> = p.iter().map(|p| p.ts_ns).collect();
        assert_eq!(ts, vec![10, 20, 15, 30]);
    }

    #[test]
    fn count_stops_the_merge() {
        let (mut w, i) = writer();
        let mut m = Merge::default();
        for t in 0..10 {
            m.push(t, i, &[0], 1, "in");
        }
        m.emit_all(&mut w, Some(4)).unwrap();
        assert_eq!(m.written, 4);
    }
}
