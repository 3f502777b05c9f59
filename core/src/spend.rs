//! [`SpendCounter`]: what each gateway has charged each API key in a budget period, as a
//! lattice that gateways exchange so that a key's budget holds across all of them with no
//! coordinator — and its datagram encoding.
//!
//! # The lattice
//!
//! One entry per (key, gateway): the gateway's own [`Tally`] for the key, `(period, tokens)`,
//! where `period` names the budget period (its start, in Unix seconds) and `tokens` the tokens
//! that gateway charged the key in it. Only the gateway itself adds to its entry, and only
//! upwards: within a period its count grows, and a new period replaces the old one. Tallies are
//! ordered by `(period, tokens)`, and merge ⊔ is the pointwise maximum over entries — so it is
//! commutative, associative and idempotent (checked below with proptest), and a gateway may
//! resend its whole state at any time: a lost, duplicated or reordered datagram changes nothing
//! once a later one arrives. A key's spend in a period is the sum of the entries of that
//! period over gateways ([`SpendCounter::spent`]).
//!
//! # On the wire
//!
//! A gateway sends its whole counter (its own entries and those it heard, so that gateways that
//! are not connected to each other still learn each other's counts) every exchange period, in
//! datagrams of at most [`MAX_DATAGRAM`] bytes:
//!
//! ```text
//! [SPEND_TAG = 0xF1][SPEND_VERSION = 1][postcard(Vec<SpendEntry>)]
//! ```
//!
//! The tag keeps them apart from the core's membership datagrams, which start with the small
//! [`WIRE_VERSION`](crate::wire::WIRE_VERSION), and from the runtime's load reports (`0xF0`).
//! A datagram of another version, or one that does not decode, is an error and changes
//! nothing; either side can move to a new version first.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{NodeId, MAX_DATAGRAM};

/// First byte of a spend datagram.
pub const SPEND_TAG: u8 = 0xF1;
/// Second byte: the format. Bumped on any incompatible change.
pub(crate) const SPEND_VERSION: u8 = 1;

/// A key as the spend counter names it: 16 bytes of a hash of the key's hash, so that the
/// datagrams never carry what the key file stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SpendId(pub [u8; 16]);

/// One gateway's count for one key: the tokens it charged the key in the budget period that
/// starts at `period` (Unix seconds). Ordered by period, then tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Tally {
    /// The period's start, Unix seconds.
    pub period: u64,
    /// Tokens charged in it.
    pub tokens: u64,
}

/// One entry of the counter, as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpendEntry {
    /// The key.
    pub key: SpendId,
    /// The gateway whose count this is.
    pub gateway: NodeId,
    /// Its count.
    pub tally: Tally,
}

/// The grow-only counter per (key, gateway), merged by max; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpendCounter {
    entries: BTreeMap<(SpendId, NodeId), Tally>,
}

/// Why a spend datagram was dropped; dropping never changes the counter.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpendError {
    /// It does not start with [`SPEND_TAG`].
    #[error("not a spend datagram")]
    NotSpend,
    /// Longer than any datagram may be.
    #[error("spend datagram of {0} bytes exceeds the {MAX_DATAGRAM}-byte limit")]
    Oversized(usize),
    /// Another format (a newer or older release).
    #[error("spend datagram version {0} not supported (this build reads {SPEND_VERSION})")]
    UnsupportedVersion(u8),
    /// The body does not decode.
    #[error("malformed spend datagram: {0}")]
    Malformed(String),
}

impl SpendCounter {
    /// An empty counter.
    pub fn new() -> SpendCounter {
        SpendCounter::default()
    }

    /// Takes in one entry: the larger tally wins. Returns whether the counter changed.
    pub(crate) fn merge_entry(&mut self, entry: SpendEntry) -> bool {
        let held = self.entries.entry((entry.key, entry.gateway)).or_default();
        if entry.tally > *held {
            *held = entry.tally;
            true
        } else {
            false
        }
    }

    /// Merges `other` into this counter (⊔). Returns whether this counter changed.
    pub fn merge(&mut self, other: &SpendCounter) -> bool {
        let mut changed = false;
        for entry in other.entries() {
            changed |= self.merge_entry(entry);
        }
        changed
    }

    /// Sets `gateway`'s own count for `key` in `period` to `tokens`, never moving the entry
    /// down: a count below the one held for that period, or a period before the held one (the
    /// clock stepped back), changes nothing.
    pub fn observe(&mut self, key: SpendId, gateway: NodeId, period: u64, tokens: u64) -> bool {
        self.merge_entry(SpendEntry { key, gateway, tally: Tally { period, tokens } })
    }

    /// `gateway`'s count for `key`, if it has one.
    pub fn tally(&self, key: SpendId, gateway: NodeId) -> Option<Tally> {
        self.entries.get(&(key, gateway)).copied()
    }

