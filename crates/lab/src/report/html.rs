//! `index.html`: one self-contained page (inline CSS and SVG, no scripts, no
//! network) rendered from the [`Report`].

use super::model::{Experiment, Plot, Report, Table, fmt_num};
use plotters::chart::MeshStyle;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::prelude::*;
use serde_json::Value;

const W: u32 = 760;
const H: u32 = 400;

/// Engine colours, shared by every plot and the tables.
fn engine_color(e: &str, i: usize) -> RGBColor {
    match e.split(' ').next().unwrap_or("") {
        "kernel" if e.contains("iperf3") => RGBColor(230, 145, 56),
        "kernel" => RGBColor(204, 63, 63),
        "spin" => RGBColor(52, 120, 198),
        "xdp" => RGBColor(46, 160, 90),
        _ => PALETTE[i % PALETTE.len()],
    }
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(52, 120, 198),
    RGBColor(204, 63, 63),
    RGBColor(46, 160, 90),
    RGBColor(230, 145, 56),
    RGBColor(130, 90, 180),
    RGBColor(120, 120, 120),
    RGBColor(0, 160, 170),
    RGBColor(190, 90, 140),
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Render one plot to an SVG string; a plot without data becomes a short
/// message instead of an empty frame.
/// One legend entry: label, colour, marker (0 circle, 1 triangle, 2 cross, 3 bar).
pub type LegendEntry = (String, RGBColor, u8);

/// The legend of a plot (drawn in HTML under the SVG, where it hides no data).
pub fn legend(p: &Plot) -> Vec<LegendEntry> {
    let mut engines: Vec<&str> = vec![];
    for s in &p.series {
        if !engines.contains(&s.engine.as_str()) {
            engines.push(&s.engine);
        }
    }
    if p.categories.is_some() {
        if p.series.len() == 1 {
            return p.categories.as_ref().map_or(vec![], |c| {
                c.iter()
                    .enumerate()
                    .map(|(i, c)| (c.clone(), engine_color(c, i), 3))
                    .collect()
            });
        }
        return p
            .series
            .iter()
            .enumerate()
            .map(|(k, s)| (s.label.clone(), engine_color(&s.engine, k), 3))
            .collect();
    }
    let mut v: Vec<LegendEntry> = p
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (
                s.label.clone(),
                series_color(p, &engines, i),
                marker_for(&s.metric),
            )
        })
        .collect();
    if p.series.iter().any(|s| !s.missing.is_empty()) {
        v.push((
            "on the x axis: offered but not sustained (see the table)".into(),
            RGBColor(90, 90, 90),
            5,
        ));
    }
    v
}

fn series_color(p: &Plot, engines: &[&str], i: usize) -> RGBColor {
    let s = &p.series[i];
    if engines.len() > 1 {
        engine_color(
            &s.label,
            engines.iter().position(|x| *x == s.engine).unwrap_or(0),
        )
    } else {
        PALETTE[i % PALETTE.len()]
    }
}

