//! The routing decision: which node gets the next request for a model.
//!
//! Candidates are the replica's routable hosts of the model (alive, SERVE, hosting it) that the
//! caller can reach (a gateway: those with a live tunnel to it) and has not already tried for
//! this request. Among them a [`RoutingPolicy`] picks one:
//!
//! - [`RoutingPolicy::Prefix`] (the default): **prefix affinity with bounded load**. The
//!   request's leading content is hashed into a [`Prefix`]; the candidates are ranked by
//!   rendezvous (highest-random-weight) hashing of its key, and the request goes to the
//!   highest-ranked candidate that is not over the load bound. A request without content falls
//!   back to least-loaded.
//! - [`RoutingPolicy::LeastLoaded`]: the candidate with the lowest load score,
//!   `(in_flight + 1) × tier weight`, one with room (step 6 below) before one without; ties go
//!   to the lowest [`NodeId`].
//! - [`RoutingPolicy::P2c`]: power-of-two-choices ([`route`]): draw two candidates at random
//!   and keep the one with the lower load score. Two draws instead of a scan keep it `O(1)` at
//!   any federation size, but it is blind to what an engine holds in its KV cache.
//!
//! Tier weights (in tenths: 10 for tier 0 — no GPU, e.g. a simulator — and tier 1, 15 for tier
//! 2, 20 for tier 3, 25 otherwise) make faster GPUs take proportionally more.
//!
//! # Prefix affinity, precisely
//!
//! Multi-turn chat resends the same growing conversation every turn; an engine that still holds
//! its beginning in the KV cache answers the next turn's first token much sooner. So every turn
//! of a conversation should land on the same node, whichever gateway receives it, without any
//! state shared between gateways. The rule is a pure function of the request, the candidates
//! and their loads:
//!
//! 1. **The head.** A chat request's head is its messages in order *up to and including the
//!    first `user` message*: the system prompt (and any other leading messages) plus the first
//!    user turn. Every later turn of the conversation resends exactly these messages, and two
//!    conversations differ in them unless they really start alike (then they share a cached
//!    prefix too). Later messages are not hashed: they change every turn, and cannot change
//!    the decision. A completions request's head is the first block of its prompt: a prompt
//!    has no turns to cut at, and its first block is what successive, growing prompts of one
//!    session share (a prompt shorter than a block is keyed whole, so a session may move once,
//!    when its prompt first fills a block).
//! 2. **Blocks.** The head is serialised — a kind tag, then per message its role (length byte,
//!    at most [`Prefix::ROLE_BYTES`]) and its content (4-byte little-endian length, then at most
//!    [`Prefix::MESSAGE_BYTES`] of it); for a prompt the tag and its text as it is (the pieces of a
//!    list joined by a zero byte, token ids as little-endian `u32`) — and cut into blocks of
//!    [`Prefix::BLOCK_BYTES`], the last one possibly shorter. Each block's hash is SHA-256 over the
//!    previous block's hash (32 zero bytes before the first) and the block's bytes, so a block's
//!    hash stands for everything before it. At most [`Prefix::MAX_BLOCKS`] blocks are hashed: a huge
//!    message costs the same bounded work as a short one (the per-message cap keeps a huge
//!    system prompt from crowding the first user turn out of the bound).
//! 3. **The key** ([`Prefix::key`]) is the first 8 bytes (little-endian) of the last block's
//!    hash: the whole bounded head. No content (no messages, or only empty ones, no prompt)
//!    means no key.
//! 4. **Ranking.** Each candidate's weight is a fixed 64-bit mix (SplitMix64's finaliser) of the
//!    key and the node's id; higher weight ranks first. Only a node's own weight depends on it,
//!    so adding or removing a node moves only the keys that rank it first (while loads are
//!    within the bound below).
//! 5. **Bounded load** (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam
//!    2018). With `T` requests in flight on the candidates and capacities `c` (the inverse of the
//!    tier weight: 60, 40, 30, 24), a candidate may take the request if its load with the
//!    request stays within `⌈(1 + ε) · (T + 1) · c / Σc⌉`: (1 + ε) times its fair share of
//!    everything in flight, this request included (with equal tiers, `(1 + ε)` times the mean).
//!    The request goes to the highest-ranked candidate within the bound, so a hot prefix spills
//!    to its next-ranked node, the same one on every gateway, instead of melting one node.
//!    ε = 25% (0.25, as HAProxy's `hash-balance-factor 125`): small enough to
//!    keep the busiest node within about a quarter above its share, large enough that balanced
//!    traffic keeps its affinity. At low load a quarter of a share is less than one request, and
//!    the bound alone would move a conversation whenever its node holds a single other request
//!    (or a load report still counts the turn that just ended); so a candidate may also go
//!    two requests above its share, `⌈(T + 1) · c / Σc⌉ + 2`, whichever
//!    bound is larger (SGLang's router has the same absolute threshold beside its relative one):
//!    a cached prefix saves more than waiting behind one or two requests costs. The bound always
//!    leaves at least one candidate: their bounds sum to more than `T`.
//! 6. **Room.** A candidate whose engine says how many requests it runs at once (its *slots*:
//!    a llama.cpp server started with `--parallel 1` runs one) has no room when its load fills
//!    them: a request sent there waits in the engine's queue behind whole generations, which
//!    often costs more than recomputing a prefix elsewhere (where answers are long against a
//!    prefix miss: `benches/results/affinity.md`, section 5). So among the candidates within
//!    the bound, those with room come first: the request goes to the highest-ranked candidate
//!    within the bound that has room, and to the highest-ranked within the bound only when none
//!    has. A candidate whose slots are unknown always has room (the bound alone judges it), so
//!    without slot counts nothing changes. With many slots this rarely trips; with one slot it
//!    keeps a conversation from queueing behind another while an engine idles.
//! 7. **Handover.** A candidate that is [handing over](HostState::handing_over) — its node
//!    leaves soon: its walltime is near — ranks below every other. Steps 4 and 5 run over the
//!    other candidates as if it were gone (their loads and capacities alone make the bound), and
//!    it gets a prefix only when no other candidate is usable. So its keys move, before it
//!    turns DOWN, to the node they will stay on once it has left — their next-ranked one — and no
//!    other key moves (rendezvous hashing's minimal disruption). Requests it already serves
//!    finish there. Only prefix-keyed requests avoid it: a request without a key, and every
//!    request under the other policies, has no next turn to keep together, and a node that hands
//!    over still has capacity until it drains (its drain window lets what it takes finish).
//!
//! Everything is integer arithmetic over fixed hashes — no RNG, no float, no per-process hash
//! seed — so two gateways given the same request, the same candidates, the same loads and the
//! same handover marks pick the same node (a node that hands over says so to every gateway at
//! once, in its load reports, so the marks agree). Loads are each gateway's own in-flight counts; two gateways agree exactly
//! while neither pushes the first choice over its bound. Unlike p2c, prefix and least-loaded
//! look at every host of the model (`O(n)`; a hash mix and a comparison per host).

