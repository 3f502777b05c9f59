//! Scenarios: TOML files describing a federation, its network, its world and its faults.
//!
//! Every field has a default, so a scenario names only what it changes. Unknown fields are
//! errors (a typo must not silently fall back to a default). `runtime-sim/scenarios/` holds the
//! named scenarios; [`Scenario::load`] takes a name from there or a path.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

mod spin;

pub use spin::{Burst, ModelDemand, PlannedModel, QueueWait, Spin, SpinPlan, TraceStep};

/// A whole scenario.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in reports and replay commands.
    pub name: String,
    /// One line on what it exercises.
    pub description: String,
    /// Simulated seconds to run.
    pub duration_s: f64,
    /// No fault starts after this time; the liveness phase begins here.
    pub faults_until_s: f64,
    /// After faults stop, every live replica must hold the same view within this many seconds.
    pub liveness_bound_s: f64,
    /// Who takes part.
    pub federation: Federation,
    /// Protocol timings.
    pub protocol: Protocol,
    /// The network model.
    pub network: Network,
    /// Clock skew.
    pub clock: Clock,
    /// Scheduled partitions.
    pub partition: Vec<Partition>,
    /// Batch jobs, preemptions and crashes.
    pub jobs: Jobs,
    /// Client traffic.
    pub workload: Workload,
    /// Ranges from which swarm mode draws each seed's fault mix.
    pub swarm: Swarm,
    /// Model spinning: Slurm partitions, spinnable models and their demand over the day. Off when
    /// it names no model.
    pub spin: Spin,
    /// Lying nodes that send forged records (see [`crate::liar`]). Off unless it names nodes.
    pub liar: crate::liar::LiarConfig,
}

/// Nodes and what they serve.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Federation {
    /// Serving nodes.
    pub nodes: u32,
    /// Gateways (public anchors that route client requests).
    pub gateways: u32,
    /// Share of serving nodes that are outbound-only (behind NAT).
    pub outbound_fraction: f64,
    /// Model names served across the federation.
    pub models: Vec<String>,
    /// Models per serving node.
    pub models_per_node: u32,
    /// Hardware profiles drawn uniformly per node (`h100x4`, `rtx4090`, ...).
    pub hardware: Vec<String>,
    /// Serving nodes start uniformly over this many seconds (unless `formed`).
    pub join_spread_s: f64,
    /// The federation has formed before the run starts: at time 0 every node runs with its
    /// engine serving, and every replica holds every node's record, as after each node's join
    /// and first anti-entropy exchange (the core's [`tela_core::Node::restore`], which checks
    /// each record as one from a peer). The run then measures a running federation, its churn
    /// and faults, rather than every node joining at once.
    pub formed: bool,
}

/// Protocol settings handed to every node's `Config`. There is one membership protocol (SWIM
/// probing with piggybacked changes and anti-entropy), run with the core's default settings but
/// for the ones named here; a key this does not know, such as the removed `dissemination`, is an
/// error.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Protocol {
    /// Drain window before the walltime.
    pub drain_window_s: f64,
    /// How many times a record goes whole before it is only announced by version
    /// (`tela_core::MembershipSettings::eager_sends`); at least 1.
    pub eager_sends: u32,
    /// Datagrams of answers a node sends per gossip round
    /// (`tela_core::MembershipSettings::answers_per_round`); at least 1 if set. Unset (the
    /// default): every answer goes out at once.
    pub answers_per_round: Option<usize>,
    /// The failure detector's time between probes (`tela_core::SwimConfig::protocol_period`);
    /// at least 2. The probe timeout stays at most half of it and the anchors' vouch lease at
    /// least one period; suspicions last a number of periods, so a longer period makes a slow
    /// detector.
    pub protocol_period_ms: u64,
}

