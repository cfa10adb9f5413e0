//! The experiments of a report behind one small trait: an id, a time
//! estimate for the progress bar, and the run itself. `all()` is the order
//! a report runs them in. New experiments live in their own file (like
//! `loss.rs`) and are added here; the seed experiments still share
//! `experiments.rs` and are registered through `Seed`.

use super::experiments::Ctx;
pub use super::experiments::ExperimentKind;
use super::model::Experiment;

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

fn seed(
    id: &'static str,
    est: fn(&Ctx) -> f64,
    run: fn(&Ctx) -> Experiment,
) -> Box<dyn ExperimentKind> {
    Box::new(Seed { id, est, run })
}

/// Every experiment, in run order. `loss` runs last: it turns the lab into
/// an impaired one for its duration and back into a plain pair afterwards.
pub fn all() -> Vec<Box<dyn ExperimentKind>> {
    vec![
        seed(
            "latency_vs_size",
            |c| c.est_latency_vs_size(),
            |c| c.latency_vs_size(),
        ),
        seed(
            "latency_under_load",
            |c| c.est_latency_under_load(),
            |c| c.latency_under_load(),
        ),
        seed("max_rate", |c| c.est_max_rate(), |c| c.max_rate()),
        seed("microburst", |c| c.est_bursts(), |c| c.bursts()),
        seed("throughput", |c| c.est_throughput(), |c| c.throughput()),
        seed("latency_vs_load", |c| c.est_load(), |c| c.latency_vs_load()),
        seed(
            "tick_to_trade",
            |c| c.est_tick_to_trade(),
            |c| c.tick_to_trade(),
        ),
        Box::new(super::capture::Capture),
        Box::new(super::loss::Loss),
    ]
}

/// The ids of `all()`, for `--only` validation and help.
pub fn ids() -> Vec<&'static str> {
    all().iter().map(|e| e.id()).collect()
}
