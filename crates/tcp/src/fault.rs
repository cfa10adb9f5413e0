//! A seeded fault injector for packet paths: loss, duplication, reordering,
//! delay (with jitter) and corruption, in the spirit of smoltcp's
//! FaultInjector. Packets go in with `push(now, bytes)` and come out, in
//! release order, with `pop(now)`. Deterministic for a given seed.
//! Off by default (`FaultConfig::default()` changes nothing).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultConfig {
    /// Probability a packet is dropped.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is held back by `reorder_delay_ns` (later ones overtake it).
    pub reorder: f64,
    pub reorder_delay_ns: u64,
    /// Probability one random byte of a packet is flipped.
    pub corrupt: f64,
    /// Fixed one-way delay and uniform extra jitter.
    pub delay_ns: u64,
    pub jitter_ns: u64,
    pub seed: u64,
}

impl FaultConfig {
    pub fn is_active(&self) -> bool {
        self.loss > 0.0
            || self.duplicate > 0.0
            || self.reorder > 0.0
            || self.corrupt > 0.0
            || self.delay_ns > 0
            || self.jitter_ns > 0
    }
}

impl FaultConfig {
    /// Parse `loss=0.01,dup=0.001,reorder=0.01,reorder_delay_us=100,
    /// corrupt=0.0001,delay_us=50,jitter_us=10,seed=7` (any subset; the
    /// options-table form). Probabilities are in [0, 1].
    pub fn parse(s: &str) -> Result<FaultConfig, String> {
        let mut c = FaultConfig::default();
        for kv in s.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("fault option {kv:?}: expected key=value"))?;
            let prob = |v: &str| -> Result<f64, String> {
                // `0.01` or `1%`.
                let (num, scale) = match v.strip_suffix('%') {
                    Some(n) => (n.trim(), 100.0),
                    None => (v, 1.0),
                };
                let p: f64 = num
                    .parse::<f64>()
                    .map_err(|_| format!("fault option {k}: {v:?} is not a number"))?
                    / scale;
                if (0.0..=1.0).contains(&p) {
                    Ok(p)
                } else {
                    Err(format!(
                        "fault option {k}: {p} is not a probability in [0, 1]"
                    ))
                }
            };
            let us = |v: &str| -> Result<u64, String> {
                v.parse::<u64>()
                    .map(|u| u.saturating_mul(1000))
                    .map_err(|_| {
                        format!("fault option {k}: {v:?} is not a whole number of microseconds")
                    })
            };
            match k {
                "loss" => c.loss = prob(v)?,
                "dup" | "duplicate" => c.duplicate = prob(v)?,
                "reorder" => c.reorder = prob(v)?,
                "corrupt" => c.corrupt = prob(v)?,
                "reorder_delay_us" => c.reorder_delay_ns = us(v)?,
                "delay_us" => c.delay_ns = us(v)?,
                "jitter_us" => c.jitter_ns = us(v)?,
                "seed" => {
                    c.seed = v
                        .parse()
                        .map_err(|_| format!("fault option seed: {v:?} is not a number"))?
                }
                _ => {
                    return Err(format!(
                        "unknown fault option {k:?} (loss, dup, reorder, reorder_delay_us, corrupt, delay_us, jitter_us, seed)"
                    ));
                }
            }
        }
        if c.reorder > 0.0 && c.reorder_delay_ns == 0 {
            c.reorder_delay_ns = 100_000;
        }
        Ok(c)
    }
}

/// Which of an engine's paths a fault specification applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultDir {
    Rx,
    Tx,
    Both,
}

/// The engine's `faults` option: a [`FaultConfig`] plus `dir=rx|tx|both`
/// (default both). Timing faults (delay, jitter, reordering) act on the
/// receive path only: a receiver polls, so held packets are released on
/// time, while a transmit path runs only when its owner sends.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineFaults {
    pub cfg: FaultConfig,
    pub dir: FaultDir,
}