pub fn plot_svg(p: &Plot) -> Result<String, String> {
    let mut svg = String::new();
    let empty = p.series.iter().all(|s| s.points.is_empty());
    {
        let root =
            SVGBackend::with_string(&mut svg, (W, if empty { 70 } else { H })).into_drawing_area();
        if empty {
            root.fill(&RGBColor(250, 250, 250))
                .map_err(|e| e.to_string())?;
            root.draw(&Text::new(
                format!(
                    "{}: no engine produced data for this plot (see above and the table)",
                    p.title
                ),
                (16, 28),
                ("sans-serif", 15)
                    .into_font()
                    .color(&RGBColor(120, 120, 120)),
            ))
            .map_err(|e| e.to_string())?;
            root.present().map_err(|e| e.to_string())?;
            drop(root);
            return Ok(svg);
        }
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let r = if p.categories.is_some() {
            bars(&root, p)
        } else {
            lines(&root, p)
        };
        r?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn bounds(vals: impl Iterator<Item = f64>, log: bool) -> Option<(f64, f64)> {
    let v: Vec<f64> = vals
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .collect();
    if v.is_empty() {
        return None;
    }
    let (mut lo, mut hi) = (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    if log {
        lo /= 1.6;
        hi *= 1.6;
        // At least a decade, so the axis gets labelled ticks.
        if hi / lo < 10.0 {
            let c = (hi * lo).sqrt();
            lo = c / 3.2;
            hi = c * 3.2;
        }
    } else {
        let pad = ((hi - lo) * 0.08).max(hi.abs() * 0.05).max(1e-9);
        lo = if lo >= 0.0 { 0.0 } else { lo - pad };
        hi += pad;
    }
    if hi <= lo {
        hi = lo + 1.0;
    }
    Some((lo, hi))
}

fn marker_for(metric: &str) -> u8 {
    match metric {
        "min" => 1,
        "p99" => 2,
        "p99.9" => 4,
        _ => 0,
    }
}

fn lines(root: &DrawingArea<SVGBackend, Shift>, p: &Plot) -> Result<(), String> {
    let xs = p.series.iter().flat_map(|s| {
        s.points
            .iter()
            .map(|pt| pt.x)
            .chain(s.missing.iter().copied())
    });
    let ys = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().flat_map(|pt| [pt.min, pt.max, pt.median]));
    let (Some(xb), Some(yb)) = (bounds(xs, p.x_log), bounds(ys, p.y_log)) else {
        return no_data(root, p);
    };
    match (p.x_log, p.y_log) {
        (true, true) => draw_lines(
            root,
            p,
            (xb.0..xb.1).log_scale(),
            (yb.0..yb.1).log_scale(),
            yb.0,
        ),
        (true, false) => draw_lines(root, p, (xb.0..xb.1).log_scale(), yb.0..yb.1, yb.0),
        (false, true) => draw_lines(root, p, xb.0..xb.1, (yb.0..yb.1).log_scale(), yb.0),
        (false, false) => draw_lines(root, p, xb.0..xb.1, yb.0..yb.1, yb.0),
    }
}

fn no_data(root: &DrawingArea<SVGBackend, Shift>, p: &Plot) -> Result<(), String> {
    root.draw(&Text::new(
        format!(
            "{}: no engine produced data for this plot (see the table)",
            p.title
        ),
        (20, (H / 2) as i32),
        ("sans-serif", 16)
            .into_font()
            .color(&RGBColor(120, 120, 120)),
    ))
    .map_err(|e| e.to_string())
}

fn draw_lines<X, Y>(
    root: &DrawingArea<SVGBackend, Shift>,
    p: &Plot,
    xr: X,
    yr: Y,
    y_floor: f64,
) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let mut chart = house_chart(root).build_cartesian_2d(xr, yr).map_err(e)?;
    let fx = |v: &f64| fmt_num(*v);
    house_mesh(
        chart
            .configure_mesh()
            .x_label_formatter(&fx)
            .y_label_formatter(&fx),
        p,
    )
    .draw()
    .map_err(e)?;
    // Series of one engine share a colour; metrics get their own markers.
    let mut engines: Vec<&str> = vec![];
    for s in &p.series {
        if !engines.contains(&s.engine.as_str()) {
            engines.push(&s.engine);
        }
    }
    for (i, s) in p.series.iter().enumerate() {
        let c = series_color(p, &engines, i);
        let pts: Vec<(f64, f64)> = s.points.iter().map(|pt| (pt.x, pt.median)).collect();
        let m = marker_for(&s.metric);
        let style = if m == 1 {
            c.mix(0.55).stroke_width(1)
        } else {
            c.stroke_width(2)
        };
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(e)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart
            .draw_series(s.points.iter().filter(|pt| pt.max > pt.min).map(|pt| {
                ErrorBar::new_vertical(
                    pt.x,
                    pt.min,
                    pt.median,
                    pt.max,
                    c.mix(0.7).stroke_width(1),
                    8,
                )
            }))
            .map_err(e)?;
        match m {
            1 => {
                chart
                    .draw_series(
                        pts.iter()
                            .map(|&(x, y)| TriangleMarker::new((x, y), 4, c.filled())),
                    )
                    .map_err(e)?;
            }
            2 => {
                chart
                    .draw_series(
                        pts.iter()
                            .map(|&(x, y)| Cross::new((x, y), 4, c.stroke_width(2))),
                    )
                    .map_err(e)?;
            }
            4 => {
                chart
                    .draw_series(
                        pts.iter()
                            .map(|&(x, y)| Circle::new((x, y), 4, c.stroke_width(2))),
                    )
                    .map_err(e)?;
            }
            _ => {
                chart
                    .draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled())))
                    .map_err(e)?;
            }
        }
        // Unsustained points: a hollow marker on the floor of the plot.
        chart
            .draw_series(
                s.missing
                    .iter()
                    .map(|&x| Circle::new((x, y_floor), 5, c.stroke_width(1))),
            )
            .map_err(e)?;
    }
    Ok(())
}

