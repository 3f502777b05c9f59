//! Processes and their Slurm-like jobs: a job's start (a fresh node), the formed federation's
//! start, engines coming up, walltimes, preemptions, crashes, and the replacement job after each.

use super::uniform;
use crate::rng;
use crate::sim::{micros, Kind, Sim, Stop};
use crate::track::DrainCause;
use std::time::Duration;
use tela_core::{Config, Input, Lifecycle, Node, Reachability, Record, Role, SharedRecord};

impl Sim {
    /// A job starts on host `h`: a fresh node process in a new generation.
    pub(crate) fn start(&mut self, h: u32) {
        if self.hosts[h as usize].running() {
            return;
        }
        let p = self.sc.protocol.clone();
        let seed = self.seed;
        let now = self.now;
        let drain_window = self.spin_drain_window(h).unwrap_or(Duration::from_secs_f64(p.drain_window_s));
        let host = &mut self.hosts[h as usize];
        host.job += 1;
        host.ending = false;
        host.state = Lifecycle::Join;
        let local = host.local(now);
        let mut c = Config::new(host.id, local.as_millis());
        c.verifier = crate::liar::shared_verifier();
        c.interner = crate::pool::shared_interner();
        c.role = if host.gateway { Role::Gateway } else { Role::Serving };
        c.reach = if host.public {
            Reachability::Public(format!("site{}-host{h}:7000", host.site))
        } else {
            Reachability::OutboundOnly
        };
        c.hardware = host.hardware.clone();
        c.rng_seed = rng::node_seed(seed, h, host.job);
        c.drain_window = drain_window;
        c.membership.eager_sends = p.eager_sends;
        c.membership.answers_per_round = p.answers_per_round;
        let detector = &mut c.membership.detector;
        detector.protocol_period = Duration::from_millis(p.protocol_period_ms);
        detector.probe_timeout = detector.probe_timeout.min(detector.protocol_period / 2);
        detector.vouch_lease = detector.vouch_lease.max(detector.protocol_period);
        host.node = Some(Node::new(c, local));
        let job = host.job;
        let gateway = host.gateway;
        let walltime = host.walltime.take();
        self.t.on_host_started(h);
        self.pump(h);
        let gateways: Vec<u32> = (0..self.sc.federation.gateways).filter(|&g| g != h).collect();
        if gateway {
            self.feed(h, Input::EngineReady { models: Vec::new() });
            // Gateways dial the gateways before them; the others dial this one.
            for g in gateways {
                let rtt = 2 * self.latency(h, g);
                if g < h {
                    self.after(rtt, Kind::Connect { dialer: h, gateway: g, attempt: 0 });
                }
            }
            // The nodes come back to a restarted gateway by themselves: each redials it with
            // backoff from the moment its connection timed out.
        } else {
            for g in gateways {
                let rtt = 2 * self.latency(h, g);
                self.after(rtt, Kind::Connect { dialer: h, gateway: g, attempt: 0 });
            }
            let range = self.spin_startup(h).unwrap_or(self.sc.jobs.engine_startup_s);
            let startup = micros(uniform(&mut self.world_rng, range));
            self.after(startup, Kind::EngineUp { host: h, job });
            if let Some(end) = walltime.filter(|e| *e > self.now) {
                self.hosts[h as usize].ending = true;
                let local_end = self.hosts[h as usize].local(end);
                self.feed(h, Input::Walltime(local_end));
                self.at(end, Kind::JobEnd { host: h, job });
            }
        }
    }

