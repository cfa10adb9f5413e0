//! The experiments of a report: each one's identity (id, title, the seed or
//! issue it follows), written here once, and behind one small trait its time
//! estimate for the progress bar and its run. `all()` is the order a report
//! runs them in. New experiments live in their own file (like `loss.rs`) and
//! are added here; the seed experiments share `experiments/` (one file each,
//! a pair of `Ctx` methods) and are registered through `Seed`.

use super::experiments::Ctx;
pub use super::experiments::ExperimentKind;
use super::model::{Experiment, Identity};

/// One experiment of the suite: who it is and how it runs.
pub struct Entry {
    pub who: Identity,
    pub kind: Box<dyn ExperimentKind>,
}

impl Entry {
    /// Run it: the experiment starts with its identity, the run adds its
    /// method and everything measured.
    pub fn run(&self, ctx: &Ctx) -> Experiment {
        self.kind.run(ctx, Experiment::of(self.who.clone(), ""))
    }
}

/// A seed experiment implemented as a pair of `Ctx` methods.
pub struct Seed {
    pub est: fn(&Ctx) -> f64,
    pub run: fn(&Ctx, Experiment) -> Experiment,
}

impl ExperimentKind for Seed {
    fn estimate_s(&self, ctx: &Ctx) -> f64 {
        (self.est)(ctx)
    }
    fn run(&self, ctx: &Ctx, ex: Experiment) -> Experiment {
        (self.run)(ctx, ex)
    }
}

fn entry(
    id: &'static str,
    title: &'static str,
    seed: &'static str,
    kind: impl ExperimentKind + 'static,
) -> Entry {
    Entry {
        who: Identity {
            id: id.into(),
            title: title.into(),
            seed: seed.into(),
        },
        kind: Box::new(kind),
    }
}

fn seed(est: fn(&Ctx) -> f64, run: fn(&Ctx, Experiment) -> Experiment) -> Seed {
    Seed { est, run }
}

/// Every experiment, in run order. `loss` runs last: it turns the lab into
/// an impaired one for its duration and back into a plain pair afterwards.
pub fn all() -> Vec<Entry> {
    vec![
        entry(
            "latency_vs_size",
            "1. Latency vs message size",
            "seeds 000, 001, 002",
            seed(|c| c.est_latency_vs_size(), |c, ex| c.latency_vs_size(ex)),
        ),
        entry(
            "latency_under_load",
            "2. Latency under load",
            "seeds 000, 003",
            seed(
                |c| c.est_latency_under_load(),
                |c, ex| c.latency_under_load(ex),
            ),
        ),
        entry(
            "max_rate",
            "3. Maximum message rate with zero loss",
            "seed 003 table 1",
            seed(|c| c.est_max_rate(), |c, ex| c.max_rate(ex)),
        ),
        entry(
            "microburst",
            "4. Microburst tolerance",
            "seed 000 (RFC 2544 back-to-back)",
            seed(|c| c.est_bursts(), |c, ex| c.bursts(ex)),
        ),
        entry(
            "throughput",
            "5. Throughput and CPU efficiency vs I/O size",
            "seed 001",
            seed(|c| c.est_throughput(), |c, ex| c.throughput(ex)),
        ),
        entry(
            "latency_vs_load",
            "6. Latency vs network load",
            "seed 004",
            seed(|c| c.est_load(), |c, ex| c.latency_vs_load(ex)),
        ),
        entry(
            "tick_to_trade",
            "10. Tick-to-trade",
            "Onload trade_sim",
            seed(|c| c.est_tick_to_trade(), |c, ex| c.tick_to_trade(ex)),
        ),
        entry(
            "capture",
            "9. Capture of accelerated traffic, and where the time goes",
            "issue 13",
            super::capture::Capture,
        ),
        entry(
            "loss",
            "8. Loss on an impaired wire",
            "issue 12",
            super::loss::Loss,
        ),
    ]
}

/// The ids of `all()`, for `--only` validation and help.
pub fn ids() -> Vec<String> {
    all().into_iter().map(|e| e.who.id).collect()
}
