//! The wire format: a versioned envelope around postcard-encoded messages, bounded by
//! construction.
//!
//! A datagram is `[WIRE_VERSION][postcard(Message)]` and never longer than [`MAX_DATAGRAM`]
//! bytes. Senders build datagrams with a [`Builder`], which adds items one at a time and refuses
//! the item that would not fit, so an oversized datagram cannot be produced; the caller carries
//! the rest in the next datagram or the next round. [`decode`] never panics: empty, oversized,
//! unknown-version, truncated, trailing or otherwise malformed input and records that break the
//! limits are typed [`DecodeError`]s, and decoding touches no state.

use crate::id::NodeId;
use crate::record::{InvalidRecord, Record, Version};
use bytes::Bytes;
use core::marker::PhantomData;
use serde::{Deserialize, Serialize};

/// The largest datagram Tela sends or accepts, in bytes; fits one QUIC datagram on any path.
pub const MAX_DATAGRAM: usize = 1100;
/// Version byte leading every datagram. Bumped on any incompatible change.
///
/// - 1: the first format. The SWIM messages (`Ping` and after) were appended to the messages
///   without a bump: the encodings of the earlier variants did not change, and a node
///   that predates them rejects them as [`DecodeError::Malformed`] without touching its state.
/// - 2: records carry their owner's seal (public key and signature) and an optional DOWN mark
///   ([`Seal`](crate::Seal), [`MarkedDown`](crate::MarkedDown)). Version-1 datagrams are refused as
///   [`DecodeError::UnsupportedVersion`]: their records are unsigned and would be refused anyway.
///   Announcements by version (`Have`) and fetches (`Fetch`) were appended later without a bump, as the SWIM
///   messages were: a node that predates them rejects a datagram carrying them as malformed.
/// - 3: one membership protocol. The push-pull digests (`Digest`, `DigestReply`) are gone and
///   the later variants moved up two places; version-2 datagrams are refused as
///   [`DecodeError::UnsupportedVersion`], and transport admission refuses version-2 members.
/// - 4: a suspicion carries its age (the `age` of `Piggyback::Suspect`), so that a node that
///   withdrew its suspicions after a healed cut can tell the cut's from later ones.
pub const WIRE_VERSION: u8 = 4;

/// A gossip message. Variant order is part of the wire format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Full records to merge: an anti-entropy transfer, or a lifecycle announcement.
    Records(Vec<Record>),
    /// Ids whose records the sender wants (anti-entropy).
    Want(Vec<NodeId>),
    /// A SWIM probe; the receiver answers with an [`Message::Ack`] carrying `seq`.
    Ping {
        /// Echoed in the ack.
        seq: u32,
        /// Updates riding along.
        piggyback: Vec<Piggyback>,
    },
    /// Asks the receiver to ping `target` and forward its ack (or answer with a nack).
    PingReq {
        /// The member to probe.
        target: NodeId,
        /// Echoed in the forwarded ack or the nack.
        seq: u32,
        /// Updates riding along.
        piggyback: Vec<Piggyback>,
    },
    /// The answer to a ping, or a forwarded answer to a ping-req.
    Ack {
        /// The sequence number of the ping answered.
        seq: u32,
        /// Updates riding along.
        piggyback: Vec<Piggyback>,
    },
    /// The target of a ping-req did not answer the helper in time.
    Nack {
        /// The sequence number of the ping-req.
        seq: u32,
        /// Updates riding along.
        piggyback: Vec<Piggyback>,
    },
    /// Updates only, sent to a few random peers while there is news to spread.
    Gossip(Vec<Piggyback>),
    /// Anti-entropy, first step: the sender's hashes of buckets `first..first + hashes.len()`
    /// of its registry split into `count` buckets by node id. The receiver answers the buckets that
    /// differ with a [`Message::BucketEntries`].
    Buckets {
        /// Buckets the registry is split into: a power of two, at most 1024.
        count: u16,
        /// The bucket of the first hash.
        first: u16,
        /// One hash per bucket, little-endian.
        hashes: Vec<[u8; 4]>,
    },
    /// Anti-entropy, second step: which record versions the sender holds in buckets whose hashes
    /// differed. The receiver sends the records it holds differently and asks for the others.
    BucketEntries {
        /// As in the [`Message::Buckets`] answered.
        count: u16,
        /// Buckets all of whose records are listed here: a record of one of these buckets that is
        /// not listed is one the sender lacks.
        complete: Vec<u16>,
        /// The sender's records in those buckets (and maybe part of another).
        entries: Vec<BucketEntry>,
    },
    /// The records of these nodes, which the receiver announced with [`Piggyback::Have`] and the
    /// sender lacks; answered with [`Message::Gossip`] carrying them, so that they spread on
    /// from the sender like any piggybacked news.
    Fetch(Vec<NodeId>),
}

