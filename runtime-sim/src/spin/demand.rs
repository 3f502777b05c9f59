//! Demand: arrivals of spin requests (the daily curve and bursts of each model, drawn at the
//! peak rate and thinned), the gateway tier's demand meters, and the cold-start queues where a
//! request with no routable replica waits until one becomes routable or its wait times out.

use super::{Waiting, MINUTE};
use crate::scenario::{ModelDemand, Scenario};
use crate::sim::{micros, Kind, Micros, Sim};
use crate::world::Routed;
use rand::Rng;
use std::time::Duration;
use tela_core::cold_start::Enqueued;
use tela_core::Time;

/// Arrivals per second for model `m` at `t`: the daily curve inside the active hours, plus bursts.
pub(crate) fn rate_at(sc: &Scenario, demand: &ModelDemand, t: Micros) -> f64 {
    let secs = t as f64 / 1e6;
    let hour = (secs / 3600.0) % 24.0;
    let [from, to] = demand.active_hours;
    let mut rate = 0.0;
    if hour >= from && hour < to {
        let phase = 2.0 * std::f64::consts::PI * (hour - demand.peak_hour) / 24.0;
        rate = demand.base_per_s + (demand.peak_per_s - demand.base_per_s) * (1.0 + phase.cos()) / 2.0;
    }
    for b in sc.spin.burst.iter().filter(|b| b.model == demand.model) {
        let start = b.start_h * 3600.0;
        if secs >= start && secs < start + b.minutes * 60.0 {
            rate += b.rate_per_s;
        }
    }
    rate
}

impl Sim {
    pub(super) fn next_spin_arrival(&mut self) -> Micros {
        let rate = self.spin.as_ref().map_or(0.0, |s| s.lambda_max);
        let u: f64 = self.work_rng.random_range(f64::EPSILON..1.0);
        self.now + micros(-u.ln() / rate)
    }

    /// A candidate arrival at the peak rate, kept with probability rate(t) / peak (thinning).
    pub(crate) fn spin_arrival(&mut self) {
        let next = self.next_spin_arrival();
        self.at(next, Kind::SpinArrival);
        let Some(spin) = self.spin.as_ref() else { return };
        let n = spin.plan.models.len();
        let mut u = self.work_rng.random_range(0.0..spin.lambda_max);
        let mut picked = None;
        for m in 0..n {
            let r = rate_at(&self.sc, &spin.plan.models[m].demand, self.now);
            if u < r {
                picked = Some(m);
                break;
            }
            u -= r;
        }
        let Some(m) = picked else { return };
        let tokens = {
            let [lo, hi] = spin.plan.models[m].demand.tokens;
            self.work_rng.random_range(lo..=hi.max(lo))
        };
        self.spin_request(m, tokens);
    }

    /// Step `i` of the scenario's demand trace: its requests arrive together.
    pub(crate) fn spin_trace(&mut self, i: u32) {
        let Some(step) = self.sc.spin.trace.get(i as usize).cloned() else { return };
        let Some(m) = self.spin.as_ref().and_then(|s| s.model_index(&step.model)) else { return };
        for _ in 0..step.requests {
            self.spin_request(m, step.tokens);
        }
    }

    /// A request for model `m` streaming `tokens` tokens arrives at a gateway.
    fn spin_request(&mut self, m: usize, tokens: u32) {
        let w = &self.sc.workload;
        let service_s = w.ttft_ms / 1e3 + f64::from(tokens) / w.tokens_per_s;
        let now = self.now;
        let spin = self.spin.as_mut().expect("checked");
        let minute = (now / MINUTE) as usize;
        if let Some(slot) = spin.m.load_s[m].get_mut(minute) {
            *slot += service_s;
            spin.m.arrivals[m][minute] += 1;
        }
        spin.meters[m].arrive(Time(now));
        self.t.sent += 1;
        let name = spin.plan.models[m].name().to_string();
        let Some(g) = self.client_gateway() else { return };
        match self.route_request(g, &name, Some(tokens), Some(m as u16), now) {
            Routed::Placed | Routed::Stopped => {}
            Routed::Exhausted => self.t.failed += 1,
            Routed::NoReplica => self.cold_enqueue(g, m, Waiting { model: m as u16, arrived: now, tokens }),
        }
    }