use core::fmt;
use core::str::FromStr;

use crate::id::NodeId;
use crate::replica::Replica;
use rand::Rng;

mod prefix;

use prefix::rendezvous_weight;
pub use prefix::{Prefix, PrefixHasher};

/// Why no node was chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No routable node hosts the model at all.
    #[error("no serving node hosts model '{model}' (known: {})", known.join(", "))]
    UnknownModel {
        /// The model asked for.
        model: String,
        /// Models that do have routable hosts.
        known: Vec<String>,
    },
    /// Hosts exist but none is usable now (no tunnel here, or all already tried).
    #[error("no capacity for model '{model}': {hosts} host(s), none usable now")]
    NoCapacity {
        /// The model asked for.
        model: String,
        /// How many routable hosts the replica lists.
        hosts: usize,
    },
}

/// Which rule picks among a model's candidates (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RoutingPolicy {
    /// Rendezvous hashing of the request's leading content, with bounded load.
    #[default]
    Prefix,
    /// The lowest load score.
    LeastLoaded,
    /// Power-of-two-choices on the load score.
    P2c,
}

impl RoutingPolicy {
    /// Every policy, in the order of the `--routing` help.
    pub const ALL: [RoutingPolicy; 3] = [RoutingPolicy::Prefix, RoutingPolicy::LeastLoaded, RoutingPolicy::P2c];

    /// The name `--routing` takes and `/status` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutingPolicy::Prefix => "prefix",
            RoutingPolicy::LeastLoaded => "least-loaded",
            RoutingPolicy::P2c => "p2c",
        }
    }
}

impl fmt::Display for RoutingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A routing policy name that is not `prefix`, `least-loaded` or `p2c`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown routing policy {0:?}: use prefix, least-loaded or p2c")]
pub struct UnknownRoutingPolicy(pub String);

impl FromStr for RoutingPolicy {
    type Err = UnknownRoutingPolicy;

    fn from_str(s: &str) -> Result<RoutingPolicy, UnknownRoutingPolicy> {
        let lower = s.to_ascii_lowercase();
        RoutingPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == lower || (lower == "least_loaded" && *p == RoutingPolicy::LeastLoaded))
            .ok_or_else(|| UnknownRoutingPolicy(s.to_string()))
    }
}

/// ε of the load bound, in percent: a node may carry up to `1 + ε` times its fair share.
pub(crate) const EPSILON_PERCENT: u64 = 25;
/// Requests a node may carry above its fair share whatever ε allows (see the module docs).
pub(crate) const LOAD_SLACK: u64 = 2;

/// Load-score multiplier per GPU tier, in tenths (tier 0 = no GPU, e.g. a simulator).
fn tier_weight(tier: u8) -> u64 {
    match tier {
        0 | 1 => 10,
        2 => 15,
        3 => 20,
        _ => 25,
    }
}

