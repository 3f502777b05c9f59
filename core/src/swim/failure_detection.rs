//! Failure detection across a cluster: SWIM detectors exchanging probes over a lossy network in
//! virtual time, with suspicions, refutations and deaths piggybacked through broadcast queues the
//! way the node carries them. As in the node, a suspicion is also told to its suspect, a stale
//! suspicion or a message from a member held dead is answered directly, and a member that hears
//! itself declared dead comes back in a new generation.
//!
//! Replay a failing seed with `cargo test -p tela-core --lib swim::failure_detection`; every
//! assertion names its seed.

use super::{Action, Event, Rumor, Swim, SwimConfig};
use crate::broadcast::{BroadcastQueue, Update};
use crate::id::{NodeId, Numbered};
use crate::time::Time;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

/// Bytes of a datagram left for piggybacked gossip after the probe message.
const PIGGYBACK_BUDGET: usize = 400;
/// What one gossip item costs on the wire (an id, an incarnation, a kind, a suspecter).
const GOSSIP_LEN: usize = 42;

/// A probe message.
#[derive(Clone, Copy, Debug)]
enum Probe {
    Ping(u32),
    PingReq(NodeId, u32),
    Ack(u32),
    Nack(u32),
    /// No probe: gossip sent directly (a suspicion told to its suspect, or a correction).
    Direct,
}

/// News about one member, as the node will piggyback it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gossip {
    Suspect {
        id: NodeId,
        incarnation: u64,
        from: NodeId,
    },
    Alive {
        id: NodeId,
        incarnation: u64,
    },
    Dead {
        id: NodeId,
        generation: u64,
    },
    /// The member is back in a new generation after hearing itself declared dead (the node
    /// refutes a DOWN mark this way).
    Join {
        id: NodeId,
        generation: u64,
        incarnation: u64,
    },
}

impl Update for Gossip {
    fn key(&self) -> NodeId {
        match *self {
            Gossip::Suspect { id, .. }
            | Gossip::Alive { id, .. }
            | Gossip::Dead { id, .. }
            | Gossip::Join { id, .. } => id,
        }
    }

    /// A new generation covers everything of older ones, and a death covers its own generation;
    /// within a generation the higher incarnation wins and, at one incarnation, a suspicion
    /// covers an alive. Suspicions from different suspecters replace each other, which is what
    /// spreads confirmations.
    fn covers(&self, other: &Self) -> bool {
        match (*self, *other) {
            (
                Gossip::Dead { generation: a, .. },
                Gossip::Dead { generation: b, .. } | Gossip::Join { generation: b, .. },
            ) => a >= b,
            (
                Gossip::Join { generation: a, .. },
                Gossip::Dead { generation: b, .. } | Gossip::Join { generation: b, .. },
            ) => a > b,
            (Gossip::Dead { .. } | Gossip::Join { .. }, _) => true,
            (_, Gossip::Dead { .. } | Gossip::Join { .. }) => false,
            (Gossip::Alive { incarnation: a, .. }, Gossip::Alive { incarnation: b, .. }) => a >= b,
            (Gossip::Alive { incarnation: a, .. }, Gossip::Suspect { incarnation: b, .. }) => a > b,
            (Gossip::Suspect { incarnation: a, .. }, Gossip::Alive { incarnation: b, .. }) => a >= b,
            (Gossip::Suspect { incarnation: a, from: f, .. }, Gossip::Suspect { incarnation: b, from: g, .. }) => {
                a > b || (a == b && f == g)
            }
        }
    }

    fn encoded_len(&self, _sends: u32) -> usize {
        GOSSIP_LEN
    }
}

struct Member {
    id: NodeId,
    swim: Swim,
    queue: BroadcastQueue<Gossip>,
    crashed: bool,
    /// This member's generation: it starts a new one when it hears itself declared dead.
    generation: u64,
    /// The generation this member knows of each member, by index.
    generations: Vec<u64>,
    /// Members this one holds dead (confirmed itself or heard), with when it learned.
    dead: BTreeMap<NodeId, Time>,
    /// Suspicions of this member it refuted.
    refutations: u32,
    /// Suspicions it raised itself.
    suspicions_raised: u32,
    /// The highest local health multiplier it reached.
    worst_health: u8,
}

struct Datagram {
    from: usize,
    to: usize,
    probe: Probe,
    gossip: Vec<Gossip>,
}

/// N detectors on a network that loses each datagram with probability `loss` and delivers the
/// rest after 1–20 ms.
struct Cluster {
    now: Time,
    members: Vec<Member>,
    net: ChaCha8Rng,
    loss: f64,
    in_flight: BTreeMap<(Time, u64), Datagram>,
    sent: u64,
    /// A member whose incoming datagrams all arrive this much later (an overloaded host).
    slow: Option<(usize, Duration)>,
    /// Every failure a member's own detector confirmed: (confirmer, member, when).
    confirmations: Vec<(NodeId, NodeId, Time)>,
}

