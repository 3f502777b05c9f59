//! The modelled world: hosts and their Slurm-like jobs, engines, failures, and clients whose
//! requests simulated gateways route with the core's routing decision.

use crate::rng;
use crate::scenario::{Partition, Scenario};
use crate::sim::{host_of, id_of, micros, Kind, Micros, Sim, Stop};
use crate::track::DrainCause;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::time::Duration;
use tela_core::retry::{Attempts, Next, Outcome};
use tela_core::{
    route, Command, Config, Event, Hardware, Input, Lifecycle, Load, Model, Node, Reachability, Record, Role,
    RouteError, SharedRecord,
};

/// One client request.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    node: u32,
    node_job: u32,
    gateway: u32,
    gateway_job: u32,
    /// The drain the request was caught in, if its node started draining while it was in flight.
    drain: Option<DrainCause>,
    /// The spinnable model it asked for, if any.
    spin_model: Option<u16>,
    done: bool,
}

impl Request {
    /// Whether it has completed or failed.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }
}

/// What became of one attempt to route a request.
pub(crate) enum Routed {
    /// A node took it.
    Placed,
    /// No node hosts the model routably (the cold-start queue's case).
    NoReplica,
    /// Every attempt failed before the first byte, or the gateway is gone.
    Exhausted,
    /// The run stopped on an invariant violation.
    Stopped,
}

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

fn next_arrival(sim: &mut Sim) -> Micros {
    let rate = sim.sc.workload.rate_per_s;
    let u: f64 = sim.work_rng.random_range(f64::EPSILON..1.0);
    sim.now + micros(-u.ln() / rate)
}

