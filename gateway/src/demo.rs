//! `tela demo`: a whole federation on loopback from one command — a gateway, three serving nodes
//! and three built-in engine simulators.
//!
//! # Shape
//!
//! The gateway runs inside the demo process; every node and every engine simulator is a child
//! process of the same `tela` binary (`tela node`, `tela engine-sim`), so the demo exercises
//! exactly what a real deployment runs: nodes dial the gateway's anchor over QUIC, gossip, and
//! serve tunnelled requests. The children run in their own process group (a terminal's Ctrl-C
//! reaches only the demo, which then stops them in order), are killed if the demo fails, and log
//! to files in a temporary directory whose path the demo prints.
//!
//! # Supervision
//!
//! While the federation runs, the demo waits on every child, so none is left a zombie. A child
//! that exits is reported on the terminal (which one, how it ended, where its log is) and started
//! again with the same arguments. An engine comes back on the port it had, so its node finds it
//! again at the same URL; if that port has been taken meanwhile, the engine gets a new one and
//! its node is restarted pointing there. A node that exits 0 was drained on purpose (`tela
//! drain`) and stays down. A child that dies again after three restarts within a minute is not
//! started again: the demo stops everything, keeps the directory with the logs, and exits
//! non-zero.
//!
//! Stopping (Ctrl-C or SIGTERM): nodes get SIGTERM and drain (they finish open requests, leave
//! the federation and exit), then the engines get SIGTERM, then the gateway stops; anything still
//! running after its grace period is killed, and the temporary directory is removed (unless the
//! demo failed: then it keeps the logs). These exits are awaited by the stop itself, so the
//! supervision never mistakes them for deaths.
//!
//! # Terminal
//!
//! Stdout carries the banner alone: base URL, key, curl line, Python snippet. The gateway's own
//! log goes to `gateway.log` in the temporary directory (to stderr with `--verbose`); stderr
//! shows only the demo's lines (children dying and restarting, stopping) and errors.
//!
//! The API needs a key: the demo makes one, puts its hash in the temporary key file, and prints
//! it in the curl line and the Python snippet.

use std::collections::VecDeque;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tela_transports::{Identity, JoinSecret};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::auth::{generate_key, key_line};
use crate::gateway::{AuthConfig, Gateway, GatewayConfig};

/// How many times one child is restarted within [`RESTART_WINDOW`]; dying once more ends the
/// demo, since a child that keeps crashing will not be healed by starting it again.
const RESTARTS: usize = 3;

/// The window [`RESTARTS`] counts in.
const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// What the terminal shows besides the banner when the gateway logs to a file (`--log` and
/// `RUST_LOG` set what the file gets).
const TERMINAL_LOG: &str = "error,tela_gateway::demo=info";

/// How long a node has to drain when stopped.
const NODE_STOP_GRACE: Duration = Duration::from_secs(15);

/// How long an engine has to finish when stopped.
const ENGINE_STOP_GRACE: Duration = Duration::from_secs(5);

/// Run a demo federation on loopback: a gateway, three nodes and three built-in engine
/// simulators (placeholder text, not a model). Prints the base URL, a curl line and an OpenAI
/// SDK snippet; restarts a node or engine that dies; Ctrl-C stops everything.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Port of the gateway's API on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// How many nodes (each with its own engine simulator).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub nodes: u16,

    /// The model the simulated engines serve.
    #[arg(long, default_value = "tela-demo")]
    pub model: String,

    /// The engines' time to first token before prefill (which their prefix cache shortens), in
    /// milliseconds.
    #[arg(long, default_value_t = 50)]
    pub ttft_ms: u64,

    /// The engines' tokens per second.
    #[arg(long, default_value_t = 50.0)]
    pub tokens_per_s: f64,

    /// How the gateway picks a node: prefix (a conversation stays on one node), least-loaded
    /// or p2c (see `tela gateway --help`).
    #[arg(long, default_value = "prefix", value_name = "prefix|least-loaded|p2c")]
    pub routing: tela_core::routing::RoutingPolicy,

    /// Show the gateway's log on the terminal (stderr) instead of writing it to gateway.log in
    /// the demo's directory.
    #[arg(short, long)]
    pub verbose: bool,
}

/// The demo's temporary directory: keys, control sockets and every log.
fn directory() -> PathBuf {
    std::env::temp_dir().join(format!("tela-demo-{}", std::process::id()))
}

/// A child process of the demo, and what it takes to start it again.
struct Proc {
    name: String,
    args: Vec<String>,
    log: PathBuf,
    /// Engines print their address on stdout; nodes print nothing there.
    piped: bool,
    child: Child,
    /// Kept because the child forgets its pid once it has been waited for, and the report of
    /// its death needs it.
    pid: u32,
    /// Its unexpected exits within the last [`RESTART_WINDOW`].
    deaths: VecDeque<Instant>,
    /// A node that was drained on purpose: it has exited and is not waited on again.
    retired: bool,
}