    /// `key`'s spend in `period`: the sum over gateways of their counts for that period.
    pub fn spent(&self, key: SpendId, period: u64) -> u64 {
        self.spent_by(key, period, |_| true)
    }

    /// `key`'s spend in `period` on every gateway but `except` (a gateway adds its own count,
    /// which it knows more recently than its entry here).
    pub fn spent_elsewhere(&self, key: SpendId, period: u64, except: NodeId) -> u64 {
        self.spent_by(key, period, |g| g != except)
    }

    fn spent_by(&self, key: SpendId, period: u64, mut count: impl FnMut(NodeId) -> bool) -> u64 {
        let low = (key, NodeId([0; 16]));
        self.entries
            .range(low..)
            .take_while(|((k, _), _)| *k == key)
            .filter(|((_, g), t)| t.period == period && count(*g))
            .fold(0u64, |sum, (_, t)| sum.saturating_add(t.tokens))
    }

    /// Every entry, in (key, gateway) order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = SpendEntry> + '_ {
        self.entries.iter().map(|(&(key, gateway), &tally)| SpendEntry { key, gateway, tally })
    }

    /// How many entries the counter holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets entries of periods that started before `oldest` (over for every budget that
    /// could still count them). Every gateway forgets by the same rule, and a forgotten entry
    /// that is heard again only counts toward its own, past, period.
    pub fn forget_before(&mut self, oldest: u64) {
        self.entries.retain(|_, t| t.period >= oldest);
    }

    /// The whole counter as datagrams of at most [`MAX_DATAGRAM`] bytes each (none when empty).
    pub fn encode(&self) -> Vec<Vec<u8>> {
        encode_entries(self.entries())
    }

    /// Decodes one datagram and merges it; returns the keys whose counts changed, sorted and
    /// without repeats (none: the datagram was old news). An error changes nothing.
    pub fn receive(&mut self, datagram: &[u8]) -> Result<Vec<SpendId>, SpendError> {
        let entries = decode(datagram)?;
        let mut changed: Vec<SpendId> = entries.into_iter().filter(|e| self.merge_entry(*e)).map(|e| e.key).collect();
        changed.sort_unstable();
        changed.dedup();
        Ok(changed)
    }
}

/// Largest encoding of one entry: 16 + 16 bytes of ids and two varints of at most 10 bytes.
const MAX_ENTRY: usize = 16 + 16 + 10 + 10;
/// Header (tag, version) plus the list's length varint.
const HEADER: usize = 2 + 5;

/// Packs `entries` into datagrams of at most [`MAX_DATAGRAM`] bytes each.
pub(crate) fn encode_entries(entries: impl Iterator<Item = SpendEntry>) -> Vec<Vec<u8>> {
    let per_datagram = (MAX_DATAGRAM - HEADER) / MAX_ENTRY;
    let entries: Vec<SpendEntry> = entries.collect();
    entries
        .chunks(per_datagram)
        .map(|chunk| {
            let mut out = vec![SPEND_TAG, SPEND_VERSION];
            // Serialising into a Vec cannot fail for these types.
            out.extend(postcard::to_allocvec(chunk).unwrap_or_default());
            debug_assert!(out.len() <= MAX_DATAGRAM, "a chunk fits one datagram");
            out
        })
        .collect()
}

