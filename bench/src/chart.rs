//! The PNG chart: throughput (top) and p50/p99 latency (bottom, log scale)
//! per scenario, Flashgate beside its peer.
//!
//! Text is drawn with ab_glyph from a TTF file read at run time (DejaVu or
//! Liberation Sans, or `FLASHGATE_BENCH_FONT`), so neither building nor
//! running needs fontconfig; without a font the chart is drawn unlabelled.

use std::path::Path;

use plotters::prelude::*;

use crate::report::{avg, rps};
use crate::results::{Results, Side, SCENARIOS};

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers a sans-serif font; false when none could be found.
fn register_font() -> bool {
    let path = std::env::var("FLASHGATE_BENCH_FONT")
        .ok()
        .into_iter()
        .chain(FONT_CANDIDATES.iter().map(|s| (*s).to_owned()));
    for p in path {
        if let Ok(bytes) = std::fs::read(&p) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

const FG: RGBColor = RGBColor(0xe4, 0x39, 0x3c);
const PEER: RGBColor = RGBColor(0x4a, 0x6f, 0xa5);

/// Draws the chart into `path`.
///
/// # Errors
/// When the PNG cannot be written.
pub fn draw(r: &Results, path: &Path) -> anyhow::Result<()> {
    let text = register_font();
    let scenarios: Vec<_> = SCENARIOS
        .iter()
        .filter(|s| !r.of(s.id, Side::Flashgate).is_empty())
        .collect();
    let n = scenarios.len().max(1) as f64;
    let root = BitMapBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (top, bottom) = root.split_vertically(480);
    let labels: Vec<String> = scenarios.iter().map(|s| s.id.replace('_', " ")).collect();
    let x_label = |x: &f64| -> String {
        let i = x.floor() as usize;
        if (x - x.floor() - 0.5).abs() < 1e-6 {
            labels.get(i).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };

    // Throughput.
    let max_rps = scenarios
        .iter()
        .flat_map(|s| [rps(r, s.id, Side::Flashgate), rps(r, s.id, Side::Peer)])
        .flatten()
        .fold(1.0f64, f64::max);
    let mut b = ChartBuilder::on(&top);
    b.margin(20)
        .x_label_area_size(if text { 40 } else { 0 })
        .y_label_area_size(if text { 80 } else { 0 });
    if text {
        b.caption(
            format!(
                "Requests per second (mean of rounds) - {} cores, {}",
                r.machine.nproc, r.machine.date
            ),
            ("sans-serif", 24),
        );
    }
    let mut chart = b
        .build_cartesian_2d(0.0..n, 0.0..max_rps * 1.15)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh()
        .x_labels(2 * scenarios.len() + 1)
        .x_label_formatter(&x_label);
    if text {
        mesh.y_desc("req/s")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .label_style(("sans-serif", 16));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, s) in scenarios.iter().enumerate() {
        let x = i as f64;
        for (side, color, off) in [(Side::Flashgate, FG, 0.12), (Side::Peer, PEER, 0.5)] {
            let Some(v) = rps(r, s.id, side) else {
                continue;
            };
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x + off, 0.0), (x + off + 0.36, v)],
                    color.filled(),
                )))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if text {
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("{v:.0}"),
                        (x + off, v + max_rps * 0.03),
                        ("sans-serif", 14),
                    )))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
    }
    if text {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                FG.filled(),
            )))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label("Flashgate")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], FG.filled()));
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                PEER.filled(),
            )))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label("peer (nginx / OpenResty)")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], PEER.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }

    // Latency: p50 (light) and p99 (full) bars, log scale.
    let lat = |s: &str, side, q: fn(&crate::load::Summary) -> f64| {
        avg(r, s, side, |x| Some(q(&x.summary)))
    };
    let max_ms = scenarios
        .iter()
        .flat_map(|s| {
            [
                lat(s.id, Side::Flashgate, |x| x.p99_ms),
                lat(s.id, Side::Peer, |x| x.p99_ms),
            ]
        })
        .flatten()
        .fold(1.0f64, f64::max);
    let mut b = ChartBuilder::on(&bottom);
    b.margin(20)
        .x_label_area_size(if text { 40 } else { 0 })
        .y_label_area_size(if text { 80 } else { 0 });
    if text {
        b.caption(
            "Latency, ms (log scale): light = p50, full = p99",
            ("sans-serif", 24),
        );
    }
    let mut chart = b
        .build_cartesian_2d(0.0..n, (0.05f64..max_ms * 2.0).log_scale())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh()
        .x_labels(2 * scenarios.len() + 1)
        .x_label_formatter(&x_label);
    if text {
        mesh.y_desc("ms").label_style(("sans-serif", 16));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, s) in scenarios.iter().enumerate() {
        let x = i as f64;
        for (side, color, off) in [(Side::Flashgate, FG, 0.12), (Side::Peer, PEER, 0.5)] {
            let (Some(p50), Some(p99)) =
                (lat(s.id, side, |x| x.p50_ms), lat(s.id, side, |x| x.p99_ms))
            else {
                continue;
            };
            chart
                .draw_series([
                    Rectangle::new(
                        [(x + off, 0.05), (x + off + 0.36, p99.max(0.05))],
                        color.filled(),
                    ),
                    Rectangle::new(
                        [(x + off + 0.06, 0.05), (x + off + 0.30, p50.max(0.05))],
                        WHITE.mix(0.6).filled(),
                    ),
                ])
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if text {
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("{p99:.1}"),
                        (x + off, p99 * 1.25),
                        ("sans-serif", 14),
                    )))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
