//! `tela node`'s settings: flags, `TELA_*` environment variables, a TOML file and defaults,
//! in that order of precedence, checked into [`NodeSettings`] with errors that say what to fix.

use crate::control::default_control_path;
use crate::identity::{read_secret, SecretError};
use crate::join::JoinArgs;
use crate::path::DialPath;
use crate::ssh::SshVia;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tela_core::Hardware;
use tela_core::ProfileError;
use tela_core::{MAX_MODELS, MAX_MODEL_NAME};
use tela_transports::{JoinSecret, TransportMode};

/// The longest `--load-interval`: gateways judge reports older than a few seconds stale.
const MAX_LOAD_INTERVAL: Duration = Duration::from_secs(1);

const AFTER_HELP: &str = "\
SETTINGS
  Every flag has a TELA_* environment variable (shown with each flag) and a key of the same
  name with underscores in the --config TOML file (join = [\"gw:7000\"], drain_window = \"10m\").
  Flags win over the environment, which wins over the file, which wins over the defaults.

LIFECYCLE
  JOIN at start; SERVE once the engine answers GET /health (or, where there is none, as on the
  llama.cpp server, GET /v1/models) and its models are known; DOWN when draining or when the
  engine fails; LEFT when in-flight requests are done (or the drain window has passed); then
  the engine is stopped (if the node launched it) and the process exits 0. A node counts as
  SERVE in its log only once a gateway has admitted it.

  Exit status: 0 after a drain; 78 when every --join address refused the node three times in
  a row for a reason retrying cannot fix (wrong join secret or another release: the error
  line says which); 130 after a second Ctrl-C; 1 on an internal failure.
  Unreachable or overloaded gateways are redialled for as long as the node runs.

  Draining starts on SIGTERM, SIGUSR1, Ctrl-C, `tela drain`, or one drain window before the
  walltime: --walltime, else inside a Slurm job the job's remaining time (SLURM_JOB_END_TIME,
  squeue, scontrol). One --handover-window before that drain the node hands over: still
  SERVE, it tells the gateways it is leaving, and they send the next turns of its
  conversations to the nodes those will stay on, so each moves once, before the node is gone.

SLURM
  Start the engine and `tela node` in one batch job and have Slurm warn the batch shell
  before the time limit, at least a drain window ahead:

      #SBATCH --time=04:00:00
      #SBATCH --signal=B:USR1@960          # 16 min: the 15 min drain window + slack
      tela node --join gw.example.org:7000 \\
          --engine-cmd 'vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000' &
      wait

  With `B:` the signal goes to the batch shell only: run `tela node` in it (not under srun)
  or forward the signal with a trap. Slurm checks limits every 30 s, so signals come up to
  ~30 s late. The node needs no inbound port and no root: it dials out over QUIC, or
  TCP+TLS where UDP is blocked (--transport tcp, or auto).

  Compute nodes that can reach only the login host: --via-ssh user@login carries the tunnel
  over your own ssh (`ssh -W gateway:port`; your keys, agent, ~/.ssh/config and ControlMaster
  apply; it must log in without a prompt), or --relay login:7100 uses a `tela relay` running
  there. Either way the TLS session runs end to end with the gateway.

  A complete example: runtime-tokio/examples/slurm-node.sbatch in the Tela repository.";

/// Run a serving node next to an inference engine: it probes (or launches) the engine, dials
/// out to the federation's gateways and anchors, announces its models and GPUs, serves the
/// requests they tunnel to it, and drains before its walltime.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct NodeArgs {
    /// TOML file with settings (flags and TELA_* variables override it).
    #[arg(long, env = "TELA_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// The federation, as every role joins it: --join-secret, --join-secret-file, --join,
    /// --transport and --identity.
    #[command(flatten)]
    pub federation: JoinArgs,

    /// Reach the gateways through this login host's ssh (`ssh -W gateway:port`), for compute
    /// nodes whose only way out is the login host; carries TCP+TLS.
    #[arg(long, env = "TELA_VIA_SSH", value_name = "[USER@]HOST", conflicts_with = "relay")]
    pub via_ssh: Option<String>,

    /// The ssh client for --via-ssh, as a shell command line (`ssh -p 2222 -i ~/.ssh/key`)
    /// [default: ssh].
    #[arg(long, env = "TELA_SSH_COMMAND", value_name = "COMMAND")]
    pub ssh_command: Option<String>,

    /// Reach the gateways through a `tela relay` (host:port); repeat for several, the first
    /// that answers carries each tunnel; carries TCP+TLS.
    #[arg(long, env = "TELA_RELAY", value_delimiter = ',', value_name = "HOST:PORT")]
    pub relay: Vec<String>,

    /// The engine's OpenAI-compatible base URL [default: http://127.0.0.1:8000].
    #[arg(long, env = "TELA_BACKEND_URL", value_name = "URL")]
    pub backend_url: Option<String>,

    /// Launch the engine with this shell command and supervise it (stopped when the node
    /// leaves; relaunched if it dies). Without it, the node attaches to --backend-url.
    #[arg(long, env = "TELA_ENGINE_CMD", value_name = "COMMAND")]
    pub engine_cmd: Option<String>,

    /// How long before the walltime draining starts, and the longest a drain may take
    /// (e.g. 15m, 90s) [default: 15m].
    #[arg(long, env = "TELA_DRAIN_WINDOW", value_name = "DURATION")]
    pub drain_window: Option<String>,

    /// Time until the allocation ends (e.g. 2h, 3h30m); inside a Slurm job it is read from
    /// Slurm when not given.
    #[arg(long, env = "TELA_WALLTIME", value_name = "DURATION")]
    pub walltime: Option<String>,

    /// How long before the walltime's drain the node hands over: gateways send its
    /// conversations' next turns to the nodes they will stay on, while it finishes what it
    /// serves; 0s turns it off [default: 5m].
    #[arg(long, env = "TELA_HANDOVER_WINDOW", value_name = "DURATION")]
    pub handover_window: Option<String>,

    /// Hardware to announce when no NVIDIA driver is found: cpu, gh200x4, a100-80x2,
    /// rtx4090, ... [default: cpu].
    #[arg(long, env = "TELA_HARDWARE_PROFILE", value_name = "PROFILE")]
    pub hardware_profile: Option<String>,

    /// Announce these model names instead of the engine's /v1/models (comma-separated).
    #[arg(long, env = "TELA_MODELS", value_delimiter = ',', value_name = "NAME")]
    pub models: Vec<String>,

    /// Local control socket for `tela drain` and `tela status`
    /// [default: $XDG_RUNTIME_DIR/tela/node[-$SLURM_JOB_ID].sock].
    #[arg(long, env = "TELA_CONTROL", value_name = "PATH")]
    pub control: Option<PathBuf>,

    /// Time between engine health probes [default: 2s].
    #[arg(long, env = "TELA_PROBE_INTERVAL", value_name = "DURATION")]
    pub probe_interval: Option<String>,

    /// Time between reads of the engine's /metrics, whose load (running and waiting requests,
    /// KV-cache usage) is pushed to the gateways for routing; at most 1s [default: 500ms].
    #[arg(long, env = "TELA_LOAD_INTERVAL", value_name = "DURATION")]
    pub load_interval: Option<String>,

    /// Requests the engine runs at once (a llama.cpp server's --parallel, vLLM's
    /// --max-num-seqs): told to the gateways, which then send a conversation to an engine with
    /// a free slot rather than queue it behind another (worth it where answers take longer
    /// than recomputing a prompt); an engine without /metrics is then reported by this node's
    /// own count of requests in flight [default: unknown].
    #[arg(long, env = "TELA_ENGINE_SLOTS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub engine_slots: Option<u32>,

    /// End a tunnelled request when the engine sends nothing for this long (there is no
    /// limit on a request's total time) [default: 5m].
    #[arg(long, env = "TELA_STREAM_IDLE_TIMEOUT", value_name = "DURATION")]
    pub stream_idle_timeout: Option<String>,

    /// Between SIGTERM and SIGKILL when stopping a launched engine [default: 15s].
    #[arg(long, env = "TELA_ENGINE_STOP_GRACE", value_name = "DURATION")]
    pub engine_stop_grace: Option<String>,

    /// Print the hardware this node would announce (GPU discovery or the profile) and exit.
    #[arg(long)]
    pub print_hardware: bool,

    /// Print this node's id (32 hex digits) from its identity key, creating the key if there
    /// is none, and exit. Job scripts use it to name the node in the job's comment.
    #[arg(long)]
    pub print_id: bool,

    /// Print the first TCP port from PORT upward (at most 1,000 tried) on which nothing
    /// listens, and exit. Job scripts use it to give the engine a port no other job or
    /// service on the host holds.
    #[arg(long, value_name = "PORT")]
    pub print_free_port: Option<u16>,
}

