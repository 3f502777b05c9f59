//! Authenticity of records: only a record's owner writes it, and others add only DOWN marks.
//! The rules are on [`Verifier`], which checks them.

use crate::id::NodeId;
use crate::record::{Lifecycle, Record};
use core::fmt;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// An Ed25519 public key, 32 raw bytes.
pub type PublicKey = [u8; 32];

/// Domain separation of what owners sign, so that no signature is valid in another role.
const OWNER_DOMAIN: &[u8] = b"tela record v1\0";
/// Domain separation of DOWN marks.
const MARK_DOMAIN: &[u8] = b"tela down mark v1\0";
/// Domain separation of test keys.
const TEST_KEY_DOMAIN: &[u8] = b"tela test identity v1\0";

/// The id a public key owns: the first 16 bytes of its SHA-256.
pub(crate) fn node_id_of(key: &PublicKey) -> NodeId {
    let digest = Sha256::digest(key);
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    NodeId(id)
}

/// True for ids made by [`NodeId::from_u64`] (eight leading zero bytes), which no SHA-256-derived
/// id has in practice (a chance of 2⁻⁶⁴).
pub(crate) fn is_test_id(id: &NodeId) -> bool {
    id.0[..8] == [0; 8]
}

/// An Ed25519 signature, 64 raw bytes; encoded on the wire as exactly 64 bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SignatureBytes(pub [u8; 64]);

impl SignatureBytes {
    /// All zeros: what an unsigned record carries; no key verifies it.
    pub const ZERO: SignatureBytes = SignatureBytes([0; 64]);
}

impl fmt::Debug for SignatureBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

impl Serialize for SignatureBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(64)?;
        for b in &self.0 {
            t.serialize_element(b)?;
        }
        t.end()
    }
}

impl<'de> Deserialize<'de> for SignatureBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SignatureBytes, D::Error> {
        struct Bytes64;
        impl<'de> serde::de::Visitor<'de> for Bytes64 {
            type Value = SignatureBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("64 signature bytes")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<SignatureBytes, A::Error> {
                let mut out = [0u8; 64];
                for (i, b) in out.iter_mut().enumerate() {
                    *b = seq.next_element()?.ok_or_else(|| serde::de::Error::invalid_length(i, &self))?;
                }
                Ok(SignatureBytes(out))
            }
        }
        d.deserialize_tuple(64, Bytes64)
    }
}

/// The owner's public key and signature over the owner's fields of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Seal {
    /// The owner's Ed25519 public key.
    pub key: PublicKey,
    /// The owner's signature over the owner's fields: id, generation, the owner's lifecycle
    /// state, heartbeat, role, models, hardware, reachability and load.
    pub signature: SignatureBytes,
}

impl Seal {
    /// No key, no signature: a record built locally and not signed yet. Never accepted from a peer.
    pub const UNSIGNED: Seal = Seal { key: [0; 32], signature: SignatureBytes::ZERO };
}

impl Default for Seal {
    fn default() -> Seal {
        Seal::UNSIGNED
    }
}

/// Another node's signed statement that the record's owner failed, in the record's generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DownMark {
    /// The target's heartbeat the confirmer last saw: the evidence, and the first sort key when
    /// two confirmers marked the same generation.
    pub heartbeat: u64,
    /// Who confirmed the failure.
    pub by: NodeId,
    /// The confirmer's public key; it must own `by`.
    pub key: PublicKey,
    /// The confirmer's signature over the target's id and generation and `heartbeat`.
    pub signature: SignatureBytes,
}

/// A DOWN mark on a record, with the state the record's owner signed (which the mark raised).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MarkedDown {
    /// The lifecycle state the owner signed; [`Record::state`] is this raised to DOWN.
    pub owner_state: Lifecycle,
    /// The mark.
    pub mark: DownMark,
}

