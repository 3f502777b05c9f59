//! `tela gateway` and `tela status --gateway`: flags, checks and the run loop.
// The doc comments of the flags are clap's help text, written for terminals, not rustdoc.
#![allow(rustdoc::bare_urls, rustdoc::invalid_html_tags)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tela_runtime::identity::{load_identity, read_secret};
use tela_runtime::join::JoinArgs;

use crate::auth::HashKeyArgs;
use crate::config::LoadedConfig;
use crate::gateway::{AuthConfig, Gateway, GatewayConfig};
use crate::proxy::ProxySettings;
use crate::service::Limits;

/// Run an ingress gateway: the OpenAI-compatible API on --listen, and the anchor that serving
/// nodes dial (`tela node --join PUBLIC_ADDR`) on --anchor-listen.
///
/// The first line on stdout is `listening on http(s)://ADDR`, the second `anchor on ADDR`.
/// Ctrl-C or SIGTERM stops accepting, lets open responses finish (--shutdown-grace), and exits.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct GatewayCommand {
    #[command(subcommand)]
    command: Option<GatewaySubcommand>,
    #[command(flatten)]
    run: GatewayArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
enum GatewaySubcommand {
    HashKey(HashKeyArgs),
}

/// The flags of `tela gateway`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    mut_arg("join_secret", |a| a.help("The federation's join secret (prefer TELA_JOIN_SECRET or --join-secret-file)")),
    mut_arg("join", |a| a.help("Other gateways or anchors to keep a connection to (repeatable)")),
    mut_arg("transport", |a| a.help("Transport for dials to other gateways").default_value("auto")),
    mut_arg("identity", |a| a.help("Identity key file (created on first run) [default: <config dir>/tela/gateway.key]")),
)]
pub struct GatewayArgs {
    /// Read settings from this TOML file (see gateway/examples/gateway.toml): the flags below
    /// by their names with `_` (a flag or variable given explicitly wins), `[spin]`, the
    /// batch jobs the gateway may start to serve models on demand, and `[[overflow]]`, outside
    /// providers for keys with overflow=yes.
    #[arg(long, env = "TELA_GATEWAY_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Check this configuration file, print the spin plan (where each model's replica would
    /// go: partition, GPUs, tensor parallelism, weights) and exit; exit status 1 if it is refused.
    #[arg(long, value_name = "PATH", conflicts_with = "config")]
    pub check_config: Option<PathBuf>,

    /// The arguments given explicitly (command line or environment), which win over the file.
    #[arg(skip)]
    pub explicit: Vec<String>,

    /// Where the HTTP API listens.
    #[arg(long, env = "TELA_GATEWAY_LISTEN", default_value = "127.0.0.1:8080", value_name = "HOST:PORT")]
    pub listen: SocketAddr,

    /// Where nodes connect (QUIC and TCP on one port number).
    #[arg(long, env = "TELA_ANCHOR_LISTEN", default_value = "0.0.0.0:7000", value_name = "HOST:PORT")]
    pub anchor_listen: SocketAddr,

    /// The address nodes should dial, as advertised in the registry (default: the anchor's
    /// bound address; set it when listening on 0.0.0.0 or behind a port mapping).
    #[arg(long, env = "TELA_PUBLIC_ADDR", value_name = "HOST:PORT")]
    pub public_addr: Option<String>,

    /// The federation, as every role joins it: --join-secret, --join-secret-file, --join,
    /// --transport and --identity.
    #[command(flatten)]
    pub federation: JoinArgs,

    /// File of hashed API keys, one `sha256:<hex>` per line (make lines with `tela gateway
    /// hash-key`); reloaded when it changes.
    #[arg(long, env = "TELA_API_KEYS", value_name = "PATH", required_unless_present_any = ["no_auth", "config", "check_config"])]
    pub api_keys: Option<PathBuf>,

    /// Serve the API without keys (loopback demos and tests only).
    #[arg(long, conflicts_with = "api_keys")]
    pub no_auth: bool,

    /// TLS certificate chain (PEM) to serve HTTPS; needs --tls-key.
    #[arg(long, env = "TELA_TLS_CERT", requires = "tls_key", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,

    /// TLS private key (PEM).
    #[arg(long, env = "TELA_TLS_KEY", requires = "tls_cert", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,