/// The `--config` file: the same settings as the flags, with underscores.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    join: Option<Vec<String>>,
    join_secret: Option<String>,
    join_secret_file: Option<PathBuf>,
    transport: Option<String>,
    via_ssh: Option<String>,
    ssh_command: Option<String>,
    relay: Option<Vec<String>>,
    identity: Option<PathBuf>,
    backend_url: Option<String>,
    engine_cmd: Option<String>,
    drain_window: Option<String>,
    walltime: Option<String>,
    handover_window: Option<String>,
    hardware_profile: Option<String>,
    models: Option<Vec<String>>,
    control: Option<PathBuf>,
    probe_interval: Option<String>,
    load_interval: Option<String>,
    engine_slots: Option<u32>,
    stream_idle_timeout: Option<String>,
    engine_stop_grace: Option<String>,
}

/// Settings checked and with defaults applied.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// Gateways and anchors to dial.
    pub join: Vec<String>,
    /// The federation's secret.
    pub join_secret: JoinSecret,
    /// Transport for dials.
    pub transport: TransportMode,
    /// How dials reach the gateways (directly, through ssh, through relays).
    pub path: DialPath,
    /// Identity key file (`None`: the default location).
    pub identity: Option<PathBuf>,
    /// The engine's base URL.
    pub backend_url: String,
    /// The command that launches the engine, if the node launches it.
    pub engine_cmd: Option<String>,
    /// Drain window.
    pub drain_window: Duration,
    /// Time until the allocation ends, if given.
    pub walltime: Option<Duration>,
    /// Handover window (zero: none).
    pub handover_window: Duration,
    /// Fallback hardware profile (validated).
    pub hardware_profile: String,
    /// Model names announced instead of the engine's.
    pub models: Option<Vec<String>>,
    /// Control socket.
    pub control: PathBuf,
    /// Probe interval.
    pub probe_interval: Duration,
    /// Time between reads of the engine's load.
    pub load_interval: Duration,
    /// Requests the engine runs at once, if told.
    pub engine_slots: Option<u32>,
    /// Stream idle timeout.
    pub stream_idle_timeout: Duration,
    /// Engine stop grace.
    pub engine_stop_grace: Duration,
}

