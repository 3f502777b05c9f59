//! Only a record's owner writes it: forged, altered, unsigned and wrongly marked records are
//! refused on merge, counted, and never change the replica.

use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tela_core::harness::auth::{self, Strict};
use tela_core::harness::wire::{encode_unbounded, Message};
use tela_core::{
    Config, Identity, Input, Lifecycle, Load, Model, ModelSet, Node, NodeId, PublicKey, Reachability, Record, Role,
    SignatureBytes, Time, Verifier, Verify,
};

const ME: NodeId = NodeId::from_u64(1);
const OWNER: NodeId = NodeId::from_u64(2);
const OTHER: NodeId = NodeId::from_u64(3);

fn node() -> Node {
    Node::new(Config::new(ME, 1), Time::ZERO)
}

fn feed(node: &mut Node, records: Vec<Record>) {
    let payload = encode_unbounded(&Message::Records(records)).into();
    node.handle_input(Time::from_millis(1), Input::Datagram { from: OTHER, payload });
}

fn feed_bytes(node: &mut Node, payload: Vec<u8>) {
    node.handle_input(Time::from_millis(1), Input::Datagram { from: OTHER, payload: payload.into() });
}

/// Every record the node holds, sorted: what must not move when a forgery arrives.
/// Feeds `r` to a fresh node and checks that it was refused as forged and changed nothing.
fn refused_as_forged(r: Record) -> Result<(), TestCaseError> {
    let mut n = node();
    let before = snapshot(&n);
    feed(&mut n, vec![r]);
    prop_assert_eq!(snapshot(&n), before);
    prop_assert_eq!(n.stats().records_forged, 1);
    Ok(())
}

fn snapshot(node: &Node) -> Vec<Record> {
    node.replica().sorted_records().iter().map(|r| (**r).clone()).collect()
}

fn forged(node: &Node) -> u64 {
    node.stats().records_forged + node.stats().marks_forged
}

/// A record of `OWNER`, not yet sealed.
fn content() -> impl Strategy<Value = Record> {
    (1u64..5, 0u8..4, 0u64..50, prop::collection::vec("[a-f]{1,6}", 0..4), any::<bool>(), (0u32..9, 0u32..9)).prop_map(
        |(generation, state, heartbeat, models, public, (in_flight, queued))| {
            let reach = if public { Reachability::Public("10.0.0.2:7000".into()) } else { Reachability::OutboundOnly };
            let mut r = Record::new(OWNER, generation, Role::Serving, tela_core::Hardware::CPU, reach);
            r.state = [Lifecycle::Join, Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left][usize::from(state)];
            r.heartbeat = heartbeat;
            r.models = ModelSet::from_models(models.into_iter().map(Model::named).collect());
            r.load = Load { in_flight, queued };
            r
        },
    )
}

/// A record of `OWNER` sealed by its owner, DOWN-marked by `OTHER` or not.
fn signed() -> impl Strategy<Value = Record> {
    (content(), any::<bool>()).prop_map(|(mut r, marked)| {
        Identity::for_test(OWNER).seal(&mut r);
        if marked {
            r = r.with_down_mark(Identity::for_test(OTHER).mark_down(&r));
        }
        r
    })
}

