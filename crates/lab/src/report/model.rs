//! What a report holds: every number behind every plot and table, written to
//! `results.json` and rendered to `index.html`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const SCHEMA: &str = "nanowire-lab-report/1";

/// One x position of a series: the median of the repeats and their spread.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Point {
    pub x: f64,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Every repeat's value (the median/min/max are derived from these).
    pub samples: Vec<f64>,
    /// The value is a lower bound: the search stopped at its largest trial.
    #[serde(default)]
    pub lower_bound: bool,
}

impl Point {
    /// `None` when there is nothing finite to summarize.
    pub fn from_samples(x: f64, samples: Vec<f64>) -> Option<Point> {
        let mut v: Vec<f64> = samples.into_iter().filter(|s| s.is_finite()).collect();
        if v.is_empty() || !x.is_finite() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        Some(Point {
            x,
            median: median_sorted(&v),
            min: v[0],
            max: v[v.len() - 1],
            samples: v,
            lower_bound: false,
        })
    }
    /// Relative spread (max - min) / median.
    pub fn spread(&self) -> f64 {
        if self.median.abs() < f64::EPSILON {
            0.0
        } else {
            (self.max - self.min) / self.median.abs()
        }
    }
}

pub fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(|a, b| a.total_cmp(b));
    median_sorted(&s)
}

/// The median of what `f` reads from each item (those it finds).
pub fn median_of<T>(items: impl IntoIterator<Item = T>, f: impl FnMut(T) -> Option<f64>) -> f64 {
    median(&items.into_iter().filter_map(f).collect::<Vec<_>>())
}

/// A line (or a set of bars) of one engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Series {
    pub label: String,
    pub engine: String,
    pub protocol: String,
    pub metric: String,
    pub points: Vec<Point>,
    /// x positions that were measured but could not be sustained (shown as gaps).
    #[serde(default)]
    pub missing: Vec<f64>,
}