/// A setting is missing or wrong; the message says which and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    /// The config file could not be read.
    #[error("cannot read the config file {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for these settings.
    #[error("config file {path}: {detail}")]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the key).
        detail: String,
    },
    /// No join address.
    #[error(
        "no gateway to join: give at least one --join HOST:PORT (or TELA_JOIN, or join = [...] in the config file)"
    )]
    NoJoin,
    /// A join address is not `host:port`.
    #[error("--join '{0}' is not HOST:PORT (e.g. gw.example.org:7000 or 10.0.0.5:7000)")]
    BadJoin(String),
    /// The secret is missing or unusable.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// Unknown transport.
    #[error("--transport '{0}' is not one of auto, quic, tcp")]
    BadTransport(String),
    /// A relay address is not `host:port`.
    #[error("--relay '{0}' is not HOST:PORT (e.g. login1.cluster:7100)")]
    BadRelay(String),
    /// Two paths at once, or QUIC over a path that carries only TCP.
    #[error("{0}")]
    BadPath(String),
    /// A duration does not parse.
    #[error("--{flag} '{value}' is not a duration ({detail}); use e.g. 90s, 15m, 2h, 1h30m")]
    BadDuration {
        /// The setting.
        flag: &'static str,
        /// What was given.
        value: String,
        /// The parser's complaint.
        detail: String,
    },
    /// A duration that must be positive is zero.
    #[error("--{0} must be longer than zero")]
    ZeroDuration(&'static str),
    /// Load read too rarely for gateways to route by it.
    #[error("--load-interval {0:?} is longer than 1s: gateways ignore load reports older than a few seconds")]
    LoadIntervalTooLong(Duration),
    /// An engine that runs no request at once.
    #[error("engine_slots = 0: an engine runs at least one request at once (leave it out if unknown)")]
    NoSlots,
    /// Unknown hardware profile.
    #[error("--hardware-profile: {0}")]
    Profile(#[from] ProfileError),
    /// A model override is unusable.
    #[error("--models: {0}")]
    BadModels(String),
    /// The backend URL is unusable.
    #[error(transparent)]
    Backend(#[from] crate::engine::BackendUrlError),
}

impl NodeArgs {
    /// The identity key file from the flag, `TELA_IDENTITY` or the config file (`None`: the
    /// default location); needs no other setting.
    pub fn identity_path(&self) -> Result<Option<PathBuf>, NodeConfigError> {
        if self.federation.identity.is_some() {
            return Ok(self.federation.identity.clone());
        }
        match &self.config {
            Some(path) => Ok(read_file(path)?.identity),
            None => Ok(None),
        }
    }

    /// The hardware profile from the flag, `TELA_HARDWARE_PROFILE` or the config file (`cpu`
    /// when none names one), checked; needs no other setting, so that `--print-hardware`
    /// works before a job script knows its gateway.
    pub fn hardware_profile(&self) -> Result<String, NodeConfigError> {
        let from_file = match (&self.hardware_profile, &self.config) {
            (None, Some(path)) => read_file(path)?.hardware_profile,
            _ => None,
        };
        profile_or_default(&self.hardware_profile, from_file)
    }

    /// Applies the config file (if any) and defaults, and checks everything.
    pub fn resolve(&self) -> Result<NodeSettings, NodeConfigError> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let federation = &self.federation;
        let join = if federation.join.is_empty() { file.join.unwrap_or_default() } else { federation.join.clone() };
        let join: Vec<String> = join.into_iter().map(|j| j.trim().to_string()).filter(|j| !j.is_empty()).collect();
        if join.is_empty() {
            return Err(NodeConfigError::NoJoin);
        }
        for j in &join {
            check_join(j)?;
        }
        let (secret, secret_file) = match (&federation.join_secret, &federation.join_secret_file) {
            (None, None) => (file.join_secret, file.join_secret_file),
            (s, f) => (s.clone(), f.clone()),
        };
        let join_secret = read_secret(secret.as_deref(), secret_file.as_deref())?;
        // A bad --transport or TELA_TRANSPORT is refused when the flags are parsed.
        let mut transport = match (federation.transport, file.transport) {
            (Some(flag), _) => flag,
            (None, Some(t)) => t.parse().map_err(|_| NodeConfigError::BadTransport(t.clone()))?,
            (None, None) => TransportMode::Auto,
        };
        let path = dial_path(
            pick(&self.via_ssh, file.via_ssh),
            pick(&self.ssh_command, file.ssh_command),
            if self.relay.is_empty() { file.relay.unwrap_or_default() } else { self.relay.clone() },
        )?;
        if !path.carries(transport) {
            return Err(NodeConfigError::BadPath(format!(
                "--transport quic cannot go {path}: ssh and relays carry TCP+TLS only (use --transport tcp or auto)"
            )));
        }
        if path != DialPath::Direct {
            transport = TransportMode::Tcp;
        }
        let backend_url = pick(&self.backend_url, file.backend_url).unwrap_or_else(|| "http://127.0.0.1:8000".into());
        crate::engine::Backend::new(&backend_url)?;
        let engine_cmd = pick(&self.engine_cmd, file.engine_cmd).filter(|c| !c.trim().is_empty());
        let hardware_profile = profile_or_default(&self.hardware_profile, file.hardware_profile)?;
        let models = if self.models.is_empty() { file.models } else { Some(self.models.clone()) };
        if let Some(models) = &models {
            check_models(models)?;
        }
        let duration = |flag: &'static str, given: &Option<String>, from_file: Option<String>, default: &str| {
            let value = pick(given, from_file).unwrap_or_else(|| default.to_string());
            parse_duration(flag, &value)
        };
        let walltime = match pick(&self.walltime, file.walltime) {
            Some(w) => Some(parse_duration("walltime", &w)?),
            None => None,
        };
        let handover_window = match pick(&self.handover_window, file.handover_window) {
            Some(w) if humantime::parse_duration(w.trim()).is_ok_and(|d| d.is_zero()) => Duration::ZERO,
            Some(w) => parse_duration("handover-window", &w)?,
            None => crate::engine::DEFAULT_HANDOVER_WINDOW,
        };
        let load_interval = duration("load-interval", &self.load_interval, file.load_interval, "500ms")?;
        if load_interval > MAX_LOAD_INTERVAL {
            return Err(NodeConfigError::LoadIntervalTooLong(load_interval));
        }
        let engine_slots = pick(&self.engine_slots, file.engine_slots);
        if engine_slots == Some(0) {
            return Err(NodeConfigError::NoSlots);
        }
        Ok(NodeSettings {
            join,
            join_secret,
            transport,
            path,
            identity: pick(&federation.identity, file.identity),
            backend_url,
            engine_cmd,
            drain_window: duration("drain-window", &self.drain_window, file.drain_window, "15m")?,
            walltime,
            handover_window,
            hardware_profile,
            models: models.map(|m| m.into_iter().map(|s| s.trim().to_string()).collect()),
            control: pick(&self.control, file.control).unwrap_or_else(default_control_path),
            probe_interval: duration("probe-interval", &self.probe_interval, file.probe_interval, "2s")?,
            load_interval,
            engine_slots,
            stream_idle_timeout: duration(
                "stream-idle-timeout",
                &self.stream_idle_timeout,
                file.stream_idle_timeout,
                "5m",
            )?,
            engine_stop_grace: duration("engine-stop-grace", &self.engine_stop_grace, file.engine_stop_grace, "15s")?,
        })
    }
}

