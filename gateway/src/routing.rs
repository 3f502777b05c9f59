//! Choosing the node for a request: the core's decision ([`tela_core::routing::route_with`], by the
//! gateway's [`RoutingPolicy`]) over the anchor's latest registry snapshot, with what only this
//! gateway knows — which nodes have a live tunnel connection here, which were already tried for
//! this request, and how many requests this gateway has in flight on each — and what the
//! request itself says: its leading content, read into a [`Prefix`] while its body is parsed
//! ([`Messages`], [`Prompt`]).
//!
//! A node is usable when the snapshot lists it as routable for the model (alive, SERVE — so a
//! draining node is skipped the moment its DOWN reaches this gateway), it has a connection to
//! this gateway that is not closed and not [`Silent`], and it has not been tried for this request. A connection
//! that closes is taken out of the runtime's peer table as soon as the transport reports it, so
//! a node that died (its TCP connection reset, its QUIC connection timed out) stops being
//! picked at once, before any gossip says so.
//!
//! # The load the policy balances
//!
//! Two figures describe a node's load here:
//!
//! - **this gateway's in-flight count**: a [`NodeGuard`] per forwarded request, held by the
//!   response body until it ends on any path (see [`crate::body`]). Exact and immediate, but
//!   blind to what other gateways (or clients talking to the engine directly) sent;
//! - **the engine's own report**: requests running and waiting at the engine and its KV-cache
//!   usage, which the node reads from the engine's `/metrics` about twice a second and pushes
//!   over its tunnel ([`tela_runtime::load_report`]). It sees every request, whoever sent it,
//!   but a little behind.
//!
//! [`combined_load`] merges them: this gateway's in-flight count now, plus the engine's
//! requests that are not this gateway's — `running + waiting` in the report, less this
//! gateway's in-flight count on the node when the report arrived (the runtime stamps each
//! report with it: [`tela_runtime::load_report::LoadReports::count_local_with`]) — plus one
//! when the engine is running requests with its KV cache at least [`KV_PRESSURE_PERMILLE`]
//! full. This gateway's own requests are counted once, exactly and at once: one sent since the
//! report counts, and one that ended since the report no longer does (a turn of a
//! conversation that just ended does not push the conversation's next turn off its node for
//! the sake of a figure a report interval old). Waiting requests count like running ones: a
//! request that waits at an engine costs a new one there as much as one that runs. Other
//! gateways' requests are seen as soon as the node tells: it reports at once when a tunnelled
//! request starts or ends, moving its last reading by that (`tela_runtime::engine`'s load
//! reporter); requests sent to the engine directly show at the next reading. KV usage only
//! breaks near-ties: an engine whose cache is nearly full will make the next request wait or
//! preempt one, but high usage on an idle engine (the llama.cpp server keeps idle slots'
//! prompts) means nothing.
//! All of it stays in request units, so the bounded-load rule of prefix routing keeps its
//! meaning (`(1 + ε)` times the mean number of requests).
//!
//! A report is used only while it is younger than [`REPORT_MAX_AGE`] (3 s: a few report
//! intervals, so one lost datagram does not matter). A node whose reports stop — its engine
//! has no metrics, its node is wedged, datagrams are lost — falls back to this gateway's
//! in-flight count alone, and is never preferred on figures older than that. Since every
//! gateway reads the same reports, gateways also agree on loads far more often than on their
//! own counts alone, which keeps prefix affinity identical across them under load.
//!
//! # Room at the engine
//!
//! An engine runs some requests at once and queues the rest: vLLM up to its `max_num_seqs`, a
//! llama.cpp server one per `--parallel` slot (one by default). A node that knows its engine's
//! slots (`tela node --engine-slots`) says so in its reports; a node whose engine reports
//! requests waiting is taken as full at the count it runs ([`engine_slots`]). The core then
//! gives a conversation to a node with room before a full one within the load bound
//! ([`tela_core::routing::HostState::slots`]): with one-slot engines, a turn that would queue
//! behind another conversation's whole generation goes to an idle engine instead.
//!
//! # Nodes that hand over
//!
//! A node whose walltime is near says, in its load reports, how long until it starts draining
//! (`tela node --handover-window`, [`tela_runtime::load_report::LoadReport::leaving_in_ms`]).
//! Such a node is passed to the core as [handing over](tela_core::routing::HostState::handing_over):
//! still SERVE and still finishing what it serves, but ranked last for prefix-keyed requests,
//! so a conversation's next turn goes to the node it will stay on after this one has left.
//! The node decides when it hands over and tells every gateway at once, so gateways agree. The
//! claim does not go stale with the load: it holds, whatever the report's age, until
//! [`REPORT_MAX_AGE`] past the moment the node named ([`handing_over`]).
//!
//! Reading the prefix never refuses a request: a `messages` or `prompt` of an unexpected shape
//! simply has no content to key on (the engine judges it, as before), and only the bounded head
//! the core hashes is kept — the rest of a huge body is skipped as it is parsed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tela_core::routing::{HostState, Prefix, PrefixHasher, RouteError, RoutingPolicy};
use tela_core::NodeId;
use tela_runtime::load_report::FreshLoad;
use tela_runtime::status::RegistrySnapshot;
use tela_runtime::RuntimeView;
use tela_transports::Connection;

