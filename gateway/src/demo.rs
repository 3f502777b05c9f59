//! `tela demo`: a whole federation on loopback from one command — a gateway, three serving nodes
//! and three built-in engine simulators.
//!
//! # Shape
//!
//! The gateway runs inside the demo process; every node and every engine simulator is a child
//! process of the same `tela` binary (`tela node`, `tela engine-sim`), so the demo exercises
//! exactly what a real deployment runs: nodes dial the gateway's anchor over QUIC, gossip, and
//! serve tunnelled requests. The children run in their own process group (a terminal's Ctrl-C
//! reaches only the demo, which then stops them in order), are killed if the demo dies, and log
//! to files in a temporary directory whose path the demo prints.
//!
//! Stopping (Ctrl-C or SIGTERM): nodes get SIGTERM and drain (they finish open requests, leave
//! the federation and exit), then the engines get SIGTERM, then the gateway stops; anything still
//! running after its grace period is killed, and the temporary directory is removed.
//!
//! The API needs a key: the demo makes one, puts its hash in the temporary key file, and prints
//! it in the curl line and the Python snippet.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tela_transports::{Identity, JoinSecret};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::auth::{generate_key, key_line};
use crate::gateway::{AuthConfig, Gateway, GatewayConfig};

/// Run a demo federation on loopback: a gateway, three nodes and three built-in engine
/// simulators (placeholder text, not a model). Prints the base URL, a curl line and an OpenAI
/// SDK snippet; Ctrl-C stops everything.
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

    /// The engines' time to first token, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub ttft_ms: u64,

    /// The engines' tokens per second.
    #[arg(long, default_value_t = 50.0)]
    pub tokens_per_s: f64,
}

/// A child process of the demo.
struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    /// Starts `exe args`; stdout is piped (engines print their address there) or discarded.
    fn spawn(name: String, exe: &Path, args: &[String], log: &Path, secret: &str, piped: bool) -> anyhow::Result<Proc> {
        let log_file = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(exe)
            .args(args)
            .env("TELA_JOIN_SECRET", secret)
            .env_remove("TELA_JOIN")
            .stdin(Stdio::null())
            .stdout(if piped { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::from(log_file))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {name} ({})", exe.display()))?;
        Ok(Proc { name, child })
    }

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

/// Removes the demo's directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl DemoArgs {
    /// Starts the federation, prints how to use it, and runs until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        let stop = crate::signal::shutdown_signal()?;
        let dir = TempDir(std::env::temp_dir().join(format!("tela-demo-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).with_context(|| format!("cannot create {}", dir.0.display()))?;
        let exe = std::env::current_exe().context("cannot find the tela binary itself")?;
        let secret = generate_key();
        let key = generate_key();
        let keys = dir.0.join("api-keys");
        std::fs::write(&keys, format!("{} demo\n", key_line(&key)))?;

        let mut config = GatewayConfig::new(Identity::generate()?, JoinSecret::new(secret.as_str())?);
        config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        config.anchor_listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        config.auth = AuthConfig::KeyFile(keys);
        config.shutdown_grace = Duration::from_secs(5);
        let gateway = Gateway::start(config).await?;
        let anchor = gateway.anchor_addr().to_string();

        let mut engines = Vec::new();
        let mut nodes = Vec::new();
        let started = async {
            for i in 0..self.nodes {
                let args: Vec<String> = vec![
                    "engine-sim".into(),
                    "--port".into(),
                    "0".into(),
                    "--model".into(),
                    self.model.clone(),
                    "--ttft-ms".into(),
                    self.ttft_ms.to_string(),
                    "--tokens-per-s".into(),
                    self.tokens_per_s.to_string(),
                    "--seed".into(),
                    i.to_string(),
                ];
                let mut engine = Proc::spawn(
                    format!("engine {i}"),
                    &exe,
                    &args,
                    &dir.0.join(format!("engine-{i}.log")),
                    &secret,
                    true,
                )?;
                let url = engine_addr(&mut engine).await?;
                engines.push(engine);
                let args: Vec<String> = vec![
                    "node".into(),
                    "--join".into(),
                    anchor.clone(),
                    "--backend-url".into(),
                    url,
                    "--control".into(),
                    dir.0.join(format!("node-{i}.sock")).display().to_string(),
                    "--identity".into(),
                    dir.0.join(format!("node-{i}.key")).display().to_string(),
                    "--drain-window".into(),
                    "10s".into(),
                    "--probe-interval".into(),
                    "500ms".into(),
                ];
                nodes.push(Proc::spawn(
                    format!("node {i}"),
                    &exe,
                    &args,
                    &dir.0.join(format!("node-{i}.log")),
                    &secret,
                    false,
                )?);
            }
            let want = usize::from(self.nodes);
            gateway
                .runtime()
                .wait_for(Duration::from_secs(30), |s| {
                    s.replica().slots().iter().filter(|n| n.is_routable()).count() >= want
                })
                .await
                .with_context(|| {
                    format!("the nodes did not all reach SERVE within 30 s; see the logs in {}", dir.0.display())
                })?;
            anyhow::Ok(())
        };
        let outcome = tokio::select! {
            r = started => r,
            () = stop_early() => Err(anyhow::anyhow!("interrupted while starting")),
        };
        if let Err(e) = outcome {
            shut_down(gateway, nodes, engines).await;
            return Err(e);
        }
        print_usage(&gateway.base_url(), &key, &self.model, usize::from(self.nodes), &dir.0)?;
        stop.await;
        eprintln!("stopping: draining the nodes, then the engines and the gateway");
        shut_down(gateway, nodes, engines).await;
        Ok(())
    }
}

/// A second watch on the signals while starting (the main one is awaited after start).
async fn stop_early() {
    match crate::signal::shutdown_signal() {
        Ok(signal) => signal.await,
        Err(_) => std::future::pending().await,
    }
}

async fn shut_down(gateway: Gateway, mut nodes: Vec<Proc>, mut engines: Vec<Proc>) {
    futures::future::join_all(nodes.iter_mut().map(|n| n.stop(Duration::from_secs(15)))).await;
    futures::future::join_all(engines.iter_mut().map(|e| e.stop(Duration::from_secs(5)))).await;
    gateway.shutdown().await;
}

fn print_usage(base: &str, key: &str, model: &str, nodes: usize, dir: &Path) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Tela demo: 1 gateway, {nodes} nodes, {nodes} simulated engines on loopback (placeholder text, not a model)."
    )?;
    writeln!(out)?;
    writeln!(out, "  base URL:  {base}/v1")?;
    writeln!(out, "  API key:   {key}")?;
    writeln!(out, "  dashboard: {base}/#key={key}")?;
    writeln!(out, "  logs:      {}", dir.display())?;
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
    writeln!(out, "Ctrl-C stops everything.")?;
    out.flush()
}