fn id(i: usize) -> NodeId {
    NodeId::from_u64(i as u64 + 1)
}

fn index(id: NodeId) -> usize {
    (id.short() - 1) as usize
}

impl Cluster {
    fn new(n: usize, loss: f64, seed: u64) -> Cluster {
        Cluster::with_config(n, loss, seed, SwimConfig::default())
    }

    fn with_config(n: usize, loss: f64, seed: u64, config: SwimConfig) -> Cluster {
        let members = (0..n)
            .map(|i| {
                let mut swim = Swim::new(id(i), config.clone(), seed ^ ((i as u64 + 1) * 0x9e37_79b9), Time::ZERO);
                for j in (0..n).filter(|&j| j != i) {
                    swim.add_member(&Numbered, Time::ZERO, id(j), 0, true);
                }
                Member {
                    id: id(i),
                    swim,
                    queue: BroadcastQueue::new(2.0, 256),
                    crashed: false,
                    generation: 0,
                    generations: vec![0; n],
                    dead: BTreeMap::new(),
                    refutations: 0,
                    suspicions_raised: 0,
                    worst_health: 0,
                }
            })
            .collect();
        Cluster {
            now: Time::ZERO,
            members,
            net: ChaCha8Rng::seed_from_u64(seed),
            loss,
            in_flight: BTreeMap::new(),
            sent: 0,
            slow: None,
            confirmations: Vec::new(),
        }
    }

    fn send(&mut self, from: usize, to: NodeId, probe: Probe) {
        let n = self.members[from].swim.cluster_size();
        let mut gossip = Vec::new();
        self.members[from].queue.fill(PIGGYBACK_BUDGET, n, |g, _| gossip.push(*g));
        self.post(from, to, probe, gossip);
    }

    /// Sends `gossip` straight to `to`, the way the node tells a suspect of its suspicion
    /// (Lifeguard's buddy system) and answers a stale suspicion or a member it holds dead.
    fn send_direct(&mut self, from: usize, to: NodeId, gossip: Gossip) {
        self.post(from, to, Probe::Direct, vec![gossip]);
    }

    fn post(&mut self, from: usize, to: NodeId, probe: Probe, gossip: Vec<Gossip>) {
        self.sent += 1;
        if self.net.random_bool(self.loss) {
            return;
        }
        let mut at = self.now + Duration::from_millis(self.net.random_range(1..=20));
        let to = index(to);
        if let Some((slow, delay)) = self.slow {
            if slow == to {
                at = at + delay;
            }
        }
        self.in_flight.insert((at, self.sent), Datagram { from, to, probe, gossip });
    }

    /// Turns everything member `i` wants to send or spread into datagrams and queued gossip.
    fn drain(&mut self, i: usize) {
        let me = self.members[i].id;
        while let Some(a) = self.members[i].swim.poll_action() {
            match a {
                Action::SendPing { to, seq } => self.send(i, to, Probe::Ping(seq)),
                Action::SendPingReq { via, target, seq } => self.send(i, via, Probe::PingReq(target, seq)),
                Action::SendAck { to, seq } => self.send(i, to, Probe::Ack(seq)),
                Action::SendNack { to, seq } => self.send(i, to, Probe::Nack(seq)),
                Action::GossipSuspect { id, incarnation } => {
                    self.members[i].suspicions_raised += 1;
                    let g = Gossip::Suspect { id, incarnation, from: me };
                    self.members[i].queue.push(g);
                    self.send_direct(i, id, g);
                }
                Action::GossipAlive { incarnation } => {
                    self.members[i].refutations += 1;
                    self.members[i].queue.push(Gossip::Alive { id: me, incarnation });
                }
            }
        }
        let health = self.members[i].swim.health();
        self.members[i].worst_health = self.members[i].worst_health.max(health);
        while let Some(e) = self.members[i].swim.poll_event() {
            if let Event::Confirm(dead) = e {
                self.confirmations.push((me, dead, self.now));
                self.mark_dead(i, dead);
            }
        }
    }

    fn mark_dead(&mut self, i: usize, dead: NodeId) {
        let now = self.now;
        let m = &mut self.members[i];
        if m.dead.contains_key(&dead) {
            return;
        }
        m.dead.insert(dead, now);
        m.swim.remove_member(&Numbered, dead);
        m.queue.push(Gossip::Dead { id: dead, generation: m.generations[index(dead)] });
    }

