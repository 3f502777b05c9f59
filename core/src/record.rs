//! Node records and the lattice merge that reconciles any two versions of one node's record;
//! the rules are on [`Record`].

use crate::auth::{DownMark, MarkedDown, Seal};
use crate::hardware::Hardware;
use crate::id::NodeId;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Most models one record may list; keeps any record well inside one datagram.
pub const MAX_MODELS: usize = 8;
/// Longest model name in bytes. With [`MAX_MODELS`] names this long, the longest address, an
/// owner's seal and a DOWN mark, a record still fits any datagram that carries one (1,036 of
/// 1,100 bytes; 96-byte names left no room for the 219 bytes of seal and mark).
pub const MAX_MODEL_NAME: usize = 80;
/// Longest public address in bytes.
pub const MAX_ADDR: usize = 96;

/// Lifecycle state of a node, ordered so that the lattice's max is the later state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Lifecycle {
    /// The daemon started; the engine is not ready yet.
    Join,
    /// The engine answers and its models are known: routable.
    Serve,
    /// Draining or failed: no new requests, in-flight ones finish.
    Down,
    /// Gone for good in this generation.
    Left,
}

impl Lifecycle {
    /// Upper-case name as used in tables and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Join => "JOIN",
            Lifecycle::Serve => "SERVE",
            Lifecycle::Down => "DOWN",
            Lifecycle::Left => "LEFT",
        }
    }
}

/// What a node does in the federation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Serves models from an engine next to it.
    Serving,
    /// An ingress gateway: public, terminates client HTTP, anchors outbound-only nodes.
    Gateway,
}

/// Weight format or quantization of a served model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Quantization {
    /// The engine did not say.
    Unknown,
    /// 32-bit floats.
    Fp32,
    /// bfloat16.
    Bf16,
    /// float16.
    Fp16,
    /// 8-bit floats.
    Fp8,
    /// 8-bit integers.
    Int8,
    /// 4-bit integers.
    Int4,
    /// Activation-aware 4-bit weights.
    Awq,
    /// GPTQ weights.
    Gptq,
    /// A llama.cpp GGUF file.
    Gguf,
}

/// A model a node serves: the name clients put in `model`, and its weight format.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Model {
    /// The name as it appears in the engine's `/v1/models` and in client requests.
    pub name: String,
    /// Weight format.
    pub quant: Quantization,
}

impl Model {
    /// A model of unknown format.
    pub fn named(name: impl Into<String>) -> Model {
        Model { name: name.into(), quant: Quantization::Unknown }
    }
}

/// A sorted, duplicate-free set of at most [`MAX_MODELS`] models.
///
/// The union keeps the `MAX_MODELS` smallest models of the two sets, which is still a
/// semilattice join (the k smallest of a union do not depend on grouping or order). An owner that
/// needs more models than fit starts a new generation with the set it wants.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ModelSet(Vec<Model>);

impl ModelSet {
    /// An empty set.
    pub const fn new() -> ModelSet {
        ModelSet(Vec::new())
    }

    /// Builds a set from any models: sorts, removes duplicates, keeps the smallest `MAX_MODELS`.
    pub fn from_models(mut models: Vec<Model>) -> ModelSet {
        models.sort();
        models.dedup();
        models.truncate(MAX_MODELS);
        ModelSet(models)
    }

    /// The models, sorted.
    pub fn as_slice(&self) -> &[Model] {
        &self.0
    }

    /// Number of models.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no model is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True if a model with this name is in the set (any format).
    pub fn contains_name(&self, name: &str) -> bool {
        self.0.iter().any(|m| m.name == name)
    }

    /// True if every model of `other` is in `self`.
    pub fn is_superset(&self, other: &ModelSet) -> bool {
        other.0.iter().all(|m| self.0.binary_search(m).is_ok())
    }

    /// True if `self.union(other) == self`, decided without allocating.
    pub fn absorbs(&self, other: &ModelSet) -> bool {
        let full_max = if self.0.len() == MAX_MODELS { self.0.last() } else { None };
        other.0.iter().all(|m| self.0.binary_search(m).is_ok() || full_max.is_some_and(|top| m > top))
    }