/// One record in a [`Message::BucketEntries`]: its node and the hash of its version and
/// content that anti-entropy compares, at the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketEntry {
    /// The node.
    pub id: NodeId,
    /// The sender's hash of its record's version and content, little-endian.
    pub hash: [u8; 4],
}

/// One update piggybacked on a SWIM message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Piggyback {
    /// A record to merge; a record of a suspected node at a higher heartbeat refutes the
    /// suspicion.
    Record(Record),
    /// `from` suspects `id`, whose record it holds at `generation` and `heartbeat`.
    Suspect {
        /// The suspect.
        id: NodeId,
        /// The suspect's generation as the suspecter holds it.
        generation: u64,
        /// The suspect's heartbeat in that generation (its SWIM incarnation).
        heartbeat: u64,
        /// Who raised the suspicion.
        from: NodeId,
        /// How long ago it was raised, as the sender reckons it, in hundredths of a second
        /// ([`suspicion_age`]). A node that withdrew its suspicions after a healed cut drops
        /// those raised before it did, and takes in those raised after.
        age: u16,
    },
    /// The sender holds `id`'s record at `version` (or later): announced instead of the whole
    /// record once the record has been pushed a few times. A receiver that lacks it asks for it
    /// with a [`Message::Fetch`].
    Have {
        /// Whose record.
        id: NodeId,
        /// The version the sender holds.
        version: Version,
    },
}

impl Message {
    /// The piggybacked updates, for the SWIM messages.
    pub fn piggyback(&self) -> &[Piggyback] {
        match self {
            Message::Ping { piggyback, .. }
            | Message::PingReq { piggyback, .. }
            | Message::Ack { piggyback, .. }
            | Message::Nack { piggyback, .. }
            | Message::Gossip(piggyback) => piggyback,
            Message::Records(_)
            | Message::Want(_)
            | Message::Buckets { .. }
            | Message::BucketEntries { .. }
            | Message::Fetch(_) => &[],
        }
    }
}

/// Why a datagram was rejected. Decoding never affects state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A zero-length datagram.
    #[error("empty datagram")]
    Empty,
    /// Longer than [`MAX_DATAGRAM`].
    #[error("datagram of {0} bytes exceeds the {MAX_DATAGRAM}-byte limit")]
    Oversized(usize),
    /// A version this build does not speak.
    #[error("wire version {0} not supported (this node speaks {WIRE_VERSION})")]
    UnsupportedVersion(u8),
    /// Truncated or not a valid message.
    #[error("malformed message: {0}")]
    Malformed(postcard::Error),
    /// Bytes left after a complete message.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A record breaks the wire limits.
    #[error("invalid record: {0}")]
    InvalidRecord(#[from] InvalidRecord),
    /// An anti-entropy message names a bucket count that is not a power of two up to 1024, or
    /// buckets beyond it.
    #[error("anti-entropy buckets out of range: {0}")]
    Buckets(&'static str),
}

/// Decodes one datagram.
pub fn decode(datagram: &[u8]) -> Result<Message, DecodeError> {
    let (&version, body) = datagram.split_first().ok_or(DecodeError::Empty)?;
    if datagram.len() > MAX_DATAGRAM {
        return Err(DecodeError::Oversized(datagram.len()));
    }
    if version != WIRE_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let (msg, rest) = postcard::take_from_bytes::<Message>(body).map_err(DecodeError::Malformed)?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes(rest.len()));
    }
    match &msg {
        Message::Records(records) => {
            for r in records {
                r.validate()?;
            }
        }
        Message::Buckets { count, first, hashes } => {
            check_bucket_count(*count)?;
            if usize::from(*first) + hashes.len() > usize::from(*count) {
                return Err(DecodeError::Buckets("hashes run past the bucket count"));
            }
        }
        Message::BucketEntries { count, complete, .. } => {
            check_bucket_count(*count)?;
            if complete.iter().any(|b| b >= count) {
                return Err(DecodeError::Buckets("a complete bucket is past the bucket count"));
            }
        }
        _ => {}
    }
    for item in msg.piggyback() {
        if let Piggyback::Record(r) = item {
            r.validate()?;
        }
    }
    Ok(msg)
}

