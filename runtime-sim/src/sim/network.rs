//! Datagrams between hosts: latency and jitter, loss, duplication and reordering, partitions,
//! NAT in front of outbound-only hosts, and the datagram size limit checked on every send.

use super::{host_of, id_of, micros, Kind, Micros, Sim};
use crate::scenario::Partition;
use bytes::Bytes;
use rand::Rng;
use tela_core::{Input, NodeId, MAX_DATAGRAM};

/// True if partition `p` drops traffic from site `a` to site `b` (while it is active).
pub(super) fn cuts(p: &Partition, a: u32, b: u32) -> bool {
    let (in_a, in_b) = (p.sites.contains(&a), p.sites.contains(&b));
    in_a != in_b && (!p.one_way || in_a)
}

impl Sim {
    /// One-way latency between two hosts.
    pub(crate) fn latency(&mut self, a: u32, b: u32) -> Micros {
        let n = &self.sc.network;
        let base = if self.hosts[a as usize].site == self.hosts[b as usize].site { n.intra_site_ms } else { n.wan_ms };
        let jitter = if n.jitter_ms > 0.0 { self.net_rng.random_range(0.0..n.jitter_ms) } else { 0.0 };
        micros((base + jitter) / 1e3)
    }

    /// True if an active partition drops traffic from site `a` to site `b`.
    pub(crate) fn blocked(&self, a: u32, b: u32) -> bool {
        self.active_partitions.iter().any(|&p| cuts(&self.partitions[p as usize], a, b))
    }

    pub(super) fn send(&mut self, from: u32, to: NodeId, payload: Bytes) {
        let len = payload.len();
        if len > MAX_DATAGRAM {
            self.fail(format!("node {} sent a {len}-byte datagram (limit {MAX_DATAGRAM})", id_of(from)));
            return;
        }
        self.t.on_send(self.now, len);
        if self.t.tracing {
            self.t.traffic.on_datagram(&payload);
        }
        let to = host_of(&to);
        if to as usize >= self.hosts.len() {
            self.fail(format!("node {} sent to unknown node {to}", id_of(from)));
            return;
        }
        if !self.hosts[from as usize].public {
            let until = self.now + micros(self.sc.network.nat_timeout_s);
            let nat = &mut self.hosts[from as usize].nat;
            match nat.iter_mut().find(|(p, _)| *p == to) {
                Some(e) => e.1 = until,
                None => nat.push((to, until)),
            }
        }
        let (sa, sb) = (self.hosts[from as usize].site, self.hosts[to as usize].site);
        if self.blocked(sa, sb) {
            return;
        }
        let n = &self.sc.network;
        let (loss, dup, reorder) = (n.loss, n.duplicate, n.reorder);
        if loss > 0.0 && self.net_rng.random_bool(loss) {
            return;
        }
        let copies = if dup > 0.0 && self.net_rng.random_bool(dup) { 2 } else { 1 };
        for _ in 0..copies {
            let mut delay = self.latency(from, to);
            if reorder > 0.0 && self.net_rng.random_bool(reorder) {
                delay += self.net_rng.random_range(1_000..20_000);
            }
            self.after(delay, Kind::Deliver { to, from, payload: payload.clone() });
        }
    }

    pub(super) fn deliver(&mut self, to: u32, from: u32, payload: Bytes) {
        let now = self.now;
        let host = &mut self.hosts[to as usize];
        if !host.running() {
            return;
        }
        if !host.public && !host.links.contains(&from) {
            // Behind NAT: only answers on paths this host opened recently get through.
            host.nat.retain(|(_, until)| *until >= now);
            if !host.nat.iter().any(|(p, _)| *p == from) {
                self.t.nat_dropped += 1;
                return;
            }
        }
        self.feed(to, Input::Datagram { from: id_of(from), payload });
    }
}