/// Decodes one spend datagram; never panics.
pub(crate) fn decode(datagram: &[u8]) -> Result<Vec<SpendEntry>, SpendError> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(SpendError::Oversized(datagram.len()));
    }
    match datagram {
        [SPEND_TAG, SPEND_VERSION, body @ ..] => {
            let (entries, rest): (Vec<SpendEntry>, _) =
                postcard::take_from_bytes(body).map_err(|e| SpendError::Malformed(e.to_string()))?;
            if !rest.is_empty() {
                return Err(SpendError::Malformed(format!("{} trailing bytes", rest.len())));
            }
            Ok(entries)
        }
        [SPEND_TAG, version, ..] => Err(SpendError::UnsupportedVersion(*version)),
        _ => Err(SpendError::NotSpend),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(n: u8) -> SpendId {
        SpendId([n; 16])
    }

    fn entry() -> impl Strategy<Value = SpendEntry> {
        (0u8..4, 0u64..4, 0u64..3, 0u64..50).prop_map(|(k, g, period, tokens)| SpendEntry {
            key: key(k),
            gateway: NodeId::from_u64(g),
            tally: Tally { period, tokens },
        })
    }

    fn counter() -> impl Strategy<Value = SpendCounter> {
        proptest::collection::vec(entry(), 0..12).prop_map(|entries| {
            let mut c = SpendCounter::new();
            for e in entries {
                c.merge_entry(e);
            }
            c
        })
    }

    fn merged(a: &SpendCounter, b: &SpendCounter) -> SpendCounter {
        let mut out = a.clone();
        out.merge(b);
        out
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in counter(), b in counter()) {
            prop_assert_eq!(merged(&a, &b), merged(&b, &a));
        }

        #[test]
        fn merge_is_associative(a in counter(), b in counter(), c in counter()) {
            prop_assert_eq!(merged(&merged(&a, &b), &c), merged(&a, &merged(&b, &c)));
        }

        #[test]
        fn merge_is_idempotent(a in counter(), b in counter()) {
            prop_assert_eq!(merged(&a, &a), a.clone());
            let ab = merged(&a, &b);
            prop_assert_eq!(merged(&ab, &b), ab);
        }

        #[test]
        fn spend_never_goes_down_within_a_period(a in counter(), b in counter(), k in 0u8..4, p in 0u64..3) {
            // Merging only ever raises a period's spend... unless an entry moved to a later
            // period, which is how a new period starts.
            let before = a.spent(key(k), p);
            let after = merged(&a, &b);
            let moved_on = after.entries().any(|e| e.key == key(k) && e.tally.period > p
                && a.entries().any(|o| o.key == e.key && o.gateway == e.gateway && o.tally.period == p));
            prop_assert!(after.spent(key(k), p) >= before || moved_on);
        }

        #[test]
        fn datagrams_carry_the_whole_counter(a in counter()) {
            let mut back = SpendCounter::new();
            for d in a.encode() {
                prop_assert!(d.len() <= MAX_DATAGRAM);
                back.receive(&d).expect("decodes");
            }
            prop_assert_eq!(back, a);
        }
    }

    #[test]
    fn receiving_names_the_keys_that_moved_and_old_news_none() {
        let (a, b) = (NodeId::from_u64(1), NodeId::from_u64(2));
        let mut sender = SpendCounter::new();
        sender.observe(key(2), a, 100, 40);
        sender.observe(key(1), a, 100, 25);
        sender.observe(key(1), b, 100, 5);
        let mut receiver = SpendCounter::new();
        receiver.observe(key(2), a, 100, 40);
        let datagrams = sender.encode();
        let moved: Vec<SpendId> = datagrams.iter().flat_map(|d| receiver.receive(d).expect("decodes")).collect();
        assert_eq!(moved, [key(1)], "key 2's count was already held");
        assert!(datagrams.iter().all(|d| receiver.receive(d) == Ok(vec![])), "old news moves nothing");
    }

    #[test]
    fn spend_is_the_sum_over_gateways_of_the_current_period() {
        let (a, b, c) = (NodeId::from_u64(1), NodeId::from_u64(2), NodeId::from_u64(3));
        let mut counter = SpendCounter::new();
        counter.observe(key(1), a, 100, 40);
        counter.observe(key(1), b, 100, 25);
        counter.observe(key(1), c, 50, 1000); // last period: not counted
        counter.observe(key(2), a, 100, 7);
        assert_eq!(counter.spent(key(1), 100), 65);
        assert_eq!(counter.spent_elsewhere(key(1), 100, a), 25);
        assert_eq!(counter.tally(key(1), b), Some(Tally { period: 100, tokens: 25 }));
        assert_eq!(counter.tally(key(3), b), None);
        assert_eq!(counter.spent(key(2), 100), 7);
        // A count never moves down, and a new period replaces the old.
        assert!(!counter.observe(key(1), a, 100, 30));
        assert!(counter.observe(key(1), a, 200, 1));
        assert_eq!(counter.spent(key(1), 100), 25);
        assert_eq!(counter.spent(key(1), 200), 1);
        counter.forget_before(100);
        assert_eq!(counter.len(), 3, "c's entry of period 50 is forgotten");
    }

    #[test]
    fn large_counters_are_chunked_and_bad_datagrams_change_nothing() {
        let mut counter = SpendCounter::new();
        for k in 0..=255u8 {
            for g in 0..3 {
                counter.observe(SpendId([k; 16]), NodeId::from_u64(g), u64::MAX, u64::MAX);
            }
        }
        let datagrams = counter.encode();
        assert!(datagrams.len() > 1);
        assert!(datagrams.iter().all(|d| d.len() <= MAX_DATAGRAM && d[0] == SPEND_TAG));
        assert_ne!(crate::wire::WIRE_VERSION, SPEND_TAG);
        let mut empty = SpendCounter::new();
        let good = &datagrams[0];
        let mut other_version = good.clone();
        other_version[1] = SPEND_VERSION + 1;
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(empty.receive(&[]), Err(SpendError::NotSpend));
        assert_eq!(empty.receive(&other_version), Err(SpendError::UnsupportedVersion(SPEND_VERSION + 1)));
        assert_eq!(empty.receive(&vec![SPEND_TAG; MAX_DATAGRAM + 1]), Err(SpendError::Oversized(MAX_DATAGRAM + 1)));
        assert!(matches!(empty.receive(&trailing), Err(SpendError::Malformed(_))));
        assert!(matches!(empty.receive(&good[..good.len() - 1]), Err(SpendError::Malformed(_))));
        assert!(empty.is_empty());
    }
}