fn bars(root: &DrawingArea<SVGBackend, Shift>, p: &Plot) -> Result<(), String> {
    let cats = p.categories.clone().unwrap_or_default();
    let ys = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().flat_map(|pt| [pt.min, pt.max, pt.median]));
    let Some(yb) = bounds(ys, p.y_log) else {
        return no_data(root, p);
    };
    let n = cats.len().max(1) as f64;
    if p.y_log {
        let yb = (yb.0, yb.1 * 2.0);
        draw_bars(
            root,
            p,
            &cats,
            -0.5..n - 0.5,
            (yb.0..yb.1).log_scale(),
            yb.0,
        )
    } else {
        draw_bars(root, p, &cats, -0.5..n - 0.5, yb.0..yb.1 * 1.08, yb.0)
    }
}

fn draw_bars<Y>(
    root: &DrawingArea<SVGBackend, Shift>,
    p: &Plot,
    cats: &[String],
    xr: std::ops::Range<f64>,
    yr: Y,
    y_floor: f64,
) -> Result<(), String>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let mut chart = house_chart(root).build_cartesian_2d(xr, yr).map_err(e)?;
    let fx = |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 {
            cats.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let fy = |v: &f64| fmt_num(*v);
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh()
        .x_labels(cats.len() * 2 + 1)
        .x_label_formatter(&fx)
        .y_label_formatter(&fy);
    house_mesh(&mut mesh, p).draw().map_err(e)?;
    let m = p.series.len().max(1) as f64;
    let w = 0.8 / m;
    for (k, s) in p.series.iter().enumerate() {
        // Single-series bar charts (one bar per engine) colour each bar by its category.
        let single = p.series.len() == 1;
        let c = engine_color(&s.engine, k);
        let off = (k as f64 - (m - 1.0) / 2.0) * w;
        for pt in &s.points {
            let cc = if single {
                engine_color(
                    cats.get(pt.x as usize).map(String::as_str).unwrap_or(""),
                    pt.x as usize,
                )
            } else {
                c
            };
            let x0 = pt.x + off - w * 0.45;
            let x1 = pt.x + off + w * 0.45;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, y_floor), (x1, pt.median)],
                    cc.mix(0.85).filled(),
                )))
                .map_err(e)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!(
                        "{}{}",
                        if pt.lower_bound { "≥ " } else { "" },
                        fmt_num(pt.median)
                    ),
                    (pt.x + off, pt.median),
                    ("sans-serif", 15)
                        .into_font()
                        .color(&RGBColor(40, 40, 40))
                        .pos(plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Center,
                            plotters::style::text_anchor::VPos::Bottom,
                        )),
                )))
                .map_err(e)?;
            if pt.max > pt.min {
                chart
                    .draw_series(std::iter::once(ErrorBar::new_vertical(
                        pt.x + off,
                        pt.min,
                        pt.median,
                        pt.max,
                        RGBColor(40, 40, 40).stroke_width(1),
                        8,
                    )))
                    .map_err(e)?;
            }
        }
        if !single {
            chart
                .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
                .map_err(e)?
                .label(s.label.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
    }
    Ok(())
}

/// Escaped text with `code` spans.
fn prose(s: &str) -> String {
    let e = esc(s);
    let mut out = String::new();
    for (i, part) in e.split('`').enumerate() {
        if i % 2 == 1 {
            out += &format!("<code>{part}</code>");
        } else {
            out += part;
        }
    }
    out
}

fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => esc(s),
        Value::Number(n) => n.as_f64().map(fmt_num).unwrap_or_else(|| n.to_string()),
        Value::Null => "—".into(),
        o => esc(&o.to_string()),
    }
}

