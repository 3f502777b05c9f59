//! What nodes tell the world: their lifecycle events, their commands (a drained node exits),
//! and changes of their replicas, which the invariant checks and the trackers follow.

use crate::sim::{host_of, id_of, Sim, Stop};
use crate::track::DrainCause;
use tela_core::{Command, Event, Lifecycle};

impl Sim {
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
}
