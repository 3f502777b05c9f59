//! Admission refuses a node that does not know the federation's join secret, and both sides say
//! why. The node's log carries the typed reason and what to do, the anchor (a `tela anchor`
//! process) logs whom it refused and why, and the node never enters the registry — while a node
//! that belongs joins the same anchor. Retrying cannot fix the refusal, so the refused node
//! gives up after a few attempts: one error line, a non-zero exit, and it never calls itself
//! SERVE on the way. (A member of another release is refused the same way, with both protocol
//! versions named; `tela-transports`' admission tests cover that exchange.)

use crate::procs;

use procs::*;
use std::path::Path;
use std::time::Duration;

/// A `tela anchor` process: the process, its address, its control socket.
fn anchor_process(dir: &Path) -> (Proc, String, std::path::PathBuf) {
    let anchor_key = dir.join("anchor.key");
    let anchor_sock = dir.join("anchor.sock");
    let args = [
        "anchor",
        "--listen",
        "127.0.0.1:0",
        "--identity",
        anchor_key.to_str().expect("utf-8"),
        "--control",
        anchor_sock.to_str().expect("utf-8"),
    ];
    let anchor = Proc::tela("anchor", &args, &[("TELA_JOIN_SECRET", SECRET)]);
    let line = anchor.wait_line("listening", Duration::from_secs(20));
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .expect("the listening line names the address")
        .to_string();
    anchor.wait_line("control socket at", Duration::from_secs(20));
    (anchor, addr, anchor_sock)
}

/// The refused node gives up by itself: exit status 78 (`EX_CONFIG`), exactly one error line
/// that says why, and no line calling itself SERVE, though its engine may be ready.
fn gives_up_with_one_error_line(refused: &mut Proc, why: &str) {
    let code = refused.wait_exit(Duration::from_secs(40));
    let log = refused.log_text();
    assert_eq!(code, Some(78), "the refused node must stop with EX_CONFIG:\n{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line, not {}:\n{log}", errors.len());
    assert!(errors[0].contains("giving up: every --join address refused this node"), "{}", errors[0]);
    assert!(errors[0].contains(why), "{}", errors[0]);
    if log.contains("is ready, serving") {
        // The engine was found ready before the node gave up: the node says it waits for a gateway.
        assert!(log.contains("this node turns SERVE once a gateway admits it"), "{log}");
    }
    assert!(!log.contains("is now SERVE"), "a node nobody admitted must not call itself SERVE:\n{log}");
}

/// Waits until `good` is in the registry behind `control`, checking all along that `bad` never is.
async fn joins_while_the_other_never_does(control: &Path, good: &tela_core::NodeId, bad: &tela_core::NodeId) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = status_of(control).await;
        let ids: Vec<String> = status["registry"]
            .as_array()
            .expect("registry")
            .iter()
            .filter_map(|n| n["id"].as_str().map(String::from))
            .collect();
        assert!(!ids.contains(&tela_runtime::status::hex(bad)), "the refused node is in the registry");
        if ids.contains(&tela_runtime::status::hex(good)) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the member never joined: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_node_with_the_wrong_secret_is_refused_and_both_sides_say_why() {
    run_test(Duration::from_secs(90), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let (anchor, addr, anchor_sock) = anchor_process(dir.path());

        let (_engine, url) = engine_sim("engine", "m", &[]);
        let bad_files = NodeFiles::new(dir.path(), "intruder");
        let bad_id = bad_files.node_id();
        let mut intruder = node("intruder", &bad_files, &addr, "not-the-secret", &["--backend-url", &url]);
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
        joins_while_the_other_never_does(&anchor_sock, &good_id, &bad_id).await;
        assert!(
            !intruder.log_text().contains("connected to"),
            "the refused node must not count as connected:\n{}",
            intruder.log_text()
        );
        gives_up_with_one_error_line(&mut intruder, "join secret mismatch");
    });
}