    /// A formed federation (`federation.formed`): hosts `0..hosts` start now with their engines
    /// serving, every replica restores every node's record, and every node is connected to the
    /// gateways. Formation is not a change whose spreading is measured: the tracker drops the
    /// nodes' first states before the replicas restore them.
    pub(crate) fn form(&mut self, hosts: u32) {
        for h in 0..hosts {
            self.start(h);
            if !self.hosts[h as usize].gateway {
                let job = self.hosts[h as usize].job;
                self.engine_up(h, job);
            }
        }
        // The nodes' first states are the formation, not changes whose spreading is measured.
        self.t.forget_changes();
        let pool = crate::pool::shared_interner();
        let records: Vec<SharedRecord> = (0..hosts)
            .filter_map(|h| self.hosts[h as usize].node.as_ref())
            .map(|node| pool.record(Record::clone(node.local_record())))
            .collect();
        let now = self.now;
        for h in 0..hosts {
            let host = &mut self.hosts[h as usize];
            let local = host.local(now);
            if let Some(node) = host.node.as_mut() {
                node.restore(local, &records);
            }
            self.after_merge(h, None);
            self.pump(h);
        }
        // Every node holds its connections to the gateways (gateways to those before them),
        // as after its join; the dials `start` scheduled find them up.
        let gateways = self.sc.federation.gateways.min(hosts);
        for h in 0..hosts {
            for g in (0..gateways).filter(|&g| g < h) {
                self.connect(h, g, 0);
            }
        }
    }

    pub(crate) fn engine_up(&mut self, h: u32, job: u32) {
        let host = &self.hosts[h as usize];
        if host.job == job && host.running() {
            let models = host.models.clone();
            self.feed(h, Input::EngineReady { models });
        }
    }

    /// The walltime: Slurm kills whatever is still running.
    pub(crate) fn job_end(&mut self, h: u32, job: u32) {
        if self.hosts[h as usize].job == job && self.hosts[h as usize].running() {
            self.t.walltime_kills += 1;
            self.stop_process(h, Stop::Kill);
            self.requeue(h, DrainCause::Walltime);
        }
    }

    /// Slurm preempts the job on host `h`: drain signal now, kill after the grace period. A
    /// scheduled preemption whose host is not running, or already draining, moves to the next
    /// host that is (in host order, no random draw), so a scenario gets every preemption it names.
    pub(crate) fn preempt(&mut self, h: u32) {
        let preemptible = |host: &crate::sim::Host| host.running() && !host.gateway && host.state < Lifecycle::Down;
        let h = if preemptible(&self.hosts[h as usize]) || self.is_spin_host(h) {
            h
        } else {
            let static_end = self.sc.federation.gateways + self.sc.federation.nodes;
            let g = self.sc.federation.gateways;
            let span = static_end - g;
            match (1..span).map(|k| g + (h - g + k) % span).find(|&c| preemptible(&self.hosts[c as usize])) {
                Some(c) => c,
                None => return,
            }
        };
        let host = &mut self.hosts[h as usize];
        if !preemptible(host) {
            return;
        }
        host.ending = true;
        let job = host.job;
        self.t.preemptions += 1;
        self.t.drain_cause.insert(h, DrainCause::Preemption);
        self.feed(h, Input::DrainRequested);
        let grace = micros(self.sc.jobs.preempt_grace_s);
        self.after(grace, Kind::Kill { host: h, job });
    }

    pub(crate) fn kill_job(&mut self, h: u32, job: u32) {
        if self.hosts[h as usize].job == job && self.hosts[h as usize].running() {
            self.t.preempt_kills += 1;
            self.stop_process(h, Stop::Kill);
            self.requeue(h, DrainCause::Preemption);
        }
    }

    pub(crate) fn crash(&mut self, h: u32) {
        if !self.hosts[h as usize].running() {
            return;
        }
        self.t.on_crash(h, self.now, &self.hosts);
        self.stop_process(h, Stop::Kill);
        let delay = micros(uniform(&mut self.fault_rng, self.sc.jobs.crash_restart_s));
        self.after(delay, Kind::Start(h));
    }

    /// A replacement job for host `h` after a queue wait; a spinner job ends instead (the spinner
    /// decides whether to replace it). `how` is why the job ended.
    pub(super) fn requeue(&mut self, h: u32, how: DrainCause) {
        self.t.drain_cause.remove(&h);
        if self.is_spin_host(h) {
            self.spin_host_stopped(h, how);
            return;
        }
        let wait = micros(uniform(&mut self.fault_rng, self.sc.jobs.queue_wait_s));
        self.after(wait, Kind::Start(h));
    }
}