fn pick<T: Clone>(flag_or_env: &Option<T>, file: Option<T>) -> Option<T> {
    flag_or_env.clone().or(file)
}

/// The hardware profile from the flag (or its variable), else the file, else `cpu`; checked.
fn profile_or_default(flag_or_env: &Option<String>, file: Option<String>) -> Result<String, NodeConfigError> {
    let profile = pick(flag_or_env, file).unwrap_or_else(|| "cpu".into());
    Hardware::from_profile(&profile)?;
    Ok(profile)
}

fn read_file(path: &Path) -> Result<FileConfig, NodeConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| NodeConfigError::ReadFile { path: path.to_path_buf(), source })?;
    toml::from_str(&text)
        .map_err(|e| NodeConfigError::ParseFile { path: path.to_path_buf(), detail: e.to_string().trim().to_string() })
}

fn check_join(j: &str) -> Result<(), NodeConfigError> {
    let bad = || NodeConfigError::BadJoin(j.to_string());
    let (host, port) = j.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(())
}

/// The dial path from `--via-ssh`, `--ssh-command` and `--relay`, checked.
fn dial_path(
    via_ssh: Option<String>,
    ssh_command: Option<String>,
    relays: Vec<String>,
) -> Result<DialPath, NodeConfigError> {
    let via_ssh = via_ssh.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let relays: Vec<String> = relays.into_iter().map(|r| r.trim().to_string()).filter(|r| !r.is_empty()).collect();
    let ssh_command = ssh_command.map(|c| c.trim().to_string()).filter(|c| !c.is_empty());
    match (via_ssh, relays.is_empty()) {
        (Some(_), false) => Err(NodeConfigError::BadPath(
            "--via-ssh and --relay both given: a node reaches its gateways one way; pick one".into(),
        )),
        (Some(destination), true) => {
            if destination.starts_with('-') || destination.contains(char::is_whitespace) {
                return Err(NodeConfigError::BadPath(format!(
                    "--via-ssh '{destination}' is not [USER@]HOST (put ssh options in --ssh-command)"
                )));
            }
            Ok(DialPath::Ssh(SshVia { destination, command: ssh_command }))
        }
        (None, false) => {
            for r in &relays {
                check_join(r).map_err(|_| NodeConfigError::BadRelay(r.clone()))?;
            }
            Ok(DialPath::Relays(relays))
        }
        (None, true) => Ok(DialPath::Direct),
    }
}