fn table_html(t: &Table) -> String {
    let mut h = format!(
        "<div class=\"tw\"><table><caption>{}</caption><thead><tr>",
        esc(&t.caption)
    );
    for c in &t.columns {
        h += &format!("<th>{}</th>", esc(c));
    }
    h += "</tr></thead><tbody>";
    for r in &t.rows {
        h += "<tr>";
        for (i, v) in r.iter().enumerate() {
            let cls = if v.is_number() { " class=\"n\"" } else { "" };
            let txt = cell(v);
            let e = v.as_str().unwrap_or("");
            if i == 0 && ["kernel", "spin", "xdp"].contains(&e.split(' ').next().unwrap_or("")) {
                let c = engine_color(e, 0);
                h += &format!(
                    "<td><span class=\"dot\" style=\"background:rgb({},{},{})\"></span>{txt}</td>",
                    c.0, c.1, c.2
                );
            } else {
                h += &format!("<td{cls}>{txt}</td>");
            }
        }
        h += "</tr>";
    }
    if t.rows.is_empty() {
        h += &format!(
            "<tr><td colspan=\"{}\" class=\"na\">no data</td></tr>",
            t.columns.len()
        );
    }
    h + "</tbody></table></div>"
}

fn section(ex: &Experiment) -> String {
    let mut h = format!(
        "<section id=\"{id}\" data-experiment=\"{id}\"><h2>{}</h2><p class=\"seed\">Methodology of {}</p><p class=\"method\">{}</p>",
        esc(&ex.who.title),
        esc(&ex.who.seed),
        prose(&ex.method),
        id = esc(&ex.who.id)
    );
    let na: Vec<_> = ex.coverage.iter().filter(|c| !c.available).collect();
    if !na.is_empty() {
        h += "<ul class=\"na\">";
        for c in na {
            h += &format!(
                "<li><b>{} {}</b>: not available: {}</li>",
                esc(&c.engine),
                esc(&c.protocol.to_uppercase()),
                esc(c.reason.as_deref().unwrap_or("?"))
            );
        }
        h += "</ul>";
    }
    h += "<div class=\"plots\">";
    for p in &ex.plots {
        match plot_svg(p) {
            Ok(svg) => {
                let mut lg = String::new();
                for (label, c, m) in legend(p) {
                    let sym = match m {
                        1 => "▲",
                        2 => "✕",
                        3 => "■",
                        4 => "○",
                        5 => "◌",
                        _ => "●",
                    };
                    lg += &format!(
                        "<span class=\"lg\"><i style=\"color:rgb({},{},{})\">{sym}</i>{}</span>",
                        c.0,
                        c.1,
                        c.2,
                        esc(&label)
                    );
                }
                h += &format!(
                    "<figure class=\"plot\" data-plot=\"{}\"><figcaption>{}</figcaption>{svg}<div class=\"legend\">{lg}</div></figure>",
                    esc(&p.id),
                    esc(&p.title)
                )
            }
            Err(e) => {
                h += &format!(
                    "<p class=\"err\">plot {} failed: {}</p>",
                    esc(&p.id),
                    esc(&e)
                )
            }
        }
    }
    h += "</div>";
    for t in &ex.tables {
        h += &table_html(t);
    }
    if !ex.notes.is_empty() {
        h += "<div class=\"notes\"><b>Notes</b><ul>";
        for n in &ex.notes {
            h += &format!("<li>{}</li>", prose(n));
        }
        h += "</ul></div>";
    }
    h += &format!(
        "<p class=\"foot\">{} measurement runs, {:.0} s. Raw data: <code>results.json</code> → experiments[id={}].</p></section>",
        ex.runs.len(),
        ex.elapsed_s,
        esc(&ex.who.id)
    );
    h
}

fn env_html(env: &Value) -> String {
    let mut rows = String::new();
    let mut add =
        |k: &str, v: String| rows += &format!("<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "—".into(),
        o => o.to_string(),
    };
    for k in [
        "kernel",
        "cpu_model",
        "cpus",
        "memory",
        "virtualization",
        "loadavg_start",
        "loadavg_end",
    ] {
        add(k, s(&env[k]));
    }
    if let Some(ev) = env["virtualization_evidence"].as_array() {
        add(
            "virtualization evidence",
            ev.iter().map(s).collect::<Vec<_>>().join("; "),
        );
    }
    let idle = &env["cpu_idle_before"];
    if idle.is_object() {
        add(
            "CPU idle before measuring",
            format!(
                "{:.0} % over {} s (other work: {} CPUs)",
                idle["idle_fraction"].as_f64().unwrap_or(0.0) * 100.0,
                s(&idle["window_s"]),
                s(&idle["busy_cpus"])
            ),
        );
    }
    if let Some(m) = env["lab"].as_object() {
        for (k, v) in m {
            add(&format!("lab {k}"), s(v));
        }
    }
    // Two real hosts: each one's name, NIC, driver and kernel.
    for (h, role) in [("a", "clients"), ("b", "servers")] {
        let x = &env["hosts"][h];
        if x.is_object() {
            add(
                &format!("host {h} ({role})"),
                format!(
                    "{} — {} on {} (driver {}), Linux {} {}, {} × {}",
                    s(&x["hostname"]),
                    s(&x["addr"]),
                    s(&x["iface"]),
                    s(&x["driver"]),
                    s(&x["kernel"]),
                    s(&x["arch"]),
                    s(&x["cpus"]),
                    s(&x["cpu_model"]),
                ),
            );
        }
    }
    if let Some(m) = env["sysctls"].as_object() {
        for (k, v) in m {
            add(k, s(v));
        }
    }
    if let Some(m) = env["tools"].as_object() {
        for (k, v) in m {
            add(&format!("{k} version"), s(v));
        }
    }
    format!("<table class=\"env\">{rows}</table>")
}