    /// The lattice join: union, capped at the `MAX_MODELS` smallest.
    pub fn union(&self, other: &ModelSet) -> ModelSet {
        let (a, b) = (&self.0, &other.0);
        let mut out = Vec::with_capacity((a.len() + b.len()).min(MAX_MODELS));
        let (mut i, mut j) = (0, 0);
        while out.len() < MAX_MODELS && (i < a.len() || j < b.len()) {
            let next = match (a.get(i), b.get(j)) {
                (Some(x), Some(y)) if x == y => {
                    i += 1;
                    j += 1;
                    x
                }
                (Some(x), Some(y)) if x < y => {
                    i += 1;
                    x
                }
                (_, Some(y)) => {
                    j += 1;
                    y
                }
                (Some(x), None) => {
                    i += 1;
                    x
                }
                (None, None) => unreachable!("loop condition"),
            };
            out.push(next.clone());
        }
        ModelSet(out)
    }

    fn is_canonical(&self) -> bool {
        self.0.len() <= MAX_MODELS && self.0.windows(2).all(|w| w[0] < w[1])
    }
}

/// How peers can reach a node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Reachability {
    /// Behind NAT or a firewall: it dials out and peers use the connections it opened.
    OutboundOnly,
    /// Reachable at this address (`host:port`), e.g. a gateway.
    Public(String),
}

/// The load summary routing needs, refreshed with every heartbeat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Load {
    /// Requests being served now.
    pub in_flight: u32,
    /// Requests the engine has accepted but not started.
    pub queued: u32,
}

/// The summary of a record's position in the lattice, as announcements of a record carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Version {
    /// The record's generation.
    pub generation: u64,
    /// The record's lifecycle state.
    pub state: Lifecycle,
    /// The record's heartbeat.
    pub heartbeat: u64,
}

impl Version {
    /// True if a record at `self` already holds everything a record at `other` holds.
    ///
    /// Owners bump the heartbeat with every change they make, so within a generation
    /// (state, heartbeat) is enough to tell whether merging `other` could change `self`.
    pub fn covers(&self, other: &Version) -> bool {
        self.generation > other.generation
            || (self.generation == other.generation && self.state >= other.state && self.heartbeat >= other.heartbeat)
    }
}

/// One node's record: what every replica knows about that node.
///
/// # The merge
///
/// The merge `⊔` is the registry's only way to combine knowledge, so it must be a join
/// semilattice — commutative, associative, idempotent — for replicas that see the same versions
/// in any order, any number of times, to end up equal. The rules (DESIGN.md), as they stand now
/// that only a record's owner writes it ([`Verifier`](crate::Verifier)):
///
/// 1. the higher [`Record::generation`] wins whole;
/// 2. within one generation, the owner's latest signed version wins whole: the higher heartbeat,
///    then the later owner state, then (only for versions an owner should never have signed
///    twice) the larger remaining content and seal — a total order, so the pick is a max;
/// 3. a DOWN mark by another node ([`DownMark`]) rides alongside, kept whatever the
///    owner's version, until a new generation; of two marks the larger wins. The visible
///    [`Record::state`] is the owner's state raised to DOWN when marked.
///
/// Owners bump the heartbeat with every change and move their state and models only forward
/// within a generation, so for honest owners rule 2 gives what the field-wise rules (state by
/// `LEFT > DOWN > SERVE > JOIN`, heartbeat by max, models by union) gave before records were
/// signed, while every merged record stays one its owner signed. The merge is the lexicographic
/// product of a max (generation), a max over a total order (the owner's version) and a max over
/// the marks of the winning generation — a semilattice; the core's proptests check the
/// laws on arbitrary records, signed and marked ones included.
///
/// Consequences: a node marked DOWN cannot come back in the same generation, and a node withdraws
/// a model or refutes a false DOWN only by starting a new generation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Record {
    /// Whose record this is.
    pub id: NodeId,
    /// Bumped on every restart and on every refutation; the higher one wins whole.
    pub generation: u64,
    /// Lifecycle state within the generation: the owner's, raised to DOWN if [`Record::down`]
    /// holds a mark.
    pub state: Lifecycle,
    /// Owner's counter, bumped periodically and with every change the owner makes.
    pub heartbeat: u64,
    /// What the node does.
    pub role: Role,
    /// Models the node serves.
    pub models: ModelSet,
    /// GPUs the node offers.
    pub hardware: Hardware,
    /// How to reach it.
    pub reach: Reachability,
    /// Load at the last heartbeat.
    pub load: Load,
    /// The owner's key and signature over the fields above ([`Verifier::check`](crate::Verifier::check)).
    pub seal: Seal,
    /// DOWN by another node's failure detector, in this generation. Boxed: rare, and it would
    /// more than double the size of every record held.
    pub down: Option<Box<MarkedDown>>,
}

