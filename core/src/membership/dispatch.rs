//! Every message a peer sends, by kind: the one place a datagram's meaning is decided. Probe
//! messages go to the failure detector, their piggybacked records to the lattice, suspicions to
//! [`suspicion`](super::suspicion) and announcements to [`fetch`](super::fetch); anti-entropy
//! messages go to [`crate::anti_entropy`].

use crate::answers::Answer;
use crate::id::NodeId;
use crate::node::Node;
use crate::record::{Reachability, SharedRecord, Version};
use crate::wire::{Message, Piggyback};

/// The failure detector's input a probe message carries.
enum Probe {
    Ping(u32),
    PingReq(NodeId, u32),
    Ack(u32),
    Nack(u32),
}

impl Node {
    /// Every message a peer sends, by kind: the one place a datagram's meaning is decided.
    pub(crate) fn on_message(&mut self, from: NodeId, msg: Message) {
        let now = self.now;
        let (probe, piggyback) = match msg {
            Message::Ping { seq, piggyback } => (Some(Probe::Ping(seq)), piggyback),
            Message::PingReq { target, seq, piggyback } => (Some(Probe::PingReq(target, seq)), piggyback),
            Message::Ack { seq, piggyback } => (Some(Probe::Ack(seq)), piggyback),
            Message::Nack { seq, piggyback } => (Some(Probe::Nack(seq)), piggyback),
            Message::Gossip(piggyback) => (None, piggyback),
            Message::Records(records) => {
                self.heard(from);
                // Many records at once are a bulk transfer (a join, a long separation): news to
                // this replica, old news to the federation, so they are not gossiped on.
                let spread = records.len() <= crate::anti_entropy::BULK_RECORDS;
                for r in records {
                    self.absorb_news(r, spread);
                }
                return;
            }
            Message::Want(ids) => {
                self.heard(from);
                // A want comes from an anti-entropy exchange, which asks for whole buckets.
                let records: Vec<SharedRecord> =
                    ids.iter().filter_map(|id| self.replica.get(id).map(|s| s.record().clone())).collect();
                self.send_records_up_to(from, &records, crate::anti_entropy::MAX_EXCHANGE_DATAGRAMS);
                return;
            }
            Message::Buckets { count, first, hashes } => {
                self.heard(from);
                return self.on_buckets(from, count, first, &hashes);
            }
            Message::BucketEntries { count, complete, entries } => {
                self.heard(from);
                return self.on_bucket_entries(from, count, &complete, &entries);
            }
            Message::Fetch(ids) => {
                self.heard(from);
                return self.on_fetch(from, &ids);
            }
        };
        if probe.is_none() {
            self.heard_from(from);
        }
        self.tell_if_down(from);
        let mut corrections: Vec<SharedRecord> = Vec::new();
        let mut announced: Vec<(NodeId, Version)> = Vec::new();
        for item in piggyback {
            match item {
                Piggyback::Record(r) => self.absorb(r),
                Piggyback::Suspect { id, generation, heartbeat, from: suspecter, age } => {
                    if let Some(newer) = self.on_suspicion(from, id, generation, heartbeat, suspecter, age) {
                        corrections.push(newer);
                    }
                }
                Piggyback::Have { id, version } => announced.push((id, version)),
            }
        }
        if !corrections.is_empty() && self.answer(from, Answer::Records(&corrections)) {
            self.stats.corrections_sent += 1;
        }
        self.fetch_announced(from, &announced);
        if probe.is_none() && self.replica.get(&from).is_some_and(|s| s.record().reach == Reachability::OutboundOnly) {
            // Gossip from a node only its anchors can send to is also its pull: answer with news.
            if self.answer(from, Answer::News) {
                self.stats.news_answers += 1;
            }
        }
        let detector = &mut self.membership.detector;
        match probe {
            Some(Probe::Ping(seq)) => detector.on_ping(now, from, seq),
            Some(Probe::PingReq(target, seq)) => detector.on_ping_req(now, from, target, seq),
            Some(Probe::Ack(seq)) => detector.on_ack(now, from, seq),
            Some(Probe::Nack(seq)) => detector.on_nack(now, from, seq),
            None => {}
        }
    }

    /// A message that is not a probe came from `from`: it renews a lease, and tells a node held
    /// DOWN that it is.
    fn heard(&mut self, from: NodeId) {
        self.heard_from(from);
        self.tell_if_down(from);
    }

    /// A message from `from` that the detector's probe inputs do not see (they renew on their
    /// own): renews the lease an anchor holds on an outbound-only member.
    fn heard_from(&mut self, from: NodeId) {
        let now = self.now;
        self.membership.detector.heard_from(now, from);
    }
}
