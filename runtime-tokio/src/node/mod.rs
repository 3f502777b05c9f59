//! `tela node`: a serving node next to an inference engine.
//!
//! [`run_node`] wires the pieces together and owns them until the node exits: the
//! [`Runtime`] (driver, connections to the `--join` addresses), the engine supervisor
//! ([`crate::engine::supervise`]), the engine's load reports to the gateways
//! ([`crate::engine::report_load`]), the tunnel handler ([`crate::forward`]), the control
//! socket ([`crate::control`]), and the signals that drain it.

mod config;

pub use config::{NodeArgs, NodeConfigError, NodeSettings};

use crate::clock::generation_now;
use crate::control::{ControlServer, ControlSocketError};
use crate::engine::{report_load, supervise, Backend, EngineConfig, EngineTraffic, LoadConfig};
use crate::forward::{tunnel_handler, ForwardConfig};
use crate::gpu;
use crate::identity::load_identity;
use crate::runtime::{Exit, Runtime, RuntimeConfig};
use crate::signals::{NodeSignal, NodeSignals};
use crate::walltime::{slurm_time_left, WalltimeSource};
use std::time::Duration;
use tela_core::ProfileError;
use tela_core::{Config, Reachability, Role};
use tela_transports::{Endpoint, EndpointConfig, EndpointError, IdentityError};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

/// Why `tela node` could not run.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A setting is missing or wrong.
    #[error(transparent)]
    Config(#[from] NodeConfigError),
    /// The identity key could not be loaded or created.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The hardware profile is unknown.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The dialling endpoint could not be set up.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The control socket could not be opened.
    #[error(transparent)]
    Control(#[from] ControlSocketError),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// `--print-free-port` found every port it tried taken.
    #[error("no free TCP port among the {FREE_PORT_TRIES} from {0}")]
    NoFreePort(u16),
}

/// How many ports `--print-free-port` tries.
const FREE_PORT_TRIES: u16 = 1000;

/// The first port from `from` upward (at most [`FREE_PORT_TRIES`]) that a listener on every
/// IPv4 address could bind: one that another process listens on, on any address, is taken.
fn first_free_port(from: u16) -> Option<u16> {
    (0..FREE_PORT_TRIES)
        .map_while(|k| from.checked_add(k))
        .filter(|&p| p != 0)
        .find(|&p| std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, p)).is_ok())
}

/// Exit status when a second Ctrl-C stopped the node without finishing its drain.
pub const EXIT_INTERRUPTED: i32 = 130;

/// Exit status when every `--join` address refused the node for a reason retrying cannot fix
/// (`EX_CONFIG`: a setting must change first).
pub const EXIT_REFUSED: i32 = 78;

impl NodeArgs {
    /// Runs the node until it has left; returns the process exit status (0 after a drain).
    pub async fn run(self) -> Result<i32, NodeError> {
        if self.print_id {
            // Before resolving the rest: a job script asks for the id before it has a gateway.
            let identity = load_identity(self.identity_path()?.as_deref(), "identity.key")?;
            println!("{}", identity.node_id().to_hex());
            return Ok(0);
        }
        if let Some(from) = self.print_free_port {
            let port = first_free_port(from).ok_or(NodeError::NoFreePort(from))?;
            println!("{port}");
            return Ok(0);
        }
        if self.print_hardware {
            // Likewise: a job script checks what its node would announce before anything else.
            print!("{}", gpu::discover(&self.hardware_profile()?)?);
            return Ok(0);
        }
        run_node(self.resolve()?).await
    }
}

