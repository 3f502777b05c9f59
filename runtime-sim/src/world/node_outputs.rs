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

    /// After a node's replica changed (through a datagram of message tag `via`, when tracing):
    /// invariant checks and convergence tracking.
    pub(crate) fn after_merge(&mut self, h: u32, via: Option<u8>) {
        let Some(node) = self.hosts[h as usize].node.as_ref() else {
            return;
        };
        if let Err(violation) = self.t.check_watched(h, node) {
            self.fail(violation.to_string());
        }
        let node = self.hosts[h as usize].node.as_ref().expect("checked");
        for (owner, ms) in self.t.on_merge(h, node, self.now, via) {
            self.trace_late_receiver(h, owner, ms, via);
        }
    }

    /// Traces who took a change late, and how the others hold it: what a slow tail is made of.
    fn trace_late_receiver(&self, h: u32, owner: u32, ms: u64, via: Option<u8>) {
        let host = &self.hosts[h as usize];
        let Some(node) = host.node.as_ref() else { return };
        let id = node.id();
        let own = node.local_record();
        let (mut live, mut down, mut doubt, mut older, mut absent, mut linked) = (0, 0, 0, 0, 0, 0);
        for (i, other) in self.hosts.iter().enumerate() {
            let Some(n) = other.node.as_ref().filter(|_| i as u32 != h) else { continue };
            live += 1;
            match n.replica().get(&id) {
                None => absent += 1,
                Some(s) if s.record().generation < own.generation => older += 1,
                Some(s) if s.record().state >= tela_core::Lifecycle::Down => down += 1,
                Some(_) if n.suspects(&id) => doubt += 1,
                Some(_) => {}
            }
            if other.links.contains(&h) {
                linked += 1;
            }
        }
        eprintln!(
            "late: node {h} (site {}, {}, {:?}, generation {}) took {owner}'s change after {ms} ms (through {}); \
             of {live} others {absent} lack it, {older} hold an older generation, {down} hold it DOWN, \
             {doubt} suspect it; {linked} linked",
            host.site,
            if host.public { "public" } else { "outbound-only" },
            own.state,
            own.generation,
            via.map_or("no datagram", |t| crate::traffic::tag_name(usize::from(t))),
        );
    }
}
