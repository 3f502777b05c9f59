//! SVG plots of a run: the convergence curve against Serf's estimate, and bandwidth over time.

use crate::report::{serf_fraction, Report};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Writes `<dir>/<scenario>-convergence.svg` and `<dir>/<scenario>-bandwidth.svg`; returns the paths.
pub fn write(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let conv = dir.join(format!("{}-convergence.svg", report.scenario));
    let bw = dir.join(format!("{}-bandwidth.svg", report.scenario));
    convergence(report, &conv).map_err(|e| format!("{}: {e}", conv.display()))?;
    bandwidth(report, &bw).map_err(|e| format!("{}: {e}", bw.display()))?;
    Ok(vec![conv, bw])
}

/// The mean fraction of target nodes holding a change, sampled every 50 ms after the change.
fn mean_curve(report: &Report, step_ms: u32, max_ms: u32) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut t = 0;
    while t <= max_ms {
        let mut sum = 0.0;
        for c in &report.curves {
            let reached = c.points.iter().take_while(|(at, _)| *at <= t).last().map_or(0, |(_, n)| *n);
            sum += f64::from(reached) / f64::from(c.total.max(1));
        }
        out.push((f64::from(t) / 1e3, 100.0 * sum / report.curves.len().max(1) as f64));
        t += step_ms;
    }
    out
}

fn convergence(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let max_ms = (report.convergence.latency.p100_ms.max(report.convergence.serf_bound_ms) * 1.2).max(500.0) as u32;
    let sim = mean_curve(report, 50, max_ms);
    let n = report.nodes as f64;
    let round_s = report.gossip_interval_ms as f64 / 1e3;
    let serf: Vec<(f64, f64)> = (0..=(max_ms / 50))
        .map(|i| {
            let t = f64::from(i) * 0.05;
            (t, 100.0 * serf_fraction(n, f64::from(report.fanout), report.network.loss, t / round_s))
        })
        .collect();
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: {} nodes, seed {} — share of nodes holding a record change",
                report.scenario, report.nodes, report.seed
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..f64::from(max_ms) / 1e3, 0.0..100.5)?;
    chart.configure_mesh().x_desc("seconds after the change").y_desc("% of live nodes").draw()?;
    chart
        .draw_series(LineSeries::new(sim, BLUE.stroke_width(2)))?
        .label(format!("tela-sim (mean of {} changes)", report.curves.len()))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(serf, RED.stroke_width(1)))?
        .label(format!("Serf logistic estimate (fanout {}, {} ms rounds)", report.fanout, report.gossip_interval_ms))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

fn bandwidth(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let per_node: Vec<(f64, f64)> = report
        .per_second_bytes
        .iter()
        .enumerate()
        .map(|(s, b)| (s as f64 + 1.0, *b as f64 / report.nodes.max(1) as f64))
        .collect();
    let max_y = per_node.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    let max_x = per_node.len().max(1) as f64;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: {} nodes, seed {} — gossip bytes sent per node per second",
                report.scenario, report.nodes, report.seed
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
    chart.configure_mesh().x_desc("simulated second").y_desc("bytes/s per node").draw()?;
    chart.draw_series(LineSeries::new(per_node, BLUE.stroke_width(2)))?;
    root.present()?;
    Ok(())
}