use crate::metrics::NodeLabel;

/// Bytes of one message's content that enter a request's head at most (the core takes no more).
const MESSAGE_BYTES: usize = Prefix::MESSAGE_BYTES;

/// Engine load reports older than this are ignored: the node's load is this gateway's
/// in-flight count alone (see the module docs).
pub const REPORT_MAX_AGE: Duration = Duration::from_secs(3);

/// KV-cache usage, per-mille, from which a busy engine counts one request more.
pub const KV_PRESSURE_PERMILLE: u16 = 900;

/// The load the routing policy gets for a node: this gateway's in-flight count `own`
/// combined with the engine's fresh report, if any (see the module docs).
pub fn combined_load(own: u32, report: Option<FreshLoad>) -> u32 {
    let Some(FreshLoad { engine, local_at_arrival }) = report else {
        return own;
    };
    let others = engine.running.saturating_add(engine.waiting).saturating_sub(local_at_arrival);
    let kv_pressure = engine.running > 0 && engine.kv_permille.is_some_and(|kv| kv >= KV_PRESSURE_PERMILLE);
    own.saturating_add(others).saturating_add(u32::from(kv_pressure))
}

/// The requests an engine runs at once, from its fresh report: the slots its node declared, or,
/// while requests wait at the engine, as many as it runs now (see the module docs).
pub fn engine_slots(report: Option<FreshLoad>) -> Option<u32> {
    let engine = report?.engine;
    engine.slots.or((engine.waiting > 0).then_some(engine.running))
}

/// `node`'s load as the policy sees it at `now`: [`combined_load`] of this gateway's count and
/// the node's report, if younger than [`REPORT_MAX_AGE`].
pub fn node_load(view: &RuntimeView, load: &NodeLoad, node: &NodeId, now: Instant) -> u32 {
    combined_load(load.get(node), view.load_reports().fresh(node, now, REPORT_MAX_AGE))
}

/// What the policy knows of `node` at `now`: its [`combined_load`], its [`engine_slots`] and
/// whether it is [`handing_over`].
pub fn host_state(view: &RuntimeView, load: &NodeLoad, node: &NodeId, now: Instant) -> HostState {
    let report = view.load_reports().fresh(node, now, REPORT_MAX_AGE);
    HostState {
        in_flight: combined_load(load.get(node), report),
        slots: engine_slots(report),
        handing_over: handing_over(view, node, now),
    }
}

/// Whether `node` hands over at `now`: its latest report, however old, says it leaves soon
/// (see the module docs).
pub fn handing_over(view: &RuntimeView, node: &NodeId, now: Instant) -> bool {
    view.load_reports().leaving_in(node, now, REPORT_MAX_AGE).is_some()
}

/// In-flight requests per node, as this gateway counts them.
#[derive(Clone)]
pub struct NodeLoad {
    counts: Arc<Mutex<HashMap<NodeId, Arc<AtomicU32>>>>,
    gauge: Family<NodeLabel, Gauge>,
}

/// One request in flight on a node; leaves when dropped.
#[must_use = "the request counts as in flight only while the guard is held"]
pub struct NodeGuard {
    count: Arc<AtomicU32>,
    gauge: Gauge,
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

impl NodeLoad {
    /// Counts into `gauge` (the `/metrics` family) as well.
    pub fn new(gauge: Family<NodeLabel, Gauge>) -> NodeLoad {
        NodeLoad { counts: Arc::default(), gauge }
    }

