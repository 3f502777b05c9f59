//! Helpers for the integration tests that drive `tela node` and `tela anchor` processes: the
//! `tela` binary, child processes that are killed when
//! the test ends (whatever way it ends), their logs, an anchor embedded in the test process,
//! and bounded waits. Every process binds 127.0.0.1 only.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tela_core::{Lifecycle, NodeId, SharedRecord};
use tela_runtime::anchor::{Anchor, AnchorConfig};
use tela_runtime::status::RegistrySnapshot;
use tela_transports::{Identity, JoinSecret, TransportMode};

mod ports;
#[allow(unused_imports)] // not every test binary starts a server on a chosen port
pub use ports::free_port;

pub const SECRET: &str = "integration-test-secret";

/// The `tela` binary Cargo built for these tests (this package owns it, so Cargo builds it
/// before any test starts and no clock runs while it does).
pub fn tela_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tela"))
}

/// A child process killed (SIGKILL) and reaped when dropped; its stderr (and stdout) lines
/// are kept for assertions and printed if the test fails.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    lines: Arc<Mutex<Vec<String>>>,
    pub first_stdout_line: Option<String>,
}

impl Proc {
    /// Starts `tela <args>` with `envs`, a clean `TELA_*` environment and `info` logs.
    pub fn tela(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(tela_bin());
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("TELA_") || key == "SLURM_JOB_ID" {
                cmd.env_remove(key);
            }
        }
        cmd.env("RUST_LOG", "info");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Proc::spawn(name, cmd)
    }

    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(err) = child.stderr.take() {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            });
        }
        let mut proc = Proc { name: name.into(), child: Some(child), lines, first_stdout_line: None };
        if let Some(out) = proc.child.as_mut().and_then(|c| c.stdout.take()) {
            let lines = proc.lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().unwrap_or_else(|e| e.into_inner()).push(format!("[stdout] {line}"));
                }
            });
        }
        proc
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Every line so far.
    pub fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn log_text(&self) -> String {
        self.log().join("\n")
    }

    /// Waits for a log line containing `needle`; returns it.
    pub fn wait_line(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self.log().into_iter().find(|l| l.contains(needle)) {
                return l;
            }
            if Instant::now() > deadline {
                panic!("{}: no line containing {needle:?} within {within:?}; log:\n{}", self.name, self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for a line containing `needle` after the first `skip` lines.
    pub fn wait_line_after(&self, skip: usize, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self.log().into_iter().skip(skip).find(|l| l.contains(needle)) {
                return l;
            }
            if Instant::now() > deadline {
                panic!("{}: no new line containing {needle:?} within {within:?}; log:\n{}", self.name, self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal).expect("signal the process");
    }

    /// Waits for the process to exit by itself; returns its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status.code();
            }
            if Instant::now() > deadline {
                panic!("{} did not exit within {within:?}; log:\n{}", self.name, self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills it now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("----- {} -----\n{}", self.name, self.log_text());
        }
        self.kill();
    }
}

/// `tela engine-sim` on a free loopback port; returns it and its base URL.
pub fn engine_sim(name: &str, model: &str, extra: &[&str]) -> (Proc, String) {
    let mut args = vec!["engine-sim", "--host", "127.0.0.1", "--port", "0", "--model", model];
    args.extend_from_slice(extra);
    let p = Proc::tela(name, &args, &[]);
    let line = p.wait_line("[stdout] listening on http://", Duration::from_secs(20));
    let url = line.trim_start_matches("[stdout] listening on ").trim().to_string();
    (p, url)
}

/// Files of one node: identity key and control socket in `dir`.
pub struct NodeFiles {
    pub identity: PathBuf,
    pub control: PathBuf,
}

impl NodeFiles {
    pub fn new(dir: &Path, name: &str) -> NodeFiles {
        NodeFiles { identity: dir.join(format!("{name}.key")), control: dir.join(format!("{name}.sock")) }
    }

    /// The node id its identity key gives (creating the key).
    pub fn node_id(&self) -> NodeId {
        Identity::load_or_create(&self.identity).expect("identity").node_id()
    }
}

/// `tela node` joining `join`, with fast probes, its own key and control socket.
pub fn node(name: &str, files: &NodeFiles, join: &str, secret: &str, extra: &[&str]) -> Proc {
    let identity = files.identity.to_str().expect("utf-8 path");
    let control = files.control.to_str().expect("utf-8 path");
    let mut args =
        vec!["node", "--join", join, "--identity", identity, "--control", control, "--probe-interval", "200ms"];
    args.extend_from_slice(extra);
    Proc::tela(name, &args, &[("TELA_JOIN_SECRET", secret)])
}

/// An anchor inside the test process, on a free loopback port.
pub async fn anchor() -> Anchor {
    Anchor::start(AnchorConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        advertise: None,
        identity: Identity::generate().expect("identity"),
        join_secret: JoinSecret::new(SECRET).expect("secret"),
        join: vec![],
        transport: TransportMode::Auto,
        drain_window: Duration::from_secs(5),
    })
    .await
    .expect("start the anchor")
}

/// Waits until the anchor's registry satisfies `pred`; fails with the registry otherwise.
pub async fn until(anchor: &Anchor, what: &str, within: Duration, pred: impl FnMut(&RegistrySnapshot) -> bool) {
    if anchor.runtime().wait_for(within, pred).await.is_none() {
        panic!("{what}: not within {within:?}; the anchor's registry:\n{}", anchor.runtime().snapshot().to_table());
    }
}

/// `id`'s record in `snap` if it is in `state`.
pub fn record_in(snap: &RegistrySnapshot, id: &NodeId, state: Lifecycle) -> Option<SharedRecord> {
    snap.record(id).map(|(r, _)| r).filter(|r| r.state == state)
}

/// Whether `id` is routable (SERVE, alive, with models) in `snap`.
pub fn routable(snap: &RegistrySnapshot, id: &NodeId) -> bool {
    snap.record(id).is_some_and(|(_, routable)| routable)
}

/// Runs `f` on a multi-threaded tokio runtime with a hard time limit, so a hung test fails
/// instead of hanging CI.
pub fn run_test<F: std::future::Future<Output = ()>>(limit: Duration, f: F) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        if tokio::time::timeout(limit, f).await.is_err() {
            panic!("the test did not finish within {limit:?}");
        }
    });
}