    /// Serve /status and /metrics without an API key.
    #[arg(long)]
    pub open_status: bool,

    /// Largest request body, in bytes (413 above).
    #[arg(long, default_value_t = 4 * 1024 * 1024, value_name = "BYTES")]
    pub max_body_bytes: usize,

    /// Longest a client may take to send a request's headers (the connection is closed).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub header_timeout: Duration,

    /// Longest a client may take to send a request's body (408).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub body_timeout: Duration,

    /// API requests served at once (429 above).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_concurrent: usize,

    /// Nodes tried per request before answering 503.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_attempts: usize,

    /// How a node is picked among those serving the model. prefix: every turn of a
    /// conversation (same system prompt and first user message) goes to the same node, on
    /// every gateway, so its engine reuses its KV cache; a node over 1.25x its share of the
    /// load (and 2 requests above it) passes new requests to the next node in line, and
    /// requests without content go to
    /// the least loaded. least-loaded: fewest requests in flight. p2c: the less loaded of two
    /// random nodes.
    #[arg(long, env = "TELA_ROUTING", default_value = "prefix", value_name = "prefix|least-loaded|p2c")]
    pub routing: tela_core::routing::RoutingPolicy,

    /// A node that has not accepted a written request within this long (a round trip, not the
    /// engine's time) is passed over and the request tried on another node.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub node_accept_timeout: Duration,

    /// A node connection that hears nothing for this long is closed and the node avoided.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub node_idle_timeout: Duration,

    /// How long Ctrl-C / SIGTERM waits for open responses.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub shutdown_grace: Duration,

    /// The gateway's database: the usage ledger keeps one row per request there (key,
    /// account, model, node, the engine's token counts, latency, status), which `tela usage`
    /// reports on [default: gateway.db beside the identity key].
    #[arg(long, env = "TELA_LEDGER", value_name = "PATH")]
    pub ledger: Option<PathBuf>,

    /// Keep no usage ledger.
    #[arg(long, conflicts_with = "ledger")]
    pub no_ledger: bool,

    /// Delete ledger rows older than this many days (0 keeps them forever).
    #[arg(long, default_value_t = 90, value_name = "DAYS")]
    pub ledger_retention_days: u32,

    /// How often this gateway sends its keys' spend to the other gateways, so that token
    /// budgets hold across them (a key may overspend by about what the other gateways admit
    /// for it in this time).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub budget_exchange: Duration,

    /// Requests this gateway sends at once per node serving a model before further requests
    /// wait in per-key queues, served fairly between keys (0: no fair queueing).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub fair_slots_per_node: usize,

    /// Requests one key may have waiting per saturated model (429 above).
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub fair_queue_per_key: usize,

    /// The longest a request waits for its turn on a saturated model (then 429).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub fair_max_wait: Duration,

    /// Run no batches (the OpenAI Batch API, /v1/files and /v1/batches, whose files, batches
    /// and results are kept in the gateway's database; on by default with the ledger).
    #[arg(long)]
    pub no_batch: bool,

    /// Largest batch input file a client may upload, in bytes (413 above).
    #[arg(long, default_value_t = 100 * 1024 * 1024, value_name = "BYTES")]
    pub batch_max_file_bytes: usize,

    /// Batch request slots per node: a node with N interactive requests in flight takes at
    /// most this minus N batch requests, so batches use only spare capacity.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub batch_node_slots: u32,

    /// Delete batch files (inputs, outputs, errors) this many days after they were made (0
    /// keeps them until deleted).
    #[arg(long, default_value_t = 30, value_name = "DAYS")]
    pub batch_file_days: u32,

    /// Threads that serve requests [default: 1 on a machine with at most 2 cores, else one per
    /// core].
    #[arg(long, env = "TELA_GATEWAY_THREADS", value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub threads: Option<usize>,
}

/// Up to this many cores, the gateway runs on one thread unless told otherwise.
///
/// On a multi-threaded runtime every request wakes idle workers that find nothing to do: its
/// hops (client connection, QUIC connection, UDP endpoint) are separate tasks, and each wake-up
/// of one of them may unpark another worker. With two cores, those wake-ups compete with the
/// request itself and with whatever else runs on the machine: measured with `tela-load` on two
/// cores, one thread halves the gateway's context switches per request, answers sooner at
/// concurrency 1 and serves more requests at concurrency 32. Above this, the extra cores add
/// throughput.
pub const ONE_THREAD_UP_TO_CORES: usize = 2;

