//! Inside a Slurm job the node reads the job's remaining time from `squeue` and drains one
//! drain window before the end on its own: DOWN, then LEFT, then exit 0. (`squeue` here is a
//! stand-in script on PATH that answers like Slurm's and records how it was called.)

use crate::procs;

use procs::*;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};
use tela_core::Lifecycle;

#[test]
fn the_node_drains_one_window_before_the_slurm_job_ends() {
    run_test(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("mkdir");
        let calls = dir.path().join("squeue-calls");
        let squeue = bin.join("squeue");
        // 4 seconds left, in squeue's %L format (minutes:seconds).
        std::fs::write(&squeue, format!("#!/bin/sh\necho \"$@\" >> '{}'\necho 0:04\n", calls.display()))
            .expect("write squeue");
        std::fs::set_permissions(&squeue, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());

        let anchor = anchor().await;
        let (_engine, url) = engine_sim("engine", "m", &[]);
        let files = NodeFiles::new(dir.path(), "node");
        let id = files.node_id();
        let started = Instant::now();
        let mut node = Proc::tela(
            "node",
            &[
                "node",
                "--join",
                &anchor.local_addr().to_string(),
                "--identity",
                files.identity.to_str().expect("utf-8"),
                "--control",
                files.control.to_str().expect("utf-8"),
                "--backend-url",
                &url,
                "--probe-interval",
                "200ms",
                "--drain-window",
                "2s",
            ],
            &[("TELA_JOIN_SECRET", SECRET), ("SLURM_JOB_ID", "4242"), ("PATH", &path)],
        );
        until(&anchor, "the node serves", Duration::from_secs(20), |s| routable(s, &id)).await;
        let line = node.wait_line("walltime in", Duration::from_secs(5));
        assert!(line.contains("Squeue"), "{line}");
        let called = std::fs::read_to_string(&calls).expect("squeue was called");
        assert_eq!(called.trim(), "-h -j 4242 -o %L");

        until(&anchor, "the node drains before the end", Duration::from_secs(15), |s| {
            s.record(&id).is_some_and(|(r, _)| r.state >= Lifecycle::Down)
        })
        .await;
        let drained_after = started.elapsed();
        assert!(drained_after >= Duration::from_millis(1500), "drained too early: {drained_after:?}");
        until(&anchor, "the node leaves", Duration::from_secs(15), |s| record_in(s, &id, Lifecycle::Left).is_some())
            .await;
        assert_eq!(node.wait_exit(Duration::from_secs(15)), Some(0));
    });
}
