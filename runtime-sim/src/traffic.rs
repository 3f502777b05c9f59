//! What the datagrams of a run carry, by kind, for `TELA_SIM_TRACE`: where the bytes go when
//! a run is slow or heavy (a partition's heal, say).
//!
//! Every datagram is counted by its message tag, and its records and suspicions by what they
//! are: a record with a DOWN mark by another node, a LEFT record, any other record (a record
//! at a new generation, which is how a node refutes a DOWN mark, or an owner's change), each
//! apart for piggybacked updates and for [`Message::Records`] transfers, and the announcements
//! of records by version. Totals are printed at
//! the end of the run, and each 5 simulated seconds what those seconds added, so that the heal
//! of a partition shows against the seconds before it. Tracing decodes every datagram, so it
//! costs time; without it nothing here runs. Each window also gives the gossip
//! datagrams by why they were sent, from the nodes' counters: in gossip rounds, or as one of
//! the answers outside them (news to an outbound-only node, corrections of stale suspicions,
//! DOWN notices, fetch answers, suspicion notices).

use tela_core::harness::wire::{self, Message, Piggyback};
use tela_core::{Lifecycle, Record};

/// Message tags counted (the wire's tags are below this).
const TAGS: usize = 16;
/// The wire's message kinds by tag, as [`Message`] orders its variants.
const TAG_NAMES: [&str; 10] =
    ["Records", "Want", "Ping", "PingReq", "Ack", "Nack", "Gossip", "Buckets", "BucketEntries", "Fetch"];
/// The name of message tag `tag`, as the wire numbers its kinds.
pub(crate) fn tag_name(tag: usize) -> &'static str {
    TAG_NAMES.get(tag).copied().unwrap_or("other")
}

/// Kinds of item counted: records piggybacked by [`kind_of`], suspicions, records transferred
/// by [`kind_of`], announcements of records.
const ITEMS: usize = 8;
const PIGGYBACKED: usize = 0;
const SUSPICIONS: usize = 3;
const TRANSFERRED: usize = 4;
const ANNOUNCEMENTS: usize = 7;

const ITEM_NAMES: [&str; ITEMS] = [
    "piggybacked records marked DOWN",
    "piggybacked LEFT records",
    "piggybacked other records",
    "suspicions",
    "transferred records marked DOWN",
    "transferred LEFT records",
    "transferred other records",
    "announced records",
];

/// Counts and bytes.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Tally {
    count: u64,
    bytes: u64,
}

impl Tally {
    fn add(&mut self, bytes: usize) {
        self.count += 1;
        self.bytes += bytes as u64;
    }

    fn since(self, before: Tally) -> Tally {
        Tally { count: self.count - before.count, bytes: self.bytes - before.bytes }
    }
}

/// Gossip datagrams by why they were sent, summed over the running nodes' counters
/// ([`tela_core::Stats`]): in gossip rounds, and the kinds of answer sent at once outside them, and the answers owed until a round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Senders([u64; 10]);

/// The first seven counters are gossip datagrams by why they were sent; the last three what a
/// heal costs in refutations.
const SENDER_NAMES: [&str; 10] = [
    "in gossip rounds",
    "news to outbound-only nodes",
    "corrections of stale suspicions",
    "DOWN notices",
    "fetch answers",
    "suspicion notices",
    "owed answers, in the next round",
    "suspicions of itself refuted",
    "DOWN marks of itself refuted",
    "suspicions withdrawn",
];
const GOSSIP_SENDERS: usize = 7;

impl Senders {
    pub fn of(s: tela_core::Stats) -> Senders {
        Senders([
            s.gossip_rounds_sent,
            s.news_answers,
            s.corrections_sent,
            s.down_notices,
            s.fetch_answers,
            s.suspicion_notices,
            s.owed_answers_sent,
            s.suspicions_refuted,
            s.refutations,
            s.suspicions_withdrawn,
        ])
    }
}

