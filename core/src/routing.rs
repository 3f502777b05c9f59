//! The routing decision: which node gets the next request for a model.
//!
//! Candidates are the replica's routable hosts of the model (alive, SERVE, hosting it) that the
//! caller can reach (a gateway: those with a live tunnel to it) and has not already tried for
//! this request. Among them, power-of-two-choices: draw two at random and keep the one with the
//! lower load score, `(in_flight + 1) × tier weight`, so faster GPUs take proportionally more.
//! Two random draws instead of a scan keep the decision O(1) at any federation size.

use crate::id::NodeId;
use crate::replica::Replica;
use rand::Rng;

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

/// Load-score multiplier per GPU tier, in tenths (tier 0 = no GPU, e.g. a simulator).
fn tier_weight(tier: u8) -> u64 {
    match tier {
        0 | 1 => 10,
        2 => 15,
        3 => 20,
        _ => 25,
    }
}

/// Picks a node for a request for `model`.
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
        return Err(RouteError::UnknownModel {
            model: model.to_string(),
            known: replica.routable_models().into_iter().map(str::to_string).collect(),
        });
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
}
