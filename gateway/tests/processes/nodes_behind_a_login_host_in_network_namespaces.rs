//! Real network isolation, as on a cluster whose compute nodes reach only their login host:
//! three network namespaces joined by veth pairs — "compute" (the engine and two nodes)
//! reaches only "login" (sshd, `tela relay`), "gateway" is reached from "login" and from the
//! test (the client), and "login" forwards no packets. One node reaches the gateway
//! `--via-ssh`, the other `--relay`; a client's streamed requests reach the engines behind
//! both, and a stream open on a node when it drains finishes.
//!
//! Needs root, `ip netns` and veth pairs (`.ci/setup-netns.sh` checks them; `TELA_NETNS=1`) and
//! OpenSSH's `sshd` (`.ci/setup-sshd.sh`): built without them, it shows as ignored; with
//! `CI=true` it always runs, and fails, saying what could not be made, where namespaces cannot
//! be made.

use crate::common;
use crate::login_host::*;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

#[cfg_attr(
    not(all(tela_netns, tela_sshd)),
    ignore = "needs root, network namespaces and sshd: run .ci/test, or export what .ci/setup-netns.sh and .ci/setup-sshd.sh print"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_cut_off_from_the_gateway_serve_through_the_login_host_and_drain() {
    let net = Namespaces::create().unwrap_or_else(|e| {
        panic!("cannot make the network namespaces this test needs ({e}); run it as root where `ip netns add` works")
    });
    within(180, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let anchor = format!("{}:7000", net.gateway_anchor_ip);
        let api = format!("{}:8080", net.gateway_api_ip);
        let keys = d.join("api-keys");
        std::fs::write(&keys, format!("{} test\n", tela_gateway::auth::key_line(KEY))).expect("keys");

        // The gateway, in its namespace: the API toward the test, the anchor toward login.
        let _gateway = ChildGuard(
            command_in(Some(&net.gateway), tela())
                .args(["gateway", "--listen", &api, "--anchor-listen", &anchor, "--public-addr", &anchor])
                .args(["--identity", d.join("gw.key").to_str().expect("utf-8")])
                .args(["--api-keys", keys.to_str().expect("utf-8"), "--no-ledger"])
                .env("TELA_JOIN_SECRET", SECRET)
                .env("RUST_LOG", "info")
                .env_remove("TELA_JOIN")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(d.join("gateway.log")).expect("log"))
                .spawn()
                .expect("start the gateway"),
        );
        // The login host: sshd and a relay that forwards to the gateway's anchor only.
        let sshd = start_sshd(d, format!("{}:22", net.login_ip).parse().expect("addr"), Some(&net.login));
        let (_relay, relay_addr) =
            start_relay(d, &format!("{}:7100", net.login_ip), std::slice::from_ref(&anchor), Some(&net.login));
        // The compute side: one engine (20 tokens a second) and two nodes in front of it.
        let _engine = ChildGuard(
            command_in(Some(&net.compute), tela())
                .args(["engine-sim", "--host", "127.0.0.1", "--port", "8000", "--ttft-ms", "1", "--tokens-per-s", "20"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(d.join("engine.log")).expect("log"))
                .spawn()
                .expect("start the engine"),
        );

        // The isolation holds: compute reaches login, not the gateway; login reaches the gateway.
        let gateway_up = {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if Namespaces::can_connect(&net.login, &anchor) {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        assert!(gateway_up, "login reaches the gateway's anchor: {}", read(d, "gateway.log"));
        assert!(Namespaces::can_connect(&net.compute, &relay_addr), "compute reaches login's relay");
        assert!(!Namespaces::can_connect(&net.compute, &anchor), "compute must not reach the gateway directly");

        let ssh_args = ["--via-ssh", sshd.destination.as_str(), "--ssh-command", sshd.ssh_command.as_str()];
        let via_ssh = spawn_node_via(d, "via-ssh", &anchor, "127.0.0.1:8000", &ssh_args, Some(&net.compute));
        let relayed =
            spawn_node_via(d, "relayed", &anchor, "127.0.0.1:8000", &["--relay", &relay_addr], Some(&net.compute));
        let base = format!("http://{api}");
        let both = wait_tunnels(&base, 2, Duration::from_secs(60)).await;
        assert!(
            both,
            "both nodes routable with a tunnel at the gateway\nvia-ssh:\n{}\nrelayed:\n{}\nsshd:\n{}",
            via_ssh.log_text(),
            relayed.log_text(),
            std::fs::read_to_string(&sshd.log).unwrap_or_default()
        );

        // Requests from the client reach the engine through both nodes, streaming.
        let (ssh_id, relay_id) = (via_ssh.id.to_string(), relayed.id.to_string());
        let mut seen = std::collections::HashSet::new();
        for i in 0..40 {
            let started = Instant::now();
            let response = send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(conversation(i, 4))).await;
            let s = read_stream(response, started).await;
            assert_eq!(s.status, 200, "{}", s.text());
            assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "{}", s.text());
            assert!(s.chunks.len() > 2, "the response streamed in chunks: {}", s.text());
            seen.insert(s.node());
            if seen.contains(&ssh_id) && seen.contains(&relay_id) {
                break;
            }
        }
        assert!(seen.contains(&ssh_id) && seen.contains(&relay_id), "both nodes served: {seen:?}");

        // A stream open on each node when it drains finishes, and the drained nodes exit 0.
        for node in [via_ssh, relayed] {
            let mut node = node;
            let id = node.id.to_string();
            let mut open = None;
            for i in 100..140 {
                let started = Instant::now();
                let response = send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(conversation(i, 40))).await;
                assert_eq!(response.status(), 200);
                let on = response.headers()["x-tela-node"].to_str().expect("node").to_string();
                let stream = tokio::spawn(read_stream(response, started));
                if on == id {
                    open = Some(stream);
                    break;
                }
                let _ = stream.await;
            }
            let open = open.expect("a stream landed on the node");
            tokio::time::sleep(Duration::from_millis(300)).await;
            drain(&node);
            let s = open.await.expect("stream task");
            assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "the stream finished: {}", s.text());
            assert!(!s.text().contains("\"error\""), "{}", s.text());
            let code = node.wait_exit(Duration::from_secs(30)).await;
            assert_eq!(code, Some(0), "node log:\n{}", node.log_text());
        }
    })
    .await;
    drop(net);
}

/// A streamed chat request that opens conversation `i` (prefix routing keeps one conversation
/// on one node; different ones spread).
fn conversation(i: u32, max_tokens: u32) -> String {
    let mut body = chat(MODEL, true, max_tokens);
    body["messages"][0]["content"] = format!("Hello, conversation {i}").into();
    body.to_string()
}

fn read(dir: &std::path::Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}
