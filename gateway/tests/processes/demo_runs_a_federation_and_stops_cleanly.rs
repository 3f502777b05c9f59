//! `tela demo`: one command brings up a gateway with three nodes and engines, prints a banner
//! that stands alone on the terminal (the gateway's log goes to a file), answers the OpenAI API
//! at the URL it prints, restarts a node or engine that dies (reaped, reported, healed), gives
//! up on one that keeps dying, and stops every process on SIGTERM.

use crate::common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};

/// A running `tela demo` with its stdout and stderr collected as they arrive. Dropping it kills
/// the demo's children first (they do not outlive a killed demo on their own), then the demo.
struct Demo {
    child: Option<tokio::process::Child>,
    pid: u32,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    base: String,
    key: String,
}

impl Demo {
    /// Starts `tela demo --port 0 <extra>` and waits (bounded) for its whole banner.
    async fn start(extra: &[&str]) -> Demo {
        let mut child = tokio::process::Command::new(tela())
            .args(["demo", "--port", "0", "--ttft-ms", "1", "--tokens-per-s", "1000"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start tela demo");
        let pid = child.id().expect("pid");
        let stdout = collect(BufReader::new(child.stdout.take().expect("stdout")));
        let stderr = collect(BufReader::new(child.stderr.take().expect("stderr")));
        let mut demo = Demo { child: Some(child), pid, stdout, stderr, base: String::new(), key: String::new() };
        let banner_done =
            demo.wait_output(Duration::from_secs(60), |out, _| out.contains("Ctrl-C stops everything")).await;
        assert!(banner_done, "no whole banner within 60 s\nstdout:\n{}\nstderr:\n{}", demo.out(), demo.err());
        let out = demo.out();
        for line in out.lines() {
            if let Some(url) = line.trim().strip_prefix("base URL:") {
                demo.base = url.trim().trim_end_matches("/v1").to_string();
            }
            if let Some(k) = line.trim().strip_prefix("API key:") {
                demo.key = k.trim().to_string();
            }
        }
        assert!(!demo.base.is_empty() && !demo.key.is_empty(), "no base URL or key in:\n{out}");
        demo
    }

    fn out(&self) -> String {
        self.stdout.lock().expect("lock").clone()
    }

    fn err(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Waits (bounded) until `pred(stdout, stderr)` holds.
    async fn wait_output(&self, within: Duration, mut pred: impl FnMut(&str, &str) -> bool) -> bool {
        eventually(within, || pred(&self.out(), &self.err())).await
    }

    /// The first stderr line containing every one of `parts`, waiting up to `within`.
    async fn err_line(&self, within: Duration, parts: &[&str]) -> String {
        let find = |err: &str| err.lines().find(|l| parts.iter().all(|p| l.contains(p))).map(str::to_string);
        let found = self.wait_output(within, |_, err| find(err).is_some()).await;
        assert!(found, "no line with {parts:?} on the demo's stderr within {within:?}:\n{}", self.err());
        find(&self.err()).expect("found above")
    }

    /// The demo's child processes: `(pid, subcommand, args)`.
    fn children(&self) -> Vec<(u32, String, String)> {
        children(self.pid)
            .into_iter()
            .filter_map(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let args: Vec<String> =
                    cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
                Some((pid, args.get(1).cloned().unwrap_or_default(), args.join(" ")))
            })
            .collect()
    }

    /// The pid of the child whose subcommand is `sub` and whose arguments contain `marker`.
    fn child_pid(&self, sub: &str, marker: &str) -> u32 {
        let kids = self.children();
        kids.iter()
            .find(|(_, s, args)| s == sub && args.contains(marker))
            .map(|(pid, _, _)| *pid)
            .unwrap_or_else(|| panic!("no `tela {sub}` child with '{marker}' among {kids:?}"))
    }

    /// `/status`, with the routable nodes as `(id, generation)`.
    async fn routable(&self) -> Vec<(String, u64)> {
        let status = call(&self.base, "GET", "/status", Some(&self.key), None).await.json();
        status["nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .filter(|n| n["routable"] == true)
                    .map(|n| (n["id"].as_str().unwrap_or_default().to_string(), n["generation"].as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn chat(&self) -> Reply {
        call(&self.base, "POST", "/v1/chat/completions", Some(&self.key), Some(chat("tela-demo", false, 4))).await
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid as i32), signal).expect("signal the demo");
    }

    /// Waits (bounded) for the demo to exit.
    async fn exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("still running");
        let status = tokio::time::timeout(within, child.wait()).await;
        self.child = Some(child);
        status
            .unwrap_or_else(|_| panic!("the demo did not exit within {within:?}; stderr:\n{}", self.err()))
            .expect("wait")
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        for pid in children(self.pid) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("tela-demo-{}", self.pid)));
    }
}

/// Appends every line `reader` yields to the returned string, in the background.
fn collect(reader: impl AsyncBufRead + Unpin + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    tokio::spawn(async move {
        let mut lines = reader.lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut text = sink.lock().expect("lock");
            text.push_str(&line);
            text.push('\n');
        }
    });
    text
}

