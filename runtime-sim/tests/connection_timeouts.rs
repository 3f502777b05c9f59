//! Connections that nothing closes reach the transport's idle timeout: those of a node killed
//! silently, and those a partition cuts for that long. A gateway's connections time out after
//! 5 s (`tela gateway --node-idle-timeout`, the simulator's default); anchors run as `tela
//! anchor` keep the transports' 30 s, which the tests here set where the protocol, not the
//! connection, must do the work.
//!
//! Outbound-only nodes can be probed by nobody but their anchors, so the anchors' leases are
//! what makes a kill unroutable at every gateway within seconds even behind 30 s connections; a
//! partition that outlasts the idle timeout closes the connections it cut, and the nodes dial
//! their gateways again (with the runtime's backoff) until it heals. One that outlasts the
//! suspicion timeout but not the idle timeout leaves each side holding the other DOWN over
//! connections that never dropped: the exchanges nodes now and then run with a member held DOWN
//! are what heals that.

use tela_sim::{Limits, Scenario, Sim};

/// Thirty nodes behind two gateways for 150 s, eight of them killed silently (each back 40–60 s
/// later); `extra` adds sections after `[jobs]`.
fn silent_kills(outbound_fraction: f64, extra: &str) -> Scenario {
    Scenario::parse(&format!(
        r#"
name = "silent-kills"
duration_s = 150
faults_until_s = 120
liveness_bound_s = 30

[federation]
nodes = 30
gateways = 2
outbound_fraction = {outbound_fraction:?}
join_spread_s = 5

[jobs]
crashes = 8
crash_restart_s = [40, 60]
{extra}
"#
    ))
    .expect("scenario")
}

/// Runs `sc` with seeds 1–3, checking that every gateway stopped routing to each killed node
/// within `bound_ms` and that every run passed; returns the reports.
fn gateways_stop_within(sc: &Scenario, bound_ms: f64) -> Vec<tela_sim::Report> {
    (1..=3)
        .map(|seed| {
            let r = Sim::new(sc.clone(), seed, false, Limits::default()).run();
            assert!(r.passed(), "{}", r.summary());
            let d = &r.detection;
            assert!(d.gateways.count >= 5 && d.incomplete == 0, "seed {seed}: {}", r.summary());
            assert!(
                d.gateways.p100_ms <= bound_ms,
                "seed {seed}: a gateway routed to a killed node for {} ms\n{}",
                d.gateways.p100_ms,
                r.summary()
            );
            r
        })
        .collect()
}

#[test]
fn killed_outbound_only_nodes_are_unroutable_at_every_gateway_within_the_lease() {
    // Every node outbound-only: the gateways are the only anchors and nobody else can probe,
    // and their connections last 30 s (`tela anchor`'s): the leases must do the work. The 3 s
    // lease, checked every 500 ms, from a last word at most 1.5 s before the kill (a member
    // silent for a second is pinged at the next check).
    let sc = silent_kills(1.0, "[network]\nidle_timeout_s = 30");
    for r in gateways_stop_within(&sc, 4_000.0) {
        assert_eq!(r.detection.false_down, 0, "{}", r.summary());
    }
}

#[test]
fn a_gateway_stops_routing_to_a_killed_node_at_its_connections_idle_timeout_at_the_latest() {
    // Registries that take several seconds more than the connection to take a silent node out
    // of routing (a detector probing every 8 s) behind gateways with their default 5 s idle
    // timeout: the connection's timeout takes a killed node out of every gateway's routing
    // before its registry does.
    let sc = silent_kills(0.3, "[protocol]\nprotocol_period_ms = 8000");
    assert_eq!(sc.network.idle_timeout_s, 5.0, "the gateway's default");
    for r in gateways_stop_within(&sc, 5_000.0) {
        let d = &r.detection;
        assert!(d.by_connection >= 2 * d.gateways.count as u64, "{}", r.summary());
        assert!(d.gateways_registry.p50_ms > 5_000.0, "{}", r.summary());
    }
}

/// Site 2 of four cut off for `seconds` from 20 s, behind connections with `idle_timeout_s`.
fn partition_of(seconds: u32, idle_timeout_s: u32) -> Scenario {
    Scenario::parse(&format!(
        r#"
name = "partition-{seconds}s"
duration_s = {duration}
faults_until_s = {end}
liveness_bound_s = 20  # two anti-entropy intervals

[federation]
nodes = 40
gateways = 2
outbound_fraction = 0.5
join_spread_s = 5

[network]
sites = 4
idle_timeout_s = {idle_timeout_s}

[[partition]]
start_s = 20
end_s = {end}
sites = [2]
"#,
        end = 20 + seconds,
        duration = 20 + seconds + 60,
    ))
    .expect("scenario")
}

#[test]
fn a_partition_that_outlasts_the_idle_timeout_closes_the_connections_it_cut_and_they_come_back() {
    for seed in 1..=2 {
        // 20 s: under the idle timeout, every connection survives.
        let short = Sim::new(partition_of(20, 30), seed, false, Limits::default()).run();
        assert!(short.passed(), "{}", short.summary());
        assert_eq!(short.connections_timed_out, 0, "seed {seed}: {}", short.summary());
        // 60 s: the nodes of site 2 lose their gateways (ten nodes, two gateways each) and
        // dial them again after the heal; every live replica agrees within the bound.
        let long = Sim::new(partition_of(60, 30), seed, false, Limits::default()).run();
        assert!(long.passed(), "{}", long.summary());
        assert_eq!(long.connections_timed_out, 20, "seed {seed}: {}", long.summary());
        // Behind gateways' 5 s connections, the same 20 s partition closes them all too.
        let gateway = Sim::new(partition_of(20, 5), seed, false, Limits::default()).run();
        assert!(gateway.passed(), "{}", gateway.summary());
        assert_eq!(gateway.connections_timed_out, 20, "seed {seed}: {}", gateway.summary());
    }
}

#[test]
fn sides_that_hold_each_other_down_after_a_partition_still_heal() {
    // 25 s: each side confirms the other DOWN (the suspicion timeout at 42 nodes is 6.5–39 s)
    // while every connection survives; peers are picked among the living, so without the
    // exchanges with members held DOWN the sides never talked again (seed 3 did not heal).
    for seed in 1..=5 {
        let r = Sim::new(partition_of(25, 30), seed, false, Limits::default()).run();
        assert!(r.passed(), "seed {seed}: {}", r.summary());
        assert_eq!(r.connections_timed_out, 0, "seed {seed}: {}", r.summary());
        assert!(r.detection.false_down > 10, "seed {seed}: the sides never held each other DOWN\n{}", r.summary());
    }
}
