//! Twenty seeds of smoke-100, each drawing its own fault mix, all keep every invariant and
//! converge after the faults stop.

use tela_sim::{replay_command, Limits, Scenario, Sim};

#[test]
fn twenty_swarm_seeds_of_smoke_100_pass() {
    let scenario = "smoke-100";
    let base = Scenario::load(scenario).expect("scenario");
    let mut mixes = std::collections::BTreeSet::new();
    for seed in 1..=20 {
        let r = Sim::new(base.clone(), seed, true, Limits::default()).run();
        assert!(r.passed(), "{}\nreplay: {}", r.summary(), replay_command(scenario, seed, true));
        assert!(r.max_datagram_bytes <= 1100);
        mixes.insert(format!("{:.4}/{}", r.network.loss, r.partitions));
    }
    assert!(mixes.len() > 10, "swarm seeds should draw different fault mixes: {mixes:?}");
}
