//! Lying nodes, and the signature checks the simulated nodes share.
//!
//! A scenario's `[liar]` section turns the last `nodes` serving hosts into liars: they run the
//! protocol like everyone else, and once a simulated second each also sends `per_second` forged
//! records to random running hosts, built from its own replica:
//!
//! - another node's record, its own model added, sealed with the liar's key (impersonation);
//! - a copy of another node's record marked LEFT, not re-signed (an altered record);
//! - a copy of another node's record with the liar's model added, not re-signed;
//! - a DOWN mark on another node that claims a third node confirmed it, signed by the liar;
//! - a DOWN mark by the liar whose signature covers another generation;
//! - an unsigned record of a node that does not exist, serving the liar's model.
//!
//! Each lie is fed to its target at once (no network: what is tested is the merge, not the
//! path), and the target's forgery counters must move or the lie must be old news to it. After
//! every lie, and once a second over every replica, every record held must verify: a replica
//! holding a record the liar altered, or any record whose signature fails, fails the run. The
//! liar's draws come from their own random stream, so the other streams are untouched.
//!
//! Every simulated node checks signatures through one memoizing [`Verify`] per thread: a record
//! change reaches thousands of nodes that would each check the same bytes, so the first check is
//! real and the others are a lookup of the exact bytes.

use crate::sim::{host_of, id_of, Sim};
use bytes::Bytes;
use foldhash::fast::FixedState;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tela_core::harness::auth::{self, CheckedKey, Strict};
use tela_core::harness::wire::{encode_unbounded, Message};
use tela_core::{
    DownMark, Identity, Input, Lifecycle, Model, ModelSet, NodeId, PublicKey, Record, SignatureBytes, Verifier, Verify,
};

/// The `[liar]` section of a scenario.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LiarConfig {
    /// Serving nodes that lie: the last ones of the federation. 0 turns lying off.
    pub nodes: u32,
    /// Forged records each liar sends per simulated second.
    pub per_second: u32,
    /// Lying starts at this time.
    pub start_s: f64,
}

impl Default for LiarConfig {
    fn default() -> Self {
        LiarConfig { nodes: 0, per_second: 20, start_s: 5.0 }
    }
}

/// What the liars did and what came of it.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct AuthReport {
    /// Lying hosts.
    pub liars: u32,
    /// Forged records fed to running hosts.
    pub lies: u64,
    /// Of those, refused and counted as forged by their target.
    pub refused: u64,
    /// Of those, dropped unchecked because the target already held something newer.
    pub old_news: u64,
    /// Of those, accepted: any is a violation.
    pub accepted: u64,
    /// Records checked in the once-a-second sweeps of every replica.
    pub swept: u64,
}

impl AuthReport {
    /// One line for the summary.
    pub fn line(&self) -> String {
        format!(
            "authenticity: {} liar(s) sent {} forged records: {} refused, {} old news, {} accepted; {} held records re-checked\n",
            self.liars, self.lies, self.refused, self.old_news, self.accepted, self.swept
        )
    }
}

/// The liars' state in a running simulation.
#[derive(Debug)]
pub(crate) struct Liars {
    rng: ChaCha8Rng,
    hosts: Vec<u32>,
    report: AuthReport,
    verifier: Verifier,
}

impl Liars {
    pub(crate) fn report(&self) -> AuthReport {
        self.report.clone()
    }
}

/// Once a simulated second: the liars lie, then every replica is checked.
pub(crate) fn tick(sim: &mut Sim) {
    let cfg = sim.sc.liar.clone();
    if cfg.nodes == 0 || (sim.now as f64) < cfg.start_s * 1e6 {
        return;
    }
    if sim.liar.is_none() {
        let serving: Vec<u32> = (0..sim.hosts.len() as u32).filter(|&h| !sim.hosts[h as usize].gateway).collect();
        let hosts = serving.iter().rev().take(cfg.nodes as usize).copied().collect();
        sim.liar = Some(Box::new(Liars {
            rng: ChaCha8Rng::seed_from_u64(sim.seed ^ 0x6c69_6172_6c69_6172),
            hosts,
            report: AuthReport { liars: cfg.nodes, ..AuthReport::default() },
            verifier: shared_verifier(),
        }));
    }
    let Some(mut liars) = sim.liar.take() else { return };
    for i in 0..liars.hosts.len() {
        let liar = liars.hosts[i];
        for _ in 0..cfg.per_second {
            lie(sim, &mut liars, liar);
        }
    }
    sweep(sim, &mut liars);
    sim.liar = Some(liars);
}

