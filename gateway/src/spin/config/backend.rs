//! `[spin.backend]`: the batch system's front door (sbatch, slurmrestd or FirecREST), as written
//! and checked.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tela_batch::firecrest::ClientSecret;

use super::error::{invalid, ConfigError};
use tela_core::spin::config::{positive, Dur};

/// Which front door to the batch system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// `sbatch`, `squeue` and `scancel` on this host.
    Sbatch,
    /// Slurm's REST daemon.
    Slurmrest,
    /// CSCS's FirecREST v2, with OIDC client credentials.
    Firecrest,
}

/// `[spin.backend]` as written; which keys apply depends on `kind`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    /// `"sbatch"`, `"slurmrest"` or `"firecrest"`.
    pub kind: BackendKind,
    /// sbatch: the `sbatch` program (default: looked up in `PATH`).
    pub sbatch: Option<PathBuf>,
    /// sbatch: the `squeue` program.
    pub squeue: Option<PathBuf>,
    /// sbatch: the `scancel` program.
    pub scancel: Option<PathBuf>,
    /// sbatch: arguments added to every `sbatch` call (e.g. `["--qos=serve"]`).
    pub sbatch_args: Option<Vec<String>>,
    /// sbatch: arguments added to every `squeue` and `scancel` call.
    pub query_args: Option<Vec<String>>,
    /// slurmrest, firecrest: the service's base URL (`http://slurm-rest:6820`, or `https://`).
    pub url: Option<String>,
    /// slurmrest, firecrest: a PEM file of CA certificates trusted for `https://` URLs besides
    /// the system's (a site's own CA).
    pub ca_cert: Option<PathBuf>,
    /// slurmrest: the Slurm user the token belongs to.
    pub user: Option<String>,
    /// slurmrest: a file holding the JWT (`scontrol token`), re-read on every call.
    pub token_file: Option<PathBuf>,
    /// slurmrest: the OpenAPI version (default `v0.0.38`).
    pub version: Option<String>,
    /// firecrest: the system (cluster) name in FirecREST's paths.
    pub system: Option<String>,
    /// firecrest: the OIDC provider's token endpoint (client-credentials grant).
    pub token_url: Option<String>,
    /// firecrest: the OIDC client id.
    pub client_id: Option<String>,
    /// firecrest: a file whose first line is the client secret (re-read on every token request).
    pub client_secret_file: Option<PathBuf>,
    /// firecrest: an environment variable holding the client secret.
    pub client_secret_env: Option<String>,
    /// Longest one call to the batch system may take (default 30 s).
    pub timeout: Option<Dur>,
}

/// The batch system's front door, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendPlan {
    /// The Slurm commands.
    Sbatch {
        /// `sbatch`.
        sbatch: PathBuf,
        /// `squeue`.
        squeue: PathBuf,
        /// `scancel`.
        scancel: PathBuf,
        /// Added to every `sbatch`.
        sbatch_args: Vec<String>,
        /// Added to every `squeue` and `scancel`.
        query_args: Vec<String>,
        /// Per call.
        timeout: Duration,
    },
    /// slurmrestd.
    Slurmrest {
        /// Base URL.
        url: String,
        /// Slurm user.
        user: String,
        /// JWT file.
        token_file: PathBuf,
        /// OpenAPI version.
        version: String,
        /// Per call.
        timeout: Duration,
        /// Extra CA certificates for `https://`.
        ca_cert: Option<PathBuf>,
    },
    /// FirecREST v2.
    Firecrest {
        /// Base URL.
        url: String,
        /// System name.
        system: String,
        /// Token endpoint.
        token_url: String,
        /// OIDC client id.
        client_id: String,
        /// Where the client secret is.
        client_secret: ClientSecret,
        /// Per call.
        timeout: Duration,
        /// Extra CA certificates for `https://`.
        ca_cert: Option<PathBuf>,
    },
}

impl fmt::Display for BackendPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendPlan::Sbatch { sbatch, .. } => write!(f, "sbatch ({})", sbatch.display()),
            BackendPlan::Slurmrest { url, user, version, .. } => write!(f, "slurmrestd {version} at {url} as {user}"),
            BackendPlan::Firecrest { url, system, client_id, .. } => {
                write!(f, "FirecREST v2 at {url}, system {system}, as client {client_id}")
            }
        }
    }
}

