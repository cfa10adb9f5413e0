//! Results: latency statistics, counts, the JSON object and sockperf-like text.

use crate::env::Env;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::fmt::Write as _;

/// CPU time (user + system) the calling thread has used so far, in seconds.
pub fn thread_cpu_s() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// A report as one line of JSON on stdout (the `--json` output of every
/// bench command).
pub fn print_json(report: &impl Serialize) -> Result<(), String> {
    let line = serde_json::to_string(report).map_err(|e| format!("json: {e}"))?;
    println!("{line}");
    Ok(())
}

/// One-way latency (round trip / 2) statistics in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Latency {
    pub min: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p90: f64,
    pub p99: f64,
    #[serde(rename = "p99.9")]
    pub p99_9: f64,
    #[serde(rename = "p99.99")]
    pub p99_99: f64,
    #[serde(rename = "p99.999")]
    pub p99_999: f64,
    pub max: f64,
    pub avg: f64,
    pub stddev: f64,
    /// Number of samples behind these numbers.
    pub samples: u64,
}

/// Collects one-way latency samples in nanoseconds.
pub struct LatencyRecorder {
    hist: Histogram<u64>,
    n: u64,
    sum: f64,
    sum_sq: f64,
    min: u64,
    max: u64,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyRecorder {
    pub fn new() -> LatencyRecorder {
        // 1 ns .. 1 h, 3 significant digits; auto-resize covers anything longer.
        let mut hist = Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("static histogram bounds are valid");
        hist.auto(true);
        LatencyRecorder {
            hist,
            n: 0,
            sum: 0.0,
            sum_sq: 0.0,
            min: u64::MAX,
            max: 0,
        }
    }

    pub fn record(&mut self, ns: u64) {
        let v = ns.max(1);
        // Cannot fail with auto-resize on.
        let _ = self.hist.record(v);
        self.n += 1;
        let f = v as f64;
        self.sum += f;
        self.sum_sq += f * f;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn len(&self) -> u64 {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// `None` when nothing was recorded.
    pub fn summary(&self) -> Option<Latency> {
        if self.n == 0 {
            return None;
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        // HDR buckets report their highest equivalent value: clamp to the
        // exact extremes so p99.999 never exceeds MAX.
        let q = |p: f64| us(self.hist.value_at_quantile(p).clamp(self.min, self.max));
        let avg = self.sum / self.n as f64;
        let var = (self.sum_sq / self.n as f64 - avg * avg).max(0.0);
        Some(Latency {
            min: us(self.min),
            p25: q(0.25),
            p50: q(0.50),
            p75: q(0.75),
            p90: q(0.90),
            p99: q(0.99),
            p99_9: q(0.999),
            p99_99: q(0.9999),
            p99_999: q(0.99999),
            max: us(self.max),
            avg: avg / 1000.0,
            stddev: var.sqrt() / 1000.0,
            samples: self.n,
        })
    }
}

/// The result of one client run (`pp`, `ul` or `tp`); serialises to the JSON
/// object `--json` prints. This is the schema the lab reads back
/// (`serde_json::from_value::<BenchResult>`): fields added later carry
/// `#[serde(default)]` so older JSON still reads.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BenchResult {
    pub tool: String,
    pub version: String,
    pub mode: String,
    /// The engine that actually ran (after any fallback).
    pub engine: String,
    /// The engine asked for, and why it was not used when it differs.
    pub engine_requested: String,
    pub fallback_reason: Option<String>,
    pub protocol: String,
    pub msg_size: usize,
    pub peer: String,
    pub local_addr: String,
    /// Counts over the valid (measured) period, warm-up excluded.
    pub sent: u64,
    pub received: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Valid (measured) duration in seconds.
    pub duration_s: f64,
    /// Whole run including warm-up.
    pub total_duration_s: f64,
    pub total_sent: u64,
    pub total_received: u64,
    pub warmup_s: f64,
    /// One-way latency; `null` when there were no samples (e.g. `tp`).
    pub latency_us: Option<Latency>,
    /// pp with `--rx-stamps` (xdp engine): from the engine taking each reply
    /// off its RX ring to the receive call returning it (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_to_app_us: Option<Latency>,
    /// pp: round trips per second; ul/tp: messages sent per second.
    pub rate_msg_s: f64,
    /// Payload bandwidth of what was sent, in Mbit/s.
    pub bandwidth_mbps: f64,
    /// Target rate for ul/tp (`null` = max or pp).
    pub mps_target: Option<u64>,
    pub reply_every: Option<u64>,
    pub cpu: Option<usize>,
    /// CPU time of the measuring thread during the valid period (seconds) and
    /// as a fraction of that period (1.0 = one core busy).
    pub cpu_thread_s: f64,
    pub cpu_util: f64,
    /// Did every message asked for come back or get counted as dropped?
    #[serde(default = "Accounting::unknown")]
    pub accounting: Accounting,
    pub env: Env,
    pub note: Option<String>,
}

/// The accounting identity checked at the end of a run: every message that
/// should have arrived was either received or counted as dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Accounting {
    /// The identity, in words.
    pub identity: String,
    /// What should have arrived (replies asked for, datagrams sent).
    pub expected: u64,
    pub received: u64,
    /// Counted drops.
    pub dropped: u64,
    /// `null` when this run cannot check it (say so in `identity`).
    pub holds: Option<bool>,
}

impl Accounting {
    /// pp/ul: replies asked for in the valid period = received + dropped
    /// (timed out); every request is resolved before the run ends.
    pub fn replies(asked: u64, received: u64, dropped: u64) -> Accounting {
        Accounting {
            identity: "replies asked for = received + dropped (timed out)".into(),
            expected: asked,
            received,
            dropped,
            holds: Some(asked == received + dropped),
        }
    }
    /// For JSON written before the identity existed.
    pub fn unknown() -> Accounting {
        Accounting::not_applicable("not recorded (older nanowire)")
    }
    pub fn not_applicable(why: &str) -> Accounting {
        Accounting {
            identity: why.into(),
            expected: 0,
            received: 0,
            dropped: 0,
            holds: None,
        }
    }
    /// The exit code `--strict` asks for: 3 when the identity failed.
    pub fn strict_exit_code(&self) -> i32 {
        if self.holds == Some(false) { 3 } else { 0 }
    }
    pub fn line(&self) -> String {
        match self.holds {
            Some(true) => format!(
                "accounting holds: {} = {} + {} ({})",
                self.expected, self.received, self.dropped, self.identity
            ),
            Some(false) => format!(
                "ACCOUNTING FAILED: expected {}, received {}, counted drops {} ({})",
                self.expected, self.received, self.dropped, self.identity
            ),
            None => format!("accounting not checked: {}", self.identity),
        }
    }
}

impl BenchResult {
    /// Text in the shape of sockperf's client output.
    pub fn human(&self) -> String {
        let mut s = String::new();
        let p = "nanowire:";
        if let Some(r) = &self.fallback_reason {
            let _ = writeln!(
                s,
                "{p} engine {} fell back to {}: {r}",
                self.engine_requested, self.engine
            );
        }
        let _ = writeln!(
            s,
            "{p} [Total Run] RunTime={:.3} sec; Warm up time={} msec; SentMessages={}; ReceivedMessages={}",
            self.total_duration_s,
            (self.warmup_s * 1000.0).round() as u64,
            self.total_sent,
            self.total_received
        );
        if self.mode == "tp" {
            let _ = writeln!(
                s,
                "{p} Total of {} messages sent in {:.3} sec",
                self.sent, self.duration_s
            );
            let _ = writeln!(
                s,
                "{p} Summary: Message Rate is {:.0} [msg/sec]",
                self.rate_msg_s
            );
            let _ = writeln!(
                s,
                "{p} Summary: BandWidth is {:.3} MBps ({:.3} Mbps)",
                self.bandwidth_mbps / 8.0,
                self.bandwidth_mbps
            );
            if let Some(n) = &self.note {
                let _ = writeln!(s, "{p} NOTE: {n}");
            }
            return s;
        }
        let _ = writeln!(s, "{p} ========= Printing statistics for Server No: 0");
        let _ = writeln!(
            s,
            "{p} [Valid Duration] RunTime={:.3} sec; SentMessages={}; ReceivedMessages={}",
            self.duration_s, self.sent, self.received
        );
        match &self.latency_us {
            Some(l) => {
                let _ = writeln!(
                    s,
                    "{p} ====> avg-latency={:.3} (std-dev={:.3})",
                    l.avg, l.stddev
                );
                let _ = writeln!(
                    s,
                    "{p} # dropped messages = {}; # duplicated messages = {}; # out-of-order messages = {}",
                    self.dropped, self.duplicated, self.out_of_order
                );
                let _ = writeln!(s, "{p} Summary: Latency is {:.3} usec", l.avg);
                let _ = writeln!(
                    s,
                    "{p} Total {} observations; each percentile contains {:.2} observations",
                    l.samples,
                    l.samples as f64 / 100.0
                );
                let rows = [
                    ("<MAX> observation", l.max),
                    ("percentile 99.999", l.p99_999),
                    ("percentile 99.990", l.p99_99),
                    ("percentile 99.900", l.p99_9),
                    ("percentile 99.000", l.p99),
                    ("percentile 90.000", l.p90),
                    ("percentile 75.000", l.p75),
                    ("percentile 50.000", l.p50),
                    ("percentile 25.000", l.p25),
                    ("<MIN> observation", l.min),
                ];
                for (k, v) in rows {
                    let _ = writeln!(s, "{p} ---> {k} = {v:8.3}");
                }
            }
            None => {
                let _ = writeln!(
                    s,
                    "{p} # dropped messages = {}; # duplicated messages = {}; # out-of-order messages = {}",
                    self.dropped, self.duplicated, self.out_of_order
                );
                let _ = writeln!(s, "{p} No latency samples in the valid period.");
            }
        }
        if self.mode == "ul" {
            let _ = writeln!(
                s,
                "{p} Summary: Message Rate is {:.0} [msg/sec]",
                self.rate_msg_s
            );
        }
        let _ = writeln!(s, "{p} {}", self.accounting.line());
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting_identity() {
        let a = Accounting::replies(10, 7, 3);
        assert_eq!(a.holds, Some(true));
        assert_eq!(a.strict_exit_code(), 0);
        let a = Accounting::replies(10, 7, 2);
        assert_eq!(a.holds, Some(false));
        assert_eq!(a.strict_exit_code(), 3);
        assert!(a.line().contains("FAILED"));
        let a = Accounting::not_applicable("tp");
        assert_eq!((a.holds, a.strict_exit_code()), (None, 0));
    }

    #[test]
    fn summary_numbers() {
        let mut r = LatencyRecorder::new();
        assert!(r.summary().is_none());
        for v in 1..=1000u64 {
            r.record(v * 1000);
        }
        let l = r.summary().unwrap();
        assert_eq!(l.samples, 1000);
        assert_eq!(l.min, 1.0);
        assert_eq!(l.max, 1000.0);
        assert!((l.p50 - 500.0).abs() < 1.0, "{}", l.p50);
        assert!((l.avg - 500.5).abs() < 1e-6);
        assert!(l.stddev > 288.0 && l.stddev < 289.0);
        let j = serde_json::to_value(l).unwrap();
        assert!(j.get("p99.9").is_some() && j.get("p99.999").is_some());
    }
}
