//! Connections to gateways: dials and redials with the runtime's backoff, closes when a
//! process exits, and idle timeouts after a kill or under a partition.

use super::network::cuts;
use super::{id_of, micros, Kind, Micros, Sim};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tela_core::{Input, Lifecycle};

/// The wait before redial `attempt` (0 for the first after a loss), as the runtime's backoff
/// draws it with its defaults: a step of 500 ms doubling up to 10 s, the wait uniform between
/// half and all of the step.
fn redial_delay(attempt: u8, rng: &mut ChaCha8Rng) -> Micros {
    let step = 500_000u64.saturating_mul(1 << attempt.min(5)).min(10_000_000);
    rng.random_range(step / 2..=step)
}

/// How a process ended, as its peers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// It exited and closed its connections.
    Exit,
    /// It was killed: its connections were never closed.
    Kill,
}

impl Sim {
    pub(crate) fn connect(&mut self, dialer: u32, gateway: u32, attempt: u8) {
        let (d, g) = (&self.hosts[dialer as usize], &self.hosts[gateway as usize]);
        if !d.running() || d.links.contains(&gateway) {
            return;
        }
        if !g.running() || self.blocked(d.site, g.site) || self.blocked(g.site, d.site) {
            // Nothing answers, or the handshake cannot complete: try again later, backing off
            // as the runtime does (it redials a gateway for as long as its record is not LEFT).
            let next = attempt.saturating_add(1);
            let wait = redial_delay(next, &mut self.dial_rng);
            self.after(wait, Kind::Connect { dialer, gateway, attempt: next });
            return;
        }
        self.hosts[dialer as usize].links.insert(gateway);
        self.hosts[gateway as usize].links.insert(dialer);
        self.feed(dialer, Input::PeerConnected(id_of(gateway)));
        self.feed(gateway, Input::PeerConnected(id_of(dialer)));
    }

    /// Ends a host's process: in-flight requests fail and its connections drop. A process that
    /// exits closes them, and its peers know at once; one that is killed does not: each peer
    /// keeps its side of the connection (a gateway still routes over it, and each request fails
    /// before its first byte) until it reaches the idle timeout.
    pub(crate) fn stop_process(&mut self, h: u32, how: Stop) {
        let host = &mut self.hosts[h as usize];
        if host.node.take().is_none() {
            return;
        }
        host.wake_at = Micros::MAX;
        host.state = Lifecycle::Left;
        host.nat.clear();
        host.gw_load.clear();
        let failed = std::mem::take(&mut host.in_flight);
        let links = std::mem::take(&mut host.links);
        for r in failed {
            self.fail_request(r);
        }
        let idle = micros(self.sc.network.idle_timeout_s);
        for l in links {
            match how {
                Stop::Exit => {
                    self.hosts[l as usize].links.remove(&h);
                    self.feed(l, Input::PeerDisconnected(id_of(h)));
                }
                Stop::Kill => self.after(idle, Kind::LinkTimeout { peer: l, of: h }),
            }
        }
        self.t.on_host_stopped(h, self.now);
    }

    /// Partition `p` starts: every connection it cuts will reach its idle timeout unless the
    /// partition heals first.
    pub(super) fn partition_start(&mut self, p: u32) {
        self.active_partitions.push(p);
        let idle = micros(self.sc.network.idle_timeout_s);
        let mut cut = Vec::new();
        for (a, host) in self.hosts.iter().enumerate() {
            for &b in host.links.range(a as u32 + 1..) {
                if self.separates(p, host.site, self.hosts[b as usize].site) {
                    cut.push((a as u32, b));
                }
            }
        }
        for (a, b) in cut {
            self.after(idle, Kind::PartitionIdle { a, b, partition: p });
        }
    }

    /// Whether partition `p` stops traffic between sites `x` and `y` in either direction (a
    /// connection needs both: QUIC acknowledges what it receives).
    fn separates(&self, p: u32, x: u32, y: u32) -> bool {
        let p = &self.partitions[p as usize];
        cuts(p, x, y) || cuts(p, y, x)
    }

    /// A connection cut by partition `p` for the idle timeout closes at both ends; the end
    /// that dialled it dials again, with backoff, until the partition heals.
    pub(super) fn partition_idle(&mut self, a: u32, b: u32, p: u32) {
        if !self.active_partitions.contains(&p) || !self.hosts[a as usize].links.contains(&b) {
            return;
        }
        self.hosts[a as usize].links.remove(&b);
        self.hosts[b as usize].links.remove(&a);
        self.t.connections_timed_out += 1;
        self.feed(a, Input::PeerDisconnected(id_of(b)));
        self.feed(b, Input::PeerDisconnected(id_of(a)));
        self.redial(a, b);
    }

    /// After `a` lost its connection with `b`, the end that dialled it dials again (nodes dial
    /// gateways; of two gateways, the later one dials), with the runtime's backoff.
    fn redial(&mut self, a: u32, b: u32) {
        let (dialer, gateway) = match (self.hosts[a as usize].gateway, self.hosts[b as usize].gateway) {
            (true, false) => (b, a),
            (false, true) => (a, b),
            (true, true) => (a.max(b), a.min(b)),
            (false, false) => return,
        };
        if self.hosts[dialer as usize].running() {
            let wait = redial_delay(0, &mut self.dial_rng);
            self.after(wait, Kind::Connect { dialer, gateway, attempt: 0 });
        }
    }

    /// `peer`'s connection to the killed process `of` reached the idle timeout, unless it is
    /// gone already (a partition closed it) or `of` came back and connected again meanwhile
    /// (the new connection replaced it). A gateway stops routing to `of` here, whatever its
    /// registry says; a node whose gateway was killed dials it again.
    pub(super) fn link_timeout(&mut self, peer: u32, of: u32) {
        let p = &self.hosts[peer as usize];
        let replaced = self.hosts[of as usize].running() && self.hosts[of as usize].links.contains(&peer);
        if !p.running() || !p.links.contains(&of) || replaced {
            return;
        }
        self.hosts[peer as usize].links.remove(&of);
        self.t.connections_timed_out += 1;
        if self.hosts[peer as usize].gateway {
            self.t.on_tunnel_lost(peer, of, self.now);
        }
        self.feed(peer, Input::PeerDisconnected(id_of(of)));
        self.redial(peer, of);
    }
}
