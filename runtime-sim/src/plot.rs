//! SVG plots of a run: the convergence curve against Serf's estimate, bandwidth over time, and
//! for spinning scenarios replicas against demand over the run.

use crate::report::{serf_fraction, Report};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Why the plots were not all written. Plots written before the failure stay on disk.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The output directory could not be created.
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A plot could not be drawn or written.
    #[error("{}: {source}", path.display())]
    Draw {
        /// The plot's file.
        path: PathBuf,
        /// What the plotting library said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Writes `<dir>/<scenario>-convergence.svg`, `<dir>/<scenario>-bandwidth.svg` and, for spinning
/// scenarios, `<dir>/<scenario>-spinning.svg`; returns the paths.
pub fn write(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    std::fs::create_dir_all(dir).map_err(|source| PlotError::CreateDir { dir: dir.to_path_buf(), source })?;
    let conv = dir.join(format!("{}-convergence.svg", report.scenario));
    let bw = dir.join(format!("{}-bandwidth.svg", report.scenario));
    convergence(report, &conv).map_err(|source| PlotError::Draw { path: conv.clone(), source })?;
    bandwidth(report, &bw).map_err(|source| PlotError::Draw { path: bw.clone(), source })?;
    let mut out = vec![conv, bw];
    if let Some(spin) = &report.spin {
        let path = dir.join(format!("{}-spinning.svg", report.scenario));
        spinning(report, spin, &path).map_err(|source| PlotError::Draw { path: path.clone(), source })?;
        out.push(path);
    }
    Ok(out)
}

/// Top: GPUs held by the spinner's jobs against the oracle's. Below, one panel per model: replicas
/// serving, the oracle's replicas, and the requests queued or in flight (right axis).
fn spinning(
    report: &Report,
    spin: &crate::report_spin::SpinReport,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let hours = |i: usize| (i as f64 + 1.0) / 60.0;
    let n = spin.models.len();
    let root = SVGBackend::new(path, (1000, 260 + 200 * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, rest) = root.split_vertically(260);
    let max_x = (spin.timeline.len() as f64 / 60.0).max(1.0);
    let held: Vec<(f64, f64)> = spin.timeline.iter().enumerate().map(|(i, m)| (hours(i), f64::from(m.gpus))).collect();
    let oracle: Vec<(f64, f64)> = (0..spin.timeline.len())
        .map(|i| {
            let gpus: u32 = (0..n)
                .map(|m| spin.oracle_replicas[m].get(i).copied().unwrap_or(0) * spin.models[m].gpus_per_replica)
                .sum();
            (hours(i), f64::from(gpus))
        })
        .collect();
    let max_y = held.iter().chain(&oracle).map(|p| p.1).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "{}, seed {} — GPUs held: {:.0} GPU-h used vs {:.0} oracle (×{:.2})",
                report.scenario, report.seed, spin.gpu_hours.used, spin.gpu_hours.oracle, spin.gpu_hours.ratio
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
    chart.configure_mesh().x_desc("hour").y_desc("GPUs").draw()?;
    chart
        .draw_series(LineSeries::new(held, BLUE.stroke_width(2)))?
        .label("held by spinner jobs (queue → walltime)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(oracle, RED.stroke_width(1)))?
        .label("oracle (demand known in advance, instant starts)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    for (m, area) in rest.split_evenly((n.max(1), 1)).iter().enumerate().take(n) {
        let model = &spin.models[m];
        let serving: Vec<(f64, f64)> =
            spin.timeline.iter().enumerate().map(|(i, t)| (hours(i), f64::from(t.serving[m]))).collect();
        let wanted: Vec<(f64, f64)> = spin.oracle_replicas[m]
            .iter()
            .take(spin.timeline.len())
            .enumerate()
            .map(|(i, r)| (hours(i), f64::from(*r)))
            .collect();
        let demand: Vec<(f64, f64)> =
            spin.timeline.iter().enumerate().map(|(i, t)| (hours(i), f64::from(t.demand[m]))).collect();
        let max_r = serving.iter().chain(&wanted).map(|p| p.1).fold(1.0, f64::max) + 1.0;
        let max_d = demand.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{} ({} GPU(s) per replica)", model.name, model.gpus_per_replica), ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(25)
            .y_label_area_size(50)
            .right_y_label_area_size(50)
            .build_cartesian_2d(0.0..max_x, 0.0..max_r)?
            .set_secondary_coord(0.0..max_x, 0.0..max_d);
        chart.configure_mesh().y_desc("replicas").draw()?;
        chart.configure_secondary_axes().y_desc("requests").draw()?;
        chart
            .draw_secondary_series(LineSeries::new(demand, GREEN.mix(0.6).stroke_width(1)))?
            .label("requests queued or in flight (right)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
        chart
            .draw_series(LineSeries::new(serving, BLUE.stroke_width(2)))?
            .label("replicas serving")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(wanted, RED.stroke_width(1)))?
            .label("oracle replicas")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
    }
    root.present()?;
    Ok(())
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

fn convergence(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
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

fn bandwidth(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
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