/// The default of `--threads` on this machine (see [`ONE_THREAD_UP_TO_CORES`]).
pub fn default_threads() -> usize {
    // Honours CPU affinity and cgroup quotas, so a container's share counts, not the host's.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores <= ONE_THREAD_UP_TO_CORES {
        1
    } else {
        cores
    }
}

impl GatewayCommand {
    /// Runs `tela gateway` or `tela gateway hash-key`.
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Some(GatewaySubcommand::HashKey(args)) => args.run(),
            None => self.run.run().await,
        }
    }

    /// How many threads the gateway's runtime should have: `--threads` (or its variable), else
    /// `threads` in the configuration file, else [`default_threads`]. One for `hash-key` and
    /// `--check-config`, which serve nothing.
    pub fn threads(&self) -> anyhow::Result<usize> {
        let args = &self.run;
        if self.command.is_some() || args.check_config.is_some() {
            return Ok(1);
        }
        // Set only when given on the command line or in the environment, which win.
        if let Some(n) = args.threads {
            return Ok(n);
        }
        let file = match &args.config {
            Some(path) => LoadedConfig::load(path)?.file.threads,
            None => None,
        };
        Ok(file.unwrap_or_else(default_threads))
    }

    /// Notes which arguments of `matches` (the `gateway` subcommand's) were given explicitly,
    /// on the command line or in the environment: those win over the configuration file.
    pub fn note_explicit(&mut self, matches: &clap::ArgMatches) {
        self.run.explicit = explicit_args(matches);
    }
}