impl core::iter::Sum for Senders {
    fn sum<I: Iterator<Item = Senders>>(iter: I) -> Senders {
        iter.fold(Senders::default(), |mut a, b| {
            a.0.iter_mut().zip(b.0).for_each(|(x, y)| *x += y);
            a
        })
    }
}

/// Datagrams by tag and items by kind, since the run started and at the last window's end.
#[derive(Clone, Debug, Default)]
pub(crate) struct Traffic {
    tags: [Tally; TAGS],
    items: [Tally; ITEMS],
    window_tags: [Tally; TAGS],
    window_items: [Tally; ITEMS],
    /// Datagrams that did not decode (a lying node's, say).
    undecoded: u64,
    /// The running nodes' sender counters at the last window's end.
    window_senders: Senders,
}

impl Traffic {
    /// Counts one datagram sent.
    pub fn on_datagram(&mut self, payload: &[u8]) {
        let tag = payload.get(1).map_or(TAGS - 1, |&t| usize::from(t).min(TAGS - 1));
        self.tags[tag].add(payload.len());
        let Ok(message) = wire::decode(payload) else {
            self.undecoded += 1;
            return;
        };
        if let Message::Records(records) = &message {
            for r in records {
                // A record's bytes in a message: as a piggybacked item, less the item's tag.
                let bytes = wire::encode_piggyback(&Piggyback::Record(r.clone())).len() - 1;
                self.items[TRANSFERRED + kind_of(r)].add(bytes);
            }
        }
        for p in message.piggyback() {
            let item = match p {
                Piggyback::Suspect { .. } => SUSPICIONS,
                Piggyback::Record(r) => PIGGYBACKED + kind_of(r),
                Piggyback::Have { .. } => ANNOUNCEMENTS,
            };
            self.items[item].add(wire::encode_piggyback(p).len());
        }
    }

    /// The lines for what was sent since the last window, which starts a new one.
    pub fn window(&mut self, nodes: usize, seconds: u64) -> String {
        let tags: Vec<(usize, Tally)> = (0..TAGS).map(|t| (t, self.tags[t].since(self.window_tags[t]))).collect();
        let items: Vec<(usize, Tally)> = (0..ITEMS).map(|i| (i, self.items[i].since(self.window_items[i]))).collect();
        self.window_tags = self.tags;
        self.window_items = self.items;
        let per = (nodes.max(1) as u64 * seconds.max(1)) as f64;
        format!("datagrams per node per s: {}", lines(&tags, &items, Some(per)))
    }

    /// Gossip datagrams per node per second by why they were sent, since the last window, from
    /// the running nodes' counters (`now`). A node that stopped takes its counts with it, so
    /// a window with restarts undercounts a little (never below zero).
    pub fn senders_window(&mut self, now: Senders, nodes: usize, seconds: u64) -> String {
        let per = (nodes.max(1) as u64 * seconds.max(1)) as f64;
        let parts: Vec<String> = (0..SENDER_NAMES.len())
            .map(|i| {
                let n = now.0[i].saturating_sub(self.window_senders.0[i]);
                if i < GOSSIP_SENDERS {
                    format!("{} {:.1}", SENDER_NAMES[i], n as f64 / per)
                } else {
                    format!("{} {n}", SENDER_NAMES[i])
                }
            })
            .collect();
        self.window_senders = now;
        let (gossip, refutations) = parts.split_at(GOSSIP_SENDERS);
        format!("gossip datagrams per node per s: {}\n  in all: {}", gossip.join(", "), refutations.join(", "))
    }

    /// The lines for the whole run.
    pub fn totals(&self) -> String {
        let tags: Vec<(usize, Tally)> = self.tags.iter().copied().enumerate().collect();
        let items: Vec<(usize, Tally)> = self.items.iter().copied().enumerate().collect();
        format!("datagrams in all ({} did not decode): {}", self.undecoded, lines(&tags, &items, None))
    }
}

