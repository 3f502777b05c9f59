//! The engine next to a serving node: probing its readiness, launching and supervising it.
//!
//! [`supervise`] is the one task that decides what the core hears about the engine:
//!
//! - it probes [`Backend::probe`] every `probe_interval`; the first success feeds
//!   `EngineReady` with the models from `/v1/models` (or the `--models` override), and so
//!   does any later change of the model list;
//! - `failures_before_down` consecutive failures of a ready engine, or the launched process
//!   exiting, feed `EngineFailed` with a log line naming the backend and the error;
//! - a probe that times out while the engine is busy answering this node's requests — bytes
//!   arriving for requests in flight, or requests completed, since the probe before
//!   ([`EngineTraffic`], written by the tunnel handler) — is no failure: an engine that
//!   serves one request at a time (llama-cpp-python) queues the probe behind a long
//!   generation, and is evidently alive. Only timeouts with nothing flowing count, and a
//!   refused connection or an error status always does, so a dead engine still goes DOWN
//!   after `failures_before_down` probes ([`health::judge`] decides);
//! - a launched engine that exited is started again with backoff; once it answers again the
//!   core starts a new generation (a DOWN record cannot come back within its generation);
//! - when the core asks to stop the engine (the node has LEFT) it stops a launched engine
//!   with SIGTERM, then SIGKILL after the grace, and ends.
//!
//! Beside it, [`report_load`] reads the engine's own load from its `/metrics` ([`metrics`])
//! and pushes it to the gateways as load reports ([`crate::load_report`]).

mod backend;
pub mod health;
mod load;
pub mod metrics;
mod process;
mod traffic;

pub use backend::{
    error_chain, guess_quantization, parse_models, Backend, BackendUrlError, BodyError, EngineBody, ModelListError,
    ProbeError,
};
pub use load::{report_load, LoadConfig, DEFAULT_HANDOVER_WINDOW};
pub use process::EngineProcess;
pub use traffic::{EngineRequest, EngineTraffic, Flow, TrafficMark};

use crate::backoff::Backoff;
use crate::runtime::LocalInputs;
use health::{judge, ProbeOutcome, Verdict};
use std::time::Duration;
use tela_core::Model;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How [`supervise`] watches the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The command to launch (`sh -c`), or `None` to attach to a running engine.
    pub command: Option<String>,
    /// Time between probes.
    pub probe_interval: Duration,
    /// The longest one probe may take.
    pub probe_timeout: Duration,
    /// Consecutive failed probes before a ready engine counts as failed.
    pub failures_before_down: u32,
    /// Announce these model names instead of those from `/v1/models`.
    pub models_override: Option<Vec<String>>,
    /// Between SIGTERM and SIGKILL when stopping a launched engine.
    pub stop_grace: Duration,
    /// First delay before relaunching an engine that exited (doubling up to a minute).
    pub restart_delay: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            command: None,
            probe_interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(5),
            failures_before_down: 3,
            models_override: None,
            stop_grace: Duration::from_secs(15),
            restart_delay: Duration::from_secs(2),
        }
    }
}