impl Sim {
    /// A job starts on host `h`: a fresh node process in a new generation.
    pub(crate) fn start(&mut self, h: u32) {
        if self.hosts[h as usize].running() {
            return;
        }
        let p = self.sc.protocol.clone();
        let seed = self.seed;
        let now = self.now;
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
        c.drain_window = Duration::from_secs_f64(p.drain_window_s);
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
            self.after_merge(h);
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
    fn requeue(&mut self, h: u32, how: DrainCause) {
        self.t.drain_cause.remove(&h);
        if self.is_spin_host(h) {
            self.spin_host_stopped(h, how);
            return;
        }
        let wait = micros(uniform(&mut self.fault_rng, self.sc.jobs.queue_wait_s));
        self.after(wait, Kind::Start(h));
    }

    pub(crate) fn on_event(&mut self, h: u32, e: Event) {
        match e {
            Event::LocalState { generation, state } => {
                if let Err(violation) = self.t.check_own(h, generation, state) {
                    self.fail(violation.to_string());
                }
                let host = &mut self.hosts[h as usize];
                let was = host.state;
                host.state = state;
                if state == Lifecycle::Down && was != Lifecycle::Down && host.ending {
                    let reqs = host.in_flight.clone();
                    let cause = self.t.drain_cause.get(&h).copied().unwrap_or(DrainCause::Walltime);
                    self.t.drains += 1;
                    self.t.drain_in_flight += reqs.len() as u64;
                    let c = &mut self.t.drain_by_cause[cause as usize];
                    c.drains += 1;
                    c.in_flight += reqs.len() as u64;
                    for r in reqs {
                        self.t.requests[r as usize].drain = Some(cause);
                    }
                }
                if state == Lifecycle::Serve {
                    self.spin_serving(h);
                }
                let version = self.hosts[h as usize].node.as_ref().map(|n| n.local_record().version());
                if let Some(v) = version {
                    self.t.on_local_change(h, generation, v, self.now, &self.hosts);
                }
            }
            Event::Unroutable(id) => {
                let target = host_of(&id);
                let (a, b) = (self.hosts[h as usize].site, self.hosts[target as usize].site);
                let cut = self.blocked(a, b) || self.blocked(b, a);
                self.t.on_unroutable(h, target, cut, self.now, &self.hosts);
            }
            Event::Routable(id) => self.cold_release(h, host_of(&id)),
            Event::Discovered(_) => {}
            Event::Rejected { error, .. } => {
                self.t.rejected += 1;
                self.fail(format!("node {} rejected a datagram from a correct peer: {error}", id_of(h)));
            }
        }
    }

    pub(crate) fn on_command(&mut self, h: u32, c: Command) {
        match c {
            Command::StopEngine => {}
            Command::Exit => {
                self.t.clean_exits += 1;
                let how = self.t.drain_cause.get(&h).copied().unwrap_or(DrainCause::Walltime);
                self.stop_process(h, Stop::Exit);
                self.requeue(h, how);
            }
        }
    }

    /// After a node's replica changed: invariant checks and convergence tracking.
    pub(crate) fn after_merge(&mut self, h: u32) {
        let Some(node) = self.hosts[h as usize].node.as_ref() else {
            return;
        };
        if let Err(violation) = self.t.check_watched(h, node) {
            self.fail(violation.to_string());
        }
        let node = self.hosts[h as usize].node.as_ref().expect("checked");
        self.t.on_merge(h, node, self.now);
    }

    /// The gateway a client request goes to: one of the running gateways, drawn from the
    /// workload stream; with none running the request fails (counted) and `None` comes back.
    pub(crate) fn client_gateway(&mut self) -> Option<u32> {
        let gateways: Vec<u32> =
            (0..self.sc.federation.gateways).filter(|&g| self.hosts[g as usize].running()).collect();
        if gateways.is_empty() {
            self.t.failed += 1;
            self.t.no_gateway += 1;
            return None;
        }
        Some(gateways[self.work_rng.random_range(0..gateways.len())])
    }

    pub(crate) fn arrival(&mut self) {
        let next = next_arrival(self);
        self.at(next, Kind::Arrival);
        self.t.sent += 1;
        let models = &self.sc.federation.models;
        let model = models[self.work_rng.random_range(0..models.len())].clone();
        let Some(g) = self.client_gateway() else { return };
        match self.route_request(g, &model, None, None, self.now) {
            Routed::Placed | Routed::Stopped => {}
            Routed::NoReplica | Routed::Exhausted => self.t.failed += 1,
        }
    }

    /// Gateway `g` routes a request for `model` with the core's routing decision, retrying
    /// elsewhere on failures before the first byte. `tokens` is the response length if already
    /// drawn; `spin_model` marks requests for a spinnable model, which arrived at `arrived`.
    pub(crate) fn route_request(
        &mut self,
        g: u32,
        model: &str,
        tokens: Option<u32>,
        spin_model: Option<u16>,
        arrived: Micros,
    ) -> Routed {
        let mut attempts = Attempts::new(self.sc.workload.max_attempts as usize);
        while attempts.left() {
            let gw = &self.hosts[g as usize];
            let Some(gw_node) = gw.node.as_ref() else {
                break;
            };
            let replica = gw_node.replica();
            let picked = route(
                replica,
                model,
                |id| gw.links.contains(&host_of(&id)) && attempts.untried(&id),
                |id| gw.load_of(host_of(&id)),
                &mut self.work_rng,
            );
            let id = match picked {
                Ok(id) => id,
                Err(RouteError::UnknownModel { .. } | RouteError::NoCapacity { .. }) => {
                    if spin_model.is_some() && attempts.tried().is_empty() {
                        // Nothing serves the model yet: the request may wait for a replica.
                        return Routed::NoReplica;
                    }
                    self.t.no_capacity += 1;
                    return Routed::Exhausted;
                }
            };
            let believed = replica.get(&id).map(|s| s.record().state);
            if believed != Some(Lifecycle::Serve) {
                self.fail(format!("gateway {} routed to {id} which it believes is {believed:?}", id_of(g)));
                return Routed::Stopped;
            }
            let n = host_of(&id);
            let target = &self.hosts[n as usize];
            let target_job = target.job;
            attempts.begin(id);
            // Dead (the tunnel fails before the first byte) or draining (503): the gateway's
            // policy decides, as in the proxy.
            let outcome = if !target.running() {
                Some(Outcome::Failed)
            } else if target.state != Lifecycle::Serve {
                Some(Outcome::Answered(503))
            } else {
                None
            };
            if let Some(outcome) = outcome {
                match attempts.after(outcome) {
                    Next::Retry => {
                        self.t.retries += 1;
                        continue;
                    }
                    // The client gets the last node's failure or its 503.
                    Next::GiveUp | Next::Respond => return Routed::Exhausted,
                }
            }
            let w = self.sc.workload.clone();
            let tokens =
                tokens.unwrap_or_else(|| self.work_rng.random_range(w.tokens[0]..=w.tokens[1].max(w.tokens[0])));
            let rtt = 2 * self.latency(g, n);
            let ttft = micros(w.ttft_ms / 1e3);
            let service = micros(w.ttft_ms / 1e3 + f64::from(tokens) / w.tokens_per_s);
            let r = self.t.requests.len() as u32;
            self.t.requests.push(Request {
                node: n,
                node_job: target_job,
                gateway: g,
                gateway_job: self.hosts[g as usize].job,
                drain: None,
                spin_model,
                done: false,
            });
            self.hosts[g as usize].add_load(n, 1);
            self.hosts[n as usize].in_flight.push(r);
            if let Some(m) = spin_model {
                self.spin_placed(m, self.now - arrived + rtt + ttft);
            }
            let load = Load { in_flight: self.hosts[n as usize].in_flight.len() as u32, queued: 0 };
            self.feed(n, Input::Load(load));
            self.after(rtt + service, Kind::RequestDone(r));
            return Routed::Placed;
        }
        Routed::Exhausted
    }

    pub(crate) fn request_done(&mut self, r: u32) {
        let req = self.t.requests[r as usize].clone();
        if req.done {
            return;
        }
        self.t.requests[r as usize].done = true;
        let gw_alive =
            self.hosts[req.gateway as usize].running() && self.hosts[req.gateway as usize].job == req.gateway_job;
        self.hosts[req.gateway as usize].add_load(req.node, -1);
        let host = &mut self.hosts[req.node as usize];
        host.in_flight.retain(|x| *x != r);
        let load = Load { in_flight: host.in_flight.len() as u32, queued: 0 };
        if gw_alive {
            self.t.completed += 1;
            if let Some(cause) = req.drain {
                self.t.drain_completed += 1;
                self.t.drain_by_cause[cause as usize].completed += 1;
            }
        } else {
            self.t.failed += 1;
            if let Some(cause) = req.drain {
                self.t.drain_failed += 1;
                self.t.drain_by_cause[cause as usize].failed += 1;
            }
        }
        let same_job = host.running() && host.job == req.node_job;
        if let Some(m) = req.spin_model {
            self.spin_request_over(m);
        }
        if same_job {
            self.feed(req.node, Input::Load(load));
        }
    }

    /// A request whose node died mid-stream.
    pub(crate) fn fail_request(&mut self, r: u32) {
        let req = &mut self.t.requests[r as usize];
        if req.done {
            return;
        }
        req.done = true;
        let (g, n, drain, spin_model) = (req.gateway, req.node, req.drain, req.spin_model);
        self.hosts[g as usize].add_load(n, -1);
        self.t.failed += 1;
        self.t.mid_stream += 1;
        if let Some(cause) = drain {
            self.t.drain_failed += 1;
            self.t.drain_by_cause[cause as usize].failed += 1;
        }
        if let Some(m) = spin_model {
            self.spin_request_over(m);
        }
    }
}

/// Seconds after the last initial join from which the federation counts as formed: changes from
/// then on are reported apart from the join storm's (`Convergence::settled` in the report).
pub const SETTLE_S: f64 = 60.0;
