//! Killing the engine a node launched (`--engine-cmd`) turns the node DOWN at once; the node
//! relaunches it and comes back SERVE in a new generation (a DOWN record cannot come back in
//! its own); and a node process that is drained (`tela drain`) and started again comes back
//! in a newer generation still. A node killed outright takes its launched engine with it.

use crate::procs;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use procs::*;
use std::time::Duration;
use tela_core::Lifecycle;

/// The `--engine-cmd` that runs `tela engine-sim` on `port`, and its `--backend-url`.
fn engine_sim_command(port: u16) -> (String, String) {
    let command = format!("exec '{}' engine-sim --host 127.0.0.1 --port {port} --model launched", tela_bin().display());
    (command, format!("http://127.0.0.1:{port}"))
}

#[test]
fn a_killed_engine_turns_its_node_down_and_restarts_bring_new_generations() {
    run_test(Duration::from_secs(120), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = anchor().await;
        let join = anchor.local_addr().to_string();
        let port = free_port();
        let (engine_cmd, backend) = engine_sim_command(port);
        let files = NodeFiles::new(dir.path(), "node");
        let id = files.node_id();
        let args =
            ["--engine-cmd", engine_cmd.as_str(), "--backend-url", backend.as_str(), "--engine-stop-grace", "5s"];
        let mut first = node("node", &files, &join, SECRET, &args);

        until(&anchor, "the node serves its launched engine", Duration::from_secs(30), |s| routable(s, &id)).await;
        let gen1 = anchor.runtime().snapshot().record(&id).expect("known").0.generation;
        let launched = first.wait_line("launched the engine (pid ", Duration::from_secs(5));
        let pid: i32 = launched
            .split("(pid ")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .and_then(|s| s.parse().ok())
            .expect("the engine's pid in the log");

        // Kill the engine (its whole process group) behind the node's back.
        let before = first.log().len();
        killpg(Pid::from_raw(pid), Signal::SIGKILL).expect("kill the engine");
        until(&anchor, "the anchor sees the node DOWN in the same generation", Duration::from_secs(10), |s| {
            record_in(s, &id, Lifecycle::Down).is_some_and(|r| r.generation == gen1)
        })
        .await;
        let line = first.wait_line_after(before, "the engine process", Duration::from_secs(5));
        assert!(line.contains(&format!("(pid {pid}) exited")) && line.contains("DOWN"), "{line}");

        // The node relaunches its engine and comes back in a new generation.
        until(&anchor, "the node serves again in a new generation", Duration::from_secs(30), |s| {
            routable(s, &id) && s.record(&id).is_some_and(|(r, _)| r.generation > gen1)
        })
        .await;
        let gen2 = anchor.runtime().snapshot().record(&id).expect("known").0.generation;

        // Restart the node process: drain it with `tela drain`, start it again.
        let control = files.control.to_str().expect("utf-8").to_string();
        let mut drain = Proc::tela("drain", &["drain", "--control", &control], &[]);
        assert_eq!(drain.wait_exit(Duration::from_secs(10)), Some(0), "tela drain:\n{}", drain.log_text());
        assert_eq!(first.wait_exit(Duration::from_secs(30)), Some(0), "the drained node exits 0");
        first.wait_line("stopping the engine", Duration::from_secs(5)); // the log reader may trail the exit
        until(&anchor, "the anchor sees the node LEFT", Duration::from_secs(10), |s| {
            record_in(s, &id, Lifecycle::Left).is_some_and(|r| r.generation == gen2)
        })
        .await;

        let _second = node("node-again", &files, &join, SECRET, &args);
        until(&anchor, "the restarted node serves in a newer generation", Duration::from_secs(30), |s| {
            routable(s, &id) && s.record(&id).is_some_and(|(r, _)| r.generation > gen2)
        })
        .await;
    });
}

/// `kill -9` of the node (no handler runs, nothing is stopped): the engine it launched goes
/// with it instead of holding its GPU and port for a node that is gone.
#[test]
fn a_killed_node_takes_its_launched_engine_with_it() {
    run_test(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = anchor().await;
        let join = anchor.local_addr().to_string();
        let port = free_port();
        let (engine_cmd, backend) = engine_sim_command(port);
        let files = NodeFiles::new(dir.path(), "node");
        let id = files.node_id();
        let args = ["--engine-cmd", engine_cmd.as_str(), "--backend-url", backend.as_str()];
        let mut node = node("node", &files, &join, SECRET, &args);
        until(&anchor, "the node serves its launched engine", Duration::from_secs(30), |s| routable(s, &id)).await;
        let engine = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        assert!(std::net::TcpStream::connect(engine).is_ok(), "the engine listens");

        node.kill();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&engine, Duration::from_millis(200)).is_ok() {
            assert!(std::time::Instant::now() < deadline, "the engine outlived its node by 10 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// Another process already listens on the engine's port (another job's engine on a shared
/// host): the node neither launches its engine there nor takes the other engine for its own
/// (it never serves the other's model), and launches its own once the port is free.
#[test]
fn a_port_another_engine_holds_is_not_taken_for_the_launched_one() {
    run_test(Duration::from_secs(90), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = anchor().await;
        let join = anchor.local_addr().to_string();
        let port = free_port();
        let port_arg = port.to_string();
        let mut other = Proc::tela(
            "other-engine",
            &["engine-sim", "--host", "127.0.0.1", "--port", &port_arg, "--model", "others"],
            &[],
        );
        other.wait_line("[stdout] listening on http://", Duration::from_secs(20));
        let (engine_cmd, backend) = engine_sim_command(port);
        let files = NodeFiles::new(dir.path(), "node");
        let id = files.node_id();
        let args = ["--engine-cmd", engine_cmd.as_str(), "--backend-url", backend.as_str()];
        let node = node("node", &files, &join, SECRET, &args);

        let line = node.wait_line("not launching the engine", Duration::from_secs(20));
        assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
        // A relaunch try or two later: still nothing launched, nothing served.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let log = node.log_text();
        assert!(!log.contains("launched the engine"), "{log}");
        assert!(!routable(&anchor.runtime().snapshot(), &id), "{}", anchor.runtime().snapshot().to_table());

        other.kill();
        until(&anchor, "the node serves its own engine once the port is free", Duration::from_secs(40), |s| {
            routable(s, &id) && s.record(&id).is_some_and(|(r, _)| r.models.contains_name("launched"))
        })
        .await;
        let log = node.log_text();
        assert!(!log.contains("serving others"), "{log}");
    });
}