/// The bytes an owner signs: a domain tag, then the postcard encoding of the owner's fields.
pub fn owner_message(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(OWNER_DOMAIN);
    let fields = (
        record.id,
        record.generation,
        record.owner_state(),
        record.heartbeat,
        record.role,
        &record.models,
        &record.hardware,
        &record.reach,
        record.load,
    );
    postcard::to_extend(&fields, out).unwrap_or_default()
}

/// The bytes a confirmer signs to mark `target` DOWN in `generation`, having last seen
/// `heartbeat`.
pub fn mark_message(target: &NodeId, generation: u64, heartbeat: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    out.extend_from_slice(MARK_DOMAIN);
    postcard::to_extend(&(target, generation, heartbeat), out).unwrap_or_default()
}

/// A node's signing key and the id it signs for.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    key: SigningKey,
    id: NodeId,
}

impl Identity {
    /// The identity of an Ed25519 secret key (its 32-byte seed); the id follows from the public
    /// key (the first 16 bytes of its SHA-256). This is what production nodes use.
    pub fn from_secret(secret: &[u8; 32]) -> Identity {
        let key = SigningKey::from_bytes(secret);
        let id = node_id_of(key.verifying_key().as_bytes());
        Identity { key, id }
    }

    /// A test identity for `id`: the key is derived from the id, so anyone can compute it. Only
    /// a verifier built with [`Verifier::with_test_identities`] accepts it, and only for ids
    /// made by [`NodeId::from_u64`]. For tests and simulations, never for production.
    pub fn for_test(id: NodeId) -> Identity {
        Identity { key: SigningKey::from_bytes(&test_secret(&id)), id }
    }

    /// The id this identity signs for.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The raw public key.
    pub fn public_key(&self) -> PublicKey {
        self.key.verifying_key().to_bytes()
    }

    /// Signs `message`.
    pub fn sign(&self, message: &[u8]) -> SignatureBytes {
        SignatureBytes(self.key.sign(message).to_bytes())
    }

    /// Seals `record` (which must be this identity's) as its owner: the key, and a signature over
    /// the owner's fields as they stand.
    pub fn seal(&self, record: &mut Record) {
        debug_assert_eq!(record.id, self.id, "sealing another node's record");
        record.seal = Seal { key: self.public_key(), signature: SignatureBytes::ZERO };
        record.seal.signature = self.sign(&owner_message(record));
    }

    /// A DOWN mark on `record` by this identity, with the record's heartbeat as evidence.
    pub fn mark_down(&self, record: &Record) -> DownMark {
        let heartbeat = record.heartbeat;
        DownMark {
            heartbeat,
            by: self.id,
            key: self.public_key(),
            signature: self.sign(&mark_message(&record.id, record.generation, heartbeat)),
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("Identity").field("id", &self.id).finish_non_exhaustive()
    }
}

fn test_secret(id: &NodeId) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(TEST_KEY_DOMAIN);
    h.update(id.0);
    h.finalize().into()
}

/// Decides whether a key speaks for an id and a signature is valid.
///
/// Implementations must be pure functions of their arguments; a memoizing one (the simulator's)
/// must verify for real the first time it sees a given input.
pub trait Verify: Send + Sync + fmt::Debug {
    /// True if `key` owns `signer` and `signature` is `key`'s signature of `message`.
    fn verify(&self, signer: &NodeId, key: &PublicKey, message: &[u8], signature: &SignatureBytes) -> bool;
}

/// The verification every node does without help: the SHA-256 binding of ids to keys (and, when
/// allowed, the test binding) and a strict Ed25519 check, every time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strict {
    /// Also accept [`Identity::for_test`] keys for [`NodeId::from_u64`] ids.
    pub test_identities: bool,
}

impl Strict {
    /// True if `key` may sign for `id`.
    pub fn owns(&self, id: &NodeId, key: &PublicKey) -> bool {
        if self.test_identities && is_test_id(id) {
            return SigningKey::from_bytes(&test_secret(id)).verifying_key().as_bytes() == key;
        }
        node_id_of(key) == *id
    }

