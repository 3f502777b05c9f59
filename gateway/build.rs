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

use std::path::Path;

fn main() {
    for cfg in ["tela_sdk", "tela_llama", "tela_chromium", "tela_slurm", "tela_slurmrest"] {
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
    ];
    for (cfg, here) in found {
        if here {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