impl EngineFaults {
    /// Parse `seed=1,loss=1%,dup=0.5%,reorder=1%,delay_us=50,corrupt=0.1%,dir=rx`.
    /// `Ok(None)` for an empty string (faults off).
    pub fn parse(s: &str) -> Result<Option<EngineFaults>, String> {
        let mut dir = FaultDir::Both;
        let mut rest = Vec::new();
        for kv in s.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            match kv.split_once('=') {
                Some(("dir", v)) => {
                    dir = match v.trim() {
                        "rx" => FaultDir::Rx,
                        "tx" => FaultDir::Tx,
                        "both" => FaultDir::Both,
                        o => return Err(format!("fault option dir: {o:?} is not rx, tx or both")),
                    }
                }
                _ => rest.push(kv),
            }
        }
        if rest.is_empty() {
            return Ok(None);
        }
        let cfg = FaultConfig::parse(&rest.join(","))?;
        Ok(cfg.is_active().then_some(EngineFaults { cfg, dir }))
    }

    pub fn rx(&self) -> Option<FaultConfig> {
        (self.dir != FaultDir::Tx).then(|| self.cfg.clone())
    }

    /// The transmit side: loss, duplication and corruption only, and its
    /// own random sequence (seed + 1).
    pub fn tx(&self) -> Option<FaultConfig> {
        (self.dir != FaultDir::Rx).then(|| FaultConfig {
            reorder: 0.0,
            reorder_delay_ns: 0,
            delay_ns: 0,
            jitter_ns: 0,
            seed: self.cfg.seed.wrapping_add(1),
            ..self.cfg.clone()
        })
    }
}

/// What the injector did, for assertions and counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub passed: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
}

impl FaultStats {
    /// What happened since `seen` (an earlier copy of these stats), which
    /// becomes this copy: for counters published as increments.
    pub fn since(&self, seen: &mut FaultStats) -> FaultStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let news = FaultStats {
            passed: d(self.passed, seen.passed),
            dropped: d(self.dropped, seen.dropped),
            duplicated: d(self.duplicated, seen.duplicated),
            reordered: d(self.reordered, seen.reordered),
            corrupted: d(self.corrupted, seen.corrupted),
        };
        *seen = self.clone();
        news
    }
}

pub struct FaultInjector {
    cfg: FaultConfig,
    rng: u64,
    /// (release time, sequence for FIFO among equals, packet)
    queue: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>,
    seq: u64,
    pub stats: FaultStats,
}

