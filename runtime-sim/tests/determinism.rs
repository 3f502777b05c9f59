//! Same scenario and seed in two separate processes give the same event-trace hash.

use std::process::Command;

fn run(scenario: &str, seed: u64, dir: &std::path::Path, tag: &str) -> serde_json::Value {
    let report = dir.join(format!("{scenario}-{tag}.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_tela-sim"))
        .args(["run", scenario, "--seed", &seed.to_string(), "--report"])
        .arg(&report)
        .output()
        .expect("run tela-sim");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{scenario} seed {seed} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    print!("{stdout}");
    serde_json::from_str(&std::fs::read_to_string(&report).expect("report written")).expect("report is JSON")
}

fn same_hash_twice(scenario: &str, seed: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = run(scenario, seed, dir.path(), "a");
    let b = run(scenario, seed, dir.path(), "b");
    for key in [
        "nodes",
        "seed",
        "sim_s",
        "wall_s",
        "events",
        "peak_rss_mb",
        "hash",
        "max_datagram_bytes",
        "bytes_per_node_per_s",
    ] {
        assert!(a.get(key).is_some(), "report lacks {key}");
    }
    for key in ["convergence", "detection", "requests", "drain"] {
        assert!(a[key].is_object(), "report lacks {key}");
    }
    assert_eq!(a["hash"], b["hash"], "{scenario} seed {seed}: two runs diverged");
    assert_eq!(a["events"], b["events"]);
    assert_eq!(a["events_by_kind"], b["events_by_kind"]);
    // Every event is counted once, by kind; nodes both wake and hear from each other.
    let kinds = &a["events_by_kind"];
    let count = |k: &str| kinds[k].as_u64().unwrap_or_else(|| panic!("report lacks events_by_kind.{k}"));
    assert_eq!(count("wakes") + count("deliveries") + count("other"), a["events"].as_u64().expect("events"));
    assert!(count("wakes") > 0 && count("deliveries") > 0, "{kinds}");
    assert_eq!(a["requests"], b["requests"]);
    // A different seed is a different run.
    let c = run(scenario, seed + 1, dir.path(), "c");
    assert_ne!(a["hash"], c["hash"]);
}

#[test]
fn smoke_100_is_deterministic_across_processes() {
    same_hash_twice("smoke-100", 7);
}

#[test]
fn federation_1k_is_deterministic_across_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = run("federation-1k", 3, dir.path(), "a");
    let b = run("federation-1k", 3, dir.path(), "b");
    assert_eq!(a["hash"], b["hash"], "federation-1k: two runs diverged");
    assert!(a["max_datagram_bytes"].as_u64().unwrap() <= 1100);
}
