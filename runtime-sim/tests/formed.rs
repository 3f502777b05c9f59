//! A formed federation (`federation.formed`): the run starts with every node up, its engine
//! serving, and every replica holding every node's record, restored through the core's checks.
//! That is how the large scenarios measure a running federation rather than the cold start of
//! all of its nodes at once.

use tela_sim::{Limits, Scenario, Sim};

/// Forty nodes behind two gateways, 40–60 ms apart (a connection and its first exchange take a
/// few hundred milliseconds), clients from the first millisecond; `federation` adds keys to that
/// section, `jobs` is the body of the `[jobs]` section.
fn scenario(federation: &str, jobs: &str) -> Scenario {
    Scenario::parse(&format!(
        r#"
name = "formed"
duration_s = 40
faults_until_s = 30
liveness_bound_s = 10

[federation]
nodes = 40
gateways = 2
{federation}

[jobs]
{jobs}

[network]
intra_site_ms = 40.0
wan_ms = 60.0

[workload]
rate_per_s = 200
"#
    ))
    .expect("scenario")
}

#[test]
fn a_formed_federation_serves_from_the_first_request() {
    let quiet = "churn_fraction = 0.0\ncrashes = 0\npreemptions = 0";
    let formed = Sim::new(scenario("formed = true", quiet), 1, false, Limits::default()).run();
    assert!(formed.passed(), "{}", formed.summary());
    let r = &formed.requests;
    assert!(r.sent > 5_000, "{}", formed.summary());
    assert_eq!((r.failed, r.no_capacity), (0, 0), "{}", formed.summary());
    // Nothing changed once formed: the nodes' first states are not counted as changes.
    assert_eq!(formed.convergence.latency.count, 0, "{}", formed.summary());
    // Where the memory went: every replica holds every node (42 × 42 entries), the tables are
    // counted, and they are part of what the allocator counts as live.
    let heap = formed.heap.as_ref().expect("a heap sample");
    assert_eq!((heap.nodes, heap.entries), (42, 42 * 42), "{heap:?}");
    assert!(heap.tables["replica_slots"] > 0 && heap.tables["members"] > 0, "{heap:?}");
    let tables = heap.tables_total();
    assert!(tables > 0 && tables <= heap.live_bytes && heap.live_bytes <= heap.peak_live_bytes, "{heap:?}");
    // The same federation joining: the first requests find no node serving yet.
    let joining = Sim::new(scenario("join_spread_s = 5", quiet), 1, false, Limits::default()).run();
    assert!(joining.passed(), "{}", joining.summary());
    assert!(joining.requests.no_capacity > 0, "{}", joining.summary());
}

#[test]
fn a_formed_federation_converges_after_churn_kills_and_a_partition() {
    let faults =
        "churn_fraction = 0.1\ncrashes = 4\npreemptions = 2\n\n[[partition]]\nstart_s = 10\nend_s = 16\nsites = [1]";
    let mut spanned = 0;
    for seed in 1..=3 {
        let r = Sim::new(scenario("formed = true", faults), seed, false, Limits::default()).run();
        assert!(r.passed(), "seed {seed}: {}", r.summary());
        // Formation itself is not a tracked change; what is tracked came after it.
        assert!(r.convergence.latency.count > 0, "seed {seed}: {}", r.summary());
        assert_eq!(r.convergence.incomplete, 0, "seed {seed}: {}", r.summary());
        // Changes that spread while the partition was in force are not held against Serf's
        // bound; the rest are, and reaching 99.99% never takes longer than reaching everyone.
        let (c, apart) = (&r.convergence, &r.convergence.apart_from_partitions);
        let spanning = c.changes.iter().filter(|&&(t0, ms, _)| t0 <= 16.0 && t0 + ms / 1e3 >= 10.0).count();
        assert_eq!(c.changes.len(), c.latency.count, "seed {seed}: {}", r.summary());
        assert_eq!(apart.count + spanning, c.settled.count, "seed {seed}: {}", r.summary());
        spanned += spanning;
        assert_eq!(c.apart_from_partitions_9999.count, apart.count, "seed {seed}: {}", r.summary());
        assert!(c.apart_from_partitions_9999.p100_ms <= apart.p100_ms, "seed {seed}: {}", r.summary());
        assert!(r.detection.gateways.count > 0, "seed {seed}: {}", r.summary());
    }
    assert!(spanned > 0, "no change spread during the partition: the split above was not tested");
}
