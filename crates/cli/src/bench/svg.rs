//! A hand-written SVG line plot: x on a log2 scale (job counts), y linear from zero.

use std::fmt::Write;

pub struct Series {
    pub name: String,
    /// (x, y), x > 0.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (reference lines such as the raw ceiling).
    pub dashed: bool,
}

const W: f64 = 760.0;
const H: f64 = 460.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
];

/// A round step giving about five ticks up to `max`.
fn nice_step(max: f64) -> f64 {
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    mag * if r <= 1.0 {
        1.0
    } else if r <= 2.0 {
        2.0
    } else if r <= 5.0 {
        5.0
    } else {
        10.0
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Short numbers for the y axis: 1.2M, 350K.
fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

pub fn plot(title: &str, xlabel: &str, ylabel: &str, series: &[Series]) -> String {
    let xs: Vec<f64> = {
        let mut v: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v.dedup();
        v
    };
    let ymax_data = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let step = nice_step(ymax_data * 1.05);
    let ymax = (ymax_data * 1.05 / step).ceil() * step;
    let (x0, x1) = match (xs.first(), xs.last()) {
        (Some(&a), Some(&b)) if b > a => (a.log2(), b.log2()),
        (Some(&a), _) => (a.log2() - 1.0, a.log2() + 1.0),
        _ => (0.0, 1.0),
    };
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x.log2() - x0) / (x1 - x0) * pw;
    let sy = |y: f64| TOP + ph - y / ymax * ph;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + pw / 2.0,
        esc(title)
    );
    // Grid and y ticks.
    let mut y = 0.0;
    while y <= ymax + step / 2.0 {
        let py = sy(y);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            py + 4.0,
            short(y)
        );
        y += step;
    }
    for &x in &xs {
        let px = sx(x);
        let _ = writeln!(
            o,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{x}</text>"##,
            TOP + ph,
            TOP + ph + 16.0
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 18.0,
        esc(xlabel)
    );
    let _ = writeln!(
        o,
        r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        esc(ylabel)
    );
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let dash = if s.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"{dash}/>"#,
            pts.join(" ")
        );
        for &(x, y) in &s.points {
            let _ = writeln!(
                o,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                sx(x),
                sy(y)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = LEFT + pw + 14.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_one_line_and_point_per_value() {
        let s = vec![
            Series {
                name: "raid5 <4>".into(),
                points: vec![(1.0, 100.0), (4.0, 300.0), (256.0, 250.0)],
                dashed: false,
            },
            Series {
                name: "raw".into(),
                points: vec![(1.0, 500.0), (4.0, 900.0), (256.0, 800.0)],
                dashed: true,
            },
        ];
        let svg = plot("t", "jobs", "IOPS", &s);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 6);
        assert!(svg.contains("raid5 &lt;4&gt;"));
        assert!(svg.contains(">256</text>"));
        assert_eq!(nice_step(1000.0), 200.0);
        assert_eq!(short(1_240_000.0), "1.2M");
    }
}