    fn deliver(&mut self, d: Datagram) {
        let now = self.now;
        let (i, from) = (d.to, self.members[d.from].id);
        if self.members[i].crashed {
            return;
        }
        let me = self.members[i].id;
        // What the node answers the sender directly: its DOWN record if it holds the sender
        // dead in its current generation, and the record that refutes a stale suspicion.
        let mut answers = Vec::new();
        if self.members[i].dead.contains_key(&from) {
            answers.push(Gossip::Dead { id: from, generation: self.members[i].generations[d.from] });
        }
        for g in d.gossip {
            let m = &mut self.members[i];
            match g {
                Gossip::Dead { id, generation } if id == me => {
                    // Declared dead: come back in a new generation, as the node refutes a DOWN.
                    if generation == m.generation {
                        m.generation += 1;
                        let incarnation = m.swim.incarnation();
                        m.queue.push(Gossip::Join { id, generation: m.generation, incarnation });
                    }
                }
                Gossip::Dead { id, generation } => {
                    if generation >= m.generations[index(id)] {
                        m.generations[index(id)] = generation;
                        self.mark_dead(i, id);
                    }
                }
                Gossip::Join { id, .. } if id == me => {}
                Gossip::Join { id, generation, incarnation } => {
                    if generation > m.generations[index(id)] {
                        m.generations[index(id)] = generation;
                        if m.dead.remove(&id).is_some() {
                            m.swim.add_member(&Numbered, now, id, incarnation, true);
                        }
                        m.queue.push(g);
                    }
                }
                Gossip::Suspect { id, .. } | Gossip::Alive { id, .. } if m.dead.contains_key(&id) => {}
                Gossip::Suspect { id, incarnation, from } => {
                    if m.swim.on_suspect_gossip(&Numbered, now, id, incarnation, from) == Rumor::Spread {
                        m.queue.push(g);
                    }
                    let held =
                        if id == me { Some(m.swim.incarnation()) } else { m.swim.member_incarnation(&Numbered, &id) };
                    if let Some(held) = held.filter(|&h| id == me || h > incarnation) {
                        answers.push(Gossip::Alive { id, incarnation: held });
                    }
                }
                Gossip::Alive { id, incarnation } => {
                    if m.swim.on_alive_gossip(&Numbered, now, id, incarnation) == Rumor::Spread {
                        m.queue.push(g);
                    }
                }
            }
        }
        let swim = &mut self.members[i].swim;
        match d.probe {
            Probe::Ping(seq) => swim.on_ping(now, from, seq),
            Probe::PingReq(target, seq) => swim.on_ping_req(now, from, target, seq),
            Probe::Ack(seq) => swim.on_ack(now, from, seq),
            Probe::Nack(seq) => swim.on_nack(now, from, seq),
            Probe::Direct => {}
        }
        self.drain(i);
        for a in answers {
            self.send_direct(i, from, a);
        }
    }

    /// Runs until `end`, delivering datagrams and firing deadlines in time order.
    fn run_until(&mut self, end: Time) {
        loop {
            let timers =
                self.members.iter().filter(|m| !m.crashed).map(|m| m.swim.next_deadline()).min().unwrap_or(Time::NEVER);
            let arrival = self.in_flight.keys().next().map_or(Time::NEVER, |&(at, _)| at);
            let next = timers.min(arrival);
            if next > end {
                self.now = end;
                return;
            }
            self.now = self.now.max(next);
            if arrival <= timers {
                if let Some((_, d)) = self.in_flight.pop_first() {
                    self.deliver(d);
                }
                continue;
            }
            for i in 0..self.members.len() {
                if !self.members[i].crashed && self.members[i].swim.next_deadline() <= self.now {
                    self.members[i].swim.on_timeout(&Numbered, self.now);
                    self.drain(i);
                }
            }
        }
    }

    fn crash(&mut self, i: usize) {
        self.members[i].crashed = true;
    }

    /// Every (holder, dead member) pair among running members.
    fn deaths(&self) -> Vec<(NodeId, NodeId, Time)> {
        self.members
            .iter()
            .filter(|m| !m.crashed)
            .flat_map(|m| m.dead.iter().map(move |(d, at)| (m.id, *d, *at)))
            .collect()
    }
}

#[test]
fn a_crashed_member_is_confirmed_dead_by_every_member_within_the_bound() {
    const N: usize = 16;
    let config = SwimConfig::default();
    let period = config.protocol_period;
    // One pass for the first prober to reach it (each member probes everyone once a pass), the
    // longest suspicion, and a few periods for the death to spread.
    let (_, longest) = config.suspicion_bounds(N);
    let bound = period * (N as u32 - 1) + longest + period * 10;
    for seed in [1u64, 2, 3, 4, 5, 6, 7, 8] {
        let mut c = Cluster::new(N, 0.0, seed);
        c.run_until(Time::from_secs(10));
        let victim = (seed as usize * 5) % N;
        let crashed_at = c.now;
        c.crash(victim);
        c.run_until(crashed_at + bound);
        let deaths = c.deaths();
        let mut slowest = Duration::ZERO;
        for m in c.members.iter().filter(|m| !m.crashed) {
            let at = m.dead.get(&id(victim));
            assert!(at.is_some(), "seed {seed}: {} never learned that {} died (bound {bound:?})", m.id, id(victim));
            slowest = slowest.max(*at.unwrap_or(&Time::NEVER) - crashed_at);
        }
        assert!(deaths.iter().all(|(_, d, _)| *d == id(victim)), "seed {seed}: a live member is held dead: {deaths:?}");
        let wrong: Vec<_> = c.confirmations.iter().filter(|(_, d, _)| *d != id(victim)).collect();
        assert!(wrong.is_empty(), "seed {seed}: a live member was confirmed dead: {wrong:?}");
        eprintln!("seed {seed}: all {} members confirmed the crash within {slowest:?} (bound {bound:?})", N - 1);
    }
}