impl Record {
    /// A fresh record in state JOIN.
    pub fn new(id: NodeId, generation: u64, role: Role, hardware: Hardware, reach: Reachability) -> Record {
        Record {
            id,
            generation,
            state: Lifecycle::Join,
            heartbeat: 0,
            role,
            models: ModelSet::new(),
            hardware,
            reach,
            load: Load::default(),
            seal: Seal::UNSIGNED,
            down: None,
        }
    }

    /// The lifecycle state the owner signed ([`Record::state`] before any DOWN mark).
    pub fn owner_state(&self) -> Lifecycle {
        self.down.as_ref().map_or(self.state, |d| d.owner_state)
    }

    /// The DOWN mark, if another node marked this generation DOWN.
    pub fn down_mark(&self) -> Option<&DownMark> {
        self.down.as_ref().map(|d| &d.mark)
    }

    /// This record with `mark` applied: DOWN in this generation (unless the owner said LEFT),
    /// keeping the larger of `mark` and any mark it already holds.
    pub fn with_down_mark(&self, mark: DownMark) -> Record {
        let mut out = self.clone();
        let mark = self.down_mark().map_or(mark, |m| (*m).max(mark));
        out.set_mark(Some(mark));
        out
    }

    fn set_mark(&mut self, mark: Option<DownMark>) {
        let owner_state = self.owner_state();
        self.down = mark.map(|mark| Box::new(MarkedDown { owner_state, mark }));
        self.state = if mark.is_some() { owner_state.max(Lifecycle::Down) } else { owner_state };
    }

    /// True if both carry the same version as their owner signed it (marks aside), seal included.
    pub(crate) fn same_owner_version(&self, other: &Record) -> bool {
        self.id == other.id && self.generation == other.generation && self.owner_cmp(other).is_eq()
    }

    /// The total order on one generation's owner versions (rule 2 of [`Record`]'s merge).
    fn owner_cmp(&self, other: &Record) -> core::cmp::Ordering {
        (
            self.heartbeat,
            self.owner_state(),
            self.role,
            &self.models,
            &self.hardware,
            &self.reach,
            self.load,
            &self.seal,
        )
            .cmp(&(
                other.heartbeat,
                other.owner_state(),
                other.role,
                &other.models,
                &other.hardware,
                &other.reach,
                other.load,
                &other.seal,
            ))
    }

    /// This record's version.
    pub fn version(&self) -> Version {
        Version { generation: self.generation, state: self.state, heartbeat: self.heartbeat }
    }

    /// The lattice join of two versions of the same node's record.
    ///
    /// Both must have the same `id`; merging records of different nodes is a caller bug and
    /// returns `self` unchanged (checked in debug builds).
    pub fn join(&self, other: &Record) -> Record {
        debug_assert_eq!(self.id, other.id, "merging records of different nodes");
        if self.id != other.id || self.generation > other.generation {
            return self.clone();
        }
        if other.generation > self.generation {
            return other.clone();
        }
        let owner = if self.owner_cmp(other).is_ge() { self } else { other };
        let mark = self.down_mark().max(other.down_mark()).copied();
        let mut out = owner.clone();
        out.set_mark(mark);
        out
    }

