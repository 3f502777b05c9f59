//! The modelled world: hosts and their Slurm-like jobs, engines, failures, and clients whose
//! requests simulated gateways route with the core's routing decision.
//!
//! This module builds the world and schedules its faults (and, in swarm mode, draws them);
//! `jobs` runs processes and their jobs, `node_outputs` follows what the nodes report, and
//! `requests` carries the clients' requests.

mod jobs;
mod node_outputs;
mod requests;

pub(crate) use requests::{Request, Routed};

use crate::scenario::{Partition, Scenario};
use crate::sim::{micros, Kind, Sim};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use requests::next_arrival;
use tela_core::{Hardware, Model};

fn uniform(rng: &mut ChaCha8Rng, [lo, hi]: [f64; 2]) -> f64 {
    if hi > lo {
        rng.random_range(lo..hi)
    } else {
        lo
    }
}

/// Swarm mode: this seed's own fault mix, drawn from the scenario's swarm ranges.
pub(crate) fn draw_swarm(sc: &mut Scenario, rng: &mut ChaCha8Rng) {
    let s = sc.swarm.clone();
    sc.network.loss = uniform(rng, s.loss);
    sc.network.duplicate = uniform(rng, s.duplicate);
    sc.network.reorder = uniform(rng, s.reorder);
    let count = |rng: &mut ChaCha8Rng, [lo, hi]: [u32; 2]| {
        if hi > lo {
            rng.random_range(lo..=hi)
        } else {
            lo
        }
    };
    sc.jobs.crashes = count(rng, s.crashes);
    sc.jobs.preemptions = count(rng, s.preemptions);
    let parts = count(rng, s.partitions);
    let window = sc.faults_until_s;
    for _ in 0..parts {
        let start = rng.random_range(0.1 * window..0.6 * window);
        let end = rng.random_range(start + 1.0..window.max(start + 1.5));
        let k = rng.random_range(1..=sc.network.sites.max(2) - 1).min(sc.network.sites);
        let mut sites: Vec<u32> = (0..sc.network.sites).collect();
        sites.shuffle(rng);
        sites.truncate(k as usize);
        sites.sort();
        sc.partition.push(Partition { start_s: start, end_s: end.min(window), sites, one_way: rng.random_bool(0.3) });
    }
}

/// Creates the hosts and schedules the world's events.
pub(crate) fn build(sim: &mut Sim) {
    let f = sim.sc.federation.clone();
    let sites = sim.sc.network.sites;
    for _ in 0..f.gateways {
        sim.new_host(true, true, 0, Hardware::CPU, Vec::new());
    }
    let outbound = (f64::from(f.nodes) * f.outbound_fraction).round() as u32;
    let mut order: Vec<u32> = (0..f.nodes).collect();
    order.shuffle(&mut sim.world_rng);
    let mut is_outbound = vec![false; f.nodes as usize];
    for &i in &order[..outbound as usize] {
        is_outbound[i as usize] = true;
    }
    for i in 0..f.nodes {
        let profile = &f.hardware[sim.world_rng.random_range(0..f.hardware.len())];
        let hardware = Hardware::from_profile(profile).unwrap_or(Hardware::CPU);
        let mut models: Vec<Model> = Vec::new();
        while models.len() < (f.models_per_node as usize).min(f.models.len()) {
            let m = Model::named(f.models[sim.world_rng.random_range(0..f.models.len())].clone());
            if !models.contains(&m) {
                models.push(m);
            }
        }
        sim.new_host(false, !is_outbound[i as usize], i % sites, hardware, models);
    }
    let g = f.gateways;
    let n_hosts = sim.hosts.len() as u32;
    if !f.formed {
        for h in 0..g {
            sim.at(0, Kind::Start(h));
        }
        for h in g..n_hosts {
            let t = micros(sim.world_rng.random_range(0.0..f.join_spread_s.max(1e-3)));
            sim.at(t, Kind::Start(h));
        }
    }
    sim.t.settle_at = if f.formed { 0 } else { micros(f.join_spread_s + SETTLE_S) };
    let watched: Vec<u32> = (0..g.min(2)).chain(g..n_hosts.min(g + 6)).collect();
    sim.t.watch(&watched);
    schedule_faults(sim, g, n_hosts);
    for (i, p) in sim.partitions.clone().iter().enumerate() {
        sim.at(micros(p.start_s), Kind::PartitionStart(i as u32));
        sim.at(micros(p.end_s), Kind::PartitionEnd(i as u32));
    }
    if sim.sc.workload.rate_per_s > 0.0 {
        let first = next_arrival(sim);
        sim.at(first, Kind::Arrival);
    }
    sim.at(1_000_000, Kind::Sample);
    sim.at(micros(sim.sc.faults_until_s), Kind::FaultsEnd);
    sim.spin_build();
    if f.formed {
        sim.form(n_hosts);
    }
}

/// When the initial nodes have all started: at once in a formed federation.
fn joined_by_s(f: &crate::scenario::Federation) -> f64 {
    if f.formed {
        0.0
    } else {
        f.join_spread_s
    }
}

fn schedule_faults(sim: &mut Sim, g: u32, n_hosts: u32) {
    let jobs = sim.sc.jobs.clone();
    let start = joined_by_s(&sim.sc.federation) + 5.0;
    let until = sim.sc.faults_until_s;
    let window = |rng: &mut ChaCha8Rng| micros(if until > start { rng.random_range(start..until) } else { until });
    let serving = n_hosts - g;
    if serving > 0 {
        let churn = ((f64::from(serving)) * jobs.churn_fraction).round() as u32;
        let mut order: Vec<u32> = (g..n_hosts).collect();
        order.shuffle(&mut sim.fault_rng);
        for &h in order.iter().take(churn as usize) {
            let end = window(&mut sim.fault_rng);
            sim.hosts[h as usize].walltime = Some(end);
        }
        for _ in 0..jobs.crashes {
            let h = sim.fault_rng.random_range(g..n_hosts);
            let t = window(&mut sim.fault_rng);
            sim.at(t, Kind::Crash(h));
        }
        for _ in 0..jobs.preemptions {
            let h = sim.fault_rng.random_range(g..n_hosts);
            let t = window(&mut sim.fault_rng);
            sim.at(t, Kind::Preempt(h));
        }
        sim.t.preemptions_scheduled = u64::from(jobs.preemptions);
    }
    for _ in 0..jobs.gateway_crashes {
        let h = sim.fault_rng.random_range(0..g);
        let t = window(&mut sim.fault_rng);
        sim.at(t, Kind::Crash(h));
    }
}

/// Seconds after the last initial join from which the federation counts as formed: changes from
/// then on are reported apart from the join storm's (`Convergence::settled` in the report).
pub const SETTLE_S: f64 = 60.0;
