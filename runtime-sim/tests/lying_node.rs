//! Lying nodes send forged, altered and wrongly marked records every second; no replica ever
//! accepts one, and every target counts what it refused.

use tela_sim::{Limits, Scenario, Sim};

#[test]
fn no_replica_accepts_a_forged_record() {
    let sc = Scenario::load("lying-node").expect("scenario");
    for seed in [1, 2] {
        let r = Sim::new(sc.clone(), seed, false, Limits::default()).run();
        assert!(r.passed(), "{}", r.summary());
        let a = r.authenticity.clone().expect("the scenario has liars");
        assert_eq!(a.accepted, 0, "{}", r.summary());
        assert!(a.lies > 1000 && a.refused * 10 > a.lies * 9, "too few lies refused: {a:?}");
        assert!(a.swept > 10_000, "the replicas were not re-checked: {a:?}");
    }
}