    fn counter(&self, node: NodeId) -> Arc<AtomicU32> {
        let mut map = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(node).or_default().clone()
    }

    /// Requests in flight on `node` now.
    pub fn get(&self, node: &NodeId) -> u32 {
        let map = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(node).map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Counts one more request on `node` until the guard is dropped.
    pub fn enter(&self, node: NodeId) -> NodeGuard {
        let count = self.counter(node);
        count.fetch_add(1, Ordering::AcqRel);
        let gauge = self.gauge.get_or_create(&NodeLabel { node: node.to_string() }).clone();
        gauge.inc();
        NodeGuard { count, gauge }
    }
}

/// Tunnel connections that went silent: a request was written into them and the node did not
/// accept it within [`ProxySettings::accept_timeout`](crate::proxy::ProxySettings). Such a
/// node is not picked while that same connection stays silent — a killed process behind QUIC
/// sends no reset, and waiting for the idle timeout would send it requests for seconds. The
/// mark is lifted when the late acceptance arrives, or when the node comes back on a new
/// connection; the connection itself still closes on the transport's idle timeout.
#[derive(Clone, Default)]
pub struct Silent {
    marks: Arc<Mutex<HashMap<NodeId, Connection>>>,
}

impl Silent {
    /// Marks `connection` to `node` silent.
    pub fn mark(&self, node: NodeId, connection: &Connection) {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner).insert(node, connection.clone());
    }

    /// Lifts the mark on `connection` to `node` (it answered after all).
    pub fn clear(&self, node: NodeId, connection: &Connection) {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        if marks.get(&node).is_some_and(|c| c.same_as(connection)) {
            marks.remove(&node);
        }
    }

    /// Whether `connection` to `node` is marked silent; a mark on an older connection is dropped.
    pub fn is_silent(&self, node: &NodeId, connection: &Connection) -> bool {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        match marks.get(node) {
            Some(c) if c.same_as(connection) => true,
            Some(_) => {
                marks.remove(node);
                false
            }
            None => false,
        }
    }
}

/// The routing decision for one attempt.
pub struct Choice {
    /// The node.
    pub node: NodeId,
    /// Its live connection.
    pub connection: Connection,
}

/// What a request asks of routing.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// Its model.
    pub model: &'a str,
    /// Its leading content.
    pub prefix: &'a Prefix,
}

/// Picks a node for `target` by `policy` that is not in `tried`; see the module docs.
pub fn choose(
    view: &RuntimeView,
    snapshot: &RegistrySnapshot,
    load: &NodeLoad,
    silent: &Silent,
    policy: RoutingPolicy,
    target: Target<'_>,
    tried: &[NodeId],
) -> Result<Choice, RouteError> {
    // Prefix and least-loaded ask about every host: a map keeps that linear.
    let mut connections: HashMap<NodeId, Connection> = HashMap::new();
    let mut usable = |id: NodeId| {
        if tried.contains(&id) {
            return false;
        }
        if connections.contains_key(&id) {
            return true;
        }
        match view.connection(&id) {
            Some(conn) if conn.close_reason().is_none() && !silent.is_silent(&id, &conn) => {
                connections.insert(id, conn);
                true
            }
            _ => false,
        }
    };
    let now = Instant::now();
    let node = tela_core::routing::route_with(
        policy,
        snapshot.replica(),
        target.model,
        target.prefix,
        &mut usable,
        |id| host_state(view, load, &id, now),
        &mut rand::rng(),
    )?;
    let connection = match connections.remove(&node) {
        Some(c) => c,
        // The core only returns nodes it found usable, which cached their connection.
        None => view.connection(&node).ok_or(RouteError::NoCapacity { model: target.model.to_string(), hosts: 0 })?,
    };
    Ok(Choice { node, connection })
}

/// Every model served by a routable node, sorted.
pub fn models(snapshot: &RegistrySnapshot) -> Vec<String> {
    let mut names: Vec<String> = snapshot.replica().routable_models().into_iter().map(str::to_string).collect();
    names.sort();
    names.dedup();
    names
}

/// A chat request's `messages`, read only as far as [`Prefix`] needs: each message's role and
/// text (a multi-part content's text parts and image URLs, in order), up to the end of the head.
pub struct Messages(pub Prefix);

/// A completions request's `prompt` (text, texts, or token ids), read likewise.
pub struct Prompt(pub Prefix);