/// Sites, latency and faults of the network.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Network {
    /// Number of sites (institutions); nodes are spread round-robin, gateways on site 0.
    pub sites: u32,
    /// One-way latency inside a site.
    pub intra_site_ms: f64,
    /// One-way latency between sites.
    pub wan_ms: f64,
    /// Uniform extra latency, 0..jitter.
    pub jitter_ms: f64,
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Probability a datagram is delivered twice.
    pub duplicate: f64,
    /// Probability a datagram is held back 1–20 ms more (reordering).
    pub reorder: f64,
    /// How long a NAT keeps a path open after the inside node last sent on it.
    pub nat_timeout_s: f64,
    /// How long a connection hears nothing before it is closed: the peers of a process killed
    /// without closing its connections (`kill -9`, Slurm's kill at the walltime or after a
    /// preemption's grace) learn of the loss only then, and a partition that lasts this long
    /// closes the connections it cuts. Every connection here has a gateway at one end, and
    /// QUIC closes a connection after the smaller of its two ends' idle timeouts: `tela
    /// gateway`'s is 5 s (`--node-idle-timeout`, with keep-alives every 1.25 s so that a live
    /// peer is never silent that long), the default. Anchors run as `tela anchor` keep the
    /// transports' 30 s.
    pub idle_timeout_s: f64,
}

/// Per-node clock skew: each node's `now` is `offset + t × (1 + drift)`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Clock {
    /// Largest offset, drawn uniformly in ±this.
    pub max_offset_ms: f64,
    /// Largest drift, drawn uniformly in ±this, parts per million.
    pub max_drift_ppm: f64,
}

/// A partition between a group of sites and the rest.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Partition {
    /// When it starts.
    pub start_s: f64,
    /// When it heals.
    pub end_s: f64,
    /// The sites on one side.
    pub sites: Vec<u32>,
    /// Drop only traffic leaving `sites` (a one-way partition).
    pub one_way: bool,
}

/// Slurm-like jobs and failures.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Jobs {
    /// Share of serving nodes whose job reaches its walltime before `faults_until_s`.
    pub churn_fraction: f64,
    /// Queue wait of a replacement job, uniform range in seconds.
    pub queue_wait_s: [f64; 2],
    /// Engine start-up time, uniform range in seconds.
    pub engine_startup_s: [f64; 2],
    /// Preemptions (drain signal, then kill after the grace period).
    pub preemptions: u32,
    /// Grace between the preemption signal and the kill.
    pub preempt_grace_s: f64,
    /// Silent kills of serving nodes (`kill -9`), each restarted later.
    pub crashes: u32,
    /// Delay before a crashed node restarts, uniform range in seconds.
    pub crash_restart_s: [f64; 2],
    /// Silent kills of gateways, each restarted later.
    pub gateway_crashes: u32,
}

/// Client requests.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Poisson arrivals per second, over all models.
    pub rate_per_s: f64,
    /// Tokens per response, uniform range.
    pub tokens: [u32; 2],
    /// Engine token rate.
    pub tokens_per_s: f64,
    /// Engine time to first token.
    pub ttft_ms: f64,
    /// Attempts per request before it fails (failures before the first byte are retried).
    pub max_attempts: u32,
}

/// Swarm ranges: in swarm mode each seed draws these uniformly.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Swarm {
    /// Loss range.
    pub loss: [f64; 2],
    /// Duplication range.
    pub duplicate: [f64; 2],
    /// Reordering range.
    pub reorder: [f64; 2],
    /// Number of random partitions.
    pub partitions: [u32; 2],
    /// Number of crashes.
    pub crashes: [u32; 2],
    /// Number of preemptions.
    pub preemptions: [u32; 2],
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            name: "unnamed".into(),
            description: String::new(),
            duration_s: 60.0,
            faults_until_s: 40.0,
            liveness_bound_s: 20.0,
            federation: Federation::default(),
            protocol: Protocol::default(),
            network: Network::default(),
            clock: Clock::default(),
            partition: Vec::new(),
            jobs: Jobs::default(),
            workload: Workload::default(),
            swarm: Swarm::default(),
            spin: Spin::default(),
            liar: crate::liar::LiarConfig::default(),
        }
    }
}

impl Default for Federation {
    fn default() -> Self {
        Federation {
            nodes: 100,
            gateways: 2,
            outbound_fraction: 0.2,
            models: vec!["llama-3.1-8b".into(), "qwen2.5-7b".into(), "mistral-7b".into()],
            models_per_node: 1,
            hardware: vec!["h100x4".into(), "a100-80x2".into(), "l40s".into(), "rtx4090".into()],
            join_spread_s: 5.0,
            formed: false,
        }
    }
}

