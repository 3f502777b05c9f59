//! Answers a node owes its peers, paid from a budget per gossip round.
//!
//! Most of what a node sends is scheduled: probes and acks by the detector, gossip by its
//! rounds, exchanges by the anti-entropy timer. The rest are *answers* to what a peer sent:
//! the records that refute a stale suspicion it carried, a node's DOWN record to a node that
//! talks while held DOWN, news for an outbound-only node's pull, the records a fetch asked for,
//! and a suspect told of its suspicion. Sent at once, an answer costs a datagram for a datagram
//! received, and in a heal, when every node holds stale suspicions of every member that was cut
//! off and every datagram carries some, the answers were nearly all of what nodes sent (at
//! 10,000 nodes, 587 gossip datagrams a second per node in the heal's first seconds, against at
//! most 15 in the rounds).
//!
//! So answers can be paid from a budget: with
//! [`MembershipSettings::answers_per_round`](crate::MembershipSettings::answers_per_round) set,
//! each gossip round grants that many datagrams. While the round's budget lasts an answer goes out at once, as before; after that
//! it is *owed*: it waits for the next round, and everything owed to one peer goes in one
//! datagram (refutations, the DOWN notice, fetched records, the suspicion and the news
//! together). What is owed is named, not copied: the records are read from the replica when the
//! answer is sent, so the peer gets the latest version. At most [`MAX_OWED`] peers are owed at
//! once, and nothing is owed for longer than [`OWED_FOR`]: answers beyond either are dropped,
//! and anti-entropy repairs what they would have carried. A node therefore sends at most
//! `gossip_fanout + answers_per_round` datagrams a round besides its probes and exchanges,
//! whatever it receives.
//!
//! The budget is off by default (every answer goes out at once). Measured in the simulator
//! (`runtime-sim/results/README.md`), a budget of 12 a round cuts the heal's first second at
//! 3,000 nodes from 883 events per node to 121, but the repair after the heal takes twice as
//! long: the answers were doing the repair's work, anchors answer the pulls of many
//! outbound-only nodes at once, and answers dropped when owed too long leave stale suspicions
//! circulating.

use crate::id::NodeId;
use crate::node::Node;
use crate::record::{Lifecycle, SharedRecord};
use crate::time::Time;
use crate::wire::{Piggyback, ProbeBuilder};
use core::time::Duration;
use std::collections::VecDeque;

/// Most peers owed an answer at once; answers to further peers are dropped.
pub(crate) const MAX_OWED: usize = 64;
/// How long an answer may stay owed; older ones are dropped at the next round.
pub(crate) const OWED_FOR: Duration = Duration::from_secs(1);
/// Most records owed to one peer; more are dropped.
const MAX_OWED_RECORDS: usize = 32;

/// What one answer carries.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Answer<'a> {
    /// These records, as gossip: refutations, a DOWN notice, fetched records.
    Records(&'a [SharedRecord]),
    /// The suspicion this node holds of the peer itself.
    Suspicion,
    /// Whatever news the queues hold (the peer is outbound-only and pulled).
    News,
}

/// Answers owed to one peer.
#[derive(Clone, Debug)]
struct Owed {
    peer: NodeId,
    records: Vec<NodeId>,
    suspicion: bool,
    news: bool,
    since: Time,
}

impl Owed {
    fn add(&mut self, answer: Answer<'_>) {
        match answer {
            Answer::Records(records) => {
                for r in records {
                    if self.records.len() < MAX_OWED_RECORDS && !self.records.contains(&r.id) {
                        self.records.push(r.id);
                    }
                }
            }
            Answer::Suspicion => self.suspicion = true,
            Answer::News => self.news = true,
        }
    }
}

/// The answers budget and the answers waiting for it.
#[derive(Clone, Debug)]
pub(crate) struct Answers {
    /// The budget per round; none: every answer goes out at once.
    per_round: Option<usize>,
    /// Datagrams left in this round's budget.
    left: usize,
    owed: VecDeque<Owed>,
}

impl Answers {
    pub(crate) fn new(per_round: Option<usize>) -> Answers {
        Answers { per_round, left: per_round.unwrap_or(0), owed: VecDeque::new() }
    }