/// Probes (and, with a command, launches and relaunches) the engine and tells the core;
/// returns once `stop` is cancelled and a launched engine has been stopped. `traffic` is
/// what the tunnel handler forwards to the engine, which excuses probes that time out while
/// the engine is busy answering it.
pub async fn supervise(
    backend: Backend,
    config: EngineConfig,
    traffic: EngineTraffic,
    inputs: LocalInputs,
    stop: CancellationToken,
) {
    let mut process: Option<EngineProcess> = None;
    let mut relaunch_at = Some(Instant::now());
    let mut restarts = Backoff::new(config.restart_delay, Duration::from_secs(60));
    let mut ready: Option<Vec<Model>> = None;
    let mut failures = 0u32;
    let mut busy = false;
    let mut since_last_probe = traffic.mark();
    let mut waiting_logged = 0u32;
    let mut probe = tokio::time::interval(config.probe_interval);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if config.command.is_none() {
        relaunch_at = None;
        tracing::info!("attaching to the engine at {}", backend.url());
    }
    loop {
        tokio::select! {
            () = stop.cancelled() => {
                if let Some(p) = process.take() {
                    tracing::info!("stopping the engine (pid {})", p.pid().unwrap_or(0));
                    p.stop(config.stop_grace).await;
                }
                return;
            }
            status = wait_exit(&mut process) => {
                let pid = process.as_ref().and_then(EngineProcess::pid).unwrap_or(0);
                process = None;
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                let delay = restarts.next_delay();
                tracing::error!(
                    "the engine process (pid {pid}) exited ({status}); the node is DOWN until it answers again — relaunching in {delay:?}"
                );
                ready = None;
                failures = 0;
                let _ = inputs.engine_failed().await;
                relaunch_at = Some(Instant::now() + delay);
            }
            () = sleep_until(relaunch_at), if process.is_none() && relaunch_at.is_some() => {
                relaunch_at = None;
                if let Some(cmd) = &config.command {
                    if backend.is_listened_on().await {
                        // The engine could not listen there, and the probes would reach the
                        // other process: the node would serve through an engine not its own.
                        let delay = restarts.next_delay();
                        tracing::error!(
                            "not launching the engine: another process already listens on {}, where the engine must listen (another job's engine on this host? give this node's engine a port of its own) — trying again in {delay:?}",
                            backend.host_port()
                        );
                        relaunch_at = Some(Instant::now() + delay);
                        continue;
                    }
                    match EngineProcess::spawn(cmd) {
                        Ok(p) => process = Some(p),
                        Err(e) => {
                            let delay = restarts.next_delay();
                            tracing::error!("cannot launch the engine `{cmd}`: {e} — retrying in {delay:?}");
                            relaunch_at = Some(Instant::now() + delay);
                        }
                    }
                }
            }
            _ = probe.tick() => {
                if config.command.is_some() && process.is_none() {
                    continue; // nothing to probe until it is relaunched
                }
                let probed = backend.probe(config.probe_timeout).await;
                let flow = traffic.since(since_last_probe);
                since_last_probe = traffic.mark();
                if ready.is_some() {
                    match judge(ProbeOutcome::of(&probed), flow, failures) {
                        Verdict::Healthy => busy = false,
                        Verdict::Busy => {
                            if !busy {
                                tracing::info!(
                                    "the engine at {} is too busy to answer probes within {:?}, but it is answering {} request(s) in flight ({} completed since the last probe); not counting that as a failure",
                                    backend.url(),
                                    config.probe_timeout,
                                    flow.in_flight,
                                    flow.completed
                                );
                            }
                            busy = true;
                            failures = 0;
                            continue;
                        }
                        Verdict::Failing(n) => {
                            busy = false;
                            failures = n;
                        }
                    }
                }
                match probed {
                    Ok(found) => {
                        failures = 0;
                        let models = match &config.models_override {
                            Some(names) => names.iter().map(|n| Model { name: n.clone(), quant: guess_quantization(n) }).collect(),
                            None => found,
                        };
                        if ready.as_ref() != Some(&models) {
                            let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
                            tracing::info!("the engine at {} is ready, serving {}", backend.url(), names.join(", "));
                            if config.command.is_some() {
                                restarts.reset();
                            }
                            let _ = inputs.engine_ready(models.clone()).await;
                            ready = Some(models);
                        }
                        waiting_logged = 0;
                    }
                    Err(e) if ready.is_some() => {
                        if failures >= config.failures_before_down {
                            tracing::error!(
                                "the engine at {} failed {failures} probes in a row ({e}); the node is DOWN until it answers again",
                                backend.url()
                            );
                            ready = None;
                            let _ = inputs.engine_failed().await;
                        } else {
                            tracing::warn!("probe {failures} of the engine at {} failed: {e}", backend.url());
                        }
                    }
                    Err(e) => {
                        // Not ready yet (loading weights) or never was: say so now and then.
                        if waiting_logged % 15 == 0 {
                            tracing::info!("waiting for the engine at {}: {e}", backend.url());
                        }
                        waiting_logged += 1;
                    }
                }
            }
        }
    }
}

async fn wait_exit(process: &mut Option<EngineProcess>) -> std::io::Result<std::process::ExitStatus> {
    match process {
        Some(p) => p.wait().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