/// Most hashes in one [`Message::Buckets`]: 256 four-byte hashes and the header stay under
/// 1,100 bytes.
pub(crate) const MAX_BUCKET_HASHES: usize = 256;

/// Encodes a [`Message::Buckets`] of at most 256 hashes (more are cut off).
pub fn encode_buckets(count: u16, first: u16, hashes: &[u32]) -> Bytes {
    let hashes = hashes[..hashes.len().min(MAX_BUCKET_HASHES)].iter().map(|h| h.to_le_bytes()).collect();
    let bytes = encode_unbounded(&Message::Buckets { count, first, hashes });
    debug_assert!(bytes.len() <= MAX_DATAGRAM);
    Bytes::from(bytes)
}

/// Packs a [`Message::BucketEntries`] below a datagram limit, bucket by bucket.
#[derive(Debug)]
pub struct EntriesBuilder {
    limit: usize,
    count: u16,
    complete: Vec<u16>,
    entries: Vec<BucketEntry>,
}

impl EntriesBuilder {
    /// Largest encoded size of the fixed part: version, tag, count, two list lengths.
    const HEAD: usize = 2 + 3 + 2 + 2;
    /// Encoded size of one entry: 16 id bytes and 4 hash bytes.
    const ENTRY: usize = 20;

    /// Entries one datagram of at most `limit` bytes holds, with a few complete buckets listed.
    pub fn entries_per_datagram(limit: usize) -> usize {
        limit.saturating_sub(Self::HEAD + 3 * 8) / Self::ENTRY
    }

    /// A builder for `count` buckets and datagrams of at most `limit` bytes.
    pub fn new(limit: usize, count: u16) -> EntriesBuilder {
        EntriesBuilder { limit: limit.clamp(64, MAX_DATAGRAM), count, complete: Vec::new(), entries: Vec::new() }
    }

    fn size_with(&self, buckets: usize, entries: usize) -> usize {
        Self::HEAD + 3 * (self.complete.len() + buckets) + Self::ENTRY * (self.entries.len() + entries)
    }

    /// Adds all of `bucket`'s entries if they fit (true), or nothing (false).
    pub fn push_bucket(&mut self, bucket: u16, entries: &[BucketEntry]) -> bool {
        if self.size_with(1, entries.len()) > self.limit {
            return false;
        }
        self.complete.push(bucket);
        self.entries.extend_from_slice(entries);
        true
    }

    /// Adds as many of `entries` as fit without marking their bucket complete; returns how many.
    pub fn push_partial(&mut self, entries: &[BucketEntry]) -> usize {
        let room = self.limit.saturating_sub(self.size_with(0, 0)) / Self::ENTRY;
        let n = room.min(entries.len());
        self.entries.extend_from_slice(&entries[..n]);
        n
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.complete.is_empty()
    }

    /// The datagram.
    pub fn finish(self) -> Bytes {
        let bytes = encode_unbounded(&Message::BucketEntries {
            count: self.count,
            complete: self.complete,
            entries: self.entries,
        });
        debug_assert!(bytes.len() <= self.limit, "{} > {}", bytes.len(), self.limit);
        Bytes::from(bytes)
    }
}

fn check_bucket_count(count: u16) -> Result<(), DecodeError> {
    if count.is_power_of_two() && usize::from(count) <= crate::replica::BUCKETS {
        Ok(())
    } else {
        Err(DecodeError::Buckets("the bucket count is not a power of two up to 1024"))
    }
}