/// The registry of a `tela node` or `tela anchor` process, read over its control socket.
pub async fn status_of(control: &Path) -> serde_json::Value {
    let answer = tela_runtime::control::request(control, "status").await.expect("status over the control socket");
    answer["status"].clone()
}

/// `(id, generation, state, models)` of every record, sorted: what replicas must agree on.
pub fn view_of_json(status: &serde_json::Value) -> Vec<(String, u64, String, Vec<String>)> {
    let mut v: Vec<_> = status["registry"]
        .as_array()
        .expect("registry list")
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap_or_default().to_string(),
                n["generation"].as_u64().unwrap_or_default(),
                n["state"].as_str().unwrap_or_default().to_string(),
                n["models"]
                    .as_array()
                    .map(|m| m.iter().filter_map(|x| x.as_str().map(String::from)).collect())
                    .unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

/// The same view from an in-process snapshot.
pub fn view_of(snap: &RegistrySnapshot) -> Vec<(String, u64, String, Vec<String>)> {
    view_of_json(&snap.to_json())
}

/// Three `tela node` processes, each attached to its own `tela engine-sim`, join an anchor
/// over `transport`; every replica (the anchor's and each node's) must end up agreeing on
/// the registry, and the anchor's connections must use the expected transport.
pub fn federation_agrees(transport: &str, expected: tela_transports::Transport) {
    run_test(Duration::from_secs(90), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = anchor().await;
        let (procs, nodes) = three_nodes(&anchor, dir.path(), &["--transport", transport]);
        until(&anchor, "all three nodes routable at the anchor", Duration::from_secs(30), |s| {
            nodes.iter().all(|(id, _)| routable(s, id))
        })
        .await;
        let snap = anchor.runtime().snapshot();
        for (i, (id, _)) in nodes.iter().enumerate() {
            let (record, _) = snap.record(id).expect("known");
            let names: Vec<&str> = record.models.as_slice().iter().map(|m| m.name.as_str()).collect();
            assert_eq!(names, vec![format!("model-{i}").as_str()], "node {i} announces its engine's model");
            assert_eq!(snap.replica().serving(&format!("model-{i}")).to_vec(), [*id]);
            let conn = anchor.runtime().view().connection(id).expect("a live connection to the node");
            assert_eq!(conn.transport(), expected, "node {i} joined over {expected}");
        }
        replicas_agree(&anchor, &nodes, 4).await;
        drop(procs);
    });
}

