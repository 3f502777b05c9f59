//! What the datagrams of a run carry, by kind, for `TELA_SIM_TRACE`: where the bytes go when
//! a run is slow or heavy (a partition's heal, say).
//!
//! Every datagram is counted by its message tag, and its records and suspicions by what they
//! are: a record with a DOWN mark by another node, a LEFT record, any other record (a record
//! at a new generation, which is how a node refutes a DOWN mark, or an owner's change), each
//! apart for piggybacked updates and for [`Message::Records`] transfers. Totals are printed at
//! the end of the run, and each 5 simulated seconds what those seconds added, so that the heal
//! of a partition shows against the seconds before it. Tracing decodes every datagram, so it
//! costs time; without it nothing here runs.

use tela_core::wire::{self, Message, Piggyback};
use tela_core::{Lifecycle, Record};

/// Message tags counted (the wire's tags are below this).
const TAGS: usize = 16;
/// Kinds of item counted: see [`Item`].
const ITEMS: usize = 7;

/// What one counted item is.
#[derive(Clone, Copy)]
enum Item {
    PiggyMarked,
    PiggyLeft,
    PiggyOther,
    Suspect,
    TransferMarked,
    TransferLeft,
    TransferOther,
}

const ITEM_NAMES: [&str; ITEMS] = [
    "piggybacked records marked DOWN",
    "piggybacked LEFT records",
    "piggybacked other records",
    "suspicions",
    "transferred records marked DOWN",
    "transferred LEFT records",
    "transferred other records",
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

/// Datagrams by tag and items by kind, since the run started and at the last window's end.
#[derive(Clone, Debug, Default)]
pub(crate) struct Traffic {
    tags: [Tally; TAGS],
    items: [Tally; ITEMS],
    window_tags: [Tally; TAGS],
    window_items: [Tally; ITEMS],
    /// Datagrams that did not decode (a lying node's, say).
    undecoded: u64,
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
                let kind = match kind_of(r) {
                    Kind::Marked => Item::TransferMarked,
                    Kind::Left => Item::TransferLeft,
                    Kind::Other => Item::TransferOther,
                };
                self.items[kind as usize].add(postcard_len(r));
            }
        }
        for p in message.piggyback() {
            let bytes = wire::encode_piggyback(p).len();
            let kind = match p {
                Piggyback::Suspect { .. } => Item::Suspect,
                Piggyback::Record(r) => match kind_of(r) {
                    Kind::Marked => Item::PiggyMarked,
                    Kind::Left => Item::PiggyLeft,
                    Kind::Other => Item::PiggyOther,
                },
            };
            self.items[kind as usize].add(bytes);
        }
    }

    /// The lines for what was sent since the last window, which starts a new one.
    pub fn window(&mut self, nodes: usize, seconds: u64) -> String {
        let tags: Vec<(usize, Tally)> = (0..TAGS).map(|t| (t, self.tags[t].since(self.window_tags[t]))).collect();
        let items: Vec<(usize, Tally)> = (0..ITEMS).map(|i| (i, self.items[i].since(self.window_items[i]))).collect();
        self.window_tags = self.tags;
        self.window_items = self.items;
        let per = (nodes.max(1) as u64 * seconds.max(1)) as f64;
        format!("datagrams per node per s: {}", lines(&tags, &items, per))
    }

    /// The lines for the whole run.
    pub fn totals(&self) -> String {
        let tags: Vec<(usize, Tally)> = self.tags.iter().copied().enumerate().collect();
        let items: Vec<(usize, Tally)> = self.items.iter().copied().enumerate().collect();
        format!("datagrams in all ({} did not decode): {}", self.undecoded, lines(&tags, &items, 1.0))
    }
}

/// One line of tags, one of items, each count and bytes divided by `per`.
fn lines(tags: &[(usize, Tally)], items: &[(usize, Tally)], per: f64) -> String {
    let fmt = |t: Tally| format!("{:.1} ({:.0} B)", t.count as f64 / per, t.bytes as f64 / per);
    let tags: Vec<String> =
        tags.iter().filter(|(_, t)| t.count > 0).map(|&(tag, t)| format!("tag {tag} {}", fmt(t))).collect();
    let items: Vec<String> =
        items.iter().filter(|(_, t)| t.count > 0).map(|&(i, t)| format!("{} {}", ITEM_NAMES[i], fmt(t))).collect();
    format!("{}\n  items: {}", tags.join(", "), items.join(", "))
}

enum Kind {
    Marked,
    Left,
    Other,
}

fn kind_of(r: &Record) -> Kind {
    if r.down_mark().is_some() {
        Kind::Marked
    } else if r.state == Lifecycle::Left {
        Kind::Left
    } else {
        Kind::Other
    }
}

/// Bytes `r` takes in a message: as a piggybacked item, less the item's one-byte tag.
fn postcard_len(r: &Record) -> usize {
    wire::encode_piggyback(&Piggyback::Record(r.clone())).len() - 1
}