/// Items that a [`Builder`] can pack, each tied to its [`Message`] variant.
pub trait WireItem: Serialize {
    /// The postcard variant index of the message that carries a list of these.
    const TAG: u8;
}

impl WireItem for Record {
    const TAG: u8 = 0;
}
impl WireItem for NodeId {
    const TAG: u8 = 1;
}

/// Packs items of one kind into a datagram of at most `limit` bytes.
///
/// Layout: version byte, variant tag, varint count, items — exactly postcard's encoding of the
/// [`Message`], so [`decode`] reads it back.
#[derive(Debug)]
pub struct Builder<T: WireItem> {
    limit: usize,
    tag: u8,
    count: usize,
    items: Vec<u8>,
    _kind: PhantomData<fn(&T)>,
}

impl Builder<NodeId> {
    /// A builder for a [`Message::Fetch`].
    pub fn fetch(limit: usize) -> Builder<NodeId> {
        Builder { tag: FETCH, ..Builder::new(limit) }
    }
}

impl<T: WireItem> Builder<T> {
    /// A builder for datagrams of at most `limit` bytes (clamped to 3..=[`MAX_DATAGRAM`]).
    pub fn new(limit: usize) -> Builder<T> {
        Builder { limit: limit.clamp(3, MAX_DATAGRAM), tag: T::TAG, count: 0, items: Vec::new(), _kind: PhantomData }
    }

    /// Adds `item` if it fits; returns false (and changes nothing) if it does not.
    pub fn push(&mut self, item: &T) -> bool {
        let mut scratch = [0u8; MAX_DATAGRAM];
        let Ok(encoded) = postcard::to_slice(item, &mut scratch) else {
            return false;
        };
        let total = 2 + varint_len(self.count + 1) + self.items.len() + encoded.len();
        if total > self.limit {
            return false;
        }
        self.items.extend_from_slice(encoded);
        self.count += 1;
        true
    }

    /// Items added so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The datagram.
    pub fn finish(self) -> Bytes {
        let mut out = Vec::with_capacity(2 + varint_len(self.count) + self.items.len());
        out.push(WIRE_VERSION);
        out.push(self.tag);
        let mut n = self.count;
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(&self.items);
        debug_assert!(out.len() <= self.limit);
        Bytes::from(out)
    }
}

/// Postcard variant indices of the SWIM messages.
const PING: u8 = 2;
const PING_REQ: u8 = 3;
const ACK: u8 = 4;
const NACK: u8 = 5;
const GOSSIP: u8 = 6;
/// Postcard variant index of [`Message::Fetch`].
const FETCH: u8 = 9;

/// Builds one SWIM datagram: the probe header first, then as many piggybacked items as fit
/// below the limit.
///
/// Layout: version byte, variant tag, the header's fields, varint item count, items — exactly
/// postcard's encoding of the [`Message`]. Items arrive already encoded (a queued record update
/// carries its record's encoding), so filling a datagram from
/// a broadcast queue encodes nothing twice. [`ProbeBuilder::budget`] is what a queue may still
/// fill; it keeps room for the largest count the remaining bytes could need, so the finished
/// datagram can never exceed the limit.
#[derive(Debug)]
pub struct ProbeBuilder {
    limit: usize,
    head: Vec<u8>,
    count: usize,
    items: Vec<u8>,
}

impl ProbeBuilder {
    fn with_header(limit: usize, tag: u8, fields: &[u8]) -> ProbeBuilder {
        let mut head = Vec::with_capacity(2 + fields.len());
        head.push(WIRE_VERSION);
        head.push(tag);
        head.extend_from_slice(fields);
        ProbeBuilder { limit: limit.clamp(head.len() + 1, MAX_DATAGRAM), head, count: 0, items: Vec::new() }
    }

    /// A [`Message::Ping`] of at most `limit` bytes.
    pub fn ping(limit: usize, seq: u32) -> ProbeBuilder {
        ProbeBuilder::with_header(limit, PING, &varint(seq as usize))
    }

    /// A [`Message::PingReq`] of at most `limit` bytes.
    pub fn ping_req(limit: usize, target: NodeId, seq: u32) -> ProbeBuilder {
        let mut fields = postcard::to_allocvec(&target).unwrap_or_default();
        fields.extend(varint(seq as usize));
        ProbeBuilder::with_header(limit, PING_REQ, &fields)
    }