/// The children of every thread of `pid` (a child belongs to the thread that spawned it).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|list| list.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// The pids in the `NAME restarted (pid N)` lines of `err`, in order.
fn restarted_pids(err: &str, name: &str) -> Vec<u32> {
    let prefix = format!("{name} restarted (pid ");
    err.lines().filter_map(|l| l.split(prefix.as_str()).nth(1)?.split(')').next()?.parse().ok()).collect()
}

/// A process's state letter (`Z` for a zombie), or `None` once it is gone.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Log lines as the gateway writes them (a level word in capitals), outside the demo's own.
fn log_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].iter().any(|level| l.contains(level))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_serves_the_api_and_stops_everything_on_sigterm() {
    within(120, async {
        let mut demo = Demo::start(&[]).await;
        let printed = demo.out();
        for wanted in
            ["base URL:  http://127.0.0.1:", "API key:   ", "curl http://127.0.0.1:", "from openai import OpenAI"]
        {
            assert!(printed.contains(wanted), "the banner lacks '{wanted}':\n{printed}");
        }
        assert!(printed.contains("gateway.log"), "the banner says where the logs are:\n{printed}");

        let models = call(&demo.base, "GET", "/v1/models", Some(&demo.key), None).await;
        assert_eq!(models.json()["data"][0]["id"], "tela-demo");
        assert_eq!(demo.routable().await.len(), 3, "three nodes serve");
        let reply = demo.chat().await;
        assert_eq!(reply.status, 200, "{}", reply.text());

        // The banner stands alone: the gateway logged to its file, not to the terminal.
        assert!(
            log_lines(&demo.out()).is_empty() && demo.err().is_empty(),
            "stdout:\n{}\nstderr:\n{}",
            demo.out(),
            demo.err()
        );
        let log = std::env::temp_dir().join(format!("tela-demo-{}", demo.pid)).join("gateway.log");
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(logged.contains("INFO"), "the gateway logs to {}: '{logged}'", log.display());

        let kids = children(demo.pid);
        assert_eq!(kids.len(), 6, "three nodes and three engines run as children: {kids:?}");
        demo.signal(Signal::SIGTERM);
        let started = Instant::now();
        let status = demo.exit(Duration::from_secs(40)).await;
        assert!(status.success(), "the demo exits 0 after SIGTERM: {status:?} after {:?}", started.elapsed());
        for kid in kids {
            assert!(!std::path::Path::new(&format!("/proc/{kid}")).exists(), "child {kid} is still running");
        }
        // Stopping is no crash: only the demo's own line about stopping.
        let err = demo.err();
        assert!(err.lines().all(|l| l.starts_with("stopping:")), "stderr after SIGTERM:\n{err}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_children_are_reaped_reported_and_restarted() {
    within(180, async {
        let mut demo = Demo::start(&["--nodes", "2"]).await;
        let before = demo.routable().await;
        assert_eq!(before.len(), 2, "two nodes serve: {before:?}");

        let node = demo.child_pid("node", "node-0.sock");
        let engine = demo.child_pid("engine-sim", "--seed 1");
        kill(Pid::from_raw(node as i32), Signal::SIGKILL).expect("kill node 0");
        kill(Pid::from_raw(engine as i32), Signal::SIGKILL).expect("kill engine 1");

        // One line each: which child, how it ended, where its log is; then its restart.
        let wait = Duration::from_secs(30);
        let died = demo.err_line(wait, &["node 0", &format!("(pid {node})"), "died"]).await;
        assert!(died.contains("SIGKILL") && died.contains("node-0.log") && died.contains("restarting"), "{died}");
        let died = demo.err_line(wait, &["engine 1", &format!("(pid {engine})"), "died"]).await;
        assert!(died.contains("SIGKILL") && died.contains("engine-1.log") && died.contains("restarting"), "{died}");
        demo.err_line(wait, &["node 0 restarted (pid "]).await;
        demo.err_line(wait, &["engine 1 restarted (pid "]).await;

        // Reaped, not zombies; and the federation is whole again.
        assert_ne!(state(node), Some('Z'), "the killed node is a zombie");
        assert_ne!(state(engine), Some('Z'), "the killed engine is a zombie");
        let kids = demo.children();
        assert_eq!(kids.len(), 4, "two nodes and two engines run again: {kids:?}");
        for (pid, sub, _) in &kids {
            assert_ne!(state(*pid), Some('Z'), "{sub} child {pid} is a zombie");
        }
        // The restarted node serves in a new generation, next to the other node.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut now = demo.routable().await;
        while !(now.len() == 2 && now.iter().any(|n| !before.contains(n))) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            now = demo.routable().await;
        }
        assert!(now.len() == 2 && now.iter().any(|n| !before.contains(n)), "before {before:?}, now {now:?}");
        // Both nodes answer (the one whose engine was restarted included): every request succeeds.
        let mut served = 0;
        while served < 6 && Instant::now() < deadline {
            let reply = demo.chat().await;
            if reply.status == 200 {
                served += 1;
            } else {
                served = 0;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        assert_eq!(served, 6, "six chat completions in a row after the restarts; stderr:\n{}", demo.err());

        // Stopping stops the restarted children too, and reports no more deaths.
        let kids: Vec<u32> = kids.iter().map(|(pid, _, _)| *pid).collect();
        demo.signal(Signal::SIGTERM);
        let status = demo.exit(Duration::from_secs(40)).await;
        assert!(status.success(), "the demo exits 0 after SIGTERM: {status:?}");
        for kid in kids {
            assert!(state(kid).is_none(), "child {kid} is still there after the demo stopped");
        }
        let err = demo.err();
        assert_eq!(err.matches("died").count(), 2, "only the two kills are reported:\n{err}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_keeps_dying_ends_the_demo_with_an_error() {
    within(180, async {
        let mut demo = Demo::start(&["--nodes", "1"]).await;
        let mut engine = demo.child_pid("engine-sim", "--seed 0");
        let wait = Duration::from_secs(30);
        for restart in 1..=3 {
            kill(Pid::from_raw(engine as i32), Signal::SIGKILL).expect("kill the engine");
            let died =
                demo.err_line(wait, &[&format!("engine 0 (pid {engine}) died"), &format!("{restart} of 3")]).await;
            assert!(died.contains("engine-0.log"), "{died}");
            let restarted = demo.wait_output(wait, |_, err| restarted_pids(err, "engine 0").len() == restart).await;
            assert!(restarted, "restart {restart} is reported:\n{}", demo.err());
            engine = restarted_pids(&demo.err(), "engine 0")[restart - 1];
        }
        kill(Pid::from_raw(engine as i32), Signal::SIGKILL).expect("kill the engine a fourth time");
        let status = demo.exit(Duration::from_secs(60)).await;
        assert!(!status.success(), "a demo that gives up exits non-zero: {status:?}");
        let err = demo.err();
        assert!(err.contains("giving up") && err.contains("engine 0 keeps dying"), "{err}");
        let log = std::env::temp_dir().join(format!("tela-demo-{}", demo.pid)).join("engine-0.log");
        assert!(log.exists(), "the logs it points at are kept: {}", log.display());
    })
    .await;
}
