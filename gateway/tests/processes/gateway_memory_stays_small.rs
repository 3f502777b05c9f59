//! The gateway's resident memory stays small: measured on a `tela gateway` process after it
//! has served a few hundred requests, streamed and not, through two nodes.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// The aim for a gateway is 50 MB (the test build, unoptimised, stays well below it too; the
/// benchmark reports the release build's figure).
const LIMIT_KIB: u64 = 50 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resident_memory_stays_under_the_limit_after_load() {
    within(120, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = dir.path().join("api-keys");
        std::fs::write(&keys, format!("{}\n", tela_gateway::auth::key_line(KEY))).expect("keys");
        let mut child = Command::new(tela())
            .args(["gateway", "--listen", "127.0.0.1:0", "--anchor-listen", "127.0.0.1:0"])
            .args(["--identity", dir.path().join("gw.key").to_str().expect("utf-8")])
            .args(["--api-keys", keys.to_str().expect("utf-8")])
            .env("TELA_JOIN_SECRET", SECRET)
            .env("RUST_LOG", "warn")
            .env_remove("TELA_JOIN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tela gateway");
        let stdout = child.stdout.take().expect("stdout");
        let child = ChildGuard(child);
        let mut stdout = BufReader::new(stdout);
        let (mut first, mut second) = (String::new(), String::new());
        stdout.read_line(&mut first).expect("line");
        stdout.read_line(&mut second).expect("line");
        let base = first.trim().trim_start_matches("listening on ").to_string();
        let anchor = second.trim().trim_start_matches("anchor on ").to_string();
        let pid = child.0.id();
        let idle_before = rss_kib(pid).expect("rss");

        let mut engines = Vec::new();
        let mut nodes = Vec::new();
        for i in 0..2 {
            let e = tela_gateway::engine_sim::spawn(engine(&[MODEL]), "127.0.0.1:0".parse().expect("addr"))
                .await
                .expect("engine");
            nodes.push(spawn_node(dir.path(), &format!("n{i}"), std::slice::from_ref(&anchor), e.local_addr(), &[]));
            engines.push(e);
        }
        let ready = async {
            loop {
                let s = call(&base, "GET", "/status", Some(KEY), None).await.json();
                if s["nodes"].as_array().is_some_and(|n| n.iter().filter(|n| n["tunnel"] == true).count() == 2) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), ready).await.expect("nodes connect");

        let mut tasks = Vec::new();
        for worker in 0..8 {
            let base = base.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..40 {
                    let stream = (worker + i) % 2 == 0;
                    let r = post(&base, "/v1/chat/completions", chat(MODEL, stream, 16)).await;
                    assert_eq!(r.status, 200);
                }
            }));
        }
        for t in tasks {
            t.await.expect("worker");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = rss_kib(pid).expect("rss");
        eprintln!("gateway RSS: {idle_before} KiB idle at start, {after} KiB after 320 requests");
        drop(child);
        assert!(after < LIMIT_KIB, "gateway RSS {after} KiB after load exceeds {LIMIT_KIB} KiB");
    })
    .await;
}