/// The ids of the arguments in `matches` given on the command line or in the environment.
pub fn explicit_args(matches: &clap::ArgMatches) -> Vec<String> {
    use clap::parser::ValueSource;
    matches
        .ids()
        .filter(|id| {
            matches!(matches.value_source(id.as_str()), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
        })
        .map(|id| id.as_str().to_string())
        .collect()
}

impl GatewayArgs {
    /// The configuration these flags describe.
    pub fn config(&self) -> anyhow::Result<GatewayConfig> {
        let loaded = match &self.config {
            Some(path) => Some(LoadedConfig::load(path)?),
            None => None,
        };
        let file = loaded.as_ref().map(|l| l.file.clone()).unwrap_or_default();
        // The file's value unless the flag was given explicitly (or the file has none).
        let given = |id: &str| self.explicit.iter().any(|e| e == id);
        fn pick<T>(explicit: bool, flag: T, file: Option<T>) -> T {
            match file {
                Some(v) if !explicit => v,
                _ => flag,
            }
        }
        let opt = |id: &str, flag: &Option<PathBuf>, file: &Option<PathBuf>| {
            if given(id) || file.is_none() {
                flag.clone()
            } else {
                file.clone()
            }
        };
        let max_attempts = pick(given("max_attempts"), self.max_attempts, file.max_attempts);
        let max_concurrent = pick(given("max_concurrent"), self.max_concurrent, file.max_concurrent);
        anyhow::ensure!(max_attempts >= 1, "--max-attempts must be at least 1");
        anyhow::ensure!(max_concurrent >= 1, "--max-concurrent must be at least 1");
        let federation = &self.federation;
        let secret_file = opt("join_secret_file", &federation.join_secret_file, &file.join_secret_file);
        let join_secret = read_secret(federation.join_secret.as_deref(), secret_file.as_deref())?;
        let identity_path = opt("identity", &federation.identity, &file.identity);
        let identity = load_identity(identity_path.as_deref(), "gateway.key")?;
        let mut config = GatewayConfig::new(identity, join_secret);
        config.listen = pick(given("listen"), self.listen, file.listen);
        config.anchor_listen = pick(given("anchor_listen"), self.anchor_listen, file.anchor_listen);
        config.public_addr = pick(given("public_addr"), self.public_addr.clone(), file.public_addr.clone().map(Some));
        config.join = pick(given("join"), federation.join.clone(), file.join.clone());
        config.transport = match (&file.transport, given("transport")) {
            (Some(t), false) => t.parse().map_err(|e| anyhow::anyhow!("transport in the configuration file: {e}"))?,
            // Always set: clap gives it the default `auto`.
            _ => federation.transport.unwrap_or_default(),
        };
        let no_auth = pick(given("no_auth"), self.no_auth, file.no_auth);
        let api_keys = opt("api_keys", &self.api_keys, &file.api_keys);
        config.auth = match (&api_keys, no_auth) {
            (Some(path), false) => AuthConfig::KeyFile(path.clone()),
            (None, true) => AuthConfig::Open,
            (Some(_), true) => anyhow::bail!("both API keys and no_auth are set: choose one"),
            (None, false) => anyhow::bail!("no API keys: pass --api-keys (or api_keys in the file), or --no-auth"),
        };
        let tls_cert = opt("tls_cert", &self.tls_cert, &file.tls_cert);
        let tls_key = opt("tls_key", &self.tls_key, &file.tls_key);
        config.tls = tls_cert.zip(tls_key);
        config.open_status = pick(given("open_status"), self.open_status, file.open_status);
        let dur =
            |id: &str, flag: Duration, file: Option<crate::spin::config::Dur>| pick(given(id), flag, file.map(|d| d.0));
        config.limits = Limits {
            max_body_bytes: pick(given("max_body_bytes"), self.max_body_bytes, file.max_body_bytes),
            header_timeout: dur("header_timeout", self.header_timeout, file.header_timeout),
            body_timeout: dur("body_timeout", self.body_timeout, file.body_timeout),
            max_concurrent,
        };
        config.routing = match (&file.routing, given("routing")) {
            (Some(r), false) => r.parse().map_err(|e| anyhow::anyhow!("routing in the configuration file: {e}"))?,
            _ => self.routing,
        };
        config.proxy = ProxySettings {
            max_attempts,
            accept_timeout: dur("node_accept_timeout", self.node_accept_timeout, file.node_accept_timeout),
            ..ProxySettings::default()
        };
        config.node_idle_timeout = dur("node_idle_timeout", self.node_idle_timeout, file.node_idle_timeout);
        config.shutdown_grace = dur("shutdown_grace", self.shutdown_grace, file.shutdown_grace);
        config.budget_exchange = dur("budget_exchange", self.budget_exchange, file.budget_exchange);
        anyhow::ensure!(!config.budget_exchange.is_zero(), "budget_exchange must be longer than zero");
        config.fairness = crate::fairness::FairSettings {
            slots_per_node: pick(given("fair_slots_per_node"), self.fair_slots_per_node, file.fair_slots_per_node),
            queue_per_key: pick(given("fair_queue_per_key"), self.fair_queue_per_key, file.fair_queue_per_key),
            max_wait: dur("fair_max_wait", self.fair_max_wait, file.fair_max_wait),
        };
        let ledger = opt("ledger", &self.ledger, &file.ledger);
        let no_ledger = pick(given("no_ledger"), self.no_ledger, file.no_ledger);
        let retention_days =
            pick(given("ledger_retention_days"), self.ledger_retention_days, file.ledger_retention_days);
        config.ledger = match (ledger, no_ledger) {
            (Some(_), true) => anyhow::bail!("both a ledger and no_ledger are set: choose one"),
            (None, true) => None,
            (Some(path), false) => Some(crate::ledger::LedgerConfig::new(path, retention_days)),
            (None, false) => {
                let identity = match identity_path {
                    Some(path) => path,
                    None => tela_runtime::identity::default_identity_path("gateway.key")?,
                };
                Some(crate::ledger::LedgerConfig::new(crate::ledger::default_path(&identity), retention_days))
            }
        };
        let no_batch = pick(given("no_batch"), self.no_batch, file.no_batch);
        config.batch = match (&config.ledger, no_batch) {
            (Some(ledger), false) => {
                let mut batch = crate::batch::BatchConfig::new(ledger.path.clone());
                batch.max_file_bytes =
                    pick(given("batch_max_file_bytes"), self.batch_max_file_bytes, file.batch_max_file_bytes);
                batch.node_slots = pick(given("batch_node_slots"), self.batch_node_slots, file.batch_node_slots);
                anyhow::ensure!(
                    batch.node_slots >= 1,
                    "--batch-node-slots must be at least 1 (use --no-batch to run none)"
                );
                let days = pick(given("batch_file_days"), self.batch_file_days, file.batch_file_days);
                batch.file_expiry = (days > 0).then(|| Duration::from_secs(u64::from(days) * 86_400));
                Some(batch)
            }
            _ => None,
        };
        if let Some(l) = &loaded {
            config.overflow = l.overflow.clone();
        }
        if let Some(plan) = loaded.and_then(|l| l.spin) {
            let batch =
                crate::spin::backend::connect(&plan.backend).map_err(|e| anyhow::anyhow!("[spin.backend]: {e}"))?;
            config.spin = Some(crate::spin::SpinSetup { plan, batch });
        }
        Ok(config)
    }

    /// `--check-config FILE`: checks the file and prints the plan.
    fn check(path: &std::path::Path) -> anyhow::Result<()> {
        let loaded = LoadedConfig::load(path)?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}: the configuration is valid", path.display())?;
        match &loaded.spin {
            Some(plan) => write!(stdout, "\n{}", plan.describe())?,
            None => writeln!(stdout, "no [spin] section: this gateway does not start jobs")?,
        }
        for provider in &loaded.overflow {
            writeln!(stdout, "{}", provider.describe())?;
        }
        Ok(())
    }

    /// Starts the gateway, prints where it listens, and serves until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        if let Some(path) = &self.check_config {
            return GatewayArgs::check(path);
        }
        let config = self.config()?;
        if matches!(config.auth, AuthConfig::Open) && !config.listen.ip().is_loopback() {
            tracing::warn!("--no-auth on {}: anyone who can reach it may use the API", config.listen);
        }
        let stop = tela_runtime::signals::terminate()?;
        let gateway = Gateway::start(config).await?;
        {
            // Best effort: a supervisor that closed our stdout must not stop the gateway.
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "listening on {}", gateway.base_url());
            let _ = writeln!(stdout, "anchor on {}", gateway.anchor_addr());
            let _ = stdout.flush();
        }
        stop.await;
        gateway.shutdown().await;
        Ok(())
    }
}