pub(super) fn resolve_backend(section: Option<&BackendSection>) -> Result<BackendPlan, ConfigError> {
    let Some(b) = section else {
        return Err(invalid(
            "spin.backend",
            "missing: add [spin.backend] with kind = \"sbatch\", \"slurmrest\" or \"firecrest\"",
        ));
    };
    let timeout = positive("spin.backend.timeout", b.timeout, Duration::from_secs(30))?;
    let reject = |present: bool, key: &str, kind: &str| {
        if present {
            Err(invalid(format!("spin.backend.{key}"), format!("only applies to kind = \"{kind}\"")))
        } else {
            Ok(())
        }
    };
    let not_firecrest = || -> Result<(), ConfigError> {
        reject(b.system.is_some(), "system", "firecrest")?;
        reject(b.token_url.is_some(), "token_url", "firecrest")?;
        reject(b.client_id.is_some(), "client_id", "firecrest")?;
        reject(b.client_secret_file.is_some(), "client_secret_file", "firecrest")?;
        reject(b.client_secret_env.is_some(), "client_secret_env", "firecrest")
    };
    match b.kind {
        BackendKind::Sbatch => {
            not_firecrest()?;
            reject(b.url.is_some(), "url", "slurmrest")?;
            reject(b.user.is_some(), "user", "slurmrest")?;
            reject(b.token_file.is_some(), "token_file", "slurmrest")?;
            reject(b.version.is_some(), "version", "slurmrest")?;
            reject(b.ca_cert.is_some(), "ca_cert", "slurmrest\" or \"firecrest")?;
            Ok(BackendPlan::Sbatch {
                sbatch: b.sbatch.clone().unwrap_or_else(|| "sbatch".into()),
                squeue: b.squeue.clone().unwrap_or_else(|| "squeue".into()),
                scancel: b.scancel.clone().unwrap_or_else(|| "scancel".into()),
                sbatch_args: b.sbatch_args.clone().unwrap_or_default(),
                query_args: b.query_args.clone().unwrap_or_default(),
                timeout,
            })
        }
        BackendKind::Slurmrest => {
            not_firecrest()?;
            reject(b.sbatch.is_some(), "sbatch", "sbatch")?;
            reject(b.squeue.is_some(), "squeue", "sbatch")?;
            reject(b.scancel.is_some(), "scancel", "sbatch")?;
            reject(b.sbatch_args.is_some(), "sbatch_args", "sbatch")?;
            reject(b.query_args.is_some(), "query_args", "sbatch")?;
            let required = |v: &Option<String>, key: &str, example: &str| {
                v.clone().filter(|s| !s.trim().is_empty()).ok_or_else(|| {
                    invalid(
                        format!("spin.backend.{key}"),
                        format!("required for kind = \"slurmrest\" (e.g. {example})"),
                    )
                })
            };
            let url = web_url(required(&b.url, "url", "\"http://slurm-rest:6820\"")?, "url")?;
            let ca_cert = ca_cert_for(b.ca_cert.as_ref(), &[&url])?;
            let user = required(&b.user, "user", "\"tela\"")?;
            let token_file = b.token_file.clone().ok_or_else(|| {
                invalid(
                    "spin.backend.token_file",
                    "required for kind = \"slurmrest\": a file holding the JWT from `scontrol token`",
                )
            })?;
            let version = b.version.clone().unwrap_or_else(|| "v0.0.38".into());
            if let Err(e) = version.parse::<tela_batch::slurmrest::RestVersion>() {
                return Err(invalid("spin.backend.version", e.to_string()));
            }
            Ok(BackendPlan::Slurmrest { url, user, token_file, version, timeout, ca_cert })
        }
        BackendKind::Firecrest => {
            for (present, key) in [
                (b.sbatch.is_some(), "sbatch"),
                (b.squeue.is_some(), "squeue"),
                (b.scancel.is_some(), "scancel"),
                (b.sbatch_args.is_some(), "sbatch_args"),
                (b.query_args.is_some(), "query_args"),
            ] {
                reject(present, key, "sbatch")?;
            }
            for (present, key) in
                [(b.user.is_some(), "user"), (b.token_file.is_some(), "token_file"), (b.version.is_some(), "version")]
            {
                reject(present, key, "slurmrest")?;
            }
            let required = |v: &Option<String>, key: &str, example: &str| {
                v.clone().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).ok_or_else(|| {
                    invalid(
                        format!("spin.backend.{key}"),
                        format!("required for kind = \"firecrest\" (e.g. {example})"),
                    )
                })
            };
            let url = web_url(required(&b.url, "url", "\"https://api.example.org/v2\"")?, "url")?;
            let system = required(&b.system, "system", "\"daint\"")?;
            if system.contains(['/', '?', '#', ' ']) {
                return Err(invalid("spin.backend.system", format!("'{system}' must be one path segment")));
            }
            let token_url = web_url(
                required(&b.token_url, "token_url", "\"https://idp/realms/hpc/protocol/openid-connect/token\"")?,
                "token_url",
            )?;
            let ca_cert = ca_cert_for(b.ca_cert.as_ref(), &[&url, &token_url])?;
            let client_id = required(&b.client_id, "client_id", "\"tela-spinner\"")?;
            let client_secret = match (&b.client_secret_file, &b.client_secret_env) {
                (Some(file), None) => ClientSecret::File(file.clone()),
                (None, Some(var)) if !var.trim().is_empty() => ClientSecret::Env(var.trim().to_string()),
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        "spin.backend.client_secret_env",
                        "give the secret one way: client_secret_file or client_secret_env, not both",
                    ))
                }
                _ => {
                    return Err(invalid(
                        "spin.backend.client_secret_file",
                        "required for kind = \"firecrest\": a file holding the OIDC client secret (or client_secret_env, a variable holding it)",
                    ))
                }
            };
            Ok(BackendPlan::Firecrest { url, system, token_url, client_id, client_secret, timeout, ca_cert })
        }
    }
}

