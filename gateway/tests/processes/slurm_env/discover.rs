//! Finding the local Slurm of `.ci/slurm/start.sh`: its partition and slurmrestd settings,
//! from `TELA_SLURM*` variables or the env file the script keeps. Shared by the Slurm tests of
//! `tela-runtime` and `tela-gateway` (the gateway's includes this file by path).

use std::path::PathBuf;

/// Where the test Slurm is.
#[derive(Clone, Debug)]
pub struct SlurmEnv {
    /// Partition to submit to.
    pub partition: String,
    /// slurmrestd's URL, user and token file, when it runs.
    pub rest: Option<(String, String, PathBuf)>,
}

/// Where `.ci/slurm/start.sh` keeps its variables.
const DEFAULT_ENV_FILE: &str = "/run/tela-slurm/env";

/// The local Slurm. A test that calls this runs only when the build found a Slurm named in
/// the environment (or `CI=true` / `TELA_REQUIRE_SLURM=1`; see `gateway/build.rs`), and is
/// ignored otherwise; so here a Slurm that cannot be found is a failure, never a silent pass.
pub fn slurm_env(test: &str, need_rest: bool) -> SlurmEnv {
    let skip = |why: String| -> SlurmEnv {
        panic!(
            "{test}: {why}; start a local Slurm with `.ci/slurm/start.sh` (as root) and export what it prints \
             (`.ci/test` does both)"
        )
    };
    let mut vars: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k.starts_with("TELA_SLURM")).collect();
    if !vars.iter().any(|(k, _)| k == "TELA_SLURM_PARTITION") {
        let file = std::env::var("TELA_SLURM_ENV").unwrap_or_else(|_| DEFAULT_ENV_FILE.into());
        if let Ok(text) = std::fs::read_to_string(&file) {
            vars.extend(text.lines().filter_map(|l| {
                let (k, v) = l.strip_prefix("export ")?.split_once('=')?;
                Some((k.trim().to_string(), v.trim().trim_matches('\'').to_string()))
            }));
        }
    }
    let get = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let Some(partition) = get("TELA_SLURM_PARTITION") else {
        return skip(format!("no TELA_SLURM_PARTITION and no env file ({DEFAULT_ENV_FILE} or $TELA_SLURM_ENV)"));
    };
    match std::process::Command::new("sinfo").args(["-h", "-o", "%a"]).output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => return skip(format!("sinfo fails: {}", String::from_utf8_lossy(&out.stderr).trim())),
        Err(e) => return skip(format!("cannot run sinfo: {e}")),
    }
    let rest = match (get("TELA_SLURMRESTD_URL"), get("TELA_SLURM_REST_USER"), get("TELA_SLURM_JWT_FILE")) {
        (Some(url), Some(user), Some(file)) => Some((url, user, PathBuf::from(file))),
        _ => None,
    };
    if need_rest && rest.is_none() {
        return skip(
            "slurmrestd is not configured (no TELA_SLURMRESTD_URL, TELA_SLURM_REST_USER, TELA_SLURM_JWT_FILE)".into(),
        );
    }
    SlurmEnv { partition, rest }
}