    /// A [`Message::Ack`] of at most `limit` bytes.
    pub fn ack(limit: usize, seq: u32) -> ProbeBuilder {
        ProbeBuilder::with_header(limit, ACK, &varint(seq as usize))
    }

    /// A [`Message::Nack`] of at most `limit` bytes.
    pub fn nack(limit: usize, seq: u32) -> ProbeBuilder {
        ProbeBuilder::with_header(limit, NACK, &varint(seq as usize))
    }

    /// A [`Message::Gossip`] of at most `limit` bytes.
    pub fn gossip(limit: usize) -> ProbeBuilder {
        ProbeBuilder::with_header(limit, GOSSIP, &[])
    }

    /// Bytes still free for items, with room kept for the item count however many items fill
    /// them (every item takes at least one byte).
    pub fn budget(&self) -> usize {
        let free = self.limit.saturating_sub(self.head.len() + self.items.len());
        let reserve = varint_len(self.count + free);
        free.saturating_sub(reserve)
    }

    /// Appends one item's postcard encoding if it fits within [`ProbeBuilder::budget`]; returns
    /// false (and changes nothing) if it does not.
    pub fn push_encoded(&mut self, item: &[u8]) -> bool {
        if item.is_empty() || item.len() > self.budget() {
            return false;
        }
        if self.items.capacity() == 0 {
            // Room for the whole datagram at once: the header and count go in front at the end
            // ([`ProbeBuilder::finish`]), so a datagram costs one allocation, not one per doubling.
            self.items.reserve_exact(self.limit);
        }
        self.items.extend_from_slice(item);
        self.count += 1;
        true
    }

    /// Encodes and appends `item` if it fits.
    pub fn push(&mut self, item: &Piggyback) -> bool {
        let mut scratch = [0u8; MAX_DATAGRAM];
        match postcard::to_slice(item, &mut scratch) {
            Ok(encoded) => self.push_encoded(encoded),
            Err(_) => false,
        }
    }

    /// Items added so far.
    #[cfg(any(test, feature = "harness"))]
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when no item was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The datagram.
    pub fn finish(self) -> Bytes {
        let mut out = self.items;
        let mut head = self.head;
        head.extend(varint(self.count));
        // In place: `out` has room for the whole datagram (`limit` bytes) once an item is in.
        out.splice(0..0, head);
        debug_assert!(out.len() <= self.limit);
        Bytes::from(out)
    }
}

