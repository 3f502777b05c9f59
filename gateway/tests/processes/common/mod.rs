//! A federation on loopback for the gateway's integration tests: an in-process [`Gateway`],
//! `tela node` child processes (killed when dropped) and in-process engine simulators, plus a
//! small HTTP client that sees responses chunk by chunk.
//!
//! Every wait is bounded; every process is killed on drop.
#![allow(dead_code)]

mod conversations;

pub use conversations::{next_turn, opening, ranking, turn};

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::Response;
use hyper_util::rt::TokioIo;

pub use crate::procs::free_port;
use serde_json::Value;
use tela_core::NodeId;
use tela_gateway::auth::key_line;
use tela_gateway::engine_sim::{self, EngineSimConfig, EngineSimHandle, FailMode};
use tela_gateway::gateway::{AuthConfig, Gateway, GatewayConfig};
use tela_transports::{Identity, JoinSecret};

/// The API key every test federation accepts.
pub const KEY: &str = "test-key-0123456789";
/// The federation's join secret.
pub const SECRET: &str = "test federation secret";
/// The model the default engines serve.
pub const MODEL: &str = "sim-model";

/// Bounds a whole test.
pub async fn within<T>(secs: u64, test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), test).await.expect("the test did not finish in time")
}

/// The `tela` binary under test.
pub fn tela() -> &'static str {
    env!("CARGO_BIN_EXE_tela")
}

/// Engine simulator settings: fast unless a test is about pacing.
pub fn engine(models: &[&str]) -> EngineSimConfig {
    EngineSimConfig {
        models: models.iter().map(|m| (*m).to_string()).collect(),
        ttft: Duration::from_millis(1),
        tokens_per_s: 2_000.0,
        ..EngineSimConfig::default()
    }
}

/// A slow engine: `tokens_per_s` tokens per second.
pub fn paced(tokens_per_s: f64) -> EngineSimConfig {
    EngineSimConfig { tokens_per_s, ..engine(&[MODEL]) }
}

/// An engine whose every inference request fails in `mode`.
pub fn failing(mode: FailMode) -> EngineSimConfig {
    EngineSimConfig { fail_rate: 1.0, fail_mode: mode, tokens_per_s: 200.0, ..engine(&[MODEL]) }
}

/// A `tela node` child process.
pub struct NodeProc {
    /// Its id.
    pub id: NodeId,
    /// Its control socket (for `tela drain`).
    pub control: PathBuf,
    /// Its log file.
    pub log: PathBuf,
    child: Child,
}