/// What the caller knows of a usable host beyond its record: its load, how many requests its
/// engine runs at once, and whether it hands over. A plain `u32` converts into it as a load
/// with unknown slots and no handover.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostState {
    /// Requests in flight on the host, as the caller counts them.
    pub in_flight: u32,
    /// Requests the host's engine runs at once, when known: with `in_flight` at or above it the
    /// host has no room (see the module docs, step 6).
    pub slots: Option<u32>,
    /// The host leaves soon (its walltime is near) and takes no new conversations: it ranks
    /// last for prefix-keyed requests (see the module docs, step 7).
    pub handing_over: bool,
}

impl From<u32> for HostState {
    fn from(in_flight: u32) -> HostState {
        HostState { in_flight, slots: None, handing_over: false }
    }
}

/// A usable host, its load and its capacity share.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: NodeId,
    in_flight: u32,
    /// The tier weight in tenths: a higher weight means a slower node.
    weight: u64,
    slots: Option<u32>,
    handing_over: bool,
}

impl Candidate {
    fn score(&self) -> u64 {
        (u64::from(self.in_flight) + 1) * self.weight
    }

    /// Whether a request sent now would start at once rather than queue at the engine: its
    /// slots are unknown, or not all taken.
    fn has_room(&self) -> bool {
        self.slots.map_or(true, |slots| self.in_flight < slots)
    }

    /// Capacity, the inverse of the tier weight, in integers (60, 40, 30, 24).
    fn capacity(&self) -> u64 {
        600 / self.weight
    }
}

/// The candidate with the lowest load score, one with room before one without; ties go to the
/// lowest id.
fn least_loaded(candidates: &[Candidate]) -> Option<NodeId> {
    candidates.iter().min_by_key(|c| (!c.has_room(), c.score(), c.id)).map(|c| c.id)
}

/// Whether `c` may take one more request under the bound, given everything in flight on the
/// candidates and their total capacity.
fn within_bound(c: &Candidate, total_in_flight: u64, total_capacity: u64) -> bool {
    let share = u128::from(total_in_flight + 1) * u128::from(c.capacity());
    let whole = 100 * u128::from(total_capacity);
    let relative = (u128::from(100 + EPSILON_PERCENT) * share).div_ceil(whole);
    let absolute = (100 * share).div_ceil(whole) + u128::from(LOAD_SLACK);
    u128::from(c.in_flight) < relative.max(absolute)
}

/// The highest-ranked candidate for `key` within the load bound, one with room before one
/// without, among those that do not hand over if there are any (see the module docs).
fn by_prefix(key: u64, candidates: &[Candidate]) -> Option<NodeId> {
    let staying: Vec<Candidate> = candidates.iter().filter(|c| !c.handing_over).copied().collect();
    let candidates = if staying.is_empty() { candidates } else { &staying };
    let total_in_flight: u64 = candidates.iter().map(|c| u64::from(c.in_flight)).sum();
    let total_capacity: u64 = candidates.iter().map(Candidate::capacity).sum();
    candidates
        .iter()
        .filter(|c| within_bound(c, total_in_flight, total_capacity))
        .max_by_key(|c| (c.has_room(), rendezvous_weight(key, &c.id), core::cmp::Reverse(c.id)))
        .map(|c| c.id)
        // The bounds sum to more than everything in flight, so this is only for safety.
        .or_else(|| least_loaded(candidates))
}

/// Picks a node for a request for `model` by `policy`; `prefix` is the request's leading
/// content (only [`RoutingPolicy::Prefix`] reads it, and `rng` only [`RoutingPolicy::P2c`]).
///
/// `usable(id)` says whether the caller can send to `id` now and has not tried it for this
/// request; `host(id)` is what the caller knows of `id`: its count of requests in flight there
/// (a plain `u32`), or a [`HostState`] that also says whether `id` hands over.
pub fn route_with<R: Rng + ?Sized, H: Into<HostState>>(
    policy: RoutingPolicy,
    replica: &Replica,
    model: &str,
    prefix: &Prefix,
    mut usable: impl FnMut(NodeId) -> bool,
    mut host: impl FnMut(NodeId) -> H,
    rng: &mut R,
) -> Result<NodeId, RouteError> {
    if policy == RoutingPolicy::P2c {
        return route(replica, model, usable, |id| host(id).into().in_flight, rng);
    }
    let hosts = replica.serving(model);
    if hosts.is_empty() {
        return Err(unknown_model(replica, model));
    }
    let candidates: Vec<Candidate> = hosts
        .iter()
        .filter(|&id| usable(id))
        .map(|id| {
            let tier = replica.get(&id).map_or(4, |s| s.record().hardware.gpu.tier());
            let HostState { in_flight, slots, handing_over } = host(id).into();
            Candidate { id, in_flight, weight: tier_weight(tier), slots, handing_over }
        })
        .collect();
    let picked = match (policy, prefix.key()) {
        (RoutingPolicy::Prefix, Some(key)) => by_prefix(key, &candidates),
        _ => least_loaded(&candidates),
    };
    picked.ok_or_else(|| RouteError::NoCapacity { model: model.to_string(), hosts: hosts.len() })
}

