//! The `merge_laws` target: the record merge is a join semilattice.

use arbitrary::{Result, Unstructured};
use std::sync::{Arc, OnceLock};
use tela_core::{
    FabricId, GpuModel, Hardware, Identity, Interconnect, Lifecycle, Load, Model, ModelSet, NodeId, Quantization,
    Reachability, Record, Replica, Role, Time,
};

/// The node all three records belong to.
const ID: NodeId = NodeId::from_u64(42);

/// Builds three versions of one node's record from `data` (unsigned, owner-signed, or signed and
/// DOWN-marked) and checks the lattice laws of
/// [`Record::join`], that [`Record::dominates`] is exactly `a ⊔ b == a`, that
/// [`tela_core::Version::covers`] never hides a change of version, and that a [`Replica`]
/// ends with `a ⊔ b ⊔ c` whatever order it merges them in; and that merging signed records
/// yields records that still verify.
///
/// Generations and heartbeats come from small ranges (with an occasional extreme value) and
/// models from a few names, so that versions collide and model sets overflow.
pub fn merge_laws(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(a), Ok(b), Ok(c)) = (record(&mut u), record(&mut u), record(&mut u)) else {
        return;
    };

    assert_eq!(a.join(&b), b.join(&a), "join is not commutative");
    assert_eq!(a.join(&b).join(&c), a.join(&b.join(&c)), "join is not associative");
    for x in [&a, &b, &c] {
        assert_eq!(&x.join(x), x, "join is not idempotent");
    }
    for (x, y) in [(&a, &b), (&b, &a), (&a, &c), (&c, &a), (&b, &c), (&c, &b)] {
        let j = x.join(y);
        assert_eq!(x.dominates(y), &j == x, "dominates disagrees with join");
        assert!(j.dominates(x) && j.dominates(y), "join is not an upper bound");
        assert_eq!(x.models.absorbs(&y.models), x.models.union(&y.models) == x.models, "absorbs disagrees with union");
        if x.version().covers(&y.version()) {
            assert_eq!(j.version(), x.version(), "covers hid a version change");
        }
    }

    // Merging what owners and confirmers signed yields only what they signed: no merge forges.
    let verifier = tela_core::Verifier::with_test_identities();
    let signed = [&a, &b, &c].iter().all(|x| verifier.check(x).is_ok());
    if signed {
        for j in [a.join(&b), b.join(&c), a.join(&b).join(&c)] {
            assert_eq!(verifier.check(&j), Ok(()), "a merge of signed records does not verify");
        }
    }

    let all = a.join(&b).join(&c);
    let orders = [[&a, &b, &c], [&a, &c, &b], [&b, &a, &c], [&b, &c, &a], [&c, &a, &b], [&c, &b, &a]];
    for order in orders {
        let local = Record::new(NodeId::from_u64(1), 1, Role::Gateway, Hardware::CPU, Reachability::OutboundOnly);
        let mut replica = Replica::new(local, Time::ZERO);
        for (t, r) in order.into_iter().enumerate() {
            replica.merge(Time::from_secs(t as u64), Arc::new(r.clone()));
        }
        let held = replica.get(&ID).map(|s| (**s.record()).clone());
        assert_eq!(held.as_ref(), Some(&all), "replica depends on merge order");
    }
}

/// A version of node [`ID`]'s record.
fn record(u: &mut Unstructured<'_>) -> Result<Record> {
    let generation = small_or_extreme(u, 2)?;
    let state = *u.choose(&[Lifecycle::Join, Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left])?;
    let heartbeat = small_or_extreme(u, 3)?;
    let role = *u.choose(&[Role::Serving, Role::Gateway])?;
    let models = models(u)?;
    let hardware = hardware(u)?;
    let reach = match u.int_in_range(0u8..=3)? {
        0 => Reachability::OutboundOnly,
        n => Reachability::Public(format!("10.0.0.{n}:7000")),
    };
    let load = Load { in_flight: u.int_in_range(0..=2)?, queued: u.int_in_range(0..=2)? };
    let mut r = Record::new(ID, generation, role, hardware, reach);
    (r.state, r.heartbeat, r.models, r.load) = (state, heartbeat, models, load);
    // Unsigned, signed by the owner, or signed and marked DOWN by one of two confirmers.
    match u.int_in_range(0u8..=3)? {
        0 => {}
        n => {
            let [owner, first, second] = identities();
            owner.seal(&mut r);
            if n >= 2 {
                let confirmer = if n == 2 { first } else { second };
                r = r.with_down_mark(confirmer.mark_down(&r));
            }
        }
    }
    Ok(r)
}

/// The owner's and two confirmers' test identities, made once (deriving a key costs ~20 µs).
fn identities() -> &'static [Identity; 3] {
    static IDS: OnceLock<[Identity; 3]> = OnceLock::new();
    IDS.get_or_init(|| [ID, NodeId::from_u64(7), NodeId::from_u64(8)].map(Identity::for_test))
}

/// Usually a value in `0..=max`; one time in sixteen 0, `u64::MAX` or any value.
fn small_or_extreme(u: &mut Unstructured<'_>, max: u64) -> Result<u64> {
    Ok(match u.int_in_range(0u8..=15)? {
        0 => *u.choose(&[0, u64::MAX - 1, u64::MAX])?,
        1 => u.arbitrary()?,
        _ => u.int_in_range(0..=max)?,
    })
}

/// Up to ten models drawn from eleven names and three formats, so unions overlap and overflow
/// the cap.
fn models(u: &mut Unstructured<'_>) -> Result<ModelSet> {
    const NAMES: [&str; 11] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"];
    let n = u.int_in_range(0..=10)?;
    let mut models = Vec::with_capacity(n);
    for _ in 0..n {
        models.push(Model {
            name: (*u.choose(&NAMES)?).to_string(),
            quant: *u.choose(&[Quantization::Unknown, Quantization::Fp16, Quantization::Awq])?,
        });
    }
    Ok(ModelSet::from_models(models))
}

/// One of a few hardware shapes.
fn hardware(u: &mut Unstructured<'_>) -> Result<Hardware> {
    let gpu = *u.choose(&[GpuModel::None, GpuModel::H100, GpuModel::Rtx4090])?;
    let gpu_count = u.int_in_range(0..=8)?;
    Ok(Hardware {
        gpu,
        gpu_count,
        vram_mib: u32::from(gpu_count) * 1000,
        interconnect: if gpu_count > 1 { Interconnect::NvLink } else { Interconnect::None },
        fabric: FabricId(u.int_in_range(0..=2)?),
    })
}