const CSS: &str = r#"
:root{--fg:#1d2430;--mut:#5b6472;--line:#e3e6ea;--bg:#f6f7f9;--acc:#2e6fb5}
*{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);background:var(--bg);margin:0}
header{background:#1d2430;color:#fff;padding:28px 40px 22px}
header h1{margin:0 0 6px;font-size:26px;font-weight:650}
header p{margin:2px 0;color:#c9d1dc}
main{max-width:1180px;margin:0 auto;padding:18px 28px 60px}
nav{margin:14px 0 8px;display:flex;flex-wrap:wrap;gap:6px}
nav a{font-size:13px;padding:3px 10px;border:1px solid var(--line);border-radius:14px;background:#fff;color:var(--acc);text-decoration:none}
section{background:#fff;border:1px solid var(--line);border-radius:10px;padding:18px 24px;margin:22px 0;box-shadow:0 1px 2px rgba(0,0,0,.03)}
h2{margin:0 0 4px;font-size:20px}
.seed{margin:0;color:var(--mut);font-size:13px;text-transform:uppercase;letter-spacing:.04em}
.method{color:#333;font-size:14px;max-width:980px}
.plots{display:flex;flex-wrap:wrap;gap:10px}
figure.plot{margin:0;flex:1 1 520px;max-width:calc(50% - 5px)}
@media (max-width:1100px){figure.plot{max-width:100%}}
figure.plot{border:1px solid var(--line);border-radius:8px;padding:8px 8px 6px;background:#fff}
figure.plot svg{width:100%;height:auto;display:block}
figcaption{font-weight:600;font-size:14px;text-align:center;margin:2px 0 4px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;justify-content:center;font-size:12.5px;color:#333;padding:4px 0 2px}
.lg i{font-style:normal;margin-right:4px}
.tw{overflow-x:auto;margin:14px 0}
table{border-collapse:collapse;font-size:13px;width:100%}
caption{text-align:left;font-weight:600;padding:4px 0;color:var(--mut)}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;white-space:nowrap}
thead th{background:#f0f2f5;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.dot{display:inline-block;width:9px;height:9px;border-radius:50%;margin-right:6px;vertical-align:baseline}
ul.na{background:#fff7e6;border:1px solid #f3d9a4;border-radius:6px;padding:8px 26px;font-size:13px}
.notes{background:#f3f6fb;border-radius:6px;padding:8px 14px;font-size:13px;margin-top:8px}
.notes ul{margin:4px 0;padding-left:20px}
.foot{color:var(--mut);font-size:12px}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,"DejaVu Sans Mono",monospace;background:#eef1f5;border-radius:4px;padding:1px 4px}
.err{color:#b00}
.busy{background:#fdecea;border:1px solid #f5c2bd;border-radius:8px;padding:10px 14px;color:#8a1f11;margin:16px 0 0}
.headline table td.n{font-weight:600}
table.env th{width:260px;background:none;font-weight:500;color:var(--mut)}
table.env td{white-space:normal}
"#;

/// Other work (in CPUs) above which a report says the machine was busy.
pub const BUSY_CPUS: f64 = 0.25;

/// The number a section title starts with ("10. Tick-to-trade" -> 10);
/// untitled sections go last, in their original order.
fn section_number(title: &str) -> u32 {
    title
        .split_once('.')
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or(u32::MAX)
}

pub fn render(r: &Report) -> String {
    let env = &r.env;
    let title = format!("nanowire lab report — {}", r.engines.join(" vs "));
    let mut h = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{}</title><style>{CSS}</style></head><body>",
        esc(&title)
    );
    h += &format!(
        "<header><h1>{}</h1><p>{} suite, {} repeat(s) per point, {} — {:.0} s</p><p>{} · {} · {} CPUs · {}</p></header><main>",
        esc(&title),
        esc(&r.mode),
        r.repeats,
        esc(&r.target),
        r.elapsed_s,
        esc(env["kernel"].as_str().unwrap_or("?")),
        esc(env["cpu_model"].as_str().unwrap_or("?")),
        env["cpus"].as_u64().unwrap_or(0),
        esc(env["lab"]["driver"].as_str().unwrap_or("?")),
    );
    if env["hosts"]["b"].is_object() {
        let one = |x: &Value| {
            format!(
                "{} ({}, {} {}, Linux {})",
                x["hostname"].as_str().unwrap_or("?"),
                x["addr"].as_str().unwrap_or("?"),
                x["iface"].as_str().unwrap_or("?"),
                x["driver"].as_str().unwrap_or("?"),
                x["kernel"].as_str().unwrap_or("?")
            )
        };
        h = h.replacen(
            "</header>",
            &format!(
                "<p>host a (clients): {} · host b (servers): {}</p></header>",
                esc(&one(&env["hosts"]["a"])),
                esc(&one(&env["hosts"]["b"]))
            ),
            1,
        );
    }
    // Say so when the machine was busy: numbers from a loaded machine are not results.
    let load = |k: &str| {
        env[k]
            .as_str()
            .and_then(|s| s.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let cpus = env["cpus"].as_f64().unwrap_or(1.0).max(1.0);
    // Other work is judged by CPU idle over a short window just before the
    // first measurement (the 1-minute load average still counts a build that
    // finished a moment ago, and by the end the suite's own spinning engines
    // keep the load near the number of CPUs). Older reports: the load average.
    let idle = &env["cpu_idle_before"];
    if let Some(busy) = idle["busy_cpus"].as_f64() {
        if busy > BUSY_CPUS {
            h += &format!(
                "<p class=\"busy\">The machine was busy when this report started: other work used {busy:.2} of {cpus:.0} CPUs (idle {:.0} % over {:.0} s just before the first measurement). It competed with the measurements: treat the numbers as a smoke run, not as results.</p>",
                idle["idle_fraction"].as_f64().unwrap_or(0.0) * 100.0,
                idle["window_s"].as_f64().unwrap_or(0.0)
            );
        }
    } else if let Some(l) = load("loadavg_start")
        && l > cpus * 0.75
    {
        h += &format!(
            "<p class=\"busy\">The machine was busy when this report started (1-minute load average {l:.1} on {cpus:.0} CPUs before any measurement): other work competed with the measurements. Treat the numbers as a smoke run, not as results.</p>"
        );
    }
    // Sections in their numbered order (the suite runs them in another:
    // loss last, the summary after everything), the page and its navigation alike.
    let mut order: Vec<&Experiment> = r.experiments.iter().collect();
    order.sort_by_key(|e| section_number(&e.who.title));
    h += "<nav><a href=\"#headline\">Headline</a>";
    for ex in &order {
        h += &format!(
            "<a href=\"#{}\">{}</a>",
            esc(&ex.who.id),
            esc(&ex.who.title)
        );
    }
    h += "<a href=\"#environment\">Environment</a></nav>";
    h += &format!(
        "<section id=\"headline\" class=\"headline\"><h2>Headline</h2><p class=\"method\">Each engine against the kernel engine (blocking kernel sockets, what sockperf does), measured in this run. Latency ratios below 1 and rate/burst ratios above 1 are better. Absolute numbers hold for this environment only: {} under {}; the machine may be shared and small, so read medians and ratios, not single tails.</p>{}</section>",
        esc(env["cpu_model"].as_str().unwrap_or("?")),
        esc(env["virtualization"].as_str().unwrap_or("?")),
        table_html(&r.headline)
    );
    for ex in &order {
        h += &section(ex);
    }
    h += &format!(
        "<section id=\"environment\"><h2>Environment</h2>{}</section>",
        env_html(env)
    );
    h += "</main></body></html>\n";
    h
}

/// The report's chart: margin and label areas.
fn house_chart<'a, 'b, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
) -> ChartBuilder<'a, 'b, DB> {
    let mut c = ChartBuilder::on(root);
    c.margin(12).x_label_area_size(50).y_label_area_size(76);
    c
}

/// The report's mesh: axis descriptions from the plot, light grid lines,
/// 15 px labels.
fn house_mesh<'m, 'a, 'b, X: Ranged, Y: Ranged, DB: DrawingBackend>(
    m: &'m mut MeshStyle<'a, 'b, X, Y, DB>,
    p: &Plot,
) -> &'m mut MeshStyle<'a, 'b, X, Y, DB> {
    m.x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 15))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::{Report, Table};
    use serde_json::json;

    fn report(env: serde_json::Value) -> Report {
        Report {
            schema: "nanowire-lab-report/1".into(),
            generated_unix: 0,
            mode: "quick".into(),
            engines: vec!["kernel".into()],
            repeats: 1,
            target: "lab:nw".into(),
            elapsed_s: 1.0,
            env,
            headline: Table {
                caption: String::new(),
                columns: vec![],
                rows: vec![],
            },
            experiments: vec![],
        }
    }

    #[test]
    fn navigation_and_sections_follow_the_section_numbers() {
        let mut r = report(json!({"cpus": 2}));
        // The order a report stores them in: run order, summary last.
        for (id, t) in [
            ("latency_vs_size", "1. Latency vs message size"),
            ("latency_vs_load", "6. Latency vs network load"),
            ("tick_to_trade", "10. Tick-to-trade"),
            ("capture", "9. Capture"),
            ("loss", "8. Loss on an impaired wire"),
            ("summary", "7. Summary"),
        ] {
            r.experiments.push(crate::report::model::Experiment::new(
                id, t, "seed", "method",
            ));
        }
        let h = render(&r);
        let nav = &h[h.find("<nav>").unwrap()..h.find("</nav>").unwrap()];
        let pos = |hay: &str, id: &str| hay.find(&format!("#{id}\"")).unwrap();
        let ids = [
            "latency_vs_size",
            "latency_vs_load",
            "summary",
            "loss",
            "capture",
            "tick_to_trade",
        ];
        for w in ids.windows(2) {
            assert!(
                pos(nav, w[0]) < pos(nav, w[1]),
                "nav: {} before {}",
                w[0],
                w[1]
            );
            let sec = |id: &str| h.find(&format!("<section id=\"{id}\"")).unwrap();
            assert!(sec(w[0]) < sec(w[1]), "page: {} before {}", w[0], w[1]);
        }
    }

    #[test]
    fn both_hosts_are_named_in_the_header_and_the_environment() {
        let host = |n: &str, a: &str| json!({"hostname": n, "addr": a, "iface": "eth1", "driver": "mlx5_core", "kernel": "6.8.0", "arch": "x86_64", "cpus": 8, "cpu_model": "Xeon"});
        let r = report(
            json!({"cpus": 2, "hosts": {"a": host("alpha", "10.0.0.1"), "b": host("beta", "10.0.0.2")}}),
        );
        let h = render(&r);
        let header = &h[..h.find("</header>").unwrap()];
        assert!(
            header.contains("alpha") && header.contains("beta") && header.contains("mlx5_core")
        );
        assert!(h.contains("host b (servers)") && h.contains("beta — 10.0.0.2 on eth1"));
    }

    #[test]
    fn busy_banner_follows_cpu_idle_before_measuring_not_the_load_average() {
        // Right after `make lab`'s build: the load average is high, the CPUs idle.
        let quiet = json!({"cpus": 2, "loadavg_start": "3.50 1.2 0.5 1/100 1",
            "cpu_idle_before": {"window_s": 3.0, "idle_fraction": 0.97, "busy_cpus": 0.06, "cpus": 2.0}});
        assert!(!render(&report(quiet)).contains("class=\"busy\""));
        let busy = json!({"cpus": 2, "loadavg_start": "0.10 0.1 0.1 1/100 1",
            "cpu_idle_before": {"window_s": 3.0, "idle_fraction": 0.40, "busy_cpus": 1.2, "cpus": 2.0}});
        let h = render(&report(busy));
        assert!(
            h.contains("class=\"busy\"") && h.contains("1.20 of 2 CPUs"),
            "banner"
        );
        // An old report without the idle window: the load average decides.
        let old = json!({"cpus": 2, "loadavg_start": "3.50 1.2 0.5 1/100 1"});
        assert!(render(&report(old)).contains("class=\"busy\""));
    }
}
