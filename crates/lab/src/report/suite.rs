//! The experiments of a report behind one small trait: an id, a time
//! estimate for the progress bar, and the run itself. `all()` is the order
//! a report runs them in. New experiments live in their own file (like
//! `loss.rs`) and are added here; the seed experiments still share
//! `experiments.rs` and are registered through `Seed`.

use super::experiments::Ctx;
use super::model::Experiment;

pub trait ExperimentKind {
    /// Stable id: `--only` value, results.json `experiments[].id`.
    fn id(&self) -> &'static str;
    /// Seconds it should take (progress estimate).
    fn estimate_s(&self, ctx: &Ctx) -> f64;
    fn run(&self, ctx: &Ctx) -> Experiment;
}

/// A seed experiment implemented as a pair of `Ctx` methods.
pub struct Seed {
    pub id: &'static str,
    pub est: fn(&Ctx) -> f64,
    pub run: fn(&Ctx) -> Experiment,
}

impl ExperimentKind for Seed {
    fn id(&self) -> &'static str {
        self.id
    }
    fn estimate_s(&self, ctx: &Ctx) -> f64 {
        (self.est)(ctx)
    }
    fn run(&self, ctx: &Ctx) -> Experiment {
        (self.run)(ctx)
    }
}

/// Every experiment, in run order. `loss` runs last: it turns the lab into
/// an impaired one for its duration and back into a plain pair afterwards.
pub fn all() -> Vec<Box<dyn ExperimentKind>> {
    vec![
        Box::new(Seed {
            id: "latency_vs_size",
            est: |c| c.est_latency_vs_size(),
            run: |c| c.latency_vs_size(),
        }),
        Box::new(Seed {
            id: "latency_under_load",
            est: |c| c.est_latency_under_load(),
            run: |c| c.latency_under_load(),
        }),
        Box::new(Seed {
            id: "max_rate",
            est: |c| c.est_max_rate(),
            run: |c| c.max_rate(),
        }),
        Box::new(Seed {
            id: "microburst",
            est: |c| c.est_bursts(),
            run: |c| c.bursts(),
        }),
        Box::new(Seed {
            id: "throughput",
            est: |c| c.est_throughput(),
            run: |c| c.throughput(),
        }),
        Box::new(Seed {
            id: "latency_vs_load",
            est: |c| c.est_load(),
            run: |c| c.latency_vs_load(),
        }),
        Box::new(Seed {
            id: "tick_to_trade",
            est: |c| c.est_tick_to_trade(),
            run: |c| c.tick_to_trade(),
        }),
        Box::new(super::capture::Capture),
        Box::new(super::loss::Loss),
    ]
}

/// The ids of `all()`, for `--only` validation and help.
pub fn ids() -> Vec<&'static str> {
    all().iter().map(|e| e.id()).collect()
}