fn check_models(models: &[String]) -> Result<(), NodeConfigError> {
    if models.len() > MAX_MODELS {
        return Err(NodeConfigError::BadModels(format!(
            "{} names given; a node announces at most {MAX_MODELS}",
            models.len()
        )));
    }
    if let Some(m) = models.iter().find(|m| m.trim().is_empty() || m.trim().len() > MAX_MODEL_NAME) {
        return Err(NodeConfigError::BadModels(format!("model name '{m:.40}' must be 1 to {MAX_MODEL_NAME} bytes")));
    }
    Ok(())
}

fn parse_duration(flag: &'static str, value: &str) -> Result<Duration, NodeConfigError> {
    let d = humantime::parse_duration(value.trim()).map_err(|e| NodeConfigError::BadDuration {
        flag,
        value: value.to_string(),
        detail: e.to_string(),
    })?;
    if d.is_zero() {
        return Err(NodeConfigError::ZeroDuration(flag));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::sync::Mutex;

    /// Tests that parse arguments read the process environment; run them one at a time.
    static ENV: Mutex<()> = Mutex::new(());

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeArgs,
    }

    fn parse(args: &[&str]) -> NodeArgs {
        let mut all = vec!["tela-node"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).expect("parses").node
    }

    #[test]
    fn flags_beat_env_beat_file_beat_defaults() {
        let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("node.toml");
        std::fs::write(
            &file,
            r#"
join = ["file-gw:7000"]
join_secret = "from-file"
drain_window = "10m"
probe_interval = "5s"
transport = "tcp"
"#,
        )
        .expect("write");
        let path = file.to_str().expect("utf-8");
        std::env::set_var("TELA_DRAIN_WINDOW", "20m");
        std::env::set_var("TELA_PROBE_INTERVAL", "3s");
        let args = parse(&["--config", path, "--drain-window", "30m"]);
        std::env::remove_var("TELA_DRAIN_WINDOW");
        std::env::remove_var("TELA_PROBE_INTERVAL");
        let s = args.resolve().expect("valid");
        assert_eq!(s.drain_window, Duration::from_secs(30 * 60), "flag over env");
        assert_eq!(s.probe_interval, Duration::from_secs(3), "env over file");
        assert_eq!(s.transport, TransportMode::Tcp, "file over default");
        assert_eq!(s.join, vec!["file-gw:7000".to_string()]);
        assert_eq!(s.stream_idle_timeout, Duration::from_secs(300), "default");
        assert_eq!(s.load_interval, Duration::from_millis(500), "default");
        assert_eq!(s.backend_url, "http://127.0.0.1:8000");
        assert!(s.walltime.is_none());
        assert_eq!(s.handover_window, Duration::from_secs(300), "default");
    }

    #[test]
    fn the_handover_window_can_be_set_or_turned_off() {
        let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::env::remove_var("TELA_HANDOVER_WINDOW");
        let base = ["--join", "gw:7000", "--join-secret", "s"];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            parse(&args).resolve()
        };
        assert_eq!(with(&["--handover-window", "90s"]).expect("valid").handover_window, Duration::from_secs(90));
        assert_eq!(with(&["--handover-window", "0s"]).expect("valid").handover_window, Duration::ZERO, "off");
        let e = with(&["--handover-window", "a while"]).unwrap_err().to_string();
        assert!(e.contains("--handover-window 'a while'"), "{e}");
    }

    #[test]
    fn engine_slots_are_told_as_given_and_never_zero() {
        let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::env::remove_var("TELA_ENGINE_SLOTS");
        let base = ["--join", "gw:7000", "--join-secret", "s"];
        let with = |extra: &[&str]| {
            let mut args = vec!["tela-node"];
            args.extend_from_slice(&base);
            args.extend_from_slice(extra);
            Cli::try_parse_from(args).map(|cli| cli.node.resolve().expect("valid").engine_slots)
        };
        assert_eq!(with(&[]).expect("parses"), None, "unknown by default");
        assert_eq!(with(&["--engine-slots", "1"]).expect("parses"), Some(1));
        assert!(with(&["--engine-slots", "0"]).is_err(), "refused by the flag's parser");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "engine_slots = 0\n").expect("write");
        let e = parse(&["--config", file.to_str().expect("utf-8"), "--join", "gw:7000", "--join-secret", "s"])
            .resolve()
            .unwrap_err();
        assert!(matches!(e, NodeConfigError::NoSlots), "{e}");
    }

    #[test]
    fn ssh_and_relay_paths_carry_tcp_and_exclude_each_other() {
        let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let base = ["--join", "gw.internal:7000", "--join-secret", "s"];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            parse(&args).resolve()
        };
        let s = with(&["--via-ssh", "me@login1", "--ssh-command", "ssh -p 2222"]).expect("valid");
        assert_eq!(
            s.path,
            DialPath::Ssh(SshVia { destination: "me@login1".into(), command: Some("ssh -p 2222".into()) })
        );
        assert_eq!(s.transport, TransportMode::Tcp, "ssh carries TCP+TLS");
        let s = with(&["--relay", "login1:7100", "--relay", "login2:7100"]).expect("valid");
        assert_eq!(s.path, DialPath::Relays(vec!["login1:7100".into(), "login2:7100".into()]));
        assert_eq!(with(&[]).expect("valid").path, DialPath::Direct);
        let err = with(&["--relay", "login1:7100", "--transport", "quic"]).unwrap_err().to_string();
        assert!(err.contains("TCP+TLS only"), "{err}");
        let err = with(&["--relay", "login1"]).unwrap_err().to_string();
        assert!(err.contains("--relay 'login1' is not HOST:PORT"), "{err}");
        let err = with(&["--via-ssh=-oProxyCommand=x"]).unwrap_err().to_string();
        assert!(err.contains("--ssh-command"), "{err}");
        let mut args = base.to_vec();
        args.extend_from_slice(&["--via-ssh", "login", "--relay", "login:7100"]);
        assert!(Cli::try_parse_from(std::iter::once("tela-node").chain(args)).is_err(), "one path only");
    }

    #[test]
    fn mistakes_get_messages_that_say_what_to_do() {
        let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let err = |args: &[&str]| parse(args).resolve().unwrap_err().to_string();
        assert!(err(&["--join-secret", "s"]).contains("--join HOST:PORT"));
        assert!(err(&["--join", "gw"]).contains("not HOST:PORT"));
        assert!(err(&["--join", "gw:7000"]).contains("TELA_JOIN_SECRET"));
        let e = err(&["--join", "gw:7000", "--join-secret", "s", "--drain-window", "soon"]);
        assert!(e.contains("--drain-window 'soon'") && e.contains("15m"), "{e}");
        let e = err(&["--join", "gw:7000", "--join-secret", "s", "--hardware-profile", "tpu"]);
        assert!(e.contains("gh200"), "{e}");
        let flags = ["tela-node", "--join", "gw:7000", "--join-secret", "s", "--transport", "udp"];
        let e = Cli::try_parse_from(flags).err().expect("refused when parsed").to_string();
        assert!(e.contains("auto, quic or tcp"), "{e}");
        let e = err(&["--join", "gw:7000", "--join-secret", "s", "--backend-url", "https://x:1"]);
        assert!(e.contains("http://"), "{e}");
        let e = err(&["--join", "gw:7000", "--join-secret", "s", "--walltime", "0s"]);
        assert!(e.contains("longer than zero"), "{e}");
        let e = err(&["--join", "gw:7000", "--join-secret", "s", "--load-interval", "5s"]);
        assert!(e.contains("longer than 1s"), "{e}");

        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, "joinn = [\"x:1\"]\n").expect("write");
        let e = err(&["--config", file.to_str().expect("utf-8")]);
        assert!(e.contains("joinn"), "the unknown key is named: {e}");
        std::fs::write(&file, "transport = \"udp\"\n").expect("write");
        let e = err(&["--join", "gw:7000", "--join-secret", "s", "--config", file.to_str().expect("utf-8")]);
        assert!(e.contains("auto, quic, tcp"), "a bad transport in the file: {e}");
    }

    #[test]
    fn the_hardware_profile_needs_no_other_setting() {
        let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::env::remove_var("TELA_HARDWARE_PROFILE");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "hardware_profile = \"gh200x4\"\n").expect("write");
        let path = file.to_str().expect("utf-8");
        // No join address and no secret: `--print-hardware` still has what it needs.
        assert_eq!(parse(&[]).hardware_profile().expect("default"), "cpu");
        assert_eq!(parse(&["--config", path]).hardware_profile().expect("file"), "gh200x4");
        let flag = parse(&["--config", path, "--hardware-profile", "a100-80x2"]);
        assert_eq!(flag.hardware_profile().expect("flag"), "a100-80x2", "flag over file");
        assert!(matches!(flag.resolve(), Err(NodeConfigError::NoJoin)), "the rest still needs a join address");
        let e = parse(&["--hardware-profile", "tpu"]).hardware_profile().unwrap_err().to_string();
        assert!(e.contains("gh200"), "a bad profile names the good ones: {e}");
    }

    #[test]
    fn joins_accept_names_ips_and_ipv6() {
        for ok in ["gw.example.org:7000", "10.0.0.5:7000", "[::1]:7000"] {
            assert!(check_join(ok).is_ok(), "{ok}");
        }
        for bad in ["gw", ":7000", "gw:0", "gw:x", "http://gw:7000"] {
            assert!(check_join(bad).is_err(), "{bad}");
        }
    }
}