    /// Whether the next round has answers to pay or a spent budget to renew.
    /// Heap bytes of the answers owed ([`crate::heap`]).
    pub(crate) fn heap_bytes(&self) -> u64 {
        crate::heap::array::<Owed>(self.owed.capacity())
            + self.owed.iter().map(|o| crate::heap::array::<NodeId>(o.records.capacity())).sum::<u64>()
    }

    pub(crate) fn round_has_work(&self) -> bool {
        self.per_round.is_some_and(|n| self.left < n || !self.owed.is_empty())
    }
}

impl Node {
    /// Answers `to` with `answer`: at once if this round's budget allows and nothing is owed to
    /// it yet, else with what is already owed to it at the next round. Returns whether a
    /// datagram went out now.
    pub(crate) fn answer(&mut self, to: NodeId, answer: Answer<'_>) -> bool {
        let now = self.now;
        let answers = &mut self.membership.answers;
        if answers.per_round.is_none() {
            let mut owed = Owed { peer: to, records: Vec::new(), suspicion: false, news: false, since: now };
            owed.add(answer);
            return self.send_owed(&owed);
        }
        if let Some(owed) = answers.owed.iter_mut().find(|o| o.peer == to) {
            owed.add(answer);
            self.stats.answers_deferred += 1;
            return false;
        }
        if answers.left > 0 {
            let mut owed = Owed { peer: to, records: Vec::new(), suspicion: false, news: false, since: now };
            owed.add(answer);
            if self.send_owed(&owed) {
                self.membership.answers.left -= 1;
                return true;
            }
            return false;
        }
        if answers.owed.len() >= MAX_OWED {
            self.stats.answers_dropped += 1;
            return false;
        }
        let mut owed = Owed { peer: to, records: Vec::new(), suspicion: false, news: false, since: now };
        owed.add(answer);
        answers.owed.push_back(owed);
        self.stats.answers_deferred += 1;
        false
    }

    /// A new gossip round: renews the budget, drops answers owed too long, and sends those owed
    /// longest while the budget lasts.
    pub(crate) fn answer_round(&mut self) {
        let now = self.now;
        let answers = &mut self.membership.answers;
        let Some(per_round) = answers.per_round else { return };
        answers.left = per_round;
        let before = answers.owed.len();
        answers.owed.retain(|o| now < o.since + OWED_FOR);
        self.stats.answers_dropped += (before - answers.owed.len()) as u64;
        while self.membership.answers.left > 0 {
            let Some(owed) = self.membership.answers.owed.pop_front() else { break };
            if self.send_owed(&owed) {
                self.membership.answers.left -= 1;
                self.stats.owed_answers_sent += 1;
            }
        }
    }

    /// Sends one datagram of what is owed to a peer: its suspicion, the records (as held now),
    /// then news if it pulled. Returns whether anything was sent.
    fn send_owed(&mut self, owed: &Owed) -> bool {
        let to = owed.peer;
        let mut b = ProbeBuilder::gossip(self.config.max_datagram);
        if owed.suspicion {
            if let Some(suspicion) = self.suspicion_of(to) {
                b.push(&suspicion);
            }
        }
        for id in &owed.records {
            let record = if *id == self.config.id {
                Some(self.replica.local().clone())
            } else {
                self.replica.get(id).map(|s| s.record().clone())
            };
            let Some(encoded) = record.and_then(|r| self.piggyback_encoding(&r)) else { continue };
            if !b.push_encoded(&encoded) {
                break;
            }
        }
        if owed.news {
            return self.send_probe(to, b, None, true);
        }
        if b.is_empty() {
            return false;
        }
        self.transmit(to, b.finish());
        true
    }

    /// The suspicion this node holds of `id`, as sent to it, if it still holds one and can
    /// reach it.
    fn suspicion_of(&self, id: NodeId) -> Option<Piggyback> {
        if !self.membership.is_suspect(&id) {
            return None;
        }
        let record = self.replica.get(&id).map(|s| s.record())?;
        if record.state >= Lifecycle::Down || !self.reachable(record) {
            return None;
        }
        self.own_suspicion(id)
    }
}