#[test]
fn no_live_member_is_confirmed_dead_at_five_percent_loss() {
    const N: usize = 16;
    const PERIODS: u64 = 600;
    let mut suspicions_refuted = 0;
    // Five seeds of 16 members and one of 64.
    for (seed, n) in [(11u64, N), (12, N), (13, N), (14, N), (15, N), (16, 64)] {
        let mut c = Cluster::new(n, 0.05, seed);
        c.run_until(Time::from_secs(PERIODS));
        let confirmed = &c.confirmations;
        assert!(confirmed.is_empty(), "seed {seed}: live members confirmed dead at 5% loss: {confirmed:?}");
        suspicions_refuted += c.members.iter().map(|m| m.refutations).sum::<u32>();
        let health = c.members.iter().map(|m| m.swim.health()).max().unwrap_or(0);
        eprintln!("seed {seed}, {n} members: {} datagrams, highest local health {health}", c.sent);
    }
    // The loss is heavy enough that some probes fail; the test only means something if
    // suspicions were raised and refuted along the way.
    eprintln!("refutations over all seeds: {suspicions_refuted}");
    assert!(suspicions_refuted > 0, "no suspicion was ever raised: the test exercises nothing");
}

#[test]
fn detection_is_deterministic_for_a_seed() {
    let run = || {
        let mut c = Cluster::new(8, 0.05, 99);
        c.run_until(Time::from_secs(5));
        c.crash(3);
        c.run_until(Time::from_secs(60));
        (c.sent, c.deaths(), c.confirmations)
    };
    assert_eq!(run(), run());
}

#[test]
fn dead_members_stop_being_probed() {
    let mut c = Cluster::new(6, 0.0, 5);
    c.run_until(Time::from_secs(2));
    c.crash(0);
    c.run_until(Time::from_secs(40));
    assert!(c.members[1..].iter().all(|m| m.dead.contains_key(&id(0))));
    let before = c.sent;
    // Five healthy members, one probe each per period plus the acks: nothing sent to the dead.
    c.run_until(Time::from_secs(50));
    let per_period = (c.sent - before) / 10;
    assert!(per_period <= 10, "{per_period} datagrams a period for 5 members");
    let alive: HashSet<NodeId> = (1..6).map(id).collect();
    assert!(c.in_flight.values().all(|d| alive.contains(&id(d.to))));
}

#[test]
fn a_slow_member_backs_off_instead_of_suspecting_everyone() {
    // Member 0 hears everything 1.2 s late: every ack misses its probe period. Lifeguard's local
    // health stretches its periods and timeouts, so it raises far fewer false suspicions than a
    // detector without it, and in neither case is a healthy member confirmed dead: each
    // suspicion is told to its suspect, which answers the suspecter with its refutation. (The
    // slow member itself answers pings later than anyone's period and may well be confirmed: to
    // the cluster it is as good as failed, and it comes back in a new generation.)
    let run = |max_health: u8, seed: u64| {
        let config = SwimConfig { max_health, ..SwimConfig::default() };
        let mut c = Cluster::with_config(16, 0.0, seed, config);
        c.slow = Some((0, Duration::from_millis(1200)));
        c.run_until(Time::from_secs(300));
        let wrong: Vec<_> = c.confirmations.iter().filter(|(_, dead, _)| *dead != id(0)).collect();
        assert!(wrong.is_empty(), "seed {seed}, max_health {max_health}: healthy members confirmed dead: {wrong:?}");
        (c.members[0].suspicions_raised, c.members[0].worst_health)
    };
    for seed in 1..=20 {
        let (with_lhm, worst) = run(8, seed);
        let (without, _) = run(0, seed);
        eprintln!(
            "seed {seed}: false suspicions by the slow member: {with_lhm} with local health (up to {worst}), \
             {without} without"
        );
        assert!(worst > 0, "seed {seed}: the slow member never noticed it is slow");
        assert!(
            with_lhm * 2 < without,
            "seed {seed}: local health did not hold back suspicions: {with_lhm} vs {without}"
        );
    }
}