    /// Checks once that `key` may sign for `id` and decodes it, for any number of signature
    /// checks after: what a memoizing verifier keeps per signer.
    pub fn check_key(&self, id: &NodeId, key: &PublicKey) -> CheckedKey {
        CheckedKey(if self.owns(id, key) { VerifyingKey::from_bytes(key).ok() } else { None })
    }
}

/// A public key checked against the id it signs for ([`Strict::check_key`]).
#[derive(Clone, Debug)]
pub struct CheckedKey(Option<VerifyingKey>);

impl CheckedKey {
    /// True if the key owns its id and `signature` is its signature of `message`.
    pub fn verifies(&self, message: &[u8], signature: &SignatureBytes) -> bool {
        self.0
            .as_ref()
            .is_some_and(|public| public.verify_strict(message, &Signature::from_bytes(&signature.0)).is_ok())
    }
}

impl Verify for Strict {
    fn verify(&self, signer: &NodeId, key: &PublicKey, message: &[u8], signature: &SignatureBytes) -> bool {
        self.check_key(signer, key).verifies(message, signature)
    }
}

/// The verifier a node uses, shareable between nodes.
///
/// # What is signed
///
/// Every [`Record`] carries a [`Seal`]: its owner's Ed25519 public key and the owner's signature
/// over every field the owner writes — id, generation, the owner's lifecycle state, heartbeat,
/// role, models, hardware, reachability and load. A node re-signs its record whenever it changes
/// it. The key is bound to the id: a production node's [`NodeId`] is the first 16 bytes of the
/// SHA-256 of its raw 32-byte public key, the same rule the transports use for TLS identities, so
/// nobody can sign for an id that is not theirs.
///
/// # What others may add
///
/// The lattice has one monotone mark that another node may set: DOWN by failure detection. A
/// [`DownMark`] carries the confirmer's id, public key and signature over (target id, target
/// generation, the target's heartbeat the confirmer last saw) — its evidence. A record with a
/// mark is DOWN (or LEFT, if its owner said so) in that generation whatever its owner signed,
/// which is how "a node marked DOWN cannot come back in the same generation" survives signing:
/// the owner refutes by starting a new generation, which no mark of the old one touches. The
/// owner's own signed state is kept next to the mark ([`MarkedDown::owner_state`]) so that the
/// owner's signature can still be checked.
///
/// # Checking
///
/// [`Verifier::check`] accepts a record only if the owner's key owns the id, the owner's
/// signature covers exactly the owner's fields, the visible state is what the owner's state and
/// the mark make it, and the mark (if any) is signed by a key that owns the confirmer's id. Anything else is a
/// [`Forgery`]; [`crate::Node`] drops it, counts it in [`crate::Stats::records_forged`] or
/// [`crate::Stats::marks_forged`], and leaves its replica untouched. The node checks only records
/// that would change its replica (it compares versions first), so the cost follows the news,
/// not the traffic.
///
/// # How a runtime passes its key
///
/// A runtime builds its [`crate::Config`] with [`crate::Config::with_identity`] from
/// [`Identity::from_secret`], the 32-byte Ed25519 secret of the node's persistent identity key;
/// the node id then follows from the key, and peers are checked with [`Verifier::strict`].
/// [`crate::Config::new`] instead gives a node a *test identity* ([`Identity::for_test`]): a key
/// anyone can compute from a [`NodeId::from_u64`] id, accepted only by the verifier
/// [`Verifier::with_test_identities`] that it installs. Tests and the simulator use it; it never
/// lets a key speak for an id derived from another key, because ids that are not test ids are
/// always checked against the SHA-256 rule.
///
/// A simulator running thousands of nodes in one process can share one memoizing [`Verify`]
/// among them (every node checks the same bytes once per record change); it must still verify
/// for real the first time it sees them.
#[derive(Clone)]
pub struct Verifier(Arc<dyn Verify>);

impl Verifier {
    /// Production: ids must be the SHA-256 prefix of their key.
    pub fn strict() -> Verifier {
        Verifier(Arc::new(Strict { test_identities: false }))
    }