/// One change to a signed record that its owner did not make.
fn alter(r: &mut Record, kind: u8, amount: u64) {
    let amount = amount.max(1);
    match kind % 11 {
        0 => r.generation += amount,
        1 => r.heartbeat += amount,
        2 => {
            // Another state: for a marked record the owner's state is the one that is signed.
            let next = |s: Lifecycle| match s {
                Lifecycle::Join => Lifecycle::Serve,
                Lifecycle::Serve => Lifecycle::Down,
                Lifecycle::Down => Lifecycle::Left,
                Lifecycle::Left => Lifecycle::Join,
            };
            match &mut r.down {
                Some(d) => {
                    d.owner_state = next(d.owner_state);
                    r.state = d.owner_state.max(Lifecycle::Down);
                }
                None => r.state = next(r.state),
            }
        }
        3 => {
            // The liar's model added to someone else's record.
            let mut models = r.models.as_slice().to_vec();
            models.push(Model::named("liar-model"));
            r.models = ModelSet::from_models(models);
        }
        4 => {
            let models = r.models.as_slice();
            r.models = if models.is_empty() {
                ModelSet::from_models(vec![Model::named("x")])
            } else {
                ModelSet::from_models(models[1..].to_vec())
            };
        }
        5 => r.load.in_flight = r.load.in_flight.wrapping_add(amount as u32),
        6 => {
            r.reach = match &r.reach {
                Reachability::OutboundOnly => Reachability::Public("6.6.6.6:7000".into()),
                Reachability::Public(_) => Reachability::OutboundOnly,
            }
        }
        7 => r.role = if r.role == Role::Gateway { Role::Serving } else { Role::Gateway },
        8 => r.hardware.gpu_count = r.hardware.gpu_count.wrapping_add(amount as u8 | 1),
        9 => r.seal.signature.0[(amount % 64) as usize] ^= 1 << (amount % 8),
        _ => r.seal.key[(amount % 32) as usize] ^= 1 << (amount % 8),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn a_record_its_owner_signed_is_accepted(r in signed()) {
        let mut n = node();
        feed(&mut n, vec![r.clone()]);
        prop_assert_eq!(forged(&n), 0);
        prop_assert_eq!(&**n.replica().get(&OWNER).unwrap().record(), &r);
    }

    #[test]
    fn any_field_changed_after_signing_is_refused_and_counted(r in signed(), kind in 0u8..11, amount in any::<u64>()) {
        let mut altered = r.clone();
        alter(&mut altered, kind, amount % 1000);
        prop_assume!(altered != r);
        let mut n = node();
        let before = snapshot(&n);
        feed(&mut n, vec![altered]);
        prop_assert_eq!(snapshot(&n), before);
        prop_assert_eq!(forged(&n), 1);
        // Also when the node already holds the owner's version: the replica keeps it.
        let mut n = node();
        let mut older = r.clone();
        older.down = None;
        older.state = r.owner_state();
        older.heartbeat = 0;
        older.generation = 1;
        Identity::for_test(OWNER).seal(&mut older);
        feed(&mut n, vec![older]);
        let before = snapshot(&n);
        let mut altered = r.clone();
        alter(&mut altered, kind, amount % 1000);
        feed(&mut n, vec![altered.clone()]);
        if n.replica().get(&OWNER).unwrap().record().dominates(&altered) {
            // Old news is dropped before any check.
            prop_assert_eq!(forged(&n), 0);
        } else {
            prop_assert_eq!(forged(&n), 1);
        }
        prop_assert_eq!(snapshot(&n), before);
    }

    #[test]
    fn a_bit_flip_anywhere_never_changes_the_replica(r in signed(), bit in any::<usize>()) {
        let datagram = encode_unbounded(&Message::Records(vec![r.clone()]));
        let mut flipped = datagram.clone();
        let at = bit % (flipped.len() * 8);
        flipped[at / 8] ^= 1 << (at % 8);
        let mut n = node();
        let before = snapshot(&n);
        feed_bytes(&mut n, flipped.clone());
        let after = snapshot(&n);
        if after != before {
            // Only the owner's record, exactly as signed, may ever get in.
            prop_assert_eq!(n.replica().get(&OWNER).map(|s| (**s.record()).clone()), Some(r));
        } else {
            prop_assert!(n.stats().rejected + forged(&n) >= 1, "a changed datagram was neither rejected nor counted");
        }
        prop_assert_eq!(n.local_record().generation, 1, "a forgery made the node refute");
    }

    #[test]
    fn a_record_sealed_by_another_key_is_refused(r in content(), real in any::<[u8; 32]>()) {
        for key in [Identity::for_test(OTHER), Identity::for_test(ME), Identity::from_secret(&real)] {
            let mut r = r.clone();
            // `seal` insists on the owner's id in debug builds; a forger writes the seal itself.
            r.seal.key = key.public_key();
            r.seal.signature = key.sign(&auth::owner_message(&r));
            refused_as_forged(r)?;
        }
    }

    #[test]
    fn an_unsigned_record_is_refused(r in content()) {
        refused_as_forged(r)?;
    }

    #[test]
    fn a_down_mark_its_confirmer_did_not_sign_is_refused(r in content(), kind in 0u8..5, flip in any::<u8>()) {
        let mut r = r;
        r.down = None;
        r.state = r.state.min(Lifecycle::Serve);
        Identity::for_test(OWNER).seal(&mut r);
        let mut n = node();
        feed(&mut n, vec![r.clone()]);
        let before = snapshot(&n);
        let honest = Identity::for_test(OTHER).mark_down(&r);
        let marked = match kind {
            0 => {
                // Claims OTHER confirmed it, signed with another key.
                let liar = Identity::for_test(NodeId::from_u64(9));
                let mut m = honest;
                m.signature = liar.sign(&auth::mark_message(&r.id, r.generation, r.heartbeat));
                m.key = liar.public_key();
                r.with_down_mark(m)
            }
            1 => {
                let mut m = honest;
                m.heartbeat += 1;
                r.with_down_mark(m)
            }
            2 => {
                let mut m = honest;
                m.signature.0[usize::from(flip % 64)] ^= 1 << (flip % 8);
                r.with_down_mark(m)
            }
            3 => {
                // A mark of an earlier generation carried over to this one.
                let mut earlier = r.clone();
                earlier.generation -= 1;
                r.with_down_mark(Identity::for_test(OTHER).mark_down(&earlier))
            }
            _ => {
                // A valid mark, but the state shown is not the one it implies.
                let mut m = r.with_down_mark(honest);
                m.state = r.state;
                m
            }
        };
        feed(&mut n, vec![marked]);
        prop_assert_eq!(snapshot(&n), before);
        prop_assert_eq!(n.stats().marks_forged, 1);
        prop_assert_eq!(n.stats().records_forged, 0, "the owner's part was intact");
        // The honest mark is taken.
        feed(&mut n, vec![r.with_down_mark(honest)]);
        prop_assert_eq!(n.replica().get(&OWNER).unwrap().record().state, Lifecycle::Down);
    }
}

/// Counts real verifications.
#[derive(Debug, Default)]
struct Counting(AtomicU64);

impl Verify for Counting {
    fn verify(&self, signer: &NodeId, key: &PublicKey, message: &[u8], signature: &SignatureBytes) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed);
        Strict { test_identities: true }.verify(signer, key, message, signature)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// A snapshot (`Node::restore`) is held to the same checks as records from a peer: the node
    /// ends with the replica and the forgery count that feeding the same records over the wire
    /// gives, and queues none of them for gossip.
    #[test]
    fn a_restored_snapshot_is_checked_like_records_from_a_peer(
        records in prop::collection::vec((signed(), any::<bool>(), 0u8..11, 0u64..1000), 1..6),
    ) {
        let records: Vec<Record> = records
            .into_iter()
            .map(|(mut r, altered, kind, amount)| {
                if altered {
                    alter(&mut r, kind, amount);
                }
                r
            })
            .collect();
        let mut fed = node();
        for r in &records {
            feed(&mut fed, vec![r.clone()]);
        }
        let shared: Vec<Arc<Record>> = records.into_iter().map(Arc::new).collect();
        let mut restored = node();
        restored.restore(Time::from_millis(1), &shared);
        prop_assert_eq!(snapshot(&restored), snapshot(&fed));
        prop_assert_eq!(forged(&restored), forged(&fed));
        let mut restored = Node::new(Config::new(ME, 1), Time::ZERO);
        let queued = restored.swim_queued();
        restored.restore(Time::from_millis(1), &shared);
        prop_assert_eq!(snapshot(&restored), snapshot(&fed));
        prop_assert_eq!(restored.swim_queued(), queued, "only the node's own first record is queued");
    }
}