/// One line of tags, one of items, each count and bytes divided by `per`, if given.
fn lines(tags: &[(usize, Tally)], items: &[(usize, Tally)], per: Option<f64>) -> String {
    let fmt = |t: Tally| match per {
        Some(per) => format!("{:.1} ({:.0} B)", t.count as f64 / per, t.bytes as f64 / per),
        None => format!("{} ({} B)", t.count, t.bytes),
    };
    let name = |tag: usize| TAG_NAMES.get(tag).map_or_else(|| format!("tag {tag}"), |n| (*n).to_string());
    let tags: Vec<String> =
        tags.iter().filter(|(_, t)| t.count > 0).map(|&(tag, t)| format!("{} {}", name(tag), fmt(t))).collect();
    let items: Vec<String> =
        items.iter().filter(|(_, t)| t.count > 0).map(|&(i, t)| format!("{} {}", ITEM_NAMES[i], fmt(t))).collect();
    format!("{}\n  items: {}", tags.join(", "), items.join(", "))
}

/// 0 for a record with a DOWN mark by another node, 1 for a LEFT record, 2 for any other (an
/// owner's change, or a new generation: how a node refutes a DOWN mark).
fn kind_of(r: &Record) -> usize {
    if r.down_mark().is_some() {
        0
    } else if r.state == Lifecycle::Left {
        1
    } else {
        2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tela_core::{Hardware, NodeId, Reachability, Role};

    fn record(n: u64, state: Lifecycle) -> Record {
        let mut r = Record::new(NodeId::from_u64(n), 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        r.state = state;
        r
    }

    #[test]
    fn counts_datagrams_by_tag_and_items_by_kind_per_window() {
        let mut t = Traffic::default();
        let suspect = Piggyback::Suspect {
            id: NodeId::from_u64(1),
            generation: 1,
            heartbeat: 0,
            from: NodeId::from_u64(2),
            age: 0,
        };
        let gossip = wire::encode_unbounded(&Message::Gossip(vec![
            suspect.clone(),
            Piggyback::Record(record(3, Lifecycle::Serve)),
            Piggyback::Have { id: NodeId::from_u64(6), version: record(6, Lifecycle::Serve).version() },
        ]));
        let transfer =
            wire::encode_unbounded(&Message::Records(vec![record(4, Lifecycle::Left), record(5, Lifecycle::Join)]));
        t.on_datagram(&gossip);
        t.on_datagram(&transfer);
        t.on_datagram(&[0xff]);
        assert_eq!(t.tags[usize::from(gossip[1])], Tally { count: 1, bytes: gossip.len() as u64 });
        assert_eq!(t.tags[usize::from(transfer[1])].count, 1);
        assert_eq!(t.undecoded, 1);
        let counts: Vec<u64> = t.items.iter().map(|i| i.count).collect();
        assert_eq!(counts, [0, 0, 1, 1, 0, 1, 1, 1]);
        assert_eq!(t.items[SUSPICIONS].bytes, wire::encode_piggyback(&suspect).len() as u64);
        // Two nodes over one second: halves; the next window starts empty.
        let first = t.window(2, 1);
        assert!(first.contains("suspicions 0.5"), "{first}");
        t.on_datagram(&gossip);
        let second = t.window(2, 1);
        assert!(second.contains("suspicions 0.5") && !second.contains("transferred"), "{second}");
        assert!(t.totals().contains("suspicions 2 ("), "{}", t.totals());
        assert!(t.totals().contains("Gossip 2 (") && t.totals().contains("Records 1 ("), "{}", t.totals());
        // Senders: the difference from the last window, per node and second.
        let stats = tela_core::Stats { gossip_rounds_sent: 20, corrections_sent: 4, ..Default::default() };
        let line = t.senders_window([Senders::of(stats), Senders::of(stats)].into_iter().sum(), 2, 5);
        assert!(
            line.contains("in gossip rounds 4.0") && line.contains("corrections of stale suspicions 0.8"),
            "{line}"
        );
        let line = t.senders_window(Senders::of(stats), 2, 5);
        assert!(line.contains("in gossip rounds 0.0"), "a stopped node's counts never go below zero: {line}");
    }
}
