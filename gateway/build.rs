//! Decides, when the tests are built, which of the outside programs some integration tests
//! drive are here, so that a test whose program is missing shows as *ignored* (with the reason
//! and the command that installs it) instead of passing without having checked anything.
//!
//! Each cfg below is set when the environment names the program (the variables the `.ci/setup-*`
//! scripts print, which `.ci/test` exports), and always when `CI=true` or
//! `TELA_REQUIRE_SLURM=1` for the Slurm ones: there the tests run, and fail if the program is
//! missing, so that CI cannot pass with a test skipped.
//!
//! | cfg | set by | tests |
//! |---|---|---|
//! | `tela_sdk` | `TELA_SDK_PYTHON` | the official OpenAI Python SDK suite |
//! | `tela_llama` | `TELA_LLAMA_PYTHON` and `TELA_LLAMA_MODEL` | the real llama.cpp engine |
//! | `tela_chromium` | `TELA_CHROMIUM` | the dashboard in a browser |
//! | `tela_slurm` | `TELA_SLURM_PARTITION` or `TELA_SLURM_ENV` | a real local Slurm (sbatch) |
//! | `tela_slurmrest` | `TELA_SLURMRESTD_URL`, or the file `TELA_SLURM_ENV` names | slurmrestd |
//! | `tela_firecrest` | `TELA_FIRECREST_URL` | FirecREST v2 in front of the local Slurm (`.ci/setup-firecrest.sh`) |
//! | `tela_sshd` | `TELA_SSHD` | nodes behind a login host's `sshd` (`--via-ssh`) |
//! | `tela_netns` | `TELA_NETNS=1` (root, `ip netns` works) | nodes in a network namespace cut off from the gateway |
//!
//! It also sets `TELA_VERSION`, what `tela --version` prints after the name: the package
//! version, the commit it was built from and that commit's date (see [`version`]).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for cfg in [
        "tela_sdk",
        "tela_llama",
        "tela_chromium",
        "tela_slurm",
        "tela_slurmrest",
        "tela_firecrest",
        "tela_sshd",
        "tela_netns",
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    let watched = [
        "CI",
        "TELA_REQUIRE_SLURM",
        "TELA_SDK_PYTHON",
        "TELA_LLAMA_PYTHON",
        "TELA_LLAMA_MODEL",
        "TELA_CHROMIUM",
        "TELA_SLURM_PARTITION",
        "TELA_SLURM_ENV",
        "TELA_SLURMRESTD_URL",
        "TELA_FIRECREST_URL",
        "TELA_SSHD",
        "TELA_NETNS",
    ];
    for var in watched {
        println!("cargo::rerun-if-env-changed={var}");
    }
    println!("cargo::rerun-if-changed=build.rs");

    let set = |var: &str| std::env::var_os(var).is_some_and(|v| !v.is_empty());
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let require_slurm = ci || std::env::var("TELA_REQUIRE_SLURM").is_ok_and(|v| v == "1");

    let slurm_env_file = std::env::var_os("TELA_SLURM_ENV").filter(|f| Path::new(f).is_file());
    if let Some(file) = &slurm_env_file {
        println!("cargo::rerun-if-changed={}", Path::new(file).display());
    }
    let file_has_rest = slurm_env_file
        .and_then(|f| std::fs::read_to_string(f).ok())
        .is_some_and(|text| text.contains("TELA_SLURMRESTD_URL="));

    let found = [
        ("tela_sdk", ci || set("TELA_SDK_PYTHON")),
        ("tela_llama", ci || (set("TELA_LLAMA_PYTHON") && set("TELA_LLAMA_MODEL"))),
        ("tela_chromium", ci || set("TELA_CHROMIUM")),
        ("tela_slurm", require_slurm || set("TELA_SLURM_PARTITION") || set("TELA_SLURM_ENV")),
        ("tela_slurmrest", require_slurm || set("TELA_SLURMRESTD_URL") || file_has_rest),
        ("tela_firecrest", require_slurm || set("TELA_FIRECREST_URL")),
        ("tela_sshd", ci || set("TELA_SSHD")),
        ("tela_netns", ci || std::env::var("TELA_NETNS").is_ok_and(|v| v == "1")),
    ];
    for (cfg, here) in found {
        if here {
            println!("cargo::rustc-cfg={cfg}");
        }
    }

    println!("cargo::rustc-env=TELA_VERSION={}", version());
}

/// `0.1.0 (commit 1a2b3c4d5e6f, 2026-12-03)`: a bug report then names the exact source.
///
/// The commit comes from `git` when the source is a git checkout, else from `TELA_COMMIT` (a
/// build from a source archive: set it to the commit the archive was made from), else it is
/// `unknown`. Only git's HEAD and the branch it points to are watched, so a new commit
/// re-runs this script (and rebuilds this crate) without rebuilding anything else; changes
/// not committed yet are not marked.
fn version() -> String {
    println!("cargo::rerun-if-env-changed=TELA_COMMIT");
    let package = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()));
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).current_dir(&dir).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    if let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) {
        watch_git_head(&dir, &git);
        return match git(&["log", "-1", "--date=short", "--format=%cd", "HEAD"]) {
            Some(date) => format!("{package} (commit {commit}, {date})"),
            None => format!("{package} (commit {commit})"),
        };
    }
    let commit = std::env::var("TELA_COMMIT").ok().filter(|c| !c.trim().is_empty());
    format!("{package} (commit {})", commit.as_deref().map_or("unknown", str::trim))
}

/// Re-run when HEAD moves: the HEAD file (another branch checked out, a detached HEAD) and the
/// branch it points to (a new commit). While that branch is packed (no file of its own), its
/// folder (where the next commit writes the file) and `packed-refs`. Only paths that exist are
/// named: cargo re-runs a script on every build while a path it watches is missing.
fn watch_git_head(dir: &Path, git: &dyn Fn(&[&str]) -> Option<String>) {
    // `--git-path` resolves worktrees and a `.git` file, relative to `dir`.
    let path = |name: &str| git(&["rev-parse", "--git-path", name]).map(|p| dir.join(p));
    let mut watched = vec![path("HEAD")];
    if let Some(branch) = git(&["rev-parse", "--symbolic-full-name", "HEAD"]).filter(|r| r.starts_with("refs/")) {
        match path(&branch) {
            Some(file) if file.is_file() => watched.push(Some(file)),
            file => {
                watched.push(file.and_then(|f| f.parent().map(Path::to_path_buf)));
                watched.push(path("packed-refs"));
            }
        }
    }
    for path in watched.into_iter().flatten().filter(|p| p.exists()) {
        println!("cargo::rerun-if-changed={}", path.display());
    }
}
