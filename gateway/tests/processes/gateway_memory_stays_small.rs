//! The gateway's resident memory stays small: measured on a `tela gateway` process after it
//! has served a few hundred requests, streamed and not, through two nodes.

use crate::common;

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
        let gw = start_lone_gateway(dir.path(), &keys);
        let (base, anchor) = (gw.base.clone(), gw.anchor.clone());
        let pid = gw.child.0.id();
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
        drop(gw);
        assert!(after < LIMIT_KIB, "gateway RSS {after} KiB after load exceeds {LIMIT_KIB} KiB");
    })
    .await;
}