    /// True if `self ⊔ other == self`: merging `other` would change nothing.
    ///
    /// Answers without allocating, which keeps the replica's common merge paths cheap.
    pub fn dominates(&self, other: &Record) -> bool {
        if self.id != other.id || self.generation != other.generation {
            return self.id != other.id || self.generation > other.generation;
        }
        self.owner_cmp(other).is_ge() && self.down_mark() >= other.down_mark()
    }

    /// Checks the limits that keep a record inside one datagram and its model set canonical.
    pub fn validate(&self) -> Result<(), InvalidRecord> {
        if !self.models.is_canonical() {
            return Err(InvalidRecord::ModelsNotCanonical);
        }
        if let Some(m) = self.models.as_slice().iter().find(|m| m.name.len() > MAX_MODEL_NAME || m.name.is_empty()) {
            return Err(InvalidRecord::ModelName(m.name.len()));
        }
        if let Reachability::Public(a) = &self.reach {
            if a.len() > MAX_ADDR {
                return Err(InvalidRecord::AddressTooLong(a.len()));
            }
        }
        Ok(())
    }
}

/// A record that breaks the limits of the wire format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRecord {
    /// Models unsorted, duplicated or more than [`MAX_MODELS`].
    #[error("model list is not sorted, has duplicates or more than {MAX_MODELS} entries")]
    ModelsNotCanonical,
    /// A model name is empty or longer than [`MAX_MODEL_NAME`].
    #[error("model name of {0} bytes (1..={MAX_MODEL_NAME} allowed)")]
    ModelName(usize),
    /// A public address longer than [`MAX_ADDR`].
    #[error("public address of {0} bytes (at most {MAX_ADDR} allowed)")]
    AddressTooLong(usize),
}

/// A record shared between a replica, outgoing messages and readers without copying.
pub type SharedRecord = Arc<Record>;

#[cfg(test)]
pub(crate) mod strategy {
    //! proptest strategies for records, shared by this crate's property tests.
    use super::*;
    use crate::hardware::{FabricId, GpuModel, Interconnect};
    use proptest::prelude::*;

    /// Any lifecycle state.
    pub(crate) fn lifecycle() -> impl Strategy<Value = Lifecycle> {
        prop_oneof![Just(Lifecycle::Join), Just(Lifecycle::Serve), Just(Lifecycle::Down), Just(Lifecycle::Left)]
    }

    /// A small model set drawn from a few names, so that unions overlap and overflow.
    pub(crate) fn models() -> impl Strategy<Value = ModelSet> {
        let quant = prop_oneof![Just(Quantization::Unknown), Just(Quantization::Fp16), Just(Quantization::Awq)];
        let model = ("[a-k]{1,3}", quant).prop_map(|(name, quant)| Model { name, quant });
        prop::collection::vec(model, 0..10).prop_map(ModelSet::from_models)
    }

    /// Hardware drawn from a few shapes.
    pub(crate) fn hardware() -> impl Strategy<Value = Hardware> {
        (0u8..3, 0u8..9, 0u32..3).prop_map(|(g, count, fabric)| Hardware {
            gpu: [GpuModel::None, GpuModel::H100, GpuModel::Rtx4090][g as usize],
            gpu_count: count,
            vram_mib: u32::from(count) * 1000,
            interconnect: if count > 1 { Interconnect::NvLink } else { Interconnect::None },
            fabric: FabricId(fabric),
        })
    }

    /// A record of node `id` with small generations and heartbeats so that versions collide.
    pub(crate) fn record_of(id: NodeId) -> impl Strategy<Value = Record> {
        (
            0u64..3,
            lifecycle(),
            0u64..4,
            prop_oneof![Just(Role::Serving), Just(Role::Gateway)],
            models(),
            hardware(),
            prop_oneof![Just(Reachability::OutboundOnly), "[a-c]{1,2}:[0-9]".prop_map(Reachability::Public)],
            (0u32..3, 0u32..3),
        )
            .prop_map(move |(generation, state, heartbeat, role, models, hardware, reach, (i, q))| Record {
                id,
                generation,
                state,
                heartbeat,
                role,
                models,
                hardware,
                reach,
                load: Load { in_flight: i, queued: q },
                seal: Seal::UNSIGNED,
                down: None,
            })
    }