impl Proc {
    /// SIGTERM, then up to `grace` to exit, then SIGKILL.
    async fn stop(&mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
        if tokio::time::timeout(grace, self.child.wait()).await.is_err() {
            tracing::warn!("{} did not stop within {grace:?}; killing it", self.name);
            let _ = self.child.kill().await;
        }
    }
}

/// What every child is started with.
struct Launcher {
    exe: PathBuf,
    secret: String,
}

impl Launcher {
    /// Starts a child for the first time.
    fn start(&self, name: String, args: Vec<String>, log: PathBuf, piped: bool) -> anyhow::Result<Proc> {
        let child = self.spawn(&name, &args, &log, piped)?;
        let pid = child.id().unwrap_or(0);
        Ok(Proc { name, args, log, piped, child, pid, deaths: VecDeque::new(), retired: false })
    }

    /// Starts `proc` again with its current arguments; the old child must have been reaped.
    fn restart(&self, proc: &mut Proc) -> anyhow::Result<()> {
        proc.child = self.spawn(&proc.name, &proc.args, &proc.log, proc.piped)?;
        proc.pid = proc.child.id().unwrap_or(0);
        Ok(())
    }

    /// Starts `exe args`; stdout is piped or discarded, stderr appends to `log` so that a
    /// restarted child's log still shows how the previous one ended.
    fn spawn(&self, name: &str, args: &[String], log: &Path, piped: bool) -> anyhow::Result<Child> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        Command::new(&self.exe)
            .args(args)
            .env("TELA_JOIN_SECRET", &self.secret)
            .env_remove("TELA_JOIN")
            .stdin(Stdio::null())
            .stdout(if piped { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::from(log_file))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {name} ({})", self.exe.display()))
    }
}

/// Which kind of child exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Engine,
    Node,
}

/// The demo's children: `engines[i]` serves `nodes[i]`.
struct Children {
    launcher: Launcher,
    engines: Vec<Proc>,
    nodes: Vec<Proc>,
}

impl Children {
    /// Restarts children that die until `stop` resolves (`Ok`) or one keeps dying (`Err`).
    async fn supervise(&mut self, mut stop: Pin<&mut impl Future<Output = ()>>) -> anyhow::Result<()> {
        loop {
            let (role, i, status) = tokio::select! {
                () = stop.as_mut() => return Ok(()),
                exit = self.next_exit() => exit,
            };
            tokio::select! {
                () = stop.as_mut() => return Ok(()),
                handled = self.handle_exit(role, i, status) => handled?,
            }
        }
    }

