//! Progress: what runs now and how long is left (an indicatif bar on a
//! terminal, one line per step otherwise, so `make lab` logs show progress).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::cell::Cell;
use std::io::IsTerminal;
use std::time::Instant;

pub struct Progress {
    bar: Option<ProgressBar>,
    total: Cell<f64>,
    done: Cell<f64>,
    start: Instant,
    steps: Cell<u64>,
    quiet: bool,
}

impl Progress {
    /// `total_s`: the estimated seconds of the whole run.
    pub fn new(total_s: f64, quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(
                Some((total_s * 10.0) as u64),
                ProgressDrawTarget::stderr(),
            );
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% ~{eta} left  {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.enable_steady_tick(std::time::Duration::from_millis(200));
            b
        });
        Progress {
            bar,
            total: Cell::new(total_s),
            done: Cell::new(0.0),
            start: Instant::now(),
            steps: Cell::new(0),
            quiet,
        }
    }

    /// A step starts; `est_s` is what it is expected to take.
    pub fn step(&self, what: &str, est_s: f64) {
        self.steps.set(self.steps.get() + 1);
        let done = self.done.get();
        self.done.set(done + est_s);
        if self.done.get() > self.total.get() {
            self.total.set(self.done.get());
            if let Some(b) = &self.bar {
                b.set_length((self.total.get() * 10.0) as u64);
            }
        }
        match &self.bar {
            Some(b) => {
                b.set_message(what.to_string());
                b.set_position((done * 10.0) as u64);
            }
            None if !self.quiet => {
                let el = self.start.elapsed().as_secs_f64();
                let frac = (done / self.total.get().max(1e-9)).clamp(0.0, 1.0);
                let left = if frac > 0.02 {
                    el / frac - el
                } else {
                    self.total.get() - done
                };
                eprintln!(
                    "[{:>5.0}s {:>3.0}% ~{:.0}s left] {what}",
                    el,
                    frac * 100.0,
                    left.max(0.0)
                );
            }
            None => {}
        }
    }

    pub fn note(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None if !self.quiet => eprintln!("{msg}"),
            None => {}
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
