//! SIGUSR1 (Slurm's `--signal=B:USR1@N`) on a node with open tunnelled streams: the node
//! turns DOWN at once (new streams get 503), the open streams run to their end, then the node
//! is LEFT and the process exits 0.

use crate::procs;

use nix::sys::signal::Signal;
use procs::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tela_core::Lifecycle;
use tokio::io::AsyncReadExt;

const STREAMS: usize = 3;
const TOKENS: u32 = 50;

#[test]
fn sigusr1_lets_open_streams_finish_then_the_node_leaves_and_exits_0() {
    run_test(Duration::from_secs(90), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = anchor().await;
        // 50 tokens at 10 tokens/s: each stream runs ~5 s, long enough to be open when DOWN is seen.
        let (_engine, url) = engine_sim("engine", "slow", &["--tokens-per-s", "10", "--ttft-ms", "50"]);
        let files = NodeFiles::new(dir.path(), "node");
        let id = files.node_id();
        let mut node = node("node", &files, &anchor.local_addr().to_string(), SECRET, &["--backend-url", &url]);
        until(&anchor, "the node is routable", Duration::from_secs(30), |s| routable(s, &id)).await;

        // Record the node's state as the anchor sees it, with when.
        let states: Arc<Mutex<Vec<(Instant, Lifecycle)>>> = Arc::default();
        let watcher = {
            let states = states.clone();
            let mut published = anchor.runtime().published();
            let view = anchor.runtime().view();
            tokio::spawn(async move {
                loop {
                    if let Some((r, _)) = view.snapshot().record(&id) {
                        let mut s = states.lock().expect("lock");
                        if s.last().map(|(_, l)| *l) != Some(r.state) {
                            s.push((Instant::now(), r.state));
                        }
                    }
                    if published.changed().await.is_err() {
                        return;
                    }
                }
            })
        };

        // Open the streams and wait for each one's first bytes.
        let mut readers = Vec::new();
        for _ in 0..STREAMS {
            let (send, mut recv) = open_chat(&anchor, &id, "slow", TOKENS, true).await;
            let head = tela_transports::tunnel::read_response_head(&mut recv).await.expect("head");
            assert_eq!(head.status, 200);
            let mut first = vec![0u8; 256];
            let n = recv.read(&mut first).await.expect("first bytes");
            assert!(n > 0);
            first.truncate(n);
            readers.push(tokio::spawn(async move {
                let _send = send; // keep the request side open until the response ends
                let mut rest = Vec::new();
                recv.read_to_end(&mut rest).await.expect("the stream ends cleanly");
                first.extend_from_slice(&rest);
                (Instant::now(), String::from_utf8_lossy(&first).into_owned())
            }));
        }

        node.signal(Signal::SIGUSR1);
        let signalled = Instant::now();
        until(&anchor, "the anchor sees the node DOWN", Duration::from_secs(10), |s| {
            record_in(s, &id, Lifecycle::Down).is_some()
        })
        .await;
        let down_seen = Instant::now();
        eprintln!("DOWN seen at the anchor {:?} after SIGUSR1", down_seen - signalled);

        // A new request now is turned away at once, so that the gateway retries elsewhere.
        let (_send, mut recv) = open_chat(&anchor, &id, "slow", 4, false).await;
        let refused = read_response(&mut recv).await;
        assert_eq!(refused.status, 503, "{}", refused.body);
        let error: serde_json::Value = serde_json::from_str(&refused.body).expect("OpenAI error JSON");
        assert_eq!(error["error"]["code"], "node_unavailable");

        // Every open stream runs to its end.
        let mut finished = Vec::new();
        for r in readers {
            let (at, text) = r.await.expect("reader");
            assert!(text.trim_end().ends_with("data: [DONE]"), "a stream was cut: {text}");
            let chunks = text.matches("data: {").count();
            assert!(chunks >= TOKENS as usize, "{chunks} chunks for {TOKENS} tokens");
            finished.push(at);
        }
        let last_finished = finished.into_iter().max().expect("streams");
        assert!(down_seen < last_finished, "DOWN was seen while streams were still open");

        until(&anchor, "the anchor sees the node LEFT", Duration::from_secs(20), |s| {
            record_in(s, &id, Lifecycle::Left).is_some()
        })
        .await;
        assert_eq!(node.wait_exit(Duration::from_secs(20)), Some(0), "exit status after the drain");

        watcher.abort();
        let seen: Vec<Lifecycle> = states.lock().expect("lock").iter().map(|(_, l)| *l).collect();
        assert_eq!(seen, vec![Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left], "states seen by the anchor");
        node.wait_line("SIGUSR1 received: draining", Duration::from_secs(5));
    });
}
