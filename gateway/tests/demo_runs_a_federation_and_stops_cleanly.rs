//! `tela demo`: one command brings up a gateway with three nodes and engines, answers the
//! OpenAI API at the URL it prints, and stops every process on SIGTERM.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Kills the demo if the test fails half-way.
struct Guard(Option<tokio::process::Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.start_kill();
        }
    }
}

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_serves_the_api_and_stops_everything_on_sigterm() {
    within(120, async {
        let mut child = tokio::process::Command::new(tela())
            .args(["demo", "--port", "0", "--ttft-ms", "1", "--tokens-per-s", "1000"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start tela demo");
        let stdout = child.stdout.take().expect("stdout");
        let pid = child.id().expect("pid");
        let mut guard = Guard(Some(child));
        let mut lines = BufReader::new(stdout).lines();
        let (mut base, mut key, mut printed) = (None, None, String::new());
        while base.is_none() || key.is_none() {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .expect("the demo prints its URL within 60 s")
                .expect("read")
                .unwrap_or_else(|| panic!("the demo exited early; it printed:\n{printed}"));
            printed.push_str(&line);
            printed.push('\n');
            if let Some(url) = line.trim().strip_prefix("base URL:") {
                base = Some(url.trim().trim_end_matches("/v1").to_string());
            }
            if let Some(k) = line.trim().strip_prefix("API key:") {
                key = Some(k.trim().to_string());
            }
        }
        let (base, key) = (base.expect("base"), key.expect("key"));
        // Read the rest of the banner: the curl line and the Python snippet.
        while !printed.contains("Ctrl-C") {
            match tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    printed.push_str(&line);
                    printed.push('\n');
                }
                _ => break,
            }
        }
        assert!(printed.contains("curl ") && printed.contains("from openai import OpenAI"), "{printed}");

        let models = call(&base, "GET", "/v1/models", Some(&key), None).await;
        assert_eq!(models.json()["data"][0]["id"], "tela-demo");
        let status = call(&base, "GET", "/status", Some(&key), None).await.json();
        let serving = status["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["routable"] == true).count());
        assert_eq!(serving, 3, "{status:#}");
        let reply = post_with(&base, &key).await;
        assert_eq!(reply.status, 200, "{}", reply.text());

        let kids = children(pid);
        assert_eq!(kids.len(), 6, "three nodes and three engines run as children: {kids:?}");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM)
            .expect("SIGTERM");
        let started = Instant::now();
        let mut child = guard.0.take().expect("child");
        let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
            .await
            .expect("the demo stops within 40 s")
            .expect("wait");
        assert!(status.success(), "the demo exits 0 after SIGTERM: {status:?} after {:?}", started.elapsed());
        for kid in kids {
            assert!(!std::path::Path::new(&format!("/proc/{kid}")).exists(), "child {kid} is still running");
        }
    })
    .await;
}

async fn post_with(base: &str, key: &str) -> Reply {
    call(base, "POST", "/v1/chat/completions", Some(key), Some(chat("tela-demo", false, 4))).await
}