    fn cold_enqueue(&mut self, g: u32, m: usize, w: Waiting) {
        let now = self.now;
        let spin = self.spin.as_mut().expect("spinning");
        let n = spin.plan.models.len();
        let was_idle = spin.queued(m) == 0;
        let id = spin.waiting.len() as u32;
        spin.waiting.push(w);
        let q = &mut spin.cold[g as usize * n + m];
        match q.queue.enqueue(Time(now), id) {
            Enqueued::Accepted { deadline } => {
                spin.m.cold_enqueued += 1;
                let at = deadline.as_micros();
                let expire = q.expire_at.map_or(true, |e| e > at);
                if expire {
                    q.expire_at = Some(at);
                }
                // A model with waiting requests and no replica: decide now, not at the next tick.
                let decide = was_idle && !spin.decide_pending;
                spin.decide_pending |= decide;
                if expire {
                    self.at(at, Kind::ColdExpire { gateway: g, model: m as u32 });
                }
                if decide {
                    self.at(now, Kind::SpinDecide);
                }
            }
            Enqueued::Full(_) => {
                spin.m.cold_refused += 1;
                self.t.failed += 1;
            }
        }
    }

    pub(crate) fn cold_expire(&mut self, g: u32, m: u32) {
        let now = self.now;
        let Some(spin) = self.spin.as_mut() else { return };
        let n = spin.plan.models.len();
        let q = &mut spin.cold[g as usize * n + m as usize];
        if q.expire_at != Some(now) {
            return;
        }
        let expired = q.queue.expire(Time(now));
        q.expire_at = q.queue.next_deadline().map(|d| d.as_micros());
        if let Some(at) = q.expire_at {
            self.at(at, Kind::ColdExpire { gateway: g, model: m });
        }
        let spin = self.spin.as_mut().expect("spinning");
        spin.m.cold_timed_out += expired.len() as u64;
        self.t.failed += expired.len() as u64;
    }

    /// Gateway `g` now routes to node `n`: release the requests waiting for its models.
    pub(crate) fn cold_release(&mut self, g: u32, n: u32) {
        let Some(spin) = self.spin.as_ref() else { return };
        if !self.hosts[g as usize].gateway {
            return;
        }
        let models: Vec<usize> =
            self.hosts[n as usize].models.iter().filter_map(|m| spin.model_index(&m.name)).collect();
        let now = self.now;
        for m in models {
            let spin = self.spin.as_mut().expect("spinning");
            let n_models = spin.plan.models.len();
            let released = spin.cold[g as usize * n_models + m].queue.on_replica_ready(Time(now));
            for id in released {
                let spin = self.spin.as_ref().expect("spinning");
                let (w, name) = (spin.waiting[id as usize], spin.plan.models[m].name().to_string());
                match self.route_request(g, &name, Some(w.tokens), Some(w.model), w.arrived) {
                    Routed::Placed => {
                        let spin = self.spin.as_mut().expect("spinning");
                        spin.m.cold_waits_ms.push((now - w.arrived) as f64 / 1e3);
                    }
                    Routed::Stopped => {}
                    Routed::NoReplica | Routed::Exhausted => {
                        self.spin.as_mut().expect("spinning").m.cold_unrouted += 1;
                        self.t.failed += 1;
                    }
                }
            }
        }
    }

    /// A spin request was placed: count it in flight and note its time to first byte.
    pub(crate) fn spin_placed(&mut self, m: u16, ttfb: Micros) {
        let now = self.now;
        if let Some(spin) = self.spin.as_mut() {
            let meter = &mut spin.meters[m as usize];
            meter.enter();
            meter.first_byte(Time(now), Duration::from_micros(ttfb));
        }
    }

    /// A spin request finished or failed.
    pub(crate) fn spin_request_over(&mut self, m: u16) {
        if let Some(spin) = self.spin.as_mut() {
            spin.meters[m as usize].leave();
        }
    }

    /// Requests still waiting in cold-start queues.
    pub(crate) fn spin_waiting(&self) -> u64 {
        self.spin.as_ref().map_or(0, |s| s.cold.iter().map(|q| q.queue.len() as u64).sum())
    }
}
