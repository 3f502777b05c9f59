//! Usage: the once-a-minute sample of the timeline, and at the end of a run the GPU-hours used
//! against an oracle that knows the demand in advance, per partition, and the cold-start waits.

use super::{Minute, SpinWorld, MINUTE};
use crate::sim::{Kind, Micros, Sim};
use crate::track::quantile;
use tela_core::Lifecycle;

impl Sim {
    /// The once-a-minute sample of the timeline.
    pub(crate) fn spin_minute(&mut self) {
        self.after(MINUTE, Kind::SpinMinute);
        let Some(spin) = self.spin.as_ref() else { return };
        let n = spin.plan.models.len();
        let mut minute = Minute { serving: vec![0; n], demand: vec![0; n], gpus: 0 };
        for (&h, job) in &spin.host_job {
            let j = &spin.jobs[job];
            minute.gpus += j.gpus;
            if self.hosts[h as usize].state == Lifecycle::Serve {
                minute.serving[j.model] += 1;
            }
        }
        for m in 0..n {
            minute.demand[m] = spin.queued(m) + spin.meters[m].in_flight();
        }
        self.spin.as_mut().expect("spinning").m.timeline.push(minute);
    }
}

/// GPU-hours and jobs, computed at the end of a run.
pub(crate) struct Usage {
    pub gpu_hours: f64,
    pub oracle_gpu_hours: f64,
    pub live_at_end: u64,
    pub queued_at_end: u64,
    pub min_replicas: u64,
    pub oracle_replicas: Vec<Vec<u32>>,
    /// Per partition: jobs started and GPU-hours used.
    pub partitions: Vec<(u64, f64)>,
}

impl SpinWorld {
    /// The replicas the oracle runs for model `m` in each minute: the policy's scale-up rule
    /// applied to that minute's demand, known in advance (mean concurrency = service seconds
    /// demanded / 60 over `concurrency_per_replica`; arrivals over `arrivals_per_replica`; at
    /// least one replica in any minute with an arrival), within min/max.
    fn oracle(&self, m: usize) -> Vec<u32> {
        let p = &self.plan.models[m].policy;
        self.m.load_s[m]
            .iter()
            .zip(&self.m.arrivals[m])
            .map(|(load, arrivals)| {
                let by_load = (load / 60.0 / f64::from(p.concurrency_per_replica)).ceil() as u32;
                let by_rate = p.arrivals_per_replica.map_or(0, |r| arrivals.div_ceil(r));
                by_load.max(by_rate).max(u32::from(*arrivals > 0)).clamp(p.min_replicas, p.max_replicas)
            })
            .collect()
    }

    pub(crate) fn usage(&self, now: Micros) -> Usage {
        let gpu_s: f64 = self
            .jobs
            .values()
            .filter_map(|j| Some(f64::from(j.gpus) * (j.ended.unwrap_or(now) - j.started?) as f64 / 1e6))
            .sum();
        let mut partitions = vec![(0u64, 0.0f64); self.plan.shapes.len()];
        for j in self.jobs.values() {
            if let Some(start) = j.started {
                partitions[j.partition].0 += 1;
                partitions[j.partition].1 += f64::from(j.gpus) * (j.ended.unwrap_or(now) - start) as f64 / 3.6e9;
            }
        }
        let oracle_replicas: Vec<Vec<u32>> = (0..self.plan.models.len()).map(|m| self.oracle(m)).collect();
        let elapsed = (now.div_ceil(MINUTE) as usize).min(self.m.load_s.first().map_or(0, Vec::len));
        let oracle_gpu_h: f64 = oracle_replicas
            .iter()
            .enumerate()
            .map(|(m, per_min)| {
                let total: u64 = per_min.iter().take(elapsed).map(|r| u64::from(*r)).sum();
                total as f64 * f64::from(self.gpus_per_replica(m)) / 60.0
            })
            .sum();
        Usage {
            gpu_hours: gpu_s / 3600.0,
            oracle_gpu_hours: oracle_gpu_h,
            live_at_end: self.jobs.values().filter(|j| j.ended.is_none()).count() as u64,
            queued_at_end: self.jobs.values().filter(|j| j.ended.is_none() && j.host.is_none()).count() as u64,
            min_replicas: self.plan.models.iter().map(|m| u64::from(m.policy.min_replicas)).sum(),
            oracle_replicas,
            partitions,
        }
    }

    /// Cold-start waits, sorted percentiles in ms: (count, p50, p99, max).
    pub(crate) fn cold_waits(&self) -> (usize, f64, f64, f64) {
        let mut v = self.m.cold_waits_ms.clone();
        (v.len(), quantile(&mut v, 0.5), quantile(&mut v, 0.99), quantile(&mut v, 1.0))
    }
}