    /// A record of node `id` sealed by its test identity, DOWN-marked by one of two confirmers
    /// or not at all.
    pub(crate) fn signed_record_of(id: NodeId) -> impl Strategy<Value = Record> {
        (record_of(id), 0u8..3).prop_map(move |(mut r, mark)| {
            crate::auth::Identity::for_test(id).seal(&mut r);
            match mark {
                0 => r,
                m => r.with_down_mark(
                    crate::auth::Identity::for_test(NodeId::from_u64(100 + u64::from(m))).mark_down(&r),
                ),
            }
        })
    }

    /// Unsigned, signed and signed-and-marked records of node `id`.
    pub(crate) fn any_record_of(id: NodeId) -> impl Strategy<Value = Record> {
        prop_oneof![record_of(id), signed_record_of(id)]
    }
}

#[cfg(test)]
mod tests {
    use super::strategy::*;
    use super::*;
    use proptest::prelude::*;

    const ID: NodeId = NodeId::from_u64(42);

    /// `a ≤ b` in the order the join induces.
    fn leq(a: &Record, b: &Record) -> bool {
        &a.join(b) == b
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn join_is_commutative(a in any_record_of(ID), b in any_record_of(ID)) {
            prop_assert_eq!(a.join(&b), b.join(&a));
        }

        #[test]
        fn join_is_associative(a in any_record_of(ID), b in any_record_of(ID), c in any_record_of(ID)) {
            prop_assert_eq!(a.join(&b).join(&c), a.join(&b.join(&c)));
        }

        #[test]
        fn join_is_idempotent(a in any_record_of(ID), b in any_record_of(ID)) {
            prop_assert_eq!(a.join(&a), a.clone());
            let ab = a.join(&b);
            prop_assert_eq!(ab.join(&b), ab.clone());
        }

        #[test]
        fn join_is_an_upper_bound(a in any_record_of(ID), b in any_record_of(ID)) {
            let j = a.join(&b);
            prop_assert!(leq(&a, &j) && leq(&b, &j));
            prop_assert!(j.generation >= a.generation.max(b.generation));
            if a.generation == b.generation {
                prop_assert!(j.heartbeat >= a.heartbeat.max(b.heartbeat));
                prop_assert!(j.down_mark() >= a.down_mark().max(b.down_mark()), "a DOWN mark was lost");
                // The owner's part is one the owner signed, whole: never a mix of two versions.
                prop_assert!(j.same_owner_version(&a) || j.same_owner_version(&b));
                if a.heartbeat > b.heartbeat {
                    prop_assert!(j.same_owner_version(&a), "the owner's latest version must win");
                }
            }
        }

        #[test]
        fn join_keeps_every_signature_valid(a in signed_record_of(ID), b in signed_record_of(ID), c in signed_record_of(ID)) {
            let v = crate::auth::Verifier::with_test_identities();
            for r in [a.join(&b), b.join(&a), a.join(&b).join(&c), c.join(&a.join(&b))] {
                prop_assert_eq!(crate::auth::check(&r, &v), Ok(()));
            }
        }

        #[test]
        fn a_down_mark_holds_for_the_whole_generation(a in signed_record_of(ID), b in signed_record_of(ID)) {
            let j = a.join(&b);
            if a.down.is_some() && a.generation == b.generation {
                prop_assert!(j.state >= Lifecycle::Down);
            }
            if j.down.is_none() {
                prop_assert_eq!(j.state, j.owner_state());
            }
        }

        #[test]
        fn stale_generation_is_discarded_whole(old in any_record_of(ID), mut new in any_record_of(ID), ahead in 1u64..3) {
            new.generation = old.generation + ahead;
            prop_assert_eq!(&old.join(&new), &new);
            prop_assert_eq!(&new.join(&old), &new);
        }

        #[test]
        fn version_covers_exactly_when_join_adds_nothing_observable(a in any_record_of(ID), b in any_record_of(ID)) {
            // covers() is what announcements use; if it says "nothing new", the merge must not move
            // generation, state or heartbeat.
            if a.version().covers(&b.version()) {
                let j = a.join(&b);
                prop_assert_eq!(j.version(), a.version());
            }
        }

        #[test]
        fn dominates_is_exactly_join_equals_self(a in any_record_of(ID), b in any_record_of(ID)) {
            prop_assert_eq!(a.dominates(&b), a.join(&b) == a);
        }

        #[test]
        fn absorbs_is_exactly_union_equals_self(a in models(), b in models()) {
            prop_assert_eq!(a.absorbs(&b), a.union(&b) == a);
        }

        #[test]
        fn model_union_is_a_capped_sorted_union(a in models(), b in models()) {
            let u = a.union(&b);
            prop_assert!(u.is_canonical());
            prop_assert!(u.len() <= MAX_MODELS);
            let mut all: Vec<Model> = a.as_slice().iter().chain(b.as_slice()).cloned().collect();
            all.sort();
            all.dedup();
            all.truncate(MAX_MODELS);
            prop_assert_eq!(u.as_slice(), &all[..]);
        }
    }