/// Three `tela node` processes `node0..2` dialing `anchor`, each with an engine simulator
/// serving `model-{i}`; `extra` flags go to every node. Returns the processes (engine, node per
/// index) and each node's id and files.
pub fn three_nodes(anchor: &Anchor, dir: &Path, extra: &[&str]) -> (Vec<Proc>, Vec<(NodeId, NodeFiles)>) {
    let join = anchor.local_addr().to_string();
    let mut procs = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let (engine, url) = engine_sim(&format!("engine{i}"), &format!("model-{i}"), &[]);
        let files = NodeFiles::new(dir, &format!("node{i}"));
        let id = files.node_id();
        let mut args = vec!["--backend-url", url.as_str()];
        args.extend_from_slice(extra);
        let n = node(&format!("node{i}"), &files, &join, SECRET, &args);
        procs.push(engine);
        procs.push(n);
        nodes.push((id, files));
    }
    (procs, nodes)
}

/// Waits until every node's replica equals the anchor's view (ids, generations, states,
/// models), which must hold `members` records.
pub async fn replicas_agree(anchor: &Anchor, nodes: &[(NodeId, NodeFiles)], members: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let want = view_of(&anchor.runtime().snapshot());
        assert_eq!(want.len(), members, "the anchor's registry");
        let mut disagree = Vec::new();
        for (i, (_, files)) in nodes.iter().enumerate() {
            let got = view_of_json(&status_of(&files.control).await);
            if got != want {
                disagree.push(format!("node{i}: {got:?}"));
            }
        }
        if disagree.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "replicas disagree with the anchor's {want:?}:\n{}", disagree.join("\n"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A chat completion streamed through a tunnel stream that the anchor opened toward `node`.
pub struct TunnelResponse {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: String,
}

/// Opens a tunnel stream from `anchor` to `node` and sends a chat completion request.
pub async fn open_chat(
    anchor: &Anchor,
    node: &NodeId,
    model: &str,
    max_tokens: u32,
    stream: bool,
) -> (tela_transports::SendStream, tela_transports::RecvStream) {
    use tokio::io::AsyncWriteExt;
    let conn = anchor.runtime().view().connection(node).expect("the node is connected to the anchor");
    let (mut send, recv) = conn.open_stream().await.expect("open a stream");
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string();
    let head = tela_transports::tunnel::RequestHead {
        method: "POST".into(),
        path_and_query: "/v1/chat/completions".into(),
        headers: vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("content-length".into(), body.len().to_string().into_bytes()),
            ("host".into(), b"gateway.example".to_vec()),
        ],
    };
    tela_transports::tunnel::write_request_head(&mut send, &head).await.expect("write the head");
    // A node that refuses the request (DOWN, draining) answers from the head alone and stops
    // reading, so the body may meet a stopped stream: the response, read by the caller, decides.
    if let Err(e) = send.write_all(body.as_bytes()).await {
        eprintln!("the node stopped reading the request body: {e}");
    } else if let Err(e) = send.shutdown().await {
        eprintln!("the node stopped reading before the request was finished: {e}");
    }
    (send, recv)
}

/// Reads a whole tunnelled response.
pub async fn read_response(recv: &mut tela_transports::RecvStream) -> TunnelResponse {
    use tokio::io::AsyncReadExt;
    let head = tela_transports::tunnel::read_response_head(recv).await.expect("a response head");
    let mut body = Vec::new();
    recv.read_to_end(&mut body).await.expect("read the body");
    TunnelResponse { status: head.status, headers: head.headers, body: String::from_utf8_lossy(&body).into_owned() }
}
