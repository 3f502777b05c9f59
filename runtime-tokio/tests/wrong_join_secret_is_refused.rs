//! A node with the wrong join secret is refused: the node's log carries the typed reason and
//! what to do, the anchor (a `tela anchor` process) logs whom it refused and why, and the
//! node never enters the registry — while a node with the right secret joins the same anchor.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn a_node_with_the_wrong_secret_is_refused_and_both_sides_say_why() {
    run_test(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor_key = dir.path().join("anchor.key");
        let anchor_sock = dir.path().join("anchor.sock");
        let anchor = Proc::tela(
            "anchor",
            &[
                "anchor",
                "--listen",
                "127.0.0.1:0",
                "--identity",
                anchor_key.to_str().expect("utf-8"),
                "--control",
                anchor_sock.to_str().expect("utf-8"),
            ],
            &[("TELA_JOIN_SECRET", SECRET)],
        );
        let line = anchor.wait_line("listening", Duration::from_secs(20));
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .expect("the listening line names the address")
            .to_string();
        anchor.wait_line("control socket at", Duration::from_secs(20));

        let (_engine, url) = engine_sim("engine", "m", &[]);
        let bad_files = NodeFiles::new(dir.path(), "intruder");
        let bad_id = bad_files.node_id();
        let intruder = node("intruder", &bad_files, &addr, "not-the-secret", &["--backend-url", &url]);
        let good_files = NodeFiles::new(dir.path(), "member");
        let good_id = good_files.node_id();
        let _member = node("member", &good_files, &addr, SECRET, &["--backend-url", &url]);

        // The node: a typed refusal that says what to check.
        let refused = intruder.wait_line("the gateway refused this node", Duration::from_secs(20));
        assert!(refused.contains("join secret mismatch"), "{refused}");
        assert!(refused.contains("--join-secret / TELA_JOIN_SECRET"), "{refused}");

        // The anchor: whom it refused, from where, and why.
        let logged = anchor.wait_line(&format!("refused node {bad_id}"), Duration::from_secs(20));
        assert!(logged.contains("join secret mismatch"), "{logged}");

        // The right secret joins; the wrong one never appears in the registry.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let status = status_of(&anchor_sock).await;
            let ids: Vec<String> = status["registry"]
                .as_array()
                .expect("registry")
                .iter()
                .filter_map(|n| n["id"].as_str().map(String::from))
                .collect();
            assert!(!ids.contains(&tela_runtime::status::hex(&bad_id)), "the refused node is in the registry");
            if ids.contains(&tela_runtime::status::hex(&good_id)) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the member never joined: {status}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            !intruder.log_text().contains("connected to"),
            "the refused node must not count as connected:\n{}",
            intruder.log_text()
        );
    });
}
