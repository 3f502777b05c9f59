//! One demand trace, replayed through the gateway's spinner (the real gateway, real `tela node`
//! processes started by a local stand-in for Slurm, the engine simulator) and through the
//! simulator (`tela-sim`, the same `[spin]` tables): both must submit, cancel and drain the same
//! jobs in the same order. The simulator is only worth trusting if it makes the gateway's
//! decisions; this is the check that it does, end to end.
//!
//! The trace: two requests arrive together for a model nobody serves; each streams for about
//! five seconds. One replica carries one request, so two jobs are wanted; once the requests are
//! over and demand stayed away for `scale_down_after`, both replicas are drained.

use crate::common;
use crate::spinning_starts_nodes_on_demand::{spin_header, LocalBatch};

use std::path::Path;
use std::time::Duration;

use common::*;
use tela_gateway::config::LoadedConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::spin::SpinSetup;

/// The `[[spin.partition]]` and `[[spin.model]]` tables both sides read, as written.
const TABLES: &str = r#"
[[spin.partition]]
name = "local"
shape = "rtx4090"
nodes = 2

[[spin.model]]
name = "spun"
params = "135M"
quantization = "bf16"
max_replicas = 2
concurrency_per_replica = 1
walltime = "1h"
scale_down_after = "3s"
cooldown = "1s"
"#;

/// Tokens each request streams, and how fast: about five seconds a request.
const TOKENS: u32 = 200;
const TOKENS_PER_S: u32 = 40;

/// The gateway's decisions: what it asked of the batch system, as `<kind> <model>`; and the
/// tail of each job's output, to say why when they differ.
async fn through_the_gateway(dir: &Path) -> (Vec<String>, String) {
    let anchor = format!("127.0.0.1:{}", free_port());
    let engine = format!(
        "engine = \"{} engine-sim --port {{port}} --model {{model}} --ttft-ms 5 --tokens-per-s {TOKENS_PER_S}\"\nmax_replicas",
        tela()
    );
    let toml = format!("{}{}", spin_header(dir, &anchor), TABLES.replace("max_replicas", &engine));
    let batch = LocalBatch::new(dir, true);
    let loaded = LoadedConfig::parse(&toml, "test").expect("valid config");
    let mut config = gateway_config(dir);
    config.anchor_listen = anchor.parse().expect("addr");
    config.spin = Some(SpinSetup { plan: loaded.spin.expect("[spin]"), batch: batch.clone() });
    let gateway = Gateway::start(config).await.expect("gateway starts");
    let base = gateway.base_url();

    let requests: Vec<_> = (0..2)
        .map(|_| {
            let base = base.clone();
            tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("spun", true, TOKENS)).await })
        })
        .collect();
    for r in requests {
        let r = r.await.expect("request task");
        assert_eq!(r.status, 200, "{}\nlog {:?}\njob output:\n{}", r.text(), batch.log(), batch.output(batch.first()));
    }
    // Demand is gone: both replicas go within scale_down_after (and a decision or two).
    let drained = eventually(Duration::from_secs(40), || {
        batch.log().iter().filter(|l| l.starts_with("drain ") || l.starts_with("cancel ")).count() >= 2
    })
    .await;
    assert!(drained, "log {:?}; status {:#}", batch.log(), gateway.status());
    // Nothing more happens once both are gone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = batch.log();
    gateway.shutdown().await;
    let outputs = batch.outputs(30);
    // Every job here is `spun`'s.
    let decisions = log
        .iter()
        .map(|l| {
            let kind = l.split(' ').next().unwrap_or_default();
            format!("{kind} spun")
        })
        .collect();
    (decisions, outputs)
}

/// The simulator's decisions for the same tables and trace.
fn through_the_simulator() -> Vec<String> {
    let scenario = format!(
        r#"
name = "trace-replay"
duration_s = 60
faults_until_s = 0
[federation]
nodes = 0
gateways = 1
[network]
sites = 1
loss = 0.0
[workload]
rate_per_s = 0
tokens_per_s = {TOKENS_PER_S}
ttft_ms = 5
[spin]
interval = "300ms"
max_concurrent_jobs = 4
{TABLES}
[[spin.queue]]
partition = "local"
wait_s = [0, 0]
[[spin.demand]]
model = "spun"
engine_startup_s = [1, 1]
base_per_s = 0
peak_per_s = 0
[[spin.trace]]
at_s = 1
model = "spun"
requests = 2
tokens = {TOKENS}
"#
    );
    let sc = tela_sim::Scenario::parse(&scenario).expect("scenario");
    let report = tela_sim::Sim::new(sc, 1, false, tela_sim::Limits::default()).run();
    assert!(report.passed(), "{}", report.summary());
    assert_eq!(report.requests.completed, 2, "{}", report.summary());
    let spin = report.spin.expect("a spinning scenario reports spinning");
    spin.commands.iter().map(|c| format!("{} {}", c.kind, c.model)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_and_the_simulator_make_the_same_spin_decisions_for_one_trace() {
    within(120, async {
        let simulated = through_the_simulator();
        let dir = tempfile::tempdir().expect("tempdir");
        let (real, outputs) = through_the_gateway(dir.path()).await;
        assert_eq!(real, simulated, "gateway (left) and simulator (right) decided differently\n{outputs}");
        assert_eq!(real, ["submit spun", "submit spun", "drain spun", "drain spun"]);
    })
    .await
}