fn unknown_model(replica: &Replica, model: &str) -> RouteError {
    RouteError::UnknownModel {
        model: model.to_string(),
        known: replica.routable_models().into_iter().map(str::to_string).collect(),
    }
}

/// Picks a node for a request for `model` by power-of-two-choices ([`RoutingPolicy::P2c`]).
///
/// `usable(id)` says whether the caller can send to `id` now and has not tried it for this
/// request; `in_flight(id)` is the caller's count of requests in flight on `id`.
pub fn route<R: Rng + ?Sized>(
    replica: &Replica,
    model: &str,
    mut usable: impl FnMut(NodeId) -> bool,
    mut in_flight: impl FnMut(NodeId) -> u32,
    rng: &mut R,
) -> Result<NodeId, RouteError> {
    let hosts = replica.serving(model);
    if hosts.is_empty() {
        return Err(unknown_model(replica, model));
    }
    let no_capacity = || RouteError::NoCapacity { model: model.to_string(), hosts: hosts.len() };
    let score = |id: NodeId, in_flight: &mut dyn FnMut(NodeId) -> u32| {
        let tier = replica.get(&id).map_or(4, |s| s.record().hardware.gpu.tier());
        (u64::from(in_flight(id)) + 1) * tier_weight(tier)
    };
    // Fast path: a few random draws find two usable hosts when most are usable.
    let mut picks: [Option<NodeId>; 2] = [None, None];
    for _ in 0..8 {
        let id = hosts.get(rng.random_range(0..hosts.len()));
        if picks[0] == Some(id) || !usable(id) {
            continue;
        }
        if picks[0].is_none() {
            picks[0] = Some(id);
        } else {
            picks[1] = Some(id);
            break;
        }
    }
    // Slow path: most hosts unusable; scan for the usable ones.
    if picks[1].is_none() && hosts.len() > 1 {
        let usable_hosts: Vec<NodeId> = hosts.iter().filter(|&id| Some(id) != picks[0] && usable(id)).collect();
        match (picks[0], usable_hosts.len()) {
            (_, 0) => {}
            (Some(_), n) => picks[1] = Some(usable_hosts[rng.random_range(0..n)]),
            (None, 1) => picks[0] = Some(usable_hosts[0]),
            (None, n) => {
                let a = rng.random_range(0..n);
                let b = (a + 1 + rng.random_range(0..n - 1)) % n;
                picks = [Some(usable_hosts[a]), Some(usable_hosts[b])];
            }
        }
    }
    match picks {
        [Some(a), Some(b)] => Ok(if score(b, &mut in_flight) < score(a, &mut in_flight) { b } else { a }),
        [Some(a), None] => Ok(a),
        _ => Err(no_capacity()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{GpuModel, Hardware};
    use crate::record::{Lifecycle, Model, ModelSet, Reachability, Record, Role};
    use crate::time::Time;
    use proptest::prelude::*;
    use rand_chacha::ChaCha8Rng;
    use rand_core::SeedableRng;
    use std::sync::Arc;

    fn replica(gpus: &[(u64, GpuModel)]) -> Replica {
        let local =
            Record::new(NodeId::from_u64(0), 1, Role::Gateway, Hardware::CPU, Reachability::Public("gw".into()));
        let mut r = Replica::new(local, Time::ZERO);
        for &(n, gpu) in gpus {
            let mut rec = Record::new(
                NodeId::from_u64(n),
                1,
                Role::Serving,
                Hardware::catalog(gpu, 1),
                Reachability::OutboundOnly,
            );
            rec.state = Lifecycle::Serve;
            rec.models = ModelSet::from_models(vec![Model::named("m")]);
            r.merge(Time::ZERO, Arc::new(rec));
        }
        r
    }

    #[test]
    fn unknown_model_names_the_known_ones() {
        let r = replica(&[(1, GpuModel::H100)]);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let e = route(&r, "x", |_| true, |_| 0, &mut rng).unwrap_err();
        assert_eq!(e.to_string(), "no serving node hosts model 'x' (known: m)");
    }

    #[test]
    fn never_picks_an_unusable_host() {
        let r = replica(&[(1, GpuModel::H100), (2, GpuModel::H100), (3, GpuModel::H100)]);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for _ in 0..200 {
            let id = route(&r, "m", |id| id == NodeId::from_u64(3), |_| 0, &mut rng).unwrap();
            assert_eq!(id, NodeId::from_u64(3));
        }
        let e = route(&r, "m", |_| false, |_| 0, &mut rng).unwrap_err();
        assert!(matches!(e, RouteError::NoCapacity { hosts: 3, .. }));
    }

    #[test]
    fn two_choices_spread_load_and_prefer_faster_tiers() {
        let r = replica(&[(1, GpuModel::H100), (2, GpuModel::Rtx4090), (3, GpuModel::H100), (4, GpuModel::Rtx4090)]);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut load = [0u32; 5];
        for _ in 0..1000 {
            let id = route(&r, "m", |_| true, |id| load[id.short() as usize], &mut rng).unwrap();
            load[id.short() as usize] += 1;
        }
        // Balanced within each tier, and tier 1 carries about twice the tier-3 load.
        let (h100, rtx) = (load[1] + load[3], load[2] + load[4]);
        assert!(load[1].abs_diff(load[3]) < 60 && load[2].abs_diff(load[4]) < 60, "{load:?}");
        assert!(h100 > rtx * 3 / 2, "tier 1 {h100} vs tier 3 {rtx}");
    }

    #[test]
    fn policies_are_named_as_the_flag_takes_them() {
        for p in RoutingPolicy::ALL {
            assert_eq!(p.as_str().parse::<RoutingPolicy>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!(RoutingPolicy::default(), RoutingPolicy::Prefix);
        assert_eq!("Least-Loaded".parse::<RoutingPolicy>(), Ok(RoutingPolicy::LeastLoaded));
        let e = "random".parse::<RoutingPolicy>().unwrap_err();
        assert_eq!(e.to_string(), "unknown routing policy \"random\": use prefix, least-loaded or p2c");
    }

    fn chat(messages: &[(&str, &str)]) -> Prefix {
        Prefix::of_messages(messages.iter().map(|(r, c)| (*r, c.as_bytes())))
    }

    #[test]
    fn conversations_spread_over_the_nodes() {
        let r = replica(&[(1, GpuModel::H100), (2, GpuModel::H100), (3, GpuModel::H100), (4, GpuModel::H100)]);
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let mut count = [0u32; 5];
        for i in 0..2000 {
            let prefix = chat(&[("system", "shared"), ("user", &format!("question {i}"))]);
            let id = route_with(RoutingPolicy::Prefix, &r, "m", &prefix, |_| true, |_| 0u32, &mut rng).unwrap();
            count[id.short() as usize] += 1;
        }
        assert!(count[1..].iter().all(|&n| (350..650).contains(&n)), "{count:?}");
    }

    #[test]
    fn least_loaded_takes_the_lowest_score_and_breaks_ties_by_id() {
        let r = replica(&[(1, GpuModel::H100), (2, GpuModel::Rtx4090), (3, GpuModel::H100)]);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let pick = |load: [u32; 4], rng: &mut ChaCha8Rng| {
            let prefix = chat(&[("user", "hello")]);
            route_with(RoutingPolicy::LeastLoaded, &r, "m", &prefix, |_| true, |id| load[id.short() as usize], rng)
                .unwrap()
                .short()
        };
        assert_eq!(pick([0, 0, 0, 0], &mut rng), 1);
        assert_eq!(pick([0, 1, 0, 0], &mut rng), 3);
        // Tier 3 weighs twice tier 1: (0 + 1) × 20 < (2 + 1) × 10.
        assert_eq!(pick([0, 2, 0, 2], &mut rng), 2);
        let e = route_with(RoutingPolicy::Prefix, &r, "x", &Prefix::default(), |_| true, |_| 0u32, &mut rng);
        assert!(matches!(e, Err(RouteError::UnknownModel { .. })));
        let e = route_with(RoutingPolicy::Prefix, &r, "m", &Prefix::default(), |_| false, |_| 0u32, &mut rng);
        assert_eq!(e, Err(RouteError::NoCapacity { model: "m".into(), hosts: 3 }));
    }

    /// Serving nodes `ids` (all tier 1), merged in that order.
    fn replica_of(ids: &[u64]) -> Replica {
        let gpus: Vec<(u64, GpuModel)> = ids.iter().map(|&n| (n, GpuModel::H100)).collect();
        replica(&gpus)
    }

    fn prefix_route(r: &Replica, prefix: &Prefix, usable: impl Fn(u64) -> bool, load: impl Fn(u64) -> u32) -> u64 {
        routed(RoutingPolicy::Prefix, r, prefix, usable, load, |_| false)
    }

    /// The node `policy` picks, with `leaving(n)` saying whether node `n` hands over.
    fn routed(
        policy: RoutingPolicy,
        r: &Replica,
        prefix: &Prefix,
        usable: impl Fn(u64) -> bool,
        load: impl Fn(u64) -> u32,
        leaving: impl Fn(u64) -> bool,
    ) -> u64 {
        // A different RNG every time: the prefix policy must not depend on it.
        static SEED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut rng = ChaCha8Rng::seed_from_u64(SEED.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let host =
            |id: NodeId| HostState { in_flight: load(id.short()), slots: None, handing_over: leaving(id.short()) };
        route_with(policy, r, "m", prefix, |id| usable(id.short()), host, &mut rng).expect("a usable host").short()
    }

    /// The node the prefix policy picks with `slots(n)` the slots of node `n`.
    fn with_slots(r: &Replica, prefix: &Prefix, load: impl Fn(u64) -> u32, slots: impl Fn(u64) -> Option<u32>) -> u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let host =
            |id: NodeId| HostState { in_flight: load(id.short()), slots: slots(id.short()), handing_over: false };
        route_with(RoutingPolicy::Prefix, r, "m", prefix, |_| true, host, &mut rng).expect("a usable host").short()
    }

    #[test]
    fn a_conversation_does_not_queue_behind_another_while_a_node_has_room() {
        // Two engines that run one request at a time (llama.cpp with `--parallel 1`).
        let r = replica_of(&[1, 2]);
        let prefix = chat(&[("user", "hello")]);
        let home = prefix_route(&r, &prefix, |_| true, |_| 0);
        let other = 3 - home;
        let one = |_| Some(1);
        assert_eq!(with_slots(&r, &prefix, |_| 0, one), home, "both idle: its own node");
        // Its node is busy with one request, well within the bound, but the other idles.
        let busy_home = |n: u64| u32::from(n == home);
        assert_eq!(prefix_route(&r, &prefix, |_| true, busy_home), home, "slots unknown: it waits at home");
        assert_eq!(with_slots(&r, &prefix, busy_home, one), other, "no room at home: the idle node");
        // Both full: the bound alone decides, as without slots.
        assert_eq!(with_slots(&r, &prefix, |_| 1, one), home);
        // Slots that are not filled change nothing.
        assert_eq!(with_slots(&r, &prefix, busy_home, |_| Some(16)), home);
        // One slot count known, the other not: the unknown one always has room.
        let only_home_known = |n: u64| (n == home).then_some(1);
        assert_eq!(with_slots(&r, &prefix, busy_home, only_home_known), other);
        // Least-loaded also takes a node with room first, even one with the higher score.
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let host = |id: NodeId| {
            let n = id.short();
            HostState {
                in_flight: if n == 1 { 2 } else { 3 },
                slots: Some(if n == 1 { 2 } else { 4 }),
                handing_over: false,
            }
        };
        let picked = route_with(RoutingPolicy::LeastLoaded, &r, "m", &prefix, |_| true, host, &mut rng);
        assert_eq!(picked.map(|id| id.short()), Ok(2));
    }

    #[test]
    fn a_node_that_hands_over_takes_a_prefix_only_when_nothing_else_can() {
        let r = replica_of(&[1, 2, 3]);
        let prefix = chat(&[("user", "hello")]);
        let first = prefix_route(&r, &prefix, |_| true, |_| 0);
        let second = prefix_route(&r, &prefix, |n| n != first, |_| 0);
        let handing_over = |n: u64| n == first;
        assert_eq!(routed(RoutingPolicy::Prefix, &r, &prefix, |_| true, |_| 0, handing_over), second);
        // However loaded the others are: its keys never wait for it.
        let loaded = |n: u64| if n == first { 0 } else { 500 };
        assert_ne!(routed(RoutingPolicy::Prefix, &r, &prefix, |_| true, loaded, handing_over), first);
        // It is ranked last, not removed: with nothing else usable it still serves.
        assert_eq!(routed(RoutingPolicy::Prefix, &r, &prefix, |n| n == first, |_| 0, handing_over), first);
        // When every node hands over (one batch of jobs with one walltime), the usual rule holds.
        assert_eq!(routed(RoutingPolicy::Prefix, &r, &prefix, |_| true, |_| 0, |_| true), first);
        // Requests without a key, and the other policies, do not look at it: they keep no
        // conversation together, and the node still has capacity until it drains.
        let idle_first = |n: u64| if n == first { 0 } else { 3 };
        for policy in [RoutingPolicy::Prefix, RoutingPolicy::LeastLoaded] {
            let keyless = if policy == RoutingPolicy::Prefix { Prefix::default() } else { prefix.clone() };
            assert_eq!(routed(policy, &r, &keyless, |_| true, idle_first, handing_over), first, "{policy}");
        }
        // A plain load is a host that does not hand over.
        assert_eq!(HostState::from(7), HostState { in_flight: 7, slots: None, handing_over: false });
    }

    /// The bound of the module docs with equal tiers: `⌈1.25 × (T + 1) / n⌉`, or
    /// `⌈(T + 1) / n⌉ + LOAD_SLACK` where that is larger.
    fn mean_bound(loads: &[u32]) -> u64 {
        let total: u64 = loads.iter().map(|&l| u64::from(l)).sum();
        let n = loads.len() as u64;
        (5 * (total + 1)).div_ceil(4 * n).max((total + 1).div_ceil(n) + LOAD_SLACK)
    }

    fn conversation() -> impl Strategy<Value = Vec<(String, String)>> {
        let text = "[a-z ]{0,40}";
        (text, "[a-z ]{1,40}", proptest::collection::vec((text, "[a-z ]{1,20}"), 0..6)).prop_map(
            |(system, first, turns)| {
                let mut messages = vec![("system".to_string(), system), ("user".to_string(), first)];
                for (answer, question) in turns {
                    messages.push(("assistant".to_string(), answer));
                    messages.push(("user".to_string(), question));
                }
                messages
            },
        )
    }

    fn of(messages: &[(String, String)]) -> Prefix {
        Prefix::of_messages(messages.iter().map(|(r, c)| (r.as_str(), c.as_bytes())))
    }

    fn node_ids() -> impl Strategy<Value = Vec<u64>> {
        proptest::collection::btree_set(1u64..1_000_000, 2..12).prop_map(|s| s.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn two_gateways_with_the_same_view_pick_the_same_node(
            ids in node_ids(),
            messages in conversation(),
            loads in proptest::collection::vec(0u32..40, 12),
        ) {
            let a = replica_of(&ids);
            let reversed: Vec<u64> = ids.iter().rev().copied().collect();
            let b = replica_of(&reversed);
            let prefix = of(&messages);
            let load = |n: u64| loads[ids.iter().position(|&i| i == n).unwrap_or(0)];
            let first = prefix_route(&a, &prefix, |_| true, load);
            prop_assert_eq!(first, prefix_route(&b, &prefix, |_| true, load));
            prop_assert_eq!(first, prefix_route(&a, &of(&messages), |_| true, load), "and again on the same one");
        }

        #[test]
        fn a_conversation_stays_on_one_node_while_loads_are_balanced(
            ids in node_ids(),
            messages in conversation(),
            level in 0u32..50,
        ) {
            let r = replica_of(&ids);
            let head = messages.iter().position(|(role, _)| role == "user").unwrap_or(0) + 1;
            let first = prefix_route(&r, &of(&messages[..head]), |_| true, |_| level);
            for turn in (head..=messages.len()).step_by(2) {
                prop_assert_eq!(prefix_route(&r, &of(&messages[..turn]), |_| true, |_| level), first);
            }
        }

        #[test]
        fn the_chosen_node_stays_within_the_load_bound(
            ids in node_ids(),
            key in any::<u64>(),
            loads in proptest::collection::vec(0u32..100, 12),
        ) {
            let r = replica_of(&ids);
            let prefix = Prefix::of_prompt(&key.to_le_bytes());
            let loads = &loads[..ids.len()];
            let load = |n: u64| loads[ids.iter().position(|&i| i == n).unwrap_or(0)];
            let chosen = prefix_route(&r, &prefix, |_| true, load);
            let bound = mean_bound(loads);
            // Some candidate is always within the bound, so the chosen one is.
            prop_assert!(u64::from(load(chosen)) < bound, "load {} with bound {bound}", load(chosen));
            // And every node ranked above it is over the bound: it spilled no further than needed.
            let k = prefix.key().unwrap();
            let w = |n: u64| rendezvous_weight(k, &NodeId::from_u64(n));
            for &n in &ids {
                if w(n) > w(chosen) {
                    prop_assert!(u64::from(load(n)) >= bound, "{n} was within the bound and ranks higher");
                }
            }
        }

        #[test]
        fn a_node_with_room_within_the_bound_is_preferred_and_slots_left_unfilled_change_nothing(
            ids in node_ids(),
            key in any::<u64>(),
            loads in proptest::collection::vec(0u32..8, 12),
            slots in proptest::collection::vec(proptest::option::of(1u32..6), 12),
        ) {
            let r = replica_of(&ids);
            let prefix = Prefix::of_prompt(&key.to_le_bytes());
            let at = |n: u64| ids.iter().position(|&i| i == n).unwrap_or(0);
            let (load, slot) = (|n: u64| loads[at(n)], |n: u64| slots[at(n)]);
            let room = |n: u64| slot(n).map_or(true, |s| load(n) < s);
            let chosen = with_slots(&r, &prefix, load, slot);
            let bound = mean_bound(&loads[..ids.len()]);
            prop_assert!(u64::from(load(chosen)) < bound, "still within the bound");
            if ids.iter().any(|&n| room(n) && u64::from(load(n)) < bound) {
                prop_assert!(room(chosen), "{chosen} has no room, and a node within the bound has");
            } else {
                prop_assert_eq!(chosen, prefix_route(&r, &prefix, |_| true, load), "nobody has room: as without slots");
            }
            // Slots above every load are as good as unknown.
            prop_assert_eq!(with_slots(&r, &prefix, load, |_| Some(8)), prefix_route(&r, &prefix, |_| true, load));
        }

        #[test]
        fn removing_a_node_moves_only_the_keys_it_held(
            ids in node_ids(),
            gone in any::<proptest::sample::Index>(),
            keys in proptest::collection::vec(any::<u64>(), 50),
        ) {
            let r = replica_of(&ids);
            let gone = ids[gone.index(ids.len())];
            let rest: Vec<u64> = ids.iter().copied().filter(|&n| n != gone).collect();
            let smaller = replica_of(&rest);
            for key in keys {
                let prefix = Prefix::of_prompt(&key.to_le_bytes());
                let before = prefix_route(&r, &prefix, |_| true, |_| 0);
                let after = prefix_route(&smaller, &prefix, |_| true, |_| 0);
                prop_assert_eq!(prefix_route(&r, &prefix, |n| n != gone, |_| 0), after, "unusable is as good as gone");
                if before != gone {
                    prop_assert_eq!(before, after, "a key whose node stayed moved");
                }
                prop_assert_ne!(after, gone);
            }
        }

        #[test]
        fn a_node_that_hands_over_is_as_good_as_gone_for_every_prefix(
            ids in node_ids(),
            leaving in any::<proptest::sample::Index>(),
            keys in proptest::collection::vec(any::<u64>(), 20),
            loads in proptest::collection::vec(0u32..60, 12),
        ) {
            let r = replica_of(&ids);
            let leaving = ids[leaving.index(ids.len())];
            let rest: Vec<u64> = ids.iter().copied().filter(|&n| n != leaving).collect();
            let smaller = replica_of(&rest);
            let load = |n: u64| loads[ids.iter().position(|&i| i == n).unwrap_or(0)];
            for key in keys {
                let prefix = Prefix::of_prompt(&key.to_le_bytes());
                let handed = routed(RoutingPolicy::Prefix, &r, &prefix, |_| true, load, |n| n == leaving);
                // Whatever the loads: never the leaving node while another is usable, and the
                // node the key will stay on once it has left.
                prop_assert_ne!(handed, leaving);
                prop_assert_eq!(handed, prefix_route(&smaller, &prefix, |_| true, load));
                // Every gateway with the same view and the same mark agrees.
                let reversed: Vec<u64> = ids.iter().rev().copied().collect();
                let other = routed(RoutingPolicy::Prefix, &replica_of(&reversed), &prefix, |_| true, load, |n| n == leaving);
                prop_assert_eq!(handed, other);
            }
        }

        #[test]
        fn a_handover_moves_only_the_keys_of_the_leaving_node(
            ids in node_ids(),
            leaving in any::<proptest::sample::Index>(),
            keys in proptest::collection::vec(any::<u64>(), 50),
            level in 0u32..50,
        ) {
            let r = replica_of(&ids);
            let leaving = ids[leaving.index(ids.len())];
            for key in keys {
                let prefix = Prefix::of_prompt(&key.to_le_bytes());
                let before = prefix_route(&r, &prefix, |_| true, |_| level);
                let during = routed(RoutingPolicy::Prefix, &r, &prefix, |_| true, |_| level, |n| n == leaving);
                if before == leaving {
                    let next = prefix_route(&r, &prefix, |n| n != leaving, |_| level);
                    prop_assert_eq!(during, next, "a key of the leaving node goes to its next-ranked node");
                } else {
                    prop_assert_eq!(during, before, "a key of a staying node moved");
                }
            }
        }

        #[test]
        fn without_content_the_least_loaded_node_is_chosen(
            ids in node_ids(),
            loads in proptest::collection::vec(0u32..20, 12),
        ) {
            let r = replica_of(&ids);
            let load = |n: u64| loads[ids.iter().position(|&i| i == n).unwrap_or(0)];
            let chosen = prefix_route(&r, &Prefix::default(), |_| true, load);
            let least = ids.iter().copied().min_by_key(|&n| (load(n), n)).unwrap();
            prop_assert_eq!(chosen, least);
        }

        #[test]
        fn a_hot_prefix_spills_to_its_next_ranked_node(
            ids in node_ids(),
            messages in conversation(),
            hot in 1u32..1000,
        ) {
            let r = replica_of(&ids);
            let prefix = of(&messages);
            let first = prefix_route(&r, &prefix, |_| true, |_| 0);
            let second = prefix_route(&r, &prefix, |n| n != first, |_| 0);
            let loaded = |n: u64| if n == first { hot } else { 0 };
            let loads: Vec<u32> = ids.iter().map(|&n| loaded(n)).collect();
            let chosen = prefix_route(&r, &prefix, |_| true, loaded);
            if u64::from(hot) < mean_bound(&loads) {
                prop_assert_eq!(chosen, first, "within the bound it keeps its node");
            } else {
                prop_assert_eq!(chosen, second, "over the bound it spills to the next-ranked node");
                let reversed: Vec<u64> = ids.iter().rev().copied().collect();
                prop_assert_eq!(prefix_route(&replica_of(&reversed), &prefix, |_| true, loaded), second);
            }
        }
    }
}