    /// The next child to exit, reaped.
    async fn next_exit(&mut self) -> (Role, usize, std::io::Result<ExitStatus>) {
        type Exit<'a> = Pin<Box<dyn Future<Output = (Role, usize, std::io::Result<ExitStatus>)> + Send + 'a>>;
        let engines = self.engines.iter_mut().enumerate().map(|(i, p)| (Role::Engine, i, p));
        let nodes = self.nodes.iter_mut().enumerate().map(|(i, p)| (Role::Node, i, p));
        let waits: Vec<Exit<'_>> = engines
            .chain(nodes)
            .filter(|(_, _, p)| !p.retired)
            .map(|(role, i, p)| -> Exit<'_> { Box::pin(async move { (role, i, p.child.wait().await) }) })
            .collect();
        if waits.is_empty() {
            return std::future::pending().await;
        }
        futures::future::select_all(waits).await.0
    }

    /// Reports how a child ended and starts it again; `Err` when the demo should give up.
    async fn handle_exit(&mut self, role: Role, i: usize, status: std::io::Result<ExitStatus>) -> anyhow::Result<()> {
        let proc = match role {
            Role::Engine => &mut self.engines[i],
            Role::Node => &mut self.nodes[i],
        };
        let (name, pid, log) = (proc.name.clone(), proc.pid, proc.log.display().to_string());
        // Without a status the child may still be running: starting another would double it.
        let status = status.with_context(|| format!("cannot wait for {name} (pid {pid})"))?;
        if role == Role::Node && status.success() {
            proc.retired = true;
            tracing::warn!(
                "{name} (pid {pid}) exited cleanly ({status}), as a drained node does; it stays down. Its log: {log}"
            );
            return Ok(());
        }
        let now = Instant::now();
        proc.deaths.retain(|at| now.duration_since(*at) < RESTART_WINDOW);
        if proc.deaths.len() >= RESTARTS {
            tracing::error!(
                "{name} (pid {pid}) died ({status}) after {RESTARTS} restarts within {}s; giving up. Its log: {log}",
                RESTART_WINDOW.as_secs()
            );
            anyhow::bail!("{name} keeps dying; its log: {log}");
        }
        proc.deaths.push_back(now);
        tracing::warn!(
            "{name} (pid {pid}) died ({status}); restarting it ({} of {RESTARTS} restarts within {}s). Its log: {log}",
            proc.deaths.len(),
            RESTART_WINDOW.as_secs()
        );
        match role {
            Role::Node => {
                self.launcher.restart(proc)?;
                tracing::info!("{name} restarted (pid {})", proc.pid);
                Ok(())
            }
            Role::Engine => self.restart_engine(i).await,
        }
    }

    /// Starts engine `i` again on its port, or, if that is taken, on a new port and restarts
    /// its node to point there.
    async fn restart_engine(&mut self, i: usize) -> anyhow::Result<()> {
        let engine = &mut self.engines[i];
        self.launcher.restart(engine)?;
        let url = match engine_addr(engine).await {
            Ok(url) => url,
            Err(e) => {
                let _ = engine.child.kill().await;
                set_arg(&mut engine.args, "--port", "0");
                self.launcher.restart(engine)?;
                let url = engine_addr(engine).await?;
                set_arg(&mut engine.args, "--port", port_of(&url));
                tracing::warn!("{} could not listen on its old port ({e:#}); it listens on {url} now", engine.name);
                if let Some(node) = self.nodes.get_mut(i).filter(|n| !n.retired) {
                    tracing::warn!("restarting {} to use {url}", node.name);
                    node.stop(NODE_STOP_GRACE).await;
                    set_arg(&mut node.args, "--backend-url", &url);
                    self.launcher.restart(node)?;
                    tracing::info!("{} restarted (pid {})", node.name, node.pid);
                }
                url
            }
        };
        tracing::info!("{} restarted (pid {}), listening on {url}", engine.name, engine.pid);
        Ok(())
    }

    /// Stops the nodes (they drain), then the engines.
    async fn stop(&mut self) {
        futures::future::join_all(self.nodes.iter_mut().map(|n| n.stop(NODE_STOP_GRACE))).await;
        futures::future::join_all(self.engines.iter_mut().map(|e| e.stop(ENGINE_STOP_GRACE))).await;
    }
}

/// Reads the `listening on http://ADDR` line an engine simulator prints first.
async fn engine_addr(proc: &mut Proc) -> anyhow::Result<String> {
    let stdout = proc.child.stdout.take().context("engine simulator has no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(15), lines.next_line())
        .await
        .with_context(|| format!("{} printed no address within 15 s", proc.name))??
        .with_context(|| format!("{} exited before printing its address", proc.name))?;
    let addr = line.strip_prefix("listening on ").with_context(|| format!("unexpected first line '{line}'"))?;
    Ok(addr.to_string())
}

/// The port of `http://HOST:PORT`, or 0 (any port) if there is none.
fn port_of(url: &str) -> &str {
    url.rsplit(':').next().filter(|p| p.parse::<u16>().is_ok()).unwrap_or("0")
}

/// Replaces the value that follows `flag` in `args`.
fn set_arg(args: &mut [String], flag: &str, value: &str) {
    if let Some(at) = args.iter().position(|a| a == flag) {
        if let Some(slot) = args.get_mut(at + 1) {
            *slot = value.to_string();
        }
    }
}

/// Removes the demo's directory when dropped, unless something failed and its logs are needed.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

impl DemoArgs {
    /// Installs logging: to `gateway.log` in the demo's directory with only the demo's own
    /// lines and errors on the terminal, or everything on the terminal with `--verbose`.
    pub fn init_logging(&self, level: Option<&str>) -> anyhow::Result<()> {
        if self.verbose {
            return Ok(crate::logging::init(level)?);
        }
        let dir = directory();
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(crate::logging::init_to_file(level, &dir.join("gateway.log"), TERMINAL_LOG)?)
    }

    /// The engines model a prefix cache, so that a conversation's later turns get their first
    /// token sooner on the node that served the earlier ones: what prefix affinity is for.
    fn engine_args(&self, i: u16) -> Vec<String> {
        vec![
            "engine-sim".into(),
            "--port".into(),
            "0".into(),
            "--model".into(),
            self.model.clone(),
            "--ttft-ms".into(),
            self.ttft_ms.to_string(),
            "--tokens-per-s".into(),
            self.tokens_per_s.to_string(),
            "--kv-cache-tokens".into(),
            crate::engine_sim::DEFAULT_KV_CACHE_TOKENS.to_string(),
            "--prefill-us-per-token".into(),
            crate::engine_sim::DEFAULT_PREFILL_US_PER_TOKEN.to_string(),
            "--seed".into(),
            i.to_string(),
        ]
    }

    /// Starts the federation, prints how to use it, and runs until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        let stop = tela_runtime::signals::terminate()?;
        let mut stop = std::pin::pin!(stop);
        let mut dir = TempDir { path: directory(), keep: false };
        std::fs::create_dir_all(&dir.path).with_context(|| format!("cannot create {}", dir.path.display()))?;
        let exe = std::env::current_exe().context("cannot find the tela binary itself")?;
        let secret = generate_key();
        let key = generate_key();
        let keys = dir.path.join("api-keys");
        std::fs::write(&keys, format!("{} demo\n", key_line(&key)))?;

        let mut config = GatewayConfig::new(Identity::generate()?, JoinSecret::new(secret.as_str())?);
        config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        config.anchor_listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        config.auth = AuthConfig::KeyFile(keys);
        config.shutdown_grace = Duration::from_secs(5);
        config.routing = self.routing;
        let gateway = Gateway::start(config).await?;
        let anchor = gateway.anchor_addr().to_string();

        let mut children = Children { launcher: Launcher { exe, secret }, engines: Vec::new(), nodes: Vec::new() };
        let started = async {
            for i in 0..self.nodes {
                let log = dir.path.join(format!("engine-{i}.log"));
                let mut engine = children.launcher.start(format!("engine {i}"), self.engine_args(i), log, true)?;
                let url = engine_addr(&mut engine).await;
                // Pushed before the error is returned, so that it is stopped with the rest.
                if let Ok(url) = &url {
                    set_arg(&mut engine.args, "--port", port_of(url));
                }
                children.engines.push(engine);
                let url = url?;
                let args: Vec<String> = vec![
                    "node".into(),
                    "--join".into(),
                    anchor.clone(),
                    "--backend-url".into(),
                    url,
                    "--control".into(),
                    dir.path.join(format!("node-{i}.sock")).display().to_string(),
                    "--identity".into(),
                    dir.path.join(format!("node-{i}.key")).display().to_string(),
                    "--drain-window".into(),
                    "10s".into(),
                    "--probe-interval".into(),
                    "500ms".into(),
                ];
                let log = dir.path.join(format!("node-{i}.log"));
                children.nodes.push(children.launcher.start(format!("node {i}"), args, log, false)?);
            }
            let want = usize::from(self.nodes);
            gateway
                .runtime()
                .wait_for(Duration::from_secs(30), |s| {
                    s.replica().slots().iter().filter(|n| n.is_routable()).count() >= want
                })
                .await
                .with_context(|| {
                    format!("the nodes did not all reach SERVE within 30 s; see the logs in {}", dir.path.display())
                })?;
            anyhow::Ok(())
        };
        let outcome = tokio::select! {
            r = started => r,
            () = stop.as_mut() => Err(anyhow::anyhow!("interrupted while starting")),
        };
        if let Err(e) = outcome {
            children.stop().await;
            gateway.shutdown().await;
            dir.keep = true;
            return Err(e);
        }
        print_usage(&gateway.base_url(), &key, &self.model, usize::from(self.nodes), &dir.path, self.verbose)?;
        let outcome = children.supervise(stop).await;
        eprintln!("stopping: draining the nodes, then the engines and the gateway");
        children.stop().await;
        gateway.shutdown().await;
        if outcome.is_err() {
            dir.keep = true;
        }
        outcome
    }
}

fn print_usage(base: &str, key: &str, model: &str, nodes: usize, dir: &Path, verbose: bool) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Tela demo: 1 gateway, {nodes} nodes, {nodes} simulated engines on loopback (placeholder text, not a model)."
    )?;
    writeln!(out)?;
    writeln!(out, "  base URL:  {base}/v1")?;
    writeln!(out, "  API key:   {key}")?;
    writeln!(out, "  dashboard: {base}/#key={key}")?;
    if verbose {
        writeln!(out, "  logs:      {} (node-N.log, engine-N.log)", dir.display())?;
    } else {
        writeln!(out, "  logs:      {} (gateway.log, node-N.log, engine-N.log)", dir.display())?;
    }
    writeln!(out)?;
    writeln!(out, "curl:")?;
    writeln!(
        out,
        "  curl {base}/v1/chat/completions -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\\n    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}], \"stream\": true}}'"
    )?;
    writeln!(out)?;
    writeln!(out, "Python (pip install openai):")?;
    writeln!(out, "  from openai import OpenAI")?;
    writeln!(out, "  client = OpenAI(base_url=\"{base}/v1\", api_key=\"{key}\")")?;
    writeln!(out, "  for chunk in client.chat.completions.create(")?;
    writeln!(
        out,
        "          model=\"{model}\", messages=[{{\"role\": \"user\", \"content\": \"Hello\"}}], stream=True):"
    )?;
    writeln!(out, "      print(chunk.choices[0].delta.content or \"\", end=\"\", flush=True)")?;
    writeln!(out)?;
    writeln!(out, "A node or engine that dies is restarted. Ctrl-C stops everything.")?;
    out.flush()
}
