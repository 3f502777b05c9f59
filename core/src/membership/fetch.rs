//! Records announced by version and fetched ([`Piggyback::Have`](crate::wire::Piggyback::Have),
//! [`Message::Fetch`]): a node that lacks an announced record asks the announcer for it, asks
//! the next announcer when no answer comes, and answers others' fetches with the records it
//! holds.
//!
//! [`Message::Fetch`]: crate::wire::Message::Fetch

use crate::answers::Answer;
use crate::id::NodeId;
use crate::node::Node;
use crate::record::{SharedRecord, Version};
use crate::time::Time;
use crate::wire::{Builder, ProbeBuilder};
use core::time::Duration;

/// How long a fetch waits for its answer before the record is asked of the next announcer: a
/// few round trips. The announcements of one record all come within a few hundred
/// milliseconds, so a lost fetch or answer is retried on this timer, not on the next
/// announcement.
pub(super) const FETCH_RETRY: Duration = Duration::from_millis(250);

/// Announcers remembered per record being fetched, besides the one asked.
const FALLBACK_ANNOUNCERS: usize = 2;

/// Most records fetched at once; announcements beyond it wait for anti-entropy.
const MAX_FETCHING: usize = 1024;

/// Most datagrams that answer one [`Message::Fetch`]: a fetch names what one datagram of
/// announcements held, and its answer must not be a large multiple of its size.
///
/// [`Message::Fetch`]: crate::wire::Message::Fetch
pub(super) const MAX_FETCH_ANSWERS: usize = 2;

/// A record asked for after an announcement, until it arrives or no announcer is left to ask.
#[derive(Clone, Debug)]
pub(super) struct Fetching {
    /// The latest version announced.
    version: Version,
    /// When it was last asked for.
    asked: Time,
    /// Other nodes that announced it, asked in turn if no answer comes within [`FETCH_RETRY`].
    fallbacks: [Option<NodeId>; FALLBACK_ANNOUNCERS],
}

impl Node {
    /// Asks `from` for the records it announced that this replica lacks (after the datagram's
    /// own records were merged), in one [`Message::Fetch`]. A record already asked for is not
    /// asked again; `from` becomes a fallback, asked by [`Node::retry_fetches`] if no answer
    /// comes. The announcer has just sent this datagram, so it can be answered even when it is
    /// outbound-only or not yet known here, as a pull is.
    ///
    /// [`Message::Fetch`]: crate::wire::Message::Fetch
    pub(super) fn fetch_announced(&mut self, from: NodeId, announced: &[(NodeId, Version)]) {
        if announced.is_empty() {
            return;
        }
        let (now, limit) = (self.now, self.config.max_datagram);
        let st = &mut self.membership;
        let mut b = Builder::fetch(limit);
        for (id, version) in announced {
            if !self.replica.lacks(id, version) {
                continue;
            }
            if let Some(f) = st.fetching.get_mut(id) {
                if !f.version.covers(version) {
                    f.version = *version;
                }
                if !f.fallbacks.contains(&Some(from)) {
                    if let Some(free) = f.fallbacks.iter_mut().find(|a| a.is_none()) {
                        *free = Some(from);
                    }
                }
                continue;
            }
            if st.fetching.len() >= MAX_FETCHING || !b.push(id) {
                break;
            }
            let fallbacks = [None; FALLBACK_ANNOUNCERS];
            st.fetching.insert(*id, Fetching { version: *version, asked: now, fallbacks });
        }
        if !b.is_empty() {
            self.stats.records_fetched += b.len() as u64;
            self.transmit(from, b.finish());
        }
    }

    /// Asks the next announcer for each record whose fetch went unanswered for
    /// [`FETCH_RETRY`], and forgets those that arrived or have nobody left to ask (anti-entropy
    /// repairs what is still missing then). Called every gossip round.
    pub(super) fn retry_fetches(&mut self) {
        let now = self.now;
        let st = &mut self.membership;
        if st.fetching.is_empty() {
            return;
        }
        let mut asks: Vec<(NodeId, NodeId)> = Vec::new();
        st.fetching.retain(|id, f| {
            if now < f.asked + FETCH_RETRY {
                return true;
            }
            if !self.replica.lacks(id, &f.version) {
                return false;
            }
            let Some(next) = f.fallbacks.iter_mut().find_map(Option::take) else { return false };
            f.asked = now;
            asks.push((next, *id));
            true
        });
        crate::heap::give_back_room(&mut st.fetching);
        // Sent in id order, not the table's (whose order also changes when it gives room back).
        asks.sort_unstable();
        let limit = self.config.max_datagram;
        for group in asks.chunk_by(|a, b| a.0 == b.0) {
            let mut b = Builder::fetch(limit);
            for (_, id) in group {
                if b.push(id) {
                    self.stats.records_fetched += 1;
                }
            }
            self.transmit(group[0].0, b.finish());
        }
    }

    /// A [`Message::Fetch`]: answers `from` with the records it asked for that this replica
    /// holds, as gossip (merged and spread on like any piggybacked news), in at most
    /// [`MAX_FETCH_ANSWERS`] datagrams, paid from the answers budget ([`crate::answers`]).
    ///
    /// [`Message::Fetch`]: crate::wire::Message::Fetch
    pub(crate) fn on_fetch(&mut self, from: NodeId, ids: &[NodeId]) {
        let limit = self.config.max_datagram;
        let mut groups: Vec<Vec<SharedRecord>> = vec![Vec::new()];
        let mut b = ProbeBuilder::gossip(limit);
        for id in ids {
            let Some(record) = self.replica.get(id).map(|s| s.record().clone()) else { continue };
            let Some(encoded) = self.piggyback_encoding(&record) else { continue };
            if !b.push_encoded(&encoded) {
                if groups.len() == MAX_FETCH_ANSWERS {
                    break;
                }
                groups.push(Vec::new());
                b = ProbeBuilder::gossip(limit);
                b.push_encoded(&encoded);
            }
            groups.last_mut().expect("one group at least").push(record);
        }
        for group in groups.iter().filter(|g| !g.is_empty()) {
            if self.answer(from, Answer::Records(group)) {
                self.stats.fetch_answers += 1;
            }
        }
    }
}