impl NodeProc {
    /// Wraps a `tela node` child started some other way (in a network namespace, say).
    pub fn from_parts(id: NodeId, control: PathBuf, log: PathBuf, child: Child) -> NodeProc {
        NodeProc { id, control, log, child }
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (the node drains, stops an engine it launched, and exits); waits for the exit.
    pub async fn terminate(&mut self, within: Duration) -> Option<i32> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        self.wait_exit(within).await
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) for the process to exit; returns its status code.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status.code().unwrap_or(-1));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process killed when dropped.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tela node` joining `join`, in front of the engine at `engine`.
pub fn spawn_node(dir: &Path, name: &str, join: &[String], engine: SocketAddr, extra: &[&str]) -> NodeProc {
    let key = dir.join(format!("{name}.key"));
    let id = Identity::load_or_create(&key).expect("node identity").node_id();
    let control = dir.join(format!("{name}.sock"));
    let log = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(tela());
    cmd.arg("node")
        .args(["--backend-url", &format!("http://{engine}")])
        .args(["--identity", key.to_str().expect("utf-8 path")])
        .args(["--control", control.to_str().expect("utf-8 path")])
        .args(["--probe-interval", "200ms", "--drain-window", "20s"])
        .args(extra)
        .env("TELA_JOIN_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .env_remove("TELA_JOIN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    for j in join {
        cmd.args(["--join", j]);
    }
    let child = cmd.spawn().expect("start tela node");
    NodeProc { id, control, log, child }
}

/// What a test federation looks like.
pub struct Options {
    /// One engine per node.
    pub engines: Vec<EngineSimConfig>,
    /// Extra flags for every node.
    pub node_args: Vec<&'static str>,
    /// Adjusts the gateway's configuration.
    pub tune: fn(&mut GatewayConfig),
    /// TLS certificate and key for the gateway.
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl Default for Options {
    fn default() -> Self {
        Options { engines: vec![engine(&[MODEL]), engine(&[MODEL])], node_args: vec![], tune: |_| {}, tls: None }
    }
}

/// A gateway, its nodes and their engines.
pub struct Fed {
    /// The gateway (in this process).
    pub gateway: Gateway,
    /// The nodes (child processes).
    pub nodes: Vec<NodeProc>,
    /// The engines (in this process).
    pub engines: Vec<EngineSimHandle>,
    /// Temporary files (identities, sockets, logs, the key file).
    pub dir: tempfile::TempDir,
}

/// A gateway configuration on loopback with the test key.
pub fn gateway_config(dir: &Path) -> GatewayConfig {
    let keys = dir.join("api-keys");
    if !keys.exists() {
        std::fs::write(&keys, format!("{} test\n", key_line(KEY))).expect("write key file");
    }
    let mut config =
        GatewayConfig::new(Identity::generate().expect("identity"), JoinSecret::new(SECRET).expect("secret"));
    config.listen = "127.0.0.1:0".parse().expect("addr");
    config.anchor_listen = "127.0.0.1:0".parse().expect("addr");
    config.auth = AuthConfig::KeyFile(keys);
    config.shutdown_grace = Duration::from_secs(2);
    config
}

impl Fed {
    /// The gateway's `/status` row of node `i`, if it lists the node.
    pub fn node_row(&self, i: usize) -> Option<serde_json::Value> {
        let short = self.nodes[i].id.to_string();
        let status = self.gateway.status();
        status["nodes"].as_array().and_then(|nodes| nodes.iter().find(|n| n["short"] == short.as_str())).cloned()
    }

    /// Starts everything and waits until every node is routable at the gateway.
    pub async fn start(options: Options) -> Fed {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = gateway_config(dir.path());
        (options.tune)(&mut config);
        config.tls = options.tls.clone();
        let gateway = Gateway::start(config).await.expect("gateway starts");
        let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
        for engine in options.engines {
            fed.add_node(engine, &options.node_args).await;
        }
        let n = fed.nodes.len();
        fed.wait_routable(n).await;
        fed
    }

    /// Adds a node with its own engine (does not wait for it).
    pub async fn add_node(&mut self, engine: EngineSimConfig, extra: &[&str]) -> usize {
        let handle = engine_sim::spawn(engine, "127.0.0.1:0".parse().expect("addr")).await.expect("engine starts");
        let join = vec![self.gateway.anchor_addr().to_string()];
        let name = format!("node-{}", self.nodes.len());
        let node = spawn_node(self.dir.path(), &name, &join, handle.local_addr(), extra);
        self.engines.push(handle);
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Waits until `n` nodes are routable and connected here.
    pub async fn wait_routable(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.gateway.status();
            let ready = status["nodes"]
                .as_array()
                .map_or(0, |nodes| nodes.iter().filter(|n| n["routable"] == true && n["tunnel"] == true).count());
            if ready >= n {
                return;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self.nodes.iter().map(|n| n.log_text()).collect();
                panic!(
                    "only {ready} of {n} nodes routable after 30 s: {status:#}\nnode logs:\n{}",
                    logs.join("\n---\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The gateway's base URL.
    pub fn base(&self) -> String {
        self.gateway.base_url()
    }

    /// The index of the node whose short id is `short`.
    pub fn node_index(&self, short: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id.to_string() == short)
    }
}

/// A raw response.
pub struct Reply {
    /// Status.
    pub status: u16,
    /// Headers.
    pub headers: hyper::HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a fresh HTTP/1.1 connection and returns the response head.
pub async fn send(base: &str, method: &str, path: &str, key: Option<&str>, body: Option<String>) -> Response<Incoming> {
    let uri: hyper::Uri = format!("{base}{path}").parse().expect("uri");
    let addr = format!("{}:{}", uri.host().expect("host"), uri.port_u16().expect("port"));
    let stream = tokio::net::TcpStream::connect(&addr).await.expect("connect to the gateway");
    stream.set_nodelay(true).expect("nodelay");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder().method(method).uri(path).header("host", addr);
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(Full::new(Bytes::from(body.unwrap_or_default()))).expect("request");
    sender.send_request(req).await.expect("response")
}

/// One request, the whole body read.
pub async fn call(base: &str, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> Reply {
    let response = send(base, method, path, key, body.map(|b| b.to_string())).await;
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("body within 30 s")
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Reply { status: parts.status.as_u16(), headers: parts.headers, body }
}

/// `POST path` with the test key.
pub async fn post(base: &str, path: &str, body: Value) -> Reply {
    call(base, "POST", path, Some(KEY), Some(body)).await
}

/// A chat request body.
pub fn chat(model: &str, stream: bool, max_tokens: u32) -> Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello there"}],
        "stream": stream,
        "max_tokens": max_tokens,
    })
}

/// A streamed response read chunk by chunk, with the time each arrived.
pub struct Streamed {
    /// Status.
    pub status: u16,
    /// Headers.
    pub headers: hyper::HeaderMap,
    /// Each chunk and when it arrived (since the request was sent).
    pub chunks: Vec<(Duration, Bytes)>,
    /// Whether the body ended with an error (a cut) rather than a clean end.
    pub cut: bool,
}

impl Streamed {
    /// All chunks as text.
    pub fn text(&self) -> String {
        self.chunks.iter().map(|(_, c)| String::from_utf8_lossy(c)).collect()
    }

    /// The `data:` payloads of the SSE events.
    pub fn events(&self) -> Vec<String> {
        self.text().split("\n\n").filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string)).collect()
    }

    /// The node that served it.
    pub fn node(&self) -> String {
        self.headers.get("x-tela-node").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    }
}

/// Reads a response chunk by chunk.
pub async fn read_stream(response: Response<Incoming>, started: Instant) -> Streamed {
    let (parts, mut body) = response.into_parts();
    let mut chunks = Vec::new();
    let mut cut = false;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), body.frame()).await {
            Err(_) => panic!("no chunk for 30 s"),
            Ok(None) => break,
            Ok(Some(Err(_))) => {
                cut = true;
                break;
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    chunks.push((started.elapsed(), data));
                }
            }
        }
    }
    Streamed { status: parts.status.as_u16(), headers: parts.headers, chunks, cut }
}

/// A streamed chat request, read to its end.
pub async fn stream_chat(base: &str, max_tokens: u32) -> Streamed {
    let started = Instant::now();
    let response =
        send(base, "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, max_tokens).to_string())).await;
    read_stream(response, started).await
}

/// Waits (bounded) for `pred` to hold.
pub async fn eventually(within: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if pred() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pred()
}

/// `tela drain` for a node.
pub fn drain(node: &NodeProc) {
    let out = Command::new(tela())
        .args(["drain", "--control", node.control.to_str().expect("utf-8")])
        .output()
        .expect("run tela drain");
    assert!(out.status.success(), "tela drain failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The resident set size of a process, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A second gateway: `tela gateway` as a child process that joined `fed`'s gateway, with the
/// same key file (killed on drop).
pub struct GatewayProc {
    pub child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    // Kept open: the gateway prints more lines after the first.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a second gateway listening on `listen` (e.g. `127.0.0.1:0`) with its anchor on
/// `anchor_port`, joined to `fed`'s gateway; `extra` arguments go after the others. Its log is
/// `gateway-b.log` in the federation's directory.
pub fn spawn_gateway(fed: &Fed, listen: &str, anchor_port: u16, extra: &[&str]) -> GatewayProc {
    use std::io::BufRead;
    let dir = fed.dir.path();
    let mut child = Command::new(tela())
        .arg("gateway")
        .args(["--listen", listen])
        .args(["--anchor-listen", &format!("127.0.0.1:{anchor_port}")])
        .args(["--join", &fed.gateway.anchor_addr().to_string()])
        .args(["--identity", dir.join("gateway-b.key").to_str().expect("utf-8")])
        .args(["--api-keys", dir.join("api-keys").to_str().expect("utf-8")])
        .args(extra)
        .env("TELA_JOIN_SECRET", SECRET)
        .env_remove("TELA_JOIN")
        .env_remove("TELA_ROUTING")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("gateway-b.log")).expect("log"))
        .spawn()
        .expect("start tela gateway");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line");
    let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected: {line}")).to_string();
    GatewayProc { child, base, _stdout: stdout }
}

/// Waits until `base`'s /status shows `n` routable nodes with a tunnel to it.
pub async fn wait_tunnels(base: &str, n: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let reply = call(base, "GET", "/status", Some(KEY), None).await;
        if reply.status == 200 {
            let connected = reply.json()["nodes"]
                .as_array()
                .map_or(0, |ns| ns.iter().filter(|n| n["routable"] == true && n["tunnel"] == true).count());
            if connected >= n {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// A `tela gateway` process of its own (it joins nobody), with its identity in `dir`, the key
/// file `keys` and warnings-only logs (killed on drop).
pub struct LoneGateway {
    pub child: ChildGuard,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Where nodes dial it.
    pub anchor: String,
    // Kept open: the gateway may print more lines.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

/// Starts a [`LoneGateway`] on loopback ports of the kernel's choosing.
pub fn start_lone_gateway(dir: &Path, keys: &Path) -> LoneGateway {
    use std::io::BufRead;
    let mut child = Command::new(tela())
        .args(["gateway", "--listen", "127.0.0.1:0", "--anchor-listen", "127.0.0.1:0"])
        .args(["--identity", dir.join("gw.key").to_str().expect("utf-8")])
        .args(["--api-keys", keys.to_str().expect("utf-8")])
        .env("TELA_JOIN_SECRET", SECRET)
        .env("RUST_LOG", "warn")
        .env_remove("TELA_JOIN")
        .env_remove("TELA_LEDGER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start tela gateway");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let child = ChildGuard(child);
    let (mut first, mut second) = (String::new(), String::new());
    stdout.read_line(&mut first).expect("line");
    stdout.read_line(&mut second).expect("line");
    let base = first.trim().trim_start_matches("listening on ").to_string();
    let anchor = second.trim().trim_start_matches("anchor on ").to_string();
    LoneGateway { child, base, anchor, _stdout: stdout }
}