/// One forged record from `liar` to a random running host.
fn lie(sim: &mut Sim, liars: &mut Liars, liar: u32) {
    let Some(node) = sim.hosts[liar as usize].node.as_ref() else { return };
    let me = Identity::for_test(id_of(liar));
    let others: Vec<&Record> = node
        .replica()
        .slots()
        .iter()
        .map(|s| &**s.record())
        // A record that already carries a DOWN mark keeps it under `with_down_mark`, so a lie
        // about it could come out as the honest record; lie about unmarked ones.
        .filter(|r| r.id != me.id() && r.seal.key != [0; 32] && r.down.is_none())
        .collect();
    let running: Vec<u32> =
        (0..sim.hosts.len() as u32).filter(|&h| h != liar && sim.hosts[h as usize].running()).collect();
    if others.is_empty() || running.is_empty() {
        return;
    }
    let rng = &mut liars.rng;
    let target = running[rng.random_range(0..running.len())];
    let victim = others[rng.random_range(0..others.len())].clone();
    let kind = rng.random_range(0..6u8);
    let fake_id = NodeId::from_u64(1_000_000 + u64::from(rng.random_range(0..1000u32)));
    let forged = forge(&me, &victim, kind, fake_id, sim.hosts.len() as u32);
    let ids = [forged.id, victim.id];
    let payload = Bytes::from(encode_unbounded(&Message::Records(vec![forged.clone()])));
    let counted = |sim: &Sim| {
        sim.hosts[target as usize].node.as_ref().map_or(0, |n| n.stats().records_forged + n.stats().marks_forged)
    };
    let before = counted(sim);
    sim.feed(target, Input::Datagram { from: me.id(), payload });
    let after = counted(sim);
    liars.report.lies += 1;
    let Some(node) = sim.hosts[target as usize].node.as_ref() else { return };
    let mut accepted = false;
    for id in ids {
        if let Some(held) = node.replica().get(&id).map(|s| s.record().clone()) {
            if *held == forged || liars.verifier.check(&held).is_err() {
                accepted = true;
            }
        }
    }
    if accepted {
        liars.report.accepted += 1;
        sim.fail(format!(
            "node {} accepted a forged record (lie {kind}) of {} from liar {}",
            id_of(target),
            forged.id,
            me.id()
        ));
    } else if after > before {
        liars.report.refused += 1;
    } else {
        liars.report.old_news += 1;
    }
}

/// Builds lie number `kind` about `victim`.
fn forge(me: &Identity, victim: &Record, kind: u8, fake_id: NodeId, hosts: u32) -> Record {
    let liar_model = Model::named(format!("liar-{}", me.id()));
    let with_liar_model = |r: &mut Record| {
        let mut models = r.models.as_slice().to_vec();
        models.insert(0, liar_model.clone());
        r.models = ModelSet::from_models(models);
    };
    let mut r = victim.clone();
    match kind {
        0 => {
            // Another node's id, sealed with the liar's own key.
            with_liar_model(&mut r);
            r.heartbeat += 1_000;
            r.down = None;
            r.state = Lifecycle::Serve;
            r.seal.key = me.public_key();
            r.seal.signature = me.sign(&auth::owner_message(&r));
        }
        1 => {
            // The victim's own signature on a record it never wrote.
            r.down = None;
            r.state = Lifecycle::Left;
            r.heartbeat += 1;
        }
        2 => {
            with_liar_model(&mut r);
            r.heartbeat += 1;
        }
        3 => {
            // "Node X confirmed it failed", signed by the liar.
            let third = id_of((host_of(&me.id()) + 1) % hosts.max(1));
            let message = auth::mark_message(&r.id, r.generation, r.heartbeat);
            let mark =
                DownMark { heartbeat: r.heartbeat, by: third, key: me.public_key(), signature: me.sign(&message) };
            r = r.with_down_mark(mark);
        }
        4 => {
            // A real mark by the liar, but over another generation.
            let message = auth::mark_message(&r.id, r.generation.wrapping_sub(1), r.heartbeat);
            let mark =
                DownMark { heartbeat: r.heartbeat, by: me.id(), key: me.public_key(), signature: me.sign(&message) };
            r = r.with_down_mark(mark);
        }
        _ => {
            // A node that does not exist, unsigned.
            r.id = fake_id;
            r.down = None;
            r.state = Lifecycle::Serve;
            r.models = ModelSet::from_models(vec![liar_model]);
            r.seal = tela_core::Seal::UNSIGNED;
        }
    }
    r
}