    #[test]
    fn a_down_mark_outlives_the_owners_later_versions_and_loses_to_the_next_generation() {
        let owner = crate::auth::Identity::for_test(ID);
        let mut serve = Record::new(ID, 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        serve.state = Lifecycle::Serve;
        serve.heartbeat = 3;
        owner.seal(&mut serve);
        let down = serve.with_down_mark(crate::auth::Identity::for_test(NodeId::from_u64(7)).mark_down(&serve));
        assert_eq!((down.state, down.owner_state()), (Lifecycle::Down, Lifecycle::Serve));
        let mut later = serve.clone();
        later.heartbeat = 9;
        owner.seal(&mut later);
        let j = later.join(&down);
        assert_eq!((j.state, j.heartbeat), (Lifecycle::Down, 9));
        assert_eq!(j, down.join(&later));
        let mut left = later.clone();
        left.state = Lifecycle::Left;
        left.heartbeat = 10;
        owner.seal(&mut left);
        assert_eq!(left.join(&j).state, Lifecycle::Left, "the owner's LEFT is above a DOWN mark");
        let mut next = serve.clone();
        next.generation = 2;
        next.heartbeat = 0;
        owner.seal(&mut next);
        assert_eq!(j.join(&next), next);
    }

    #[test]
    fn within_a_generation_the_later_owner_version_wins_whole() {
        let mut a = Record::new(ID, 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        a.state = Lifecycle::Serve;
        a.models = ModelSet::from_models(vec![Model::named("x")]);
        a.heartbeat = 2;
        let mut b = a.clone();
        b.models = ModelSet::from_models(vec![Model::named("x"), Model::named("y")]);
        b.heartbeat = 3;
        assert_eq!(a.join(&b), b);
        assert_eq!(b.join(&a), b);
    }

    #[test]
    fn validation_rejects_what_the_wire_cannot_carry() {
        let mut r = Record::new(ID, 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        r.models = ModelSet(vec![Model::named("b"), Model::named("a")]);
        assert_eq!(r.validate(), Err(InvalidRecord::ModelsNotCanonical));
        r.models = ModelSet::from_models(vec![Model::named("x".repeat(MAX_MODEL_NAME + 1))]);
        assert_eq!(r.validate(), Err(InvalidRecord::ModelName(MAX_MODEL_NAME + 1)));
        r.models = ModelSet::new();
        r.reach = Reachability::Public("h".repeat(MAX_ADDR + 1));
        assert!(matches!(r.validate(), Err(InvalidRecord::AddressTooLong(_))));
    }
}