/// Runs a node with checked settings; see the module docs.
pub async fn run_node(settings: NodeSettings) -> Result<i32, NodeError> {
    // First, so that a signal arriving during start-up already drains instead of killing.
    let mut signals = NodeSignals::install().map_err(NodeError::Signals)?;
    let identity = load_identity(settings.identity.as_deref(), "identity.key")?;
    let discovery = gpu::discover(&settings.hardware_profile)?;
    tracing::info!("{}", discovery.to_string().trim_end().replace('\n', "; "));
    let backend = Backend::new(&settings.backend_url).map_err(NodeConfigError::from)?;

    // Records are signed with the identity key, whose hash is the node id peers check.
    let mut core = Config::with_identity(identity.signer().clone(), generation_now());
    core.role = Role::Serving;
    core.reach = Reachability::OutboundOnly;
    core.hardware = discovery.hardware.clone();
    core.drain_window = settings.drain_window;
    let mut config = RuntimeConfig::new(core);
    config.join = settings.join.clone();
    config.transport = settings.transport;
    config.path = settings.path.clone();
    config.exit_when_refused = true;

    let endpoint = Endpoint::dialer(EndpointConfig::new(identity, settings.join_secret.clone()))?;
    let forward = ForwardConfig { idle_timeout: settings.stream_idle_timeout, ..ForwardConfig::default() };
    // What the tunnel handler forwards to the engine, read by the supervisor's probes.
    let traffic = EngineTraffic::new();
    let mut runtime = Runtime::start(config, endpoint, tunnel_handler(backend.clone(), forward, traffic.clone()));
    tracing::info!(
        "joining via {} over {} {}; engine at {}",
        settings.join.join(", "),
        settings.transport,
        settings.path,
        settings.backend_url
    );
    let _control = ControlServer::start(&settings.control, &runtime)?;
    let inputs = runtime.inputs();

    let mut drain_starts = None;
    match walltime(&settings).await {
        Some((left, source)) => {
            let drain_in = left.saturating_sub(settings.drain_window);
            tracing::info!(
                "walltime in {} (from {source:?}); draining starts in {}, handing over {} before",
                humantime::format_duration(round(left)),
                humantime::format_duration(round(drain_in)),
                humantime::format_duration(settings.handover_window)
            );
            let now = Instant::now();
            drain_starts = Some(now + drain_in);
            let _ = inputs.walltime(now + left).await;
        }
        None => tracing::info!("no walltime: the node drains on SIGTERM, SIGUSR1 or `tela drain`"),
    }

    let engine_config = EngineConfig {
        command: settings.engine_cmd.clone(),
        probe_interval: settings.probe_interval,
        models_override: settings.models.clone().filter(|m| !m.is_empty()),
        stop_grace: settings.engine_stop_grace,
        ..EngineConfig::default()
    };
    let stop_engine = runtime.stop_engine();
    let load = LoadConfig {
        interval: settings.load_interval,
        drain_starts: drain_starts.filter(|_| !settings.handover_window.is_zero()),
        handover_window: settings.handover_window,
        slots: settings.engine_slots,
        ..LoadConfig::default()
    };
    let _load_reports =
        AbortOnDropHandle::new(tokio::spawn(report_load(backend.clone(), load, runtime.view(), stop_engine.clone())));
    let mut engine = AbortOnDropHandle::new(tokio::spawn(supervise(
        backend,
        engine_config,
        traffic,
        inputs.clone(),
        stop_engine.clone(),
    )));

    let mut interrupted = false;
    let exit = loop {
        tokio::select! {
            exit = runtime.wait() => break exit,
            signal = signals.next() => match signal {
                NodeSignal::Interrupt if interrupted => {
                    tracing::warn!("second Ctrl-C: stopping now, without waiting for in-flight requests");
                    let _ = inputs.shutdown().await;
                }
                s => {
                    interrupted |= s == NodeSignal::Interrupt;
                    tracing::info!(
                        "{} received: draining (no new requests; in-flight requests finish; then exit){}",
                        match s {
                            NodeSignal::Terminate => "SIGTERM",
                            NodeSignal::User1 => "SIGUSR1",
                            NodeSignal::Interrupt => "Ctrl-C",
                        },
                        if s == NodeSignal::Interrupt { " — Ctrl-C again to stop at once" } else { "" }
                    );
                    let _ = inputs.drain().await;
                }
            }
        }
    };
    // The core asked to stop the engine when it left; after a shutdown, do it here.
    stop_engine.cancel();
    let bound = settings.engine_stop_grace + Duration::from_secs(10);
    if tokio::time::timeout(bound, &mut engine).await.is_err() {
        tracing::warn!("the engine supervisor did not finish within {bound:?}");
    }
    Ok(match exit {
        Exit::Left => {
            tracing::info!("node left the federation; exiting");
            0
        }
        Exit::Shutdown => EXIT_INTERRUPTED,
        Exit::Crashed => 1,
        Exit::Refused => EXIT_REFUSED,
    })
}

/// The time left in the allocation, from `--walltime` or Slurm.
async fn walltime(settings: &NodeSettings) -> Option<(Duration, WalltimeSource)> {
    if let Some(w) = settings.walltime {
        return Some((w, WalltimeSource::Flag));
    }
    let job = std::env::var("SLURM_JOB_ID").ok().filter(|j| !j.is_empty())?;
    match slurm_time_left(&job).await {
        Ok((Some(left), source)) => Some((left, source)),
        Ok((None, _)) => {
            tracing::info!("Slurm job {job} has no time limit");
            None
        }
        Err(e) => {
            tracing::warn!("cannot read the walltime of Slurm job {job}: {e}; pass --walltime, or rely on #SBATCH --signal=B:USR1@<drain window>");
            None
        }
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::first_free_port;
    use std::net::{Ipv4Addr, TcpListener};

    #[test]
    fn a_port_another_process_listens_on_is_skipped() {
        // A listener on loopback only still takes the port for an engine on every address.
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
        let port = taken.local_addr().expect("has an address").port();
        let free = first_free_port(port).expect("a free port");
        assert_ne!(free, port);
        assert!(free > port);
        drop(taken);
        assert_eq!(first_free_port(port), Some(port), "free again once the listener is gone");
    }

    #[test]
    fn the_search_stops_at_the_last_port() {
        assert!(matches!(first_free_port(u16::MAX), None | Some(u16::MAX)));
    }
}
