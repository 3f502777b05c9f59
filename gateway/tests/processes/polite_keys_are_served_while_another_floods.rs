//! Fair queueing between keys: while one key floods a saturated model, another key's requests
//! still complete, each after about one of the flood's requests rather than after the flood's
//! whole queue; and the flooding key gets 429 once its own queue is full.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tela_gateway::auth::entry_line;
use tela_gateway::fairness::FairSettings;
use tela_gateway::gateway::Gateway;

const FLOOD: &str = "flooding-key-0123456789";
const POLITE: &str = "polite-key-0123456789";
/// Requests in flight per node before requests queue per key.
const SLOTS: usize = 2;
/// Requests one key may have waiting.
const QUEUE: usize = 8;
/// Concurrent clients of the flooding key: more than its slots and queue hold.
const FLOODERS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polite_key_is_served_in_turn_while_another_key_floods() {
    within(150, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = format!(
            "{} test\n{}\n{}\n",
            tela_gateway::auth::key_line(KEY),
            entry_line(FLOOD, &[("name", "flood".into())]),
            entry_line(POLITE, &[("name", "polite".into())]),
        );
        std::fs::write(dir.path().join("api-keys"), keys).expect("key file");
        let mut config = gateway_config(dir.path());
        config.fairness =
            FairSettings { slots_per_node: SLOTS, queue_per_key: QUEUE, max_wait: Duration::from_secs(60) };
        let gateway = Gateway::start(config).await.expect("gateway starts");
        let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
        // About 100 ms per request of 20 tokens.
        fed.add_node(paced(200.0), &[]).await;
        fed.wait_routable(1).await;
        let base = fed.base();

        let stop = Arc::new(AtomicBool::new(false));
        let (done, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut flooders = Vec::new();
        for _ in 0..FLOODERS {
            let (base, stop, done, refused) = (base.clone(), stop.clone(), done.clone(), refused.clone());
            flooders.push(tokio::spawn(async move {
                for _ in 0..2000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r =
                        call(&base, "POST", "/v1/chat/completions", Some(FLOOD), Some(chat(MODEL, false, 20))).await;
                    match r.status {
                        200 => {
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                        429 => {
                            let v = r.json();
                            assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
                            assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("saturated")), "{v}");
                            refused.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        other => panic!("flood request: {other} {}", r.text()),
                    }
                }
            }));
        }
        // The flood saturates the model and fills its own queue.
        assert!(
            eventually(Duration::from_secs(30), || refused.load(Ordering::SeqCst) > 0).await,
            "the flooding key's queue never filled"
        );

        // The polite key's requests complete, each after a few of the flood's: the two slots'
        // requests and about one turn of the flood's, not its queue of eight ahead.
        for i in 0..4 {
            let before = done.load(Ordering::SeqCst);
            let r = call(&base, "POST", "/v1/chat/completions", Some(POLITE), Some(chat(MODEL, false, 20))).await;
            let flood_meanwhile = done.load(Ordering::SeqCst) - before;
            assert_eq!(r.status, 200, "polite request {i}: {}", r.text());
            eprintln!("polite request {i}: {flood_meanwhile} of the flood's requests ended meanwhile");
            assert!(
                flood_meanwhile <= (SLOTS + 5) as u64,
                "polite request {i} waited for {flood_meanwhile} of the flood's requests (its queue holds {QUEUE})"
            );
        }
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        assert!(
            metrics.lines().any(|l| l.starts_with("tela_gateway_key_refusals_total")
                && l.contains("key=\"flood\"")
                && l.contains("limit=\"fair_queue\"")),
            "the flood's refusals are counted: {metrics}"
        );
        stop.store(true, Ordering::Relaxed);
        for f in flooders {
            f.await.expect("flooder");
        }
    })
    .await;
}