/// Print the federation table: from a gateway's /status over HTTP (--gateway), or from the node
/// or anchor on this machine through its control socket.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusCommand {
    /// The gateway's base URL (e.g. http://gw.example.org:8080).
    #[arg(long, env = "TELA_GATEWAY", value_name = "URL")]
    pub gateway: Option<String>,

    /// API key for the gateway's /status.
    #[arg(long, env = "TELA_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub api_key: Option<String>,

    /// Also trust this CA certificate (PEM) for an https:// gateway.
    #[arg(long, value_name = "PATH")]
    pub ca_cert: Option<PathBuf>,

    #[command(flatten)]
    local: tela_runtime::control::StatusArgs,
}

impl StatusCommand {
    /// Queries and prints.
    pub async fn run(self) -> anyhow::Result<()> {
        let Some(url) = &self.gateway else {
            return self.local.run().await.context("tela status");
        };
        let status =
            crate::status::fetch_status(url, self.api_key.as_deref(), self.ca_cert.as_deref(), Duration::from_secs(10))
                .await?;
        if self.local.json {
            println!("{status}");
        } else {
            print!("{}", crate::status::format_table(&status));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    /// `tela gateway`'s arguments as a command of their own.
    #[derive(clap::Parser)]
    struct GatewayCli {
        #[command(flatten)]
        gateway: GatewayCommand,
    }

    #[test]
    fn the_file_sets_what_no_flag_gives_and_explicit_flags_win() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "a federation secret\n").expect("secret");
        let file = dir.path().join("gateway.toml");
        std::fs::write(
            &file,
            format!(
                "listen = \"127.0.0.1:9001\"\nanchor_listen = \"127.0.0.1:9101\"\nmax_attempts = 5\nno_auth = true\n\
                 header_timeout = \"3s\"\njoin_secret_file = \"{}\"\nidentity = \"{}\"\n",
                secret.display(),
                dir.path().join("gw.key").display()
            ),
        )
        .expect("config");
        let path = file.to_str().expect("utf-8");
        let matches = GatewayCli::command().get_matches_from(["tela", "--config", path, "--listen", "127.0.0.1:9002"]);
        let mut cli = GatewayCli::from_arg_matches(&matches).expect("parses");
        cli.gateway.note_explicit(&matches);
        let config = cli.gateway.run.config().expect("valid");
        assert_eq!(config.listen, "127.0.0.1:9002".parse().expect("addr"), "the flag wins");
        assert_eq!(config.anchor_listen, "127.0.0.1:9101".parse().expect("addr"), "the file fills in");
        assert_eq!((config.proxy.max_attempts, config.limits.header_timeout), (5, Duration::from_secs(3)));
        assert!(matches!(config.auth, AuthConfig::Open));
        assert!(config.spin.is_none());
        let ledger = config.ledger.expect("a ledger by default");
        assert_eq!(ledger.path, dir.path().join("gateway.db"), "beside the identity key");
        assert_eq!(ledger.retention, Some(Duration::from_secs(90 * 86_400)));
    }

