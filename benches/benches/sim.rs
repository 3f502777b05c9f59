//! Simulator throughput: events per wall-clock second when `tela-sim` drives 1,000 and 10,000
//! nodes, with peak memory. A whole simulated federation per sample is too long for criterion,
//! so this is a plain bench that prints a table:
//!
//! ```text
//! cargo bench -p tela-benches --bench sim                 # both sizes
//! cargo bench -p tela-benches --bench sim -- 1k           # only federation-1k
//! ```
//!
//! Each run is bounded in simulated time (the first seconds of the scenario: federation-1k's
//! joins, federation-10k's formation, in which every one of 10,000 replicas restores 10,000
//! records, then its first seconds of probing and churn) and guarded in wall time and memory
//! (the formed 10,000-node federation holds about 9.6 GB). Events per second count the event
//! loop only; the setup column is the formation.

use tela_sim::{Limits, Scenario, Sim};

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let runs = [("federation-1k", 20.0), ("federation-10k", 8.0)];
    println!(
        "{:<16} {:>8} {:>8} {:>12} {:>8} {:>8} {:>14} {:>9}",
        "scenario", "nodes", "sim s", "events", "wall s", "setup s", "events/s", "RSS MB"
    );
    for (name, seconds) in runs {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let mut sc = Scenario::load(name).expect("scenario");
        sc.duration_s = seconds;
        sc.faults_until_s = seconds;
        let limits = Limits { max_rss_mb: 21_000, max_wall_s: 900.0 };
        let r = Sim::new(sc, 1, false, limits).run();
        println!(
            "{:<16} {:>8} {:>8.1} {:>12} {:>8.1} {:>8.1} {:>14.0} {:>9}{}",
            name,
            r.nodes,
            r.sim_s,
            r.events,
            r.wall_s,
            r.setup_wall_s,
            r.events_per_s,
            r.peak_rss_mb,
            r.aborted.as_deref().map(|a| format!("  (aborted: {a})")).unwrap_or_default()
        );
    }
}
