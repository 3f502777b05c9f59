//! Client requests: arrivals at a gateway, routing with the core's decision and the gateway's
//! retry policy, and the end of each request, completed or failed.

use crate::sim::{host_of, id_of, micros, Kind, Micros, Sim};
use crate::track::DrainCause;
use rand::Rng;
use tela_core::retry::{Attempts, Next, Outcome};
use tela_core::routing::{route, RouteError};
use tela_core::{Input, Lifecycle, Load};

/// One client request.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    node: u32,
    node_job: u32,
    gateway: u32,
    gateway_job: u32,
    /// The drain the request was caught in, if its node started draining while it was in flight.
    pub(super) drain: Option<DrainCause>,
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

/// When the next client request arrives: Poisson arrivals at the workload's rate.
pub(super) fn next_arrival(sim: &mut Sim) -> Micros {
    let rate = sim.sc.workload.rate_per_s;
    let u: f64 = sim.work_rng.random_range(f64::EPSILON..1.0);
    sim.now + micros(-u.ln() / rate)
}

impl Sim {
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
        if gw_alive {
            self.t.completed += 1;
            if let Some(cause) = req.drain {
                self.t.drain_completed += 1;
                self.t.drain_by_cause[cause as usize].completed += 1;
            }
        } else {
            self.t.failed += 1;
            if let Some(cause) = req.drain {
                self.trace_drain_failure(r, "its gateway is gone");
                self.t.drain_failed += 1;
                self.t.drain_gateway_lost += 1;
                self.t.drain_by_cause[cause as usize].failed += 1;
            }
        }
        let host = &mut self.hosts[req.node as usize];
        host.in_flight.retain(|x| *x != r);
        let load = Load { in_flight: host.in_flight.len() as u32, queued: 0 };
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
            self.trace_drain_failure(r, "its node stopped");
            self.t.drain_failed += 1;
            self.t.drain_by_cause[cause as usize].failed += 1;
        }
        if let Some(m) = spin_model {
            self.spin_request_over(m);
        }
    }

    /// With `TELA_SIM_TRACE`: why a request caught in a drain did not complete.
    fn trace_drain_failure(&self, r: u32, why: &str) {
        if !self.t.tracing {
            return;
        }
        let req = &self.t.requests[r as usize];
        let (node, gw) = (&self.hosts[req.node as usize], &self.hosts[req.gateway as usize]);
        eprintln!(
            "drain-failed at {} ms: request {r} at node {} ({:?}, job {} of {}) through gateway {} \
             (running {}, job {} of {}), caught in a {:?} drain: {why}",
            self.now / 1000,
            id_of(req.node),
            node.state,
            node.job,
            req.node_job,
            id_of(req.gateway),
            gw.running(),
            gw.job,
            req.gateway_job,
            req.drain,
        );
    }
}