/// Postcard's unsigned varint.
fn varint(mut n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(varint_len(n));
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// A suspicion's age as [`Piggyback::Suspect`] carries it: hundredths of a second, saturating at
/// 655.35 s (a suspicion that old reads as raised at least that long ago).
pub(crate) fn suspicion_age(age: core::time::Duration) -> u16 {
    u16::try_from(age.as_millis() / 10).unwrap_or(u16::MAX)
}

/// The age a [`Piggyback::Suspect`] carries, as a duration ([`suspicion_age`]'s inverse, to the
/// hundredth of a second).
pub(crate) fn suspicion_age_duration(age: u16) -> core::time::Duration {
    core::time::Duration::from_millis(u64::from(age) * 10)
}

/// The postcard encoding of one item, as [`ProbeBuilder::push_encoded`] takes it.
#[cfg(any(test, feature = "harness"))]
pub fn encode_piggyback(item: &Piggyback) -> Bytes {
    Bytes::from(postcard::to_allocvec(item).unwrap_or_default())
}

fn varint_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

/// Encodes a whole message without a size bound; for tests and tools, never for sending.
pub fn encode_unbounded(msg: &Message) -> Vec<u8> {
    let mut out = vec![WIRE_VERSION];
    out.extend(postcard::to_allocvec(msg).unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Hardware;
    use crate::record::{Lifecycle, Model, ModelSet, Reachability, Role, MAX_ADDR, MAX_MODELS, MAX_MODEL_NAME};
    use proptest::prelude::*;

    /// The largest record the limits allow.
    fn largest_record() -> Record {
        let mut r = Record::new(
            NodeId([0xff; 16]),
            u64::MAX,
            Role::Gateway,
            Hardware::from_profile("gh200x4").unwrap(),
            Reachability::Public("a".repeat(MAX_ADDR)),
        );
        r.state = Lifecycle::Left;
        r.heartbeat = u64::MAX;
        r.load.in_flight = u32::MAX;
        r.load.queued = u32::MAX;
        r.hardware.vram_mib = u32::MAX;
        r.hardware.fabric.0 = u32::MAX;
        r.models = ModelSet::from_models(
            (0..MAX_MODELS)
                .map(|i| Model {
                    name: format!("{i}").repeat(MAX_MODEL_NAME),
                    quant: crate::record::Quantization::Gptq,
                })
                .collect(),
        );
        crate::auth::Identity::for_test(r.id).seal(&mut r);
        let confirmer = crate::auth::Identity::for_test(NodeId::from_u64(u64::MAX));
        r.with_down_mark(confirmer.mark_down(&r))
    }

    #[test]
    fn any_valid_record_fits_one_datagram() {
        let r = largest_record();
        r.validate().unwrap();
        let mut b = Builder::<Record>::new(MAX_DATAGRAM);
        assert!(b.push(&r), "largest record must fit");
        let d = b.finish();
        assert!(d.len() <= MAX_DATAGRAM, "{} bytes", d.len());
        assert_eq!(decode(&d).unwrap(), Message::Records(vec![r.clone()]));
        // The SWIM message with the largest header carries it too.
        let mut p = ProbeBuilder::ping_req(MAX_DATAGRAM, NodeId([0xff; 16]), u32::MAX);
        assert!(p.push(&Piggyback::Record(r.clone())), "largest record must ride a ping-req");
        let d = p.finish();
        assert!(d.len() <= MAX_DATAGRAM - 32, "{} bytes leave too little headroom", d.len());
        assert_eq!(decode(&d).unwrap().piggyback(), &[Piggyback::Record(r)]);
    }

    #[test]
    fn the_previous_wire_version_is_refused_with_a_typed_error() {
        let mut d = encode_unbounded(&Message::Want(vec![NodeId::from_u64(1)]));
        assert!(decode(&d).is_ok());
        d[0] = 1;
        assert_eq!(decode(&d), Err(DecodeError::UnsupportedVersion(1)));
        assert!(DecodeError::UnsupportedVersion(1).to_string().contains("speaks 4"));
        for previous in 2..WIRE_VERSION {
            d[0] = previous;
            assert_eq!(decode(&d), Err(DecodeError::UnsupportedVersion(previous)));
        }
    }

    #[test]
    fn builder_fills_until_full_and_matches_postcard() {
        let id = NodeId::from_u64(9);
        let mut b = Builder::<NodeId>::new(MAX_DATAGRAM);
        while b.push(&id) {}
        let n = b.len();
        assert!(n > 30, "only {n} ids fit");
        let d = b.finish();
        assert!(d.len() <= MAX_DATAGRAM);
        assert_eq!(&d[..], &encode_unbounded(&Message::Want(vec![id; n]))[..]);
        let mut f = Builder::fetch(MAX_DATAGRAM);
        assert!(f.push(&id));
        assert_eq!(&f.finish()[..], &encode_unbounded(&Message::Fetch(vec![id]))[..]);
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
        assert_eq!(decode(&[WIRE_VERSION; MAX_DATAGRAM + 1]), Err(DecodeError::Oversized(MAX_DATAGRAM + 1)));
        assert_eq!(decode(&[9, 0, 0]), Err(DecodeError::UnsupportedVersion(9)));
        assert!(matches!(decode(&[WIRE_VERSION, 7]), Err(DecodeError::Malformed(_))));
        let mut ok = encode_unbounded(&Message::Want(vec![NodeId::from_u64(1)]));
        assert!(matches!(decode(&ok[..ok.len() - 1]), Err(DecodeError::Malformed(_))));
        ok.push(0);
        assert_eq!(decode(&ok), Err(DecodeError::TrailingBytes(1)));
        let mut bad = Record::new(NodeId::from_u64(1), 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        bad.reach = Reachability::Public("x".repeat(MAX_ADDR + 1));
        assert!(matches!(decode(&encode_unbounded(&Message::Records(vec![bad]))), Err(DecodeError::InvalidRecord(_))));
    }

    fn piggyback() -> impl Strategy<Value = Piggyback> {
        prop_oneof![
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u16>()).prop_map(|(i, g, h, f, age)| {
                Piggyback::Suspect {
                    id: NodeId::from_u64(i),
                    generation: g,
                    heartbeat: h,
                    from: NodeId::from_u64(f),
                    age,
                }
            }),
            (any::<u64>(), any::<u64>(), 0u8..4, prop::collection::vec(0u8..40, 0..MAX_MODELS)).prop_map(
                |(i, g, s, models)| {
                    let mut r = largest_record();
                    r.id = NodeId::from_u64(i);
                    r.generation = g;
                    r.state = [Lifecycle::Join, Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left][s as usize];
                    r.models = ModelSet::from_models(models.iter().map(|m| Model::named(format!("m{m}"))).collect());
                    Piggyback::Record(r)
                }
            ),
            (any::<u64>(), any::<u64>(), 0u8..4, any::<u64>()).prop_map(|(i, g, s, h)| Piggyback::Have {
                id: NodeId::from_u64(i),
                version: Version {
                    generation: g,
                    state: [Lifecycle::Join, Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left][s as usize],
                    heartbeat: h,
                },
            }),
        ]
    }

    #[test]
    fn probe_builders_match_postcard() {
        let items = vec![
            Piggyback::Suspect {
                id: NodeId::from_u64(3),
                generation: 7,
                heartbeat: 9,
                from: NodeId::from_u64(4),
                age: 300,
            },
            Piggyback::Record(Record::new(
                NodeId::from_u64(8),
                5,
                Role::Serving,
                Hardware::CPU,
                Reachability::OutboundOnly,
            )),
            Piggyback::Have {
                id: NodeId::from_u64(6),
                version: Version { generation: 5, state: Lifecycle::Serve, heartbeat: 300 },
            },
        ];
        let build = |mut b: ProbeBuilder| {
            for i in &items {
                assert!(b.push(i));
            }
            b.finish()
        };
        let cases = [
            (build(ProbeBuilder::ping(MAX_DATAGRAM, 300)), Message::Ping { seq: 300, piggyback: items.clone() }),
            (
                build(ProbeBuilder::ping_req(MAX_DATAGRAM, NodeId::from_u64(5), 1)),
                Message::PingReq { target: NodeId::from_u64(5), seq: 1, piggyback: items.clone() },
            ),
            (
                build(ProbeBuilder::ack(MAX_DATAGRAM, u32::MAX)),
                Message::Ack { seq: u32::MAX, piggyback: items.clone() },
            ),
            (build(ProbeBuilder::nack(MAX_DATAGRAM, 0)), Message::Nack { seq: 0, piggyback: items.clone() }),
            (build(ProbeBuilder::gossip(MAX_DATAGRAM)), Message::Gossip(items.clone())),
        ];
        for (datagram, msg) in cases {
            assert_eq!(&datagram[..], &encode_unbounded(&msg)[..]);
            assert_eq!(decode(&datagram).unwrap(), msg);
        }
        // An invalid piggybacked record is rejected like one in `Records`.
        let mut bad = largest_record();
        bad.reach = Reachability::Public("x".repeat(MAX_ADDR + 1));
        let msg = Message::Gossip(vec![Piggyback::Record(bad)]);
        assert!(matches!(decode(&encode_unbounded(&msg)), Err(DecodeError::InvalidRecord(_))));
    }

    proptest! {
        #[test]
        fn probe_messages_round_trip_within_the_limit(
            kind in 0u8..5,
            seq in any::<u32>(),
            target in any::<u64>(),
            limit in 64usize..1200,
            items in prop::collection::vec(piggyback(), 0..12),
        ) {
            let mut b = match kind {
                0 => ProbeBuilder::ping(limit, seq),
                1 => ProbeBuilder::ping_req(limit, NodeId::from_u64(target), seq),
                2 => ProbeBuilder::ack(limit, seq),
                3 => ProbeBuilder::nack(limit, seq),
                _ => ProbeBuilder::gossip(limit),
            };
            let mut taken = Vec::new();
            for i in items {
                let before = b.budget();
                let encoded = encode_piggyback(&i);
                if b.push_encoded(&encoded) {
                    prop_assert!(encoded.len() <= before);
                    taken.push(i);
                } else {
                    prop_assert!(encoded.len() > before);
                }
            }
            let d = b.finish();
            prop_assert!(d.len() <= limit.min(MAX_DATAGRAM), "{} bytes over {}", d.len(), limit);
            let msg = match kind {
                0 => Message::Ping { seq, piggyback: taken },
                1 => Message::PingReq { target: NodeId::from_u64(target), seq, piggyback: taken },
                2 => Message::Ack { seq, piggyback: taken },
                3 => Message::Nack { seq, piggyback: taken },
                _ => Message::Gossip(taken),
            };
            prop_assert_eq!(decode(&d).unwrap(), msg);
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..1200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_mutated_valid_input(flips in prop::collection::vec((0usize..400, any::<u8>()), 1..8)) {
            let mut d = encode_unbounded(&Message::Records(vec![largest_record()]));
            d.truncate(400);
            for (i, b) in flips { if i < d.len() { d[i] = b; } }
            let _ = decode(&d);
        }

        #[test]
        fn builder_output_always_decodes_within_the_limit(limit in 8usize..1200, n in 0usize..60) {
            let mut b = Builder::<NodeId>::new(limit);
            for i in 0..n { b.push(&NodeId::from_u64(i as u64)); }
            let k = b.len();
            let d = b.finish();
            prop_assert!(d.len() <= limit.min(MAX_DATAGRAM));
            prop_assert_eq!(decode(&d).unwrap(), Message::Want((0..k as u64).map(NodeId::from_u64).collect()));
            let mut b = Builder::fetch(limit);
            for i in 0..n { b.push(&NodeId::from_u64(i as u64)); }
            let k = b.len();
            let d = b.finish();
            prop_assert!(d.len() <= limit.min(MAX_DATAGRAM));
            prop_assert_eq!(decode(&d).unwrap(), Message::Fetch((0..k as u64).map(NodeId::from_u64).collect()));
        }
    }

    #[test]
    fn anti_entropy_messages_stay_under_the_limit_and_bad_bucket_counts_are_refused() {
        let hashes: Vec<u32> = (0..1024u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let d = encode_buckets(1024, 768, &hashes);
        assert!(d.len() <= MAX_DATAGRAM, "{} bytes", d.len());
        match decode(&d).expect("decodes") {
            Message::Buckets { count, first, hashes: h } => {
                assert_eq!((count, first, h.len()), (1024, 768, MAX_BUCKET_HASHES));
                assert_eq!(u32::from_le_bytes(h[1]), hashes[1]);
            }
            other => panic!("{other:?}"),
        }
        for (count, first, n) in [(1000u16, 0u16, 1usize), (2048, 0, 1), (0, 0, 0), (64, 60, 8)] {
            let bytes = encode_unbounded(&Message::Buckets { count, first, hashes: vec![[0; 4]; n] });
            assert!(matches!(decode(&bytes), Err(DecodeError::Buckets(_))), "{count} {first} {n}");
        }
        let bad = encode_unbounded(&Message::BucketEntries { count: 8, complete: vec![8], entries: vec![] });
        assert!(matches!(decode(&bad), Err(DecodeError::Buckets(_))));

        let entries: Vec<BucketEntry> =
            (0..200u64).map(|n| BucketEntry { id: NodeId::from_u64(n), hash: (n as u32).to_le_bytes() }).collect();
        for limit in [256, 300, MAX_DATAGRAM] {
            let mut b = EntriesBuilder::new(limit, 1024);
            let mut bucket = 0u16;
            while b.push_bucket(bucket, &entries[..3]) {
                bucket += 1;
            }
            let partial = b.push_partial(&entries);
            let d = b.finish();
            assert!(d.len() <= limit, "{} > {limit}", d.len());
            match decode(&d).expect("decodes") {
                Message::BucketEntries { complete, entries: e, .. } => {
                    assert_eq!(complete.len(), usize::from(bucket));
                    assert_eq!(e.len(), 3 * usize::from(bucket) + partial);
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