impl Series {
    /// An empty line: points and gaps are pushed as they are measured.
    pub fn new(
        label: impl ToString,
        engine: impl ToString,
        protocol: &str,
        metric: impl Into<String>,
    ) -> Series {
        Series {
            label: label.to_string(),
            engine: engine.to_string(),
            protocol: protocol.into(),
            metric: metric.into(),
            points: vec![],
            missing: vec![],
        }
    }
    pub fn with_points(self, points: Vec<Point>) -> Series {
        Series { points, ..self }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plot {
    pub id: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub y_log: bool,
    /// Bar chart over these categories (x = index) instead of lines.
    #[serde(default)]
    pub categories: Option<Vec<String>>,
    pub series: Vec<Series>,
}

/// A plot's id and title, before its axes and series.
pub struct PlotName {
    pub id: String,
    pub title: String,
}

impl PlotName {
    /// Lines over log-log axes (how every sweep is drawn), labelled
    /// `(x, y)`.
    pub fn log_log(self, (x_label, y_label): (&str, &str), series: Vec<Series>) -> Plot {
        Plot::log_log(self.id, self.title, x_label, y_label, series)
    }
}

impl Plot {
    /// One protocol's plot of an experiment: id `<name>_<proto>`, the title
    /// after the protocol's name (`UDP <title>`).
    pub fn per_proto(proto: &str, name: &str, title: &str) -> PlotName {
        PlotName {
            id: format!("{name}_{proto}"),
            title: format!("{} {title}", proto.to_uppercase()),
        }
    }
    /// Lines over log-log axes (how every sweep is drawn).
    pub fn log_log(
        id: String,
        title: String,
        x_label: &str,
        y_label: &str,
        series: Vec<Series>,
    ) -> Plot {
        Plot {
            id,
            title,
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_log: true,
            y_log: true,
            categories: None,
            series,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table {
    pub caption: String,
    pub columns: Vec<String>,
    /// Cells are numbers or strings ("n/a: why", labels).
    pub rows: Vec<Vec<Value>>,
}

/// Whether an engine/protocol was measured in an experiment, and if not, why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Coverage {
    pub engine: String,
    pub protocol: String,
    pub available: bool,
    #[serde(default)]
    pub reason: Option<String>,
}

/// Who an experiment is, whatever a run measures (each one's is written
/// once, in `suite::all`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    /// Stable id: the `--only` value, results.json `experiments[].id`.
    pub id: String,
    pub title: String,
    /// The seed (or issue) whose methodology it follows.
    pub seed: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Experiment {
    /// `id`, `title` and `seed` in results.json.
    #[serde(flatten)]
    pub who: Identity,
    pub method: String,
    pub plots: Vec<Plot>,
    pub tables: Vec<Table>,
    pub notes: Vec<String>,
    pub coverage: Vec<Coverage>,
    /// The raw JSON of every measurement run behind the plots and tables.
    pub runs: Vec<Value>,
    pub elapsed_s: f64,
}

impl Experiment {
    pub fn new(id: &str, title: &str, seed: &str, method: &str) -> Experiment {
        let who = Identity {
            id: id.into(),
            title: title.into(),
            seed: seed.into(),
        };
        Experiment::of(who, method)
    }
    /// An experiment with nothing measured yet.
    pub fn of(who: Identity, method: &str) -> Experiment {
        Experiment {
            who,
            method: method.into(),
            plots: vec![],
            tables: vec![],
            notes: vec![],
            coverage: vec![],
            runs: vec![],
            elapsed_s: 0.0,
        }
    }
    pub fn measured(&mut self, engine: &str, protocol: &str) {
        if !self
            .coverage
            .iter()
            .any(|c| c.engine == engine && c.protocol == protocol)
        {
            self.coverage.push(Coverage {
                engine: engine.into(),
                protocol: protocol.into(),
                available: true,
                reason: None,
            });
        }
    }
    /// Record how one engine/protocol's measuring loop ended: a failure before
    /// any data makes it "not available" with the reason; a failure after
    /// some data keeps what was measured and says what went missing
    /// (`note(reason)`); no failure means measured.
    pub fn settle(
        &mut self,
        engine: &str,
        protocol: &str,
        failed: Option<String>,
        have_data: bool,
        note: impl FnOnce(String) -> String,
    ) {
        match failed {
            Some(r) if !have_data => self.unavailable(engine, protocol, r),
            Some(r) => {
                self.measured(engine, protocol);
                self.notes.push(note(r));
            }
            None => self.measured(engine, protocol),
        }
    }

    pub fn unavailable(&mut self, engine: &str, protocol: &str, reason: impl Into<String>) {
        let reason = reason.into();
        self.coverage
            .retain(|c| !(c.engine == engine && c.protocol == protocol));
        self.coverage.push(Coverage {
            engine: engine.into(),
            protocol: protocol.into(),
            available: false,
            reason: Some(reason),
        });
    }
    pub fn is_available(&self, engine: &str, protocol: &str) -> bool {
        self.coverage
            .iter()
            .any(|c| c.engine == engine && c.protocol == protocol && c.available)
    }
    /// Add a note for every point whose repeats spread widely.
    pub fn flag_spread(&mut self, threshold: f64) {
        let mut notes = vec![];
        for p in &self.plots {
            for s in &p.series {
                for pt in &s.points {
                    if pt.samples.len() > 1 && pt.spread() > threshold {
                        notes.push(format!(
                            "Large spread: {} {} at x={}: repeats range {:.3}..{:.3} around a median of {:.3} ({:.0}%).",
                            p.title,
                            s.label,
                            fmt_num(pt.x),
                            pt.min,
                            pt.max,
                            pt.median,
                            pt.spread() * 100.0
                        ));
                    }
                }
            }
        }
        notes.sort();
        notes.dedup();
        self.notes.extend(notes);
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub generated_unix: u64,
    pub mode: String,
    pub engines: Vec<String>,
    pub repeats: u32,
    /// `lab:<name>` or `peer:<addr>%<iface>`.
    pub target: String,
    pub elapsed_s: f64,
    pub env: Value,
    pub headline: Table,
    pub experiments: Vec<Experiment>,
}

/// Compact number formatting for tables and notes.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 || (v.fract() == 0.0 && a < 1e4) {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.2e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_summary() {
        let p = Point::from_samples(1.0, vec![3.0, 1.0, 2.0, f64::NAN]).unwrap();
        assert_eq!((p.min, p.median, p.max), (1.0, 2.0, 3.0));
        assert_eq!(p.samples.len(), 3);
        assert!(Point::from_samples(1.0, vec![f64::NAN]).is_none());
        assert!((p.spread() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn median_even() {
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