    #[test]
    fn the_ledger_comes_from_the_flag_or_the_file_or_is_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("gateway.toml");
        let key = dir.path().join("gw.key");
        std::fs::write(
            &file,
            format!(
                "no_auth = true\njoin_secret_file = \"{}\"\nidentity = \"{}\"\nledger = \"{}\"\nledger_retention_days = 0\n",
                dir.path().join("secret").display(),
                key.display(),
                dir.path().join("usage.db").display()
            ),
        )
        .expect("config");
        std::fs::write(dir.path().join("secret"), "a federation secret\n").expect("secret");
        let path = file.to_str().expect("utf-8");
        let config_of = |args: &[&str]| {
            let argv: Vec<&str> = ["tela", "--config", path].into_iter().chain(args.iter().copied()).collect();
            let matches = GatewayCli::command().try_get_matches_from(argv)?;
            let mut cli = GatewayCli::from_arg_matches(&matches)?;
            cli.gateway.note_explicit(&matches);
            cli.gateway.run.config()
        };
        let from_file = config_of(&[]).expect("valid").ledger.expect("a ledger");
        assert_eq!((from_file.path, from_file.retention), (dir.path().join("usage.db"), None));
        let flag = config_of(&["--ledger", "/tmp/elsewhere.db"]).expect("valid").ledger.expect("a ledger");
        assert_eq!(flag.path, PathBuf::from("/tmp/elsewhere.db"), "the flag wins");
        assert!(config_of(&["--no-ledger"]).is_err(), "the file's ledger and --no-ledger conflict");
        std::fs::write(
            &file,
            format!(
                "no_auth = true\njoin_secret_file = \"{}\"\nidentity = \"{}\"\nno_ledger = true\n",
                dir.path().join("secret").display(),
                key.display()
            ),
        )
        .expect("config");
        assert_eq!(config_of(&[]).expect("valid").ledger, None);
    }

    #[test]
    fn the_shared_join_flags_keep_the_gateways_default_and_words() {
        use clap::Parser as _;
        let cli = GatewayCli::try_parse_from(["tela", "--no-auth"]).expect("parses");
        let transport = cli.gateway.run.federation.transport;
        assert_eq!(transport, Some(tela_transports::TransportMode::Auto), "clap fills in auto");
        let help = GatewayCli::command().render_long_help().to_string();
        for words in ["Transport for dials to other gateways", "[default: <config dir>/tela/gateway.key]"] {
            assert!(help.contains(words), "{words} in {help}");
        }
    }

    fn threads(args: &[&str]) -> anyhow::Result<usize> {
        use clap::Parser as _;
        let argv = ["tela", "--no-auth"].iter().chain(args);
        GatewayCli::try_parse_from(argv).map_err(anyhow::Error::from)?.gateway.threads()
    }

    #[test]
    fn threads_come_from_the_flag_then_the_file_then_the_core_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("gateway.toml");
        std::fs::write(&file, "threads = 3\n").expect("config");
        let path = file.to_str().expect("utf-8");
        assert_eq!(threads(&["--config", path, "--threads", "2"]).expect("valid"), 2, "the flag wins");
        assert_eq!(threads(&["--config", path]).expect("valid"), 3, "the file fills in");
        assert_eq!(threads(&[]).expect("valid"), default_threads());
        assert!(threads(&["--threads", "0"]).is_err(), "at least one thread");
        std::fs::write(&file, "threads = 0\n").expect("config");
        assert!(threads(&["--config", path]).is_err(), "at least one thread in the file too");
    }
}