/// A REST backend's URL (`key`), `http://` or `https://`, without a trailing `/`.
fn web_url(url: String, key: &str) -> Result<String, ConfigError> {
    let url = url.trim().trim_end_matches('/').to_string();
    let has_host = |rest: &str| !rest.is_empty() && !rest.starts_with(['/', ':']);
    match url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")) {
        Some(rest) if has_host(rest) => Ok(url),
        _ => Err(invalid(
            format!("spin.backend.{key}"),
            format!("'{url}' is not an http:// or https:// URL (e.g. https://slurm-rest.example.org:6820)"),
        )),
    }
}

/// `ca_cert`, which only means something when one of `urls` is `https://`.
fn ca_cert_for(ca_cert: Option<&PathBuf>, urls: &[&str]) -> Result<Option<PathBuf>, ConfigError> {
    match ca_cert {
        Some(path) if !urls.iter().any(|u| u.starts_with("https://")) => Err(invalid(
            "spin.backend.ca_cert",
            format!("{} is given but no URL is https://: drop it, or name the service's https:// URL", path.display()),
        )),
        _ => Ok(ca_cert.cloned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadedConfig;

    fn with_backend(backend: &str) -> String {
        format!(
            "[spin]\n[spin.backend]\n{backend}\n[spin.job]\ntela = \"/opt/tela\"\njoin = [\"gw:7000\"]\njoin_secret_file = \"/s\"\n\
             [[spin.partition]]\nname = \"gpu\"\nshape = \"a100-80x4\"\nnodes = 2\n\
             [[spin.model]]\nname = \"small\"\nparams = \"8B\"\nquantization = \"bf16\"\nkv_headroom = \"2GiB\"\nengine = \"serve --port {{port}}\"\n"
        )
    }

    const FIRECREST: &str = "kind = \"firecrest\"\nurl = \"http://127.0.0.1:8000/\"\nsystem = \"daint\"\n\
        token_url = \"http://idp/token\"\nclient_id = \"tela\"\nclient_secret_file = \"/etc/tela/fc-secret\"";

    fn refused(backend: &str) -> String {
        match LoadedConfig::parse(&with_backend(backend), "test.toml") {
            Ok(_) => panic!("accepted:\n{backend}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_firecrest_backend_is_read_with_its_secret_from_a_file_or_a_variable() {
        let plan = LoadedConfig::parse(&with_backend(FIRECREST), "t.toml").expect("valid").spin.expect("[spin]");
        assert_eq!(
            plan.backend,
            BackendPlan::Firecrest {
                url: "http://127.0.0.1:8000".into(),
                system: "daint".into(),
                token_url: "http://idp/token".into(),
                client_id: "tela".into(),
                client_secret: ClientSecret::File("/etc/tela/fc-secret".into()),
                timeout: Duration::from_secs(30),
                ca_cert: None,
            }
        );
        assert_eq!(plan.backend.to_string(), "FirecREST v2 at http://127.0.0.1:8000, system daint, as client tela");
        let env =
            FIRECREST.replace("client_secret_file = \"/etc/tela/fc-secret\"", "client_secret_env = \"FC_SECRET\"");
        let plan = LoadedConfig::parse(&with_backend(&env), "t.toml").expect("valid").spin.expect("[spin]");
        assert!(
            matches!(plan.backend, BackendPlan::Firecrest { client_secret: ClientSecret::Env(ref v), .. } if v == "FC_SECRET")
        );
    }

    #[test]
    fn rest_backends_take_https_urls_and_a_site_ca() {
        let https = FIRECREST
            .replace("http://127.0.0.1:8000/", "https://api.cscs.ch/v2/")
            .replace("http://idp/token", "https://auth.cscs.ch/token");
        let plan = LoadedConfig::parse(&with_backend(&format!("{https}\nca_cert = \"/etc/tela/ca.pem\"")), "t.toml")
            .expect("valid")
            .spin
            .expect("[spin]");
        assert!(
            matches!(&plan.backend, BackendPlan::Firecrest { url, token_url, ca_cert: Some(ca), .. }
                if url == "https://api.cscs.ch/v2" && token_url == "https://auth.cscs.ch/token" && ca.ends_with("ca.pem")),
            "{:?}",
            plan.backend
        );
        // One https:// URL is enough for a CA file to mean something.
        let mixed =
            format!("{FIRECREST}\nca_cert = \"/etc/tela/ca.pem\"").replace("http://idp/token", "https://idp/token");
        LoadedConfig::parse(&with_backend(&mixed), "t.toml").expect("a CA for the token URL alone");
        let slurm =
            "kind = \"slurmrest\"\nurl = \"https://slurm:6820/\"\nuser = \"tela\"\ntoken_file = \"/etc/tela/jwt\"";
        let plan = LoadedConfig::parse(&with_backend(slurm), "t.toml").expect("valid").spin.expect("[spin]");
        assert!(
            matches!(&plan.backend, BackendPlan::Slurmrest { url, ca_cert: None, .. } if url == "https://slurm:6820"),
            "{:?}",
            plan.backend
        );
    }

    #[test]
    fn firecrest_refusals_name_the_key() {
        let cases = [
            (FIRECREST.replace("system = \"daint\"\n", ""), "spin.backend.system", "required for kind = \"firecrest\""),
            (FIRECREST.replace("client_id = \"tela\"\n", ""), "spin.backend.client_id", "required"),
            (
                FIRECREST.replace("client_secret_file = \"/etc/tela/fc-secret\"", ""),
                "spin.backend.client_secret_file",
                "required",
            ),
            (format!("{FIRECREST}\nclient_secret_env = \"X\""), "spin.backend.client_secret_env", "not both"),
            (
                FIRECREST.replace("http://127.0.0.1:8000/", "ftp://api.cscs.ch"),
                "spin.backend.url",
                "not an http:// or https:// URL",
            ),
            (
                FIRECREST.replace("http://idp/token", "idp/token"),
                "spin.backend.token_url",
                "not an http:// or https://",
            ),
            (FIRECREST.replace("http://idp/token", "https:///token"), "spin.backend.token_url", "not an http://"),
            (format!("{FIRECREST}\nca_cert = \"/etc/tela/ca.pem\""), "spin.backend.ca_cert", "no URL is https://"),
            (
                "kind = \"sbatch\"\nca_cert = \"/etc/tela/ca.pem\"".to_string(),
                "spin.backend.ca_cert",
                "only applies to kind = \"slurmrest\" or \"firecrest\"",
            ),
            (format!("{FIRECREST}\nuser = \"u\""), "spin.backend.user", "only applies to kind = \"slurmrest\""),
            (
                "kind = \"sbatch\"\nsystem = \"daint\"".to_string(),
                "spin.backend.system",
                "only applies to kind = \"firecrest\"",
            ),
        ];
        for (backend, key, why) in cases {
            let err = refused(&backend);
            assert!(err.contains(key) && err.contains(why), "{backend}\n→ {err}\n(wanted {key}: {why})");
        }
    }
}