    /// Tests and simulations: also accepts [`Identity::for_test`] keys for [`NodeId::from_u64`]
    /// ids.
    pub fn with_test_identities() -> Verifier {
        Verifier(Arc::new(Strict { test_identities: true }))
    }

    /// Any other implementation, e.g. a cache shared by many simulated nodes.
    pub fn custom(verify: Arc<dyn Verify>) -> Verifier {
        Verifier(verify)
    }

    /// Runs the check.
    pub fn verify(&self, signer: &NodeId, key: &PublicKey, message: &[u8], signature: &SignatureBytes) -> bool {
        self.0.verify(signer, key, message, signature)
    }

    /// Checks a record as a node does before merging it (see "Checking" above); anything else
    /// than `Ok` is a [`Forgery`].
    pub fn check(&self, record: &Record) -> Result<(), Forgery> {
        check(record, self)
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Verifier {
    /// The same shared verifier.
    fn eq(&self, other: &Verifier) -> bool {
        core::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl Eq for Verifier {}

/// Why a record from a peer was refused. Refusing it does not affect state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Forgery {
    /// The owner's key does not own the id, or the signature does not cover the owner's fields.
    #[error("the record is not signed by its owner's key, or was altered after signing")]
    Owner,
    /// The visible state is not what the owner's state and the DOWN mark make it.
    #[error("the record's state does not follow from its owner's state and its DOWN mark")]
    State,
    /// The DOWN mark's key does not own its confirmer's id, or its signature is wrong.
    #[error("the DOWN mark is not signed by its confirmer's key")]
    Mark,
}

/// Checks a record received from a peer; see [`Verifier`].
pub(crate) fn check(record: &Record, verifier: &Verifier) -> Result<(), Forgery> {
    check_owner(record, verifier)?;
    check_marks(record, verifier)
}

/// The owner's part: key binding and signature.
pub(crate) fn check_owner(record: &Record, verifier: &Verifier) -> Result<(), Forgery> {
    let seal = &record.seal;
    if verifier.verify(&record.id, &seal.key, &owner_message(record), &seal.signature) {
        Ok(())
    } else {
        Err(Forgery::Owner)
    }
}

/// The parts others add: the state's consistency with the mark, and the mark's signature.
pub(crate) fn check_marks(record: &Record, verifier: &Verifier) -> Result<(), Forgery> {
    let Some(down) = &record.down else { return Ok(()) };
    if record.state != down.owner_state.max(Lifecycle::Down) {
        return Err(Forgery::State);
    }
    let m = &down.mark;
    let message = mark_message(&record.id, record.generation, m.heartbeat);
    if verifier.verify(&m.by, &m.key, &message, &m.signature) {
        Ok(())
    } else {
        Err(Forgery::Mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_from_keys_and_test_keys_only_where_allowed() {
        let real = Identity::from_secret(&[7; 32]);
        assert_eq!(real.id(), node_id_of(&real.public_key()));
        assert!(!is_test_id(&real.id()));
        let test = Identity::for_test(NodeId::from_u64(5));
        let strict = Strict { test_identities: false };
        let lenient = Strict { test_identities: true };
        assert!(strict.owns(&real.id(), &real.public_key()) && lenient.owns(&real.id(), &real.public_key()));
        assert!(!strict.owns(&test.id(), &test.public_key()));
        assert!(lenient.owns(&test.id(), &test.public_key()));
        // A test key never speaks for another test id, nor for a real one.
        assert!(!lenient.owns(&NodeId::from_u64(6), &test.public_key()));
        assert!(!lenient.owns(&real.id(), &test.public_key()));
    }

    #[test]
    fn signatures_are_64_bytes_on_the_wire() {
        let s = SignatureBytes([0xab; 64]);
        let bytes = postcard::to_allocvec(&s).unwrap();
        assert_eq!(bytes.len(), 64);
        assert_eq!(postcard::from_bytes::<SignatureBytes>(&bytes).unwrap(), s);
        assert!(postcard::from_bytes::<SignatureBytes>(&bytes[..63]).is_err());
    }
}