/// Visitor methods that accept a JSON shape routing cannot use, skipping it: `$value` is what
/// such a shape reads as. Each kind named is one of `scalars`, `str`, `seq`, `map`.
macro_rules! skip_shapes {
    ($value:expr; $($kind:ident),*) => { $( skip_shapes!(@$kind $value); )* };
    (@scalars $value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> { Ok($value) }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> { Ok($value) }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> { Ok($value) }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> { Ok($value) }
        fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Self::Value, E> { Ok($value) }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> { Ok($value) }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> { Ok($value) }
    };
    (@str $value:expr) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> { Ok($value) }
    };
    (@seq $value:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($value)
        }
    };
    (@map $value:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($value)
        }
    };
}

/// Appends `text` to `out`, keeping at most [`MESSAGE_BYTES`] in all (the core takes no more).
fn append_bounded(out: &mut Vec<u8>, text: &[u8]) {
    let room = MESSAGE_BYTES.saturating_sub(out.len());
    out.extend_from_slice(&text[..text.len().min(room)]);
}

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Messages, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Prefix;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of messages")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prefix, A::Error> {
                let mut hasher = PrefixHasher::new();
                while hasher.wants_more() {
                    match seq.next_element::<Message>()? {
                        Some(Message(Some((role, content)))) => {
                            hasher.message(&role, &content);
                        }
                        Some(Message(None)) => {}
                        None => return Ok(hasher.finish()),
                    }
                }
                // Past the head: later messages cannot change the choice.
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(hasher.finish())
            }
            skip_shapes!(Prefix::default(); scalars, str, map);
        }
        deserializer.deserialize_any(V).map(Messages)
    }
}

/// One message's role and text; `None` when it is not an object.
struct Message(Option<(String, Vec<u8>)>);

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Message, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<(String, Vec<u8>)>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a message")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut role, mut content) = (String::new(), Vec::new());
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Role => role = String::from_utf8_lossy(&map.next_value::<Text>()?.0).into_owned(),
                        Key::Content => content = map.next_value::<Content>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Some((role, content)))
            }
            skip_shapes!(None; scalars, str, seq);
        }
        deserializer.deserialize_any(V).map(Message)
    }
}

/// The keys of a message or a content part that routing reads.
enum Key {
    Role,
    Content,
    Text,
    ImageUrl,
    Url,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "role" => Key::Role,
                    "content" => Key::Content,
                    "text" => Key::Text,
                    "image_url" => Key::ImageUrl,
                    "url" => Key::Url,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_identifier(V)
    }
}

/// A string's first [`MESSAGE_BYTES`]; empty when it is not a string.
struct Text(Vec<u8>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u8>, E> {
                let mut out = Vec::new();
                append_bounded(&mut out, text.as_bytes());
                Ok(out)
            }
            skip_shapes!(Vec::new(); scalars, seq, map);
        }
        deserializer.deserialize_any(V).map(Text)
    }
}

/// A message's content: a string, or the text parts and image URLs of a list of parts.
struct Content(Vec<u8>);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Content, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a message content")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u8>, E> {
                let mut out = Vec::new();
                append_bounded(&mut out, text.as_bytes());
                Ok(out)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while out.len() < MESSAGE_BYTES {
                    match seq.next_element::<Part>()? {
                        Some(part) => append_bounded(&mut out, &part.0),
                        None => return Ok(out),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(out)
            }
            skip_shapes!(Vec::new(); scalars, map);
        }
        deserializer.deserialize_any(V).map(Content)
    }
}