/// Every record every running replica holds must verify.
fn sweep(sim: &mut Sim, liars: &mut Liars) {
    let mut bad = None;
    for (h, host) in sim.hosts.iter().enumerate() {
        let Some(node) = host.node.as_ref() else { continue };
        for slot in node.replica().slots() {
            liars.report.swept += 1;
            if let Err(e) = liars.verifier.check(slot.record()) {
                bad = Some(format!(
                    "node {} holds a record of {} that does not verify: {e}",
                    id_of(h as u32),
                    slot.record().id
                ));
            }
        }
    }
    if let Some(what) = bad {
        liars.report.accepted += 1;
        sim.fail(what);
    }
}

/// The verifier every simulated node on this thread uses: [`Strict`] with test identities,
/// memoized on the exact bytes checked.
pub(crate) fn shared_verifier() -> Verifier {
    thread_local! {
        static SHARED: Verifier = Verifier::custom(Arc::new(Memo::default()));
    }
    SHARED.with(Verifier::clone)
}

/// Entries per generation of the cache; two generations are kept, the older dropped whole.
const MEMO_GENERATION: usize = 1 << 16;

/// A cache of verdicts keyed by everything they depend on (signer, key, signature, message), so
/// a hit can only be the same question; misses are checked for real.
#[derive(Debug, Default)]
struct Memo {
    inner: Mutex<MemoMaps>,
}

#[derive(Debug, Default)]
struct MemoMaps {
    young: HashMap<Box<[u8]>, bool, FixedState>,
    old: HashMap<Box<[u8]>, bool, FixedState>,
    /// Each signer's key, checked against its id and decoded once: a miss costs one signature
    /// check, not also a key derivation and a point decompression.
    keys: HashMap<(NodeId, PublicKey), CheckedKey, FixedState>,
}

impl Verify for Memo {
    fn verify(&self, signer: &NodeId, key: &PublicKey, message: &[u8], signature: &SignatureBytes) -> bool {
        let mut question = Vec::with_capacity(16 + 32 + 64 + message.len());
        question.extend_from_slice(&signer.0);
        question.extend_from_slice(key);
        question.extend_from_slice(&signature.0);
        question.extend_from_slice(message);
        let mut maps = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&verdict) = maps.young.get(question.as_slice()).or_else(|| maps.old.get(question.as_slice())) {
            return verdict;
        }
        let checked =
            maps.keys.entry((*signer, *key)).or_insert_with(|| Strict { test_identities: true }.check_key(signer, key));
        let verdict = checked.verifies(message, signature);
        if maps.young.len() >= MEMO_GENERATION {
            maps.old = std::mem::take(&mut maps.young);
        }
        maps.young.insert(question.into_boxed_slice(), verdict);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_agrees_with_a_real_check_and_never_trusts_new_bytes() {
        let v = shared_verifier();
        let owner = Identity::for_test(NodeId::from_u64(4));
        let mut r = Record::new(
            owner.id(),
            1,
            tela_core::Role::Serving,
            tela_core::Hardware::CPU,
            tela_core::Reachability::OutboundOnly,
        );
        owner.seal(&mut r);
        for _ in 0..2 {
            assert_eq!(v.check(&r), Ok(()));
        }
        let mut altered = r.clone();
        altered.heartbeat += 1;
        for _ in 0..2 {
            assert!(v.check(&altered).is_err());
        }
        for kind in 0..6 {
            let lie = forge(&Identity::for_test(NodeId::from_u64(9)), &r, kind, NodeId::from_u64(1_000_001), 10);
            assert!(v.check(&lie).is_err(), "lie {kind} verifies");
        }
    }
}