#[test]
fn only_news_is_verified() {
    let counting = Arc::new(Counting::default());
    let mut c = Config::new(ME, 1);
    c.verifier = Verifier::custom(counting.clone());
    let mut n = Node::new(c, Time::ZERO);
    let mut r = Record::new(OWNER, 1, Role::Serving, tela_core::Hardware::CPU, Reachability::OutboundOnly);
    r.heartbeat = 4;
    Identity::for_test(OWNER).seal(&mut r);
    feed(&mut n, vec![r.clone()]);
    assert_eq!(counting.0.load(Ordering::Relaxed), 1);
    // The same record again, and an older one: nothing to check.
    let mut older = r.clone();
    older.heartbeat = 2;
    feed(&mut n, vec![r.clone(), older]);
    assert_eq!(counting.0.load(Ordering::Relaxed), 1);
    // A mark on the version held: only the mark is checked.
    feed(&mut n, vec![r.with_down_mark(Identity::for_test(OTHER).mark_down(&r))]);
    assert_eq!(counting.0.load(Ordering::Relaxed), 2);
    assert_eq!(n.replica().get(&OWNER).unwrap().record().state, Lifecycle::Down);
    assert_eq!(forged(&n), 0);
}

#[test]
fn production_nodes_refuse_test_identities_and_accept_real_ones() {
    let me = Identity::from_secret(&[1; 32]);
    let mut n = Node::new(Config::with_identity(me, 1), Time::ZERO);
    let mut test = Record::new(OWNER, 1, Role::Serving, tela_core::Hardware::CPU, Reachability::OutboundOnly);
    Identity::for_test(OWNER).seal(&mut test);
    feed(&mut n, vec![test]);
    assert_eq!(n.stats().records_forged, 1);
    let peer = Identity::from_secret(&[2; 32]);
    let mut real = Record::new(peer.id(), 1, Role::Serving, tela_core::Hardware::CPU, Reachability::OutboundOnly);
    peer.seal(&mut real);
    feed(&mut n, vec![real.clone()]);
    assert_eq!(n.stats().records_forged, 1);
    assert_eq!(&**n.replica().get(&peer.id()).unwrap().record(), &real);
    // The same record claimed for another key's id.
    let thief = Identity::from_secret(&[3; 32]);
    let mut stolen = real.clone();
    stolen.id = thief.id();
    feed(&mut n, vec![stolen]);
    assert_eq!(n.stats().records_forged, 2);
    assert!(n.replica().get(&thief.id()).is_none());
}