/// One content part: its `text`, or its `image_url` (a string or `{"url": ...}`).
struct Part(Vec<u8>);

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Part, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a content part")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Text | Key::ImageUrl | Key::Url => append_bounded(&mut out, &map.next_value::<Part>()?.0),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(out)
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u8>, E> {
                let mut out = Vec::new();
                append_bounded(&mut out, text.as_bytes());
                Ok(out)
            }
            skip_shapes!(Vec::new(); scalars, seq);
        }
        deserializer.deserialize_any(V).map(Part)
    }
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Prompt, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Prefix;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a prompt")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Prefix, E> {
                Ok(Prefix::of_prompt(text.as_bytes()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prefix, A::Error> {
                // A list of texts or token lists (pieces), or one prompt as token ids.
                let mut hasher = PrefixHasher::new();
                let mut tokens = Vec::new();
                while hasher.wants_more() && tokens.len() < MESSAGE_BYTES {
                    match seq.next_element::<Piece>()? {
                        Some(Piece::Token(t)) => tokens.extend_from_slice(&t.to_le_bytes()),
                        Some(Piece::Bytes(piece)) => {
                            hasher.prompt(&piece);
                        }
                        Some(Piece::Other) => {}
                        None => break,
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                if !tokens.is_empty() {
                    hasher.prompt(&tokens);
                }
                Ok(hasher.finish())
            }
            skip_shapes!(Prefix::default(); scalars, map);
        }
        deserializer.deserialize_any(V).map(Prompt)
    }
}

/// An element of a prompt list.
enum Piece {
    /// A text, or a token list as little-endian `u32`s.
    Bytes(Vec<u8>),
    /// A token id.
    Token(u32),
    /// Anything else.
    Other,
}

impl<'de> Deserialize<'de> for Piece {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Piece, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Piece;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a prompt text or token")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Piece, E> {
                let mut out = Vec::new();
                append_bounded(&mut out, text.as_bytes());
                Ok(Piece::Bytes(out))
            }
            fn visit_u64<E: de::Error>(self, token: u64) -> Result<Piece, E> {
                Ok(Piece::Token(token as u32))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Piece, A::Error> {
                let mut out = Vec::new();
                while let Some(piece) = seq.next_element::<Piece>()? {
                    if let (Piece::Token(t), true) = (piece, out.len() < MESSAGE_BYTES) {
                        out.extend_from_slice(&t.to_le_bytes());
                    }
                }
                Ok(Piece::Bytes(out))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Piece, E> {
                Ok(Piece::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Piece, E> {
                Ok(Piece::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Piece, E> {
                Ok(Piece::Other)
            }
            fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Piece, E> {
                Ok(Piece::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Piece, E> {
                Ok(Piece::Other)
            }
            fn visit_none<E: de::Error>(self) -> Result<Piece, E> {
                Ok(Piece::Other)
            }
            skip_shapes!(Piece::Other; map);
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(json: &str) -> Prefix {
        serde_json::from_str::<Messages>(json).expect("any JSON reads").0
    }

    fn prompt(json: &str) -> Prefix {
        serde_json::from_str::<Prompt>(json).expect("any JSON reads").0
    }

    fn of(pairs: &[(&str, &str)]) -> Prefix {
        Prefix::of_messages(pairs.iter().map(|(r, c)| (*r, c.as_bytes())))
    }

    /// A report of `running` and `waiting` (and KV usage) that arrived while this gateway had
    /// `own_then` requests in flight on the node.
    fn report(running: u32, waiting: u32, kv_permille: Option<u16>, own_then: u32) -> Option<FreshLoad> {
        let engine = tela_runtime::load_report::EngineLoad { running, waiting, kv_permille, slots: None };
        Some(FreshLoad { engine, local_at_arrival: own_then })
    }

    #[test]
    fn loads_combine_the_own_count_with_the_engine_report() {
        assert_eq!(combined_load(3, None), 3, "no report: in-flight alone");
        assert_eq!(combined_load(0, report(4, 2, Some(300), 0)), 6, "others' requests count");
        assert_eq!(combined_load(3, report(2, 1, Some(100), 3)), 3, "own requests are not counted twice");
        assert_eq!(combined_load(5, report(2, 1, None, 3)), 5, "own requests sent since the report count");
        assert_eq!(combined_load(0, report(1, 0, None, 1)), 0, "an own request that ended since does not");
        assert_eq!(combined_load(1, report(0, 0, None, 1)), 1, "one the engine has not seen yet counts");
        // KV usage breaks ties between engines running alike, but not on an idle engine.
        assert_eq!(combined_load(0, report(2, 0, Some(950), 0)), 3);
        assert_eq!(combined_load(0, report(2, 0, Some(899), 0)), 2);
        assert_eq!(combined_load(0, report(0, 0, Some(1000), 0)), 0);
        assert_eq!(combined_load(u32::MAX, report(u32::MAX, u32::MAX, Some(1000), 0)), u32::MAX);
    }

    #[test]
    fn slots_are_what_the_node_says_or_what_a_queueing_engine_runs() {
        let with = |slots: Option<u32>, running, waiting| {
            let engine = tela_runtime::load_report::EngineLoad { running, waiting, kv_permille: None, slots };
            engine_slots(Some(FreshLoad { engine, local_at_arrival: 0 }))
        };
        assert_eq!(engine_slots(None), None, "no fresh report: unknown");
        assert_eq!(with(None, 3, 0), None, "nothing waits: unknown");
        assert_eq!(with(None, 16, 2), Some(16), "requests wait: full at what it runs");
        assert_eq!(with(Some(1), 1, 3), Some(1), "the node's word first");
    }

    #[test]
    fn stale_reports_fall_back_to_in_flight() {
        use tela_runtime::load_report::{encode, LoadReport, LoadReports, ModelLoad};
        let reports = LoadReports::default();
        let node = NodeId([7; 16]);
        let at = Instant::now();
        let busy = LoadReport {
            epoch: 1,
            seq: 1,
            models: vec![ModelLoad { model: "m".into(), running: 8, waiting: 4, kv_permille: Some(500) }],
            leaving_in_ms: None,
            slots: None,
        };
        reports.count_local_with(|_| 1);
        reports.receive(node, &encode(&busy), at).expect("a valid report");
        let load_at = |now: Instant| combined_load(1, reports.fresh(&node, now, REPORT_MAX_AGE));
        assert_eq!(load_at(at), 12);
        assert_eq!(load_at(at + REPORT_MAX_AGE - Duration::from_millis(1)), 12);
        assert_eq!(load_at(at + REPORT_MAX_AGE), 1, "a stale report is ignored");
        assert_eq!(combined_load(1, reports.fresh(&NodeId([8; 16]), at, REPORT_MAX_AGE)), 1, "never reported");
    }

    #[test]
    fn messages_read_as_the_core_hashes_them() {
        let head = of(&[("system", "Be brief."), ("user", "Hi\n\"there\"")]);
        let json = r#"[{"role":"system","content":"Be brief."},{"content":"Hi\n\"there\"","role":"user","name":"x"},
                       {"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"user","content":"more"}]"#;
        assert_eq!(messages(json), head, "field order, escapes, extra keys and later turns do not matter");
        let parts = r#"[{"role":"system","content":"Be brief."},
                        {"role":"user","content":[{"type":"text","text":"Hi\n"},{"type":"text","text":"\"there\""}]}]"#;
        assert_eq!(messages(parts), head, "text parts concatenate");
        let image = r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:a"}},{"type":"text","text":"what?"}]}]"#;
        assert_eq!(messages(image), of(&[("user", "data:awhat?")]));
    }

    #[test]
    fn odd_shapes_read_as_no_content_and_never_fail() {
        for json in ["null", "\"hello\"", "5", "true", "{}", r#"{"role":"user"}"#, "[]", "[1, null, \"x\", []]"] {
            assert_eq!(messages(json).key(), None, "{json}");
        }
        for json in ["null", "5", "{}", "[]", "[{}, true]", "\"\""] {
            assert_eq!(prompt(json).key(), None, "{json}");
        }
        // A message of an odd shape is skipped; the well-formed ones still count.
        let mixed = r#"[7, {"role": 5, "content": {"x": 1}}, {"role": "user", "content": "hi"}]"#;
        assert_eq!(messages(mixed).key(), of(&[("", ""), ("user", "hi")]).key());
    }

    #[test]
    fn prompts_read_as_text_texts_or_tokens() {
        let text = "x".repeat(1000);
        assert_eq!(prompt(&format!("\"{text}\"")), Prefix::of_prompt(text.as_bytes()));
        assert_eq!(prompt(&format!("[\"{text}\", \"y\"]")).key(), Prefix::of_prompt(text.as_bytes()).key());
        let tokens = prompt("[1, 2, 3]");
        assert_eq!(tokens.key(), prompt("[[1, 2, 3]]").key());
        assert_ne!(tokens.key(), prompt("[1, 2, 4]").key());
        assert!(tokens.key().is_some());
    }

    #[test]
    fn a_huge_body_is_read_and_keyed_by_its_bounded_head() {
        let huge = "word ".repeat(400_000);
        let json = format!(r#"[{{"role":"system","content":"{huge}"}},{{"role":"user","content":"q"}}]"#);
        let capped = &huge[..MESSAGE_BYTES];
        assert_eq!(messages(&json), of(&[("system", capped), ("user", "q")]));
        let many = format!("[{}]", vec![r#"{"role":"system","content":"s"}"#; 100_000].join(","));
        assert!(messages(&many).blocks().len() <= Prefix::MAX_BLOCKS);
    }
}
