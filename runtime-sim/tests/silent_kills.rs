//! A node killed silently does not close its connections: its peers' sides of them only time out
//! after the transport's idle timeout (30 s). Outbound-only nodes can be probed by nobody but
//! their anchors, so the anchors' leases are what makes such a kill unroutable at every gateway
//! within seconds.

use tela_sim::{Limits, Scenario, Sim};

#[test]
fn killed_outbound_only_nodes_are_unroutable_at_every_gateway_within_the_lease() {
    // Every node outbound-only: the gateways are the only anchors and nobody else can probe.
    let sc = Scenario::parse(
        r#"
name = "silent-kills"
duration_s = 150
faults_until_s = 120
liveness_bound_s = 30

[federation]
nodes = 30
gateways = 2
outbound_fraction = 1.0
join_spread_s = 5

[jobs]
crashes = 8
crash_restart_s = [40, 60]

[protocol]
dissemination = "swim"
"#,
    )
    .expect("scenario");
    assert_eq!(sc.network.idle_timeout_s, 30.0);
    for seed in 1..=3 {
        let r = Sim::new(sc.clone(), seed, false, Limits::default()).run();
        assert!(r.passed(), "{}", r.summary());
        let d = &r.detection;
        assert!(d.gateways.count >= 5 && d.incomplete == 0, "seed {seed}: {}", r.summary());
        // The 3 s lease, checked every 500 ms, from a last word at most 1.5 s before the kill
        // (a member silent for a second is pinged at the next check).
        assert!(
            d.gateways.p100_ms <= 4_000.0,
            "seed {seed}: a gateway took {} ms\n{}",
            d.gateways.p100_ms,
            r.summary()
        );
        assert_eq!(d.false_down, 0, "seed {seed}: {}", r.summary());
    }
}