impl FaultInjector {
    pub fn new(cfg: FaultConfig) -> FaultInjector {
        let rng = cfg.seed ^ 0x9e37_79b9_7f4a_7c15;
        FaultInjector {
            cfg,
            rng: if rng == 0 { 1 } else { rng },
            queue: BinaryHeap::new(),
            seq: 0,
            stats: FaultStats::default(),
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn enqueue(&mut self, at: u64, pkt: Vec<u8>) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, pkt)));
    }

    pub fn push(&mut self, now: u64, pkt: &[u8]) {
        if self.chance(self.cfg.loss) {
            self.stats.dropped += 1;
            return;
        }
        let mut p = pkt.to_vec();
        if !p.is_empty() && self.chance(self.cfg.corrupt) {
            let i = (self.next() % p.len() as u64) as usize;
            p[i] ^= 1 << (self.next() % 8);
            self.stats.corrupted += 1;
        }
        let mut at = now + self.cfg.delay_ns;
        if self.cfg.jitter_ns > 0 {
            at += self.next() % self.cfg.jitter_ns;
        }
        if self.chance(self.cfg.reorder) {
            at += self.cfg.reorder_delay_ns;
            self.stats.reordered += 1;
        }
        if self.chance(self.cfg.duplicate) {
            self.stats.duplicated += 1;
            self.enqueue(at, p.clone());
        }
        self.stats.passed += 1;
        self.enqueue(at, p);
    }

    /// Next packet due at `now`.
    pub fn pop(&mut self, now: u64) -> Option<Vec<u8>> {
        if self
            .queue
            .peek()
            .is_some_and(|Reverse((t, _, _))| *t <= now)
        {
            return self.queue.pop().map(|Reverse((_, _, p))| p);
        }
        None
    }

    pub fn next_release(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_the_options_form() {
        let c = FaultConfig::parse("loss=0.01, dup=0.5,reorder=0.1,seed=9,delay_us=3").unwrap();
        assert_eq!(c.loss, 0.01);
        assert_eq!(c.duplicate, 0.5);
        assert_eq!(c.reorder_delay_ns, 100_000);
        assert_eq!(c.delay_ns, 3000);
        assert_eq!(c.seed, 9);
        assert!(c.is_active());
        assert!(!FaultConfig::parse("").unwrap().is_active());
        assert!(FaultConfig::parse("loss=2").is_err());
        assert!(FaultConfig::parse("lose=0.1").is_err());
        assert!(FaultConfig::parse("loss").is_err());
    }

    #[test]
    fn engine_form_with_percent_and_dir() {
        let f = EngineFaults::parse("seed=1,loss=1%,dup=0.5%,reorder=1%,delay_us=50,corrupt=0.1%")
            .unwrap()
            .unwrap();
        assert_eq!(f.dir, FaultDir::Both);
        assert!((f.cfg.loss - 0.01).abs() < 1e-12);
        assert!((f.cfg.duplicate - 0.005).abs() < 1e-12);
        assert!((f.cfg.corrupt - 0.001).abs() < 1e-12);
        assert_eq!(f.cfg.delay_ns, 50_000);
        let tx = f.tx().unwrap();
        assert_eq!((tx.delay_ns, tx.reorder, tx.seed), (0, 0.0, 2));
        let f = EngineFaults::parse("loss=0.1,dir=rx").unwrap().unwrap();
        assert!(f.tx().is_none() && f.rx().is_some());
        assert_eq!(EngineFaults::parse("").unwrap(), None);
        assert_eq!(EngineFaults::parse("seed=3").unwrap(), None);
        assert!(EngineFaults::parse("loss=200%").is_err());
        assert!(EngineFaults::parse("dir=up,loss=1%").is_err());
    }

    #[test]
    fn default_is_a_wire() {
        let mut f = FaultInjector::new(FaultConfig::default());
        for i in 0..100u8 {
            f.push(0, &[i]);
        }
        for i in 0..100u8 {
            assert_eq!(f.pop(0), Some(vec![i]));
        }
        assert!(f.pop(0).is_none());
    }

    #[test]
    fn seeded_and_roughly_calibrated() {
        let cfg = FaultConfig {
            loss: 0.1,
            duplicate: 0.05,
            seed: 7,
            ..FaultConfig::default()
        };
        let run = || {
            let mut f = FaultInjector::new(cfg.clone());
            for i in 0..10000u32 {
                f.push(0, &i.to_be_bytes());
            }
            let mut out = vec![];
            while let Some(p) = f.pop(0) {
                out.push(p);
            }
            (out, f.stats.clone())
        };
        let (a, sa) = run();
        let (b, _) = run();
        assert_eq!(a, b, "same seed, same outcome");
        assert!((800..1200).contains(&sa.dropped), "{sa:?}");
        assert!((300..700).contains(&sa.duplicated), "{sa:?}");
    }

    #[test]
    fn reorder_lets_later_packets_overtake() {
        let mut f = FaultInjector::new(FaultConfig {
            reorder: 1.0,
            reorder_delay_ns: 10,
            ..FaultConfig::default()
        });
        f.push(0, b"a");
        let mut g = FaultInjector::new(FaultConfig::default());
        g.push(5, b"b");
        assert!(f.pop(5).is_none());
        assert_eq!(f.pop(10), Some(b"a".to_vec()));
        assert_eq!(f.next_release(), None);
    }
}
