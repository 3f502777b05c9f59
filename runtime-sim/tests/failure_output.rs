//! A failing run says which seed and scenario failed, prints the exact command that replays it,
//! and exits non-zero.

use std::process::Command;

#[test]
fn a_violated_bound_prints_the_replay_command_and_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("too-strict.toml");
    // Crashes and preemptions right up to the end of the faults keep records changing, and the
    // liveness bound leaves no time to re-converge: the run must fail.
    std::fs::write(
        &path,
        "name = \"too-strict\"\nduration_s = 20\nfaults_until_s = 12\nliveness_bound_s = 0.1\n\
         [federation]\nnodes = 30\n[jobs]\ncrashes = 8\ncrash_restart_s = [0.5, 1]\npreemptions = 8\n\
         preempt_grace_s = 1\nqueue_wait_s = [0.5, 1]\n",
    )
    .expect("write scenario");
    let out = Command::new(env!("CARGO_BIN_EXE_tela-sim"))
        .args(["run", path.to_str().expect("utf-8 path"), "--seed", "5"])
        .output()
        .expect("run tela-sim");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the run should fail:\n{stdout}");
    assert!(stdout.contains("FAILED"), "{stdout}");
    assert!(stdout.contains("too-strict seed 5"), "{stdout}");
    let replay = format!("replay: cargo run --release -p tela-sim -- run {} --seed 5", path.display());
    assert!(stdout.contains(&replay), "missing `{replay}` in:\n{stdout}");
}