impl Default for Protocol {
    fn default() -> Self {
        let m = tela_core::MembershipSettings::default();
        Protocol {
            drain_window_s: 120.0,
            eager_sends: m.eager_sends,
            answers_per_round: m.answers_per_round,
            protocol_period_ms: m.detector.protocol_period.as_millis() as u64,
        }
    }
}

impl Default for Network {
    fn default() -> Self {
        Network {
            sites: 4,
            intra_site_ms: 0.3,
            wan_ms: 15.0,
            jitter_ms: 2.0,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            nat_timeout_s: 30.0,
            idle_timeout_s: 5.0,
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock { max_offset_ms: 2_000.0, max_drift_ppm: 50.0 }
    }
}

impl Default for Partition {
    fn default() -> Self {
        Partition { start_s: 10.0, end_s: 20.0, sites: vec![0], one_way: false }
    }
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs {
            churn_fraction: 0.0,
            queue_wait_s: [5.0, 30.0],
            engine_startup_s: [1.0, 5.0],
            preemptions: 0,
            preempt_grace_s: 60.0,
            crashes: 0,
            crash_restart_s: [5.0, 20.0],
            gateway_crashes: 0,
        }
    }
}

impl Default for Workload {
    fn default() -> Self {
        Workload { rate_per_s: 10.0, tokens: [16, 256], tokens_per_s: 100.0, ttft_ms: 100.0, max_attempts: 3 }
    }
}

impl Default for Swarm {
    fn default() -> Self {
        Swarm {
            loss: [0.0, 0.05],
            duplicate: [0.0, 0.02],
            reorder: [0.0, 0.05],
            partitions: [0, 2],
            crashes: [0, 4],
            preemptions: [0, 4],
        }
    }
}

