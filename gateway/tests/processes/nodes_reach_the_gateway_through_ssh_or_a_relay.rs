//! A node that can reach only a login host still serves: through the login host's `sshd`
//! (`tela node --via-ssh`, stdio forwarding by the user's own `ssh`) or through `tela relay`
//! (`--relay`, the first relay that answers). Requests stream through either path, a cut path
//! is redialled, and a draining node finishes its streams. All on loopback; the network
//! isolation itself is tested in `nodes_behind_a_login_host_in_network_namespaces`.
//!
//! The ssh test needs OpenSSH's `sshd` (`.ci/setup-sshd.sh` installs Debian's package;
//! `TELA_SSHD`): built without it, it shows as ignored; with `CI=true` it always runs.

use crate::common;
use crate::login_host::*;

use std::time::{Duration, Instant};

use common::*;

/// Sends chat requests until one streams to its end from `node` (bounded); how long it took.
async fn until_served_by(base: &str, node: &str, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        let s = stream_chat(base, 8).await;
        if s.status == 200 && s.node() == node && s.events().last().map(String::as_str) == Some("[DONE]") {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_relays_serves_through_the_first_that_answers_and_comes_back_after_a_relay_restart() {
    within(120, async {
        let mut fed = Fed::start(Options { engines: vec![], ..Options::default() }).await;
        let dir = fed.dir.path().to_path_buf();
        let anchor = fed.gateway.anchor_addr().to_string();
        let relay_port = free_port();
        let relay_listen = format!("127.0.0.1:{relay_port}");
        let (relay, relay_addr) = start_relay(&dir, &relay_listen, std::slice::from_ref(&anchor), None);
        // The first relay does not answer: the node must go on to the next.
        let dead = format!("127.0.0.1:{}", free_port());
        let engine = tela_gateway::engine_sim::spawn(engine(&[MODEL]), "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("engine starts");
        let node = spawn_node_via(
            &dir,
            "relayed",
            &anchor,
            &engine.local_addr().to_string(),
            &["--relay", &dead, "--relay", &relay_addr],
            None,
        );
        let id = node.id.to_string();
        fed.nodes.push(node);
        fed.engines.push(engine);
        fed.wait_routable(1).await;
        let s = stream_chat(&fed.base(), 16).await;
        assert_eq!((s.status, s.node()), (200, id.clone()), "{}", s.text());
        assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "{}", s.text());
        let log = std::fs::read_to_string(dir.join("relay.log")).unwrap_or_default();
        assert!(log.contains("relay: tunnel from"), "the tunnel went through the relay: {log}");

        // The relay restarts: the node's tunnel ends with it, and the node redials.
        drop(relay);
        let (_relay, _) = start_relay(&dir, &relay_listen, std::slice::from_ref(&anchor), None);
        let back = until_served_by(&fed.base(), &id, Duration::from_secs(30)).await;
        assert!(back.is_some(), "the node did not come back through the restarted relay: {}", fed.nodes[0].log_text());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_forwards_only_to_the_gateways_it_allows() {
    within(60, async {
        let fed = Fed::start(Options { engines: vec![], ..Options::default() }).await;
        let dir = fed.dir.path().to_path_buf();
        let anchor = fed.gateway.anchor_addr().to_string();
        // The relay allows some other address only.
        let other = format!("127.0.0.1:{}", free_port());
        let (_relay, relay_addr) = start_relay(&dir, "127.0.0.1:0", &[other], None);
        let node = spawn_node_via(&dir, "refused", &anchor, "127.0.0.1:9", &["--relay", &relay_addr], None);
        let said =
            eventually(Duration::from_secs(20), || node.log_text().contains("not a gateway this relay forwards to"))
                .await;
        assert!(said, "the node's log says why the relay refused: {}", node.log_text());
        let id = node.id.to_string();
        let status = fed.gateway.status();
        let known = status["nodes"].as_array().is_some_and(|ns| ns.iter().any(|n| n["short"] == id.as_str()));
        assert!(!known, "the refused node never reached the gateway: {status:#}");
    })
    .await;
}

#[cfg_attr(not(tela_sshd), ignore = "needs sshd: run .ci/test, or export what .ci/setup-sshd.sh prints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_via_ssh_streams_survives_a_cut_ssh_and_drains() {
    within(150, async {
        let mut fed = Fed::start(Options { engines: vec![], ..Options::default() }).await;
        let dir = fed.dir.path().to_path_buf();
        let anchor = fed.gateway.anchor_addr().to_string();
        let sshd = start_sshd(&dir, format!("127.0.0.1:{}", free_port()).parse().expect("addr"), None);
        // 20 tokens a second: a 40-token stream stays open about two seconds.
        let engine = tela_gateway::engine_sim::spawn(paced(20.0), "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("engine starts");
        let node = spawn_node_via(
            &dir,
            "via-ssh",
            &anchor,
            &engine.local_addr().to_string(),
            &["--via-ssh", &sshd.destination, "--ssh-command", &sshd.ssh_command],
            None,
        );
        let id = node.id.to_string();
        fed.nodes.push(node);
        fed.engines.push(engine);
        fed.wait_routable(1).await;
        let ssh = children_named(fed.nodes[0].pid(), "ssh");
        assert_eq!(ssh.len(), 1, "one ssh child carries the tunnel: {ssh:?}");
        let s = stream_chat(&fed.base(), 8).await;
        assert_eq!((s.status, s.node()), (200, id.clone()), "{}", s.text());
        assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "{}", s.text());
        let sshd_log = std::fs::read_to_string(&sshd.log).unwrap_or_default();
        assert!(sshd_log.contains("Accepted publickey"), "the tunnel went through sshd: {sshd_log}");

        // The ssh connection is cut: the node notices, spawns a new ssh and is routable again.
        let cut = Instant::now();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(ssh[0] as i32), nix::sys::signal::Signal::SIGKILL);
        let back = until_served_by(&fed.base(), &id, Duration::from_secs(40)).await;
        assert!(back.is_some(), "the node did not come back through a new ssh: {}", fed.nodes[0].log_text());
        eprintln!("routable again {:?} after the ssh connection was cut", cut.elapsed());
        let gone = eventually(Duration::from_secs(5), || !is_zombie(ssh[0])).await;
        assert!(gone, "the killed ssh child {} was reaped", ssh[0]);
        let now = children_named(fed.nodes[0].pid(), "ssh");
        assert!(now.len() == 1 && now[0] != ssh[0], "a new ssh child carries the tunnel: {now:?}");

        // A stream in flight when the node drains finishes; then the node leaves and exits 0.
        let started = Instant::now();
        let response =
            send(&fed.base(), "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, 40).to_string())).await;
        assert_eq!(response.status(), 200);
        let open = tokio::spawn(read_stream(response, started));
        tokio::time::sleep(Duration::from_millis(300)).await;
        drain(&fed.nodes[0]);
        let s = open.await.expect("stream task");
        assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "the stream finished: {}", s.text());
        assert!(!s.text().contains("\"error\""), "{}", s.text());
        let code = fed.nodes[0].wait_exit(Duration::from_secs(30)).await;
        assert_eq!(code, Some(0), "node log:\n{}", fed.nodes[0].log_text());
    })
    .await;
}