/// A scenario that cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Neither a path nor a known name.
    #[error("no scenario '{name}': not a file, and not one of {known:?} in {dir}")]
    NotFound {
        /// What was asked for.
        name: String,
        /// Named scenarios available.
        known: Vec<String>,
        /// Where they were looked for.
        dir: String,
    },
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown fields.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<toml::de::Error>,
    },
    /// The values make no sense together.
    #[error("scenario '{name}': {reason}")]
    Invalid {
        /// The scenario.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// Where named scenarios live.
pub fn scenario_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// Names of the scenarios in [`scenario_dir`], sorted.
pub fn known_scenarios() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(scenario_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.path().file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

impl Scenario {
    /// Loads a scenario by path, or by name from [`scenario_dir`].
    pub fn load(name_or_path: &str) -> Result<Scenario, ScenarioError> {
        let direct = PathBuf::from(name_or_path);
        let path = if direct.is_file() {
            direct
        } else {
            let p = scenario_dir().join(format!("{name_or_path}.toml"));
            if !p.is_file() {
                return Err(ScenarioError::NotFound {
                    name: name_or_path.into(),
                    known: known_scenarios(),
                    dir: scenario_dir().display().to_string(),
                });
            }
            p
        };
        let text =
            std::fs::read_to_string(&path).map_err(|source| ScenarioError::Read { path: path.clone(), source })?;
        let sc = Scenario::parse(&text).map_err(|e| match e {
            ScenarioError::Parse { source, .. } => ScenarioError::Parse { path: path.clone(), source },
            other => other,
        })?;
        Ok(sc)
    }

    /// Parses and validates scenario TOML.
    pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        let sc: Scenario = toml::from_str(text)
            .map_err(|e| ScenarioError::Parse { path: PathBuf::from("<text>"), source: Box::new(e) })?;
        sc.validate()?;
        Ok(sc)
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |reason: String| Err(ScenarioError::Invalid { name: self.name.clone(), reason });
        let f = &self.federation;
        if f.gateways == 0 {
            return bad("at least one gateway is needed".into());
        }
        if f.models.is_empty() || f.models_per_node == 0 {
            return bad("models and models_per_node must not be empty/zero".into());
        }
        for h in &f.hardware {
            if let Err(e) = tela_core::Hardware::from_profile(h) {
                return bad(e.to_string());
            }
        }
        if !(0.0..=1.0).contains(&f.outbound_fraction) {
            return bad("outbound_fraction must be within 0..=1".into());
        }
        if !(self.faults_until_s <= self.duration_s && self.duration_s > 0.0) {
            return bad("need 0 < faults_until_s <= duration_s".into());
        }
        let n = &self.network;
        for (name, p) in [("loss", n.loss), ("duplicate", n.duplicate), ("reorder", n.reorder)] {
            if !(0.0..1.0).contains(&p) {
                return bad(format!("network.{name} must be within 0..1"));
            }
        }
        if n.sites == 0 {
            return bad("network.sites must be at least 1".into());
        }
        for p in &self.partition {
            if p.end_s > self.faults_until_s || p.start_s >= p.end_s {
                return bad(format!(
                    "partition {}..{} s must start before it ends and heal by faults_until_s",
                    p.start_s, p.end_s
                ));
            }
            if let Some(s) = p.sites.iter().find(|s| **s >= n.sites) {
                return bad(format!("partition names site {s}, but there are only {} sites", n.sites));
            }
        }
        if self.workload.max_attempts == 0 {
            return bad("workload.max_attempts must be at least 1".into());
        }
        if self.protocol.eager_sends == 0 {
            return bad("protocol.eager_sends must be at least 1".into());
        }
        if self.protocol.answers_per_round == Some(0) {
            return bad("protocol.answers_per_round must be at least 1".into());
        }
        if self.protocol.protocol_period_ms < 2 {
            return bad("protocol.protocol_period_ms must be at least 2".into());
        }
        self.spin
            .validate(&self.workload)
            .map_err(|e| ScenarioError::Invalid { name: self.name.clone(), reason: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_scenario_loads() {
        let names = known_scenarios();
        for required in [
            "smoke-100",
            "loss-100",
            "lying-node",
            "federation-1k",
            "federation-1k-formed",
            "federation-10k",
            "partition-heal",
            "preemption-storm",
            "spinning-day",
        ] {
            assert!(names.iter().any(|n| n == required), "missing scenario {required}");
        }
        for n in names {
            Scenario::load(&n).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn eager_sends_is_set_and_the_removed_dissemination_key_is_refused() {
        let defaults = Scenario::parse("").expect("defaults");
        assert_eq!(defaults.protocol.eager_sends, tela_core::MembershipSettings::default().eager_sends);
        let s = Scenario::parse("[protocol]\neager_sends = 20").expect("eager_sends");
        assert_eq!(s.protocol.eager_sends, 20);
        let e = Scenario::parse("[protocol]\neager_sends = 0").unwrap_err();
        assert!(e.to_string().contains("eager_sends"), "{e}");
        assert_eq!(defaults.protocol.answers_per_round, None, "no answers budget unless set");
        let s = Scenario::parse("[protocol]\nanswers_per_round = 12").expect("answers_per_round");
        assert_eq!(s.protocol.answers_per_round, Some(12));
        let e = Scenario::parse("[protocol]\nanswers_per_round = 0").unwrap_err();
        assert!(e.to_string().contains("answers_per_round"), "{e}");
        let e = Scenario::parse("[protocol]\nprotocol_period_ms = 1").unwrap_err();
        assert!(e.to_string().contains("protocol_period_ms"), "{e}");
        // One membership protocol: the old switch and the old name of the setting are typos now.
        for removed in ["dissemination = \"swim\"", "swim_eager_sends = 2", "heartbeat_interval_ms = 1000"] {
            let e = Scenario::parse(&format!("[protocol]\n{removed}")).unwrap_err();
            let key = removed.split(' ').next().unwrap_or_default();
            assert!(e.to_string().contains("unknown field") && e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn typos_and_nonsense_are_errors() {
        let e = Scenario::parse("duration_s = 10\nfaults_until = 5").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let e = Scenario::parse("duration_s = 10\nfaults_until_s = 20").unwrap_err();
        assert!(e.to_string().contains("faults_until_s"), "{e}");
        let e = Scenario::parse("[federation]\nhardware = [\"tpu\"]").unwrap_err();
        assert!(e.to_string().contains("unknown hardware profile"), "{e}");
        let e = Scenario::load("no-such-scenario").unwrap_err();
        assert!(e.to_string().contains("smoke-100"), "{e}");
    }
}
