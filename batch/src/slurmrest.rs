//! The Slurm REST backend: `slurmrestd` over HTTP/1.1 with JWT authentication, for gateways
//! that do not run on a host with the Slurm commands.
//!
//! Every request carries `X-SLURM-USER-NAME` and `X-SLURM-USER-TOKEN`. The token is the first
//! line of a file ([`SlurmRestConfig::token_file`]) that something else renews (`scontrol token
//! lifespan=...` from cron, a site's token service): the file is checked before every request
//! and re-read when its size or modification time changed, and re-read once more (and the
//! request repeated) when slurmrestd refuses a request with 401 or fails it with a 5xx, which
//! is how Slurm 22.05 answers an expired token.
//!
//! The daemon serves one or more versions of the OpenAPI plugin; [`RestVersion`] lists the
//! ones Tela speaks (each version's request and answer shapes live in their own module, so
//! that v0.0.39+ or FirecREST can be added beside them). [`SlurmRest::connect`] uses the
//! configured version or asks the daemon which it serves (`/openapi/v3`, `/openapi`, else a
//! ping per version).
//!
//! How each call maps onto v0.0.38:
//! - **submit**: `POST /slurm/v0.0.38/job/submit`. The job's environment is
//!   [`SlurmRestConfig::environment`] overridden by the request's own. No walltime signal is
//!   asked for: the REST API refuses `B:` signals, and a signal without it would reach only job
//!   steps (the engine, if the template starts it with `srun`). A REST-submitted `tela node`
//!   drains on its own timer instead, one drain window before the time limit it reads from
//!   Slurm (see `tela_runtime::walltime`).
//! - **jobs**: `GET /slurm/v0.0.38/job/{id}` per id (a few at a time); a job Slurm no longer
//!   knows is [`BatchState::Ended`](super::BatchState::Ended).
//! - **cancel**: `DELETE /slurm/v0.0.38/job/{id}`.
//! - **signal**: `DELETE /slurm/v0.0.38/job/{id}?signal=SIGUSR1`. Slurm sends it to every
//!   process of the job, not only the batch shell: `tela node` drains (a second USR1 from the
//!   template's trap changes nothing), and the job template starts the engine with USR1 ignored
//!   so that the signal does not kill it.
//!
//! The URL may be `http://` (slurmrestd itself, on loopback or a trusted network) or
//! `https://` (slurmrestd behind a site's TLS front end): HTTPS trusts the system's certificate
//! store plus, for a site with its own CA, the PEM file [`SlurmRestConfig::ca_cert`], and checks
//! the certificate against the URL's host. A handshake that fails is an
//! [`BatchError::Unreachable`] that says why (`TLS: certificate not trusted for host …`).
//!
//! ```no_run
//! use tela_batch::slurmrest::{SlurmRest, SlurmRestConfig};
//! use tela_batch::BatchSystem;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = SlurmRestConfig::new("http://127.0.0.1:6820", "alice", "/home/alice/.slurm-jwt");
//! let slurm = SlurmRest::connect(config).await?;   // discovers v0.0.38
//! println!("{}", slurm.name());
//! # Ok(()) }
//! ```

pub mod v0_0_38;

use super::http::{check_url, is_https, tls_for, Answer, HttpClient};
use super::{BatchError, BatchFuture, BatchJob, BatchJobId, BatchSystem, JobRequest, JobSignal};
use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::Full;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

const BACKEND: &str = "slurmrestd";

/// Job lookups in flight at once.
const LOOKUPS_AT_ONCE: usize = 8;

/// A version of slurmrestd's OpenAPI plugin that Tela speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RestVersion {
    /// `openapi/v0.0.38` (Slurm 22.05, 23.02).
    V0_0_38,
}

impl RestVersion {
    /// Every version Tela speaks, newest first (the order discovery prefers).
    pub const KNOWN: &'static [RestVersion] = &[RestVersion::V0_0_38];

    /// The version as it appears in URLs (`v0.0.38`).
    pub fn as_str(self) -> &'static str {
        match self {
            RestVersion::V0_0_38 => "v0.0.38",
        }
    }

    fn prefix(self) -> String {
        format!("/slurm/{}", self.as_str())
    }
}

impl fmt::Display for RestVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text is not a version Tela speaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a slurmrestd version Tela speaks (known: v0.0.38)")]
pub struct UnknownRestVersion(pub String);

impl FromStr for RestVersion {
    type Err = UnknownRestVersion;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let t = t.strip_prefix("openapi/").unwrap_or(t);
        RestVersion::KNOWN
            .iter()
            .copied()
            .find(|v| v.as_str() == t || v.as_str().trim_start_matches('v') == t)
            .ok_or_else(|| UnknownRestVersion(s.to_string()))
    }
}

/// Where slurmrestd is and whom to speak for.
#[derive(Clone, Debug)]
pub struct SlurmRestConfig {
    /// Base URL, `http(s)://host:port` (a path prefix is kept, for a proxy).
    pub url: String,
    /// The user the token belongs to (`X-SLURM-USER-NAME`).
    pub user: String,
    /// File whose first line is the token (`X-SLURM-USER-TOKEN`).
    pub token_file: PathBuf,
    /// The API version; `None` asks the daemon ([`SlurmRest::connect`]).
    pub version: Option<RestVersion>,
    /// Longest one request may take, answer included.
    pub timeout: Duration,
    /// Environment every job gets, under the request's own (REST jobs inherit nothing).
    pub environment: Vec<(String, String)>,
    /// A PEM file of CA certificates trusted for an `https://` URL besides the system's.
    pub ca_cert: Option<PathBuf>,
}

impl SlurmRestConfig {
    /// Settings with the defaults: version discovered, 30 s per request, and
    /// `PATH=/usr/local/bin:/usr/bin:/bin` as the jobs' base environment, the system's CAs only.
    pub fn new(url: impl Into<String>, user: impl Into<String>, token_file: impl Into<PathBuf>) -> SlurmRestConfig {
        SlurmRestConfig {
            url: url.into(),
            user: user.into(),
            token_file: token_file.into(),
            version: None,
            timeout: Duration::from_secs(30),
            environment: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
            ca_cert: None,
        }
    }
}

/// The token as last read, and what the file looked like then.
#[derive(Default)]
struct Token {
    value: String,
    stamp: Option<(SystemTime, u64)>,
}

/// The slurmrestd backend. See the module docs.
pub struct SlurmRest {
    config: SlurmRestConfig,
    base: String,
    version: RestVersion,
    name: String,
    client: HttpClient,
    token: Mutex<Token>,
}

impl fmt::Debug for SlurmRest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlurmRest").field("url", &self.base).field("version", &self.version).finish_non_exhaustive()
    }
}

impl SlurmRest {
    /// A backend for `config`, with the configured version or the one the daemon serves.
    pub async fn connect(config: SlurmRestConfig) -> Result<SlurmRest, BatchError> {
        let version = config.version;
        let mut rest = SlurmRest::with_version(config, version.unwrap_or(RestVersion::V0_0_38))?;
        if version.is_none() {
            rest.version = rest.discover().await?;
            rest.name = format!("{BACKEND} {}", rest.version);
        }
        Ok(rest)
    }

    /// A backend that speaks `version` (no request is made).
    pub fn with_version(config: SlurmRestConfig, version: RestVersion) -> Result<SlurmRest, BatchError> {
        let base = check_url(BACKEND, &config.url, "the slurmrestd URL", "http://127.0.0.1:6820")?;
        if config.user.is_empty() {
            return Err(BatchError::Refused { backend: BACKEND, detail: "no user name for X-SLURM-USER-NAME".into() });
        }
        let tls = tls_for(BACKEND, is_https(&base), config.ca_cert.as_deref())?;
        let client = HttpClient::new(BACKEND, config.timeout, tls);
        Ok(SlurmRest {
            name: format!("{BACKEND} {version}"),
            config,
            base,
            version,
            client,
            token: Mutex::new(Token::default()),
        })
    }

    /// The API version in use.
    pub fn version(&self) -> RestVersion {
        self.version
    }

    /// Asks the daemon which of [`RestVersion::KNOWN`] it serves (the newest wins): from its
    /// OpenAPI description, else by pinging each version.
    pub async fn discover(&self) -> Result<RestVersion, BatchError> {
        let mut served = Vec::new();
        for path in ["/openapi/v3", "/openapi"] {
            let Ok(answer) = self.request(Method::GET, path, None).await else { continue };
            if !answer.status.is_success() {
                continue;
            }
            let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&answer.body) else { continue };
            let Some(paths) = doc.get("paths").and_then(|p| p.as_object()) else { continue };
            served = versions_in_paths(paths.keys().map(String::as_str));
            break;
        }
        if served.is_empty() {
            for v in RestVersion::KNOWN {
                let answer = self.request(Method::GET, &format!("{}/ping", v.prefix()), None).await?;
                if answer.status.is_success() {
                    return Ok(*v);
                }
                if answer.status == StatusCode::UNAUTHORIZED {
                    return Err(self.refused("GET ping", &answer));
                }
            }
            return Err(BatchError::Refused {
                backend: BACKEND,
                detail: format!(
                    "{} answers no ping of a version Tela speaks ({})",
                    self.base,
                    RestVersion::KNOWN.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
                ),
            });
        }
        RestVersion::KNOWN.iter().copied().find(|v| served.iter().any(|s| s == v.as_str())).ok_or_else(|| {
            BatchError::Refused {
                backend: BACKEND,
                detail: format!(
                    "{} serves {}; Tela speaks {} (start slurmrestd with -s openapi/v0.0.38, or pin a version)",
                    self.base,
                    served.join(", "),
                    RestVersion::KNOWN.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
                ),
            }
        })
    }

    /// The token, re-read if the file changed (or `force`). Returns whether it changed.
    fn token(&self, force: bool) -> Result<(String, bool), BatchError> {
        let path = &self.config.token_file;
        let unreadable = |e: std::io::Error| BatchError::Refused {
            backend: BACKEND,
            detail: format!("cannot read the token file {}: {e}", path.display()),
        };
        let meta = std::fs::metadata(path).map_err(unreadable)?;
        let stamp = Some((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len()));
        let mut token = self.token.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !force && token.stamp == stamp && !token.value.is_empty() {
            return Ok((token.value.clone(), false));
        }
        let text = std::fs::read_to_string(path).map_err(unreadable)?;
        let value = text.lines().next().unwrap_or("").trim();
        let value = value.strip_prefix("SLURM_JWT=").unwrap_or(value).to_string();
        if value.is_empty() {
            return Err(BatchError::Refused {
                backend: BACKEND,
                detail: format!("the token file {} is empty (write `scontrol token`'s token into it)", path.display()),
            });
        }
        let changed = value != token.value;
        *token = Token { value: value.clone(), stamp };
        Ok((value, changed))
    }

    /// One request, repeated once with a fresh token when the answer looks like a stale one.
    async fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Answer, BatchError> {
        let body = body.map(Bytes::from);
        let (token, _) = self.token(false)?;
        let answer = self.send(&method, path, body.clone(), &token).await?;
        if answer.status == StatusCode::UNAUTHORIZED || answer.status.is_server_error() {
            let (token, changed) = self.token(true)?;
            if changed {
                return self.send(&method, path, body, &token).await;
            }
        }
        Ok(answer)
    }

    async fn send(&self, method: &Method, path: &str, body: Option<Bytes>, token: &str) -> Result<Answer, BatchError> {
        let url = format!("{}{path}", self.base);
        let mut request = Request::builder()
            .method(method.clone())
            .uri(&url)
            .header("X-SLURM-USER-NAME", &self.config.user)
            .header("X-SLURM-USER-TOKEN", token)
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body.unwrap_or_default())).map_err(|e| BatchError::Refused {
            backend: BACKEND,
            detail: format!("cannot build a request for {url}: {e} (is the user name or token odd?)"),
        })?;
        self.client.exchange(&format!("{method} {url}"), request).await
    }

    fn refused(&self, what: &str, answer: &Answer) -> BatchError {
        let said = match v0_0_38::parse::<v0_0_38::Errors>(&answer.body) {
            Ok(errors) if !errors.errors.is_empty() => errors.text(),
            _ => v0_0_38::preview(&answer.body),
        };
        let hint = if answer.status == StatusCode::UNAUTHORIZED {
            " (the token or user name was not accepted; renew the token file)"
        } else {
            ""
        };
        BatchError::Refused { backend: BACKEND, detail: format!("{what}: HTTP {}: {said}{hint}", answer.status) }
    }

    async fn job(&self, id: BatchJobId) -> Result<BatchJob, BatchError> {
        match self.version {
            RestVersion::V0_0_38 => {
                let what = format!("GET job {id}");
                let answer = self.request(Method::GET, &format!("{}/job/{id}", self.version.prefix()), None).await?;
                let parsed: Result<v0_0_38::JobsResponse, _> = v0_0_38::parse(&answer.body);
                match parsed {
                    Ok(jobs) if answer.status.is_success() => {
                        let now = SystemTime::now();
                        let job = jobs.jobs.iter().find(|j| j.job_id == id.0);
                        Ok(job.map_or_else(|| super::sbatch::not_listed(id), |j| j.to_batch_job(now)))
                    }
                    Ok(jobs) if jobs.errors.job_unknown() => Ok(super::sbatch::not_listed(id)),
                    _ => Err(self.refused(&what, &answer)),
                }
            }
        }
    }

    async fn delete(&self, id: BatchJobId, signal: Option<&str>) -> Result<(), BatchError> {
        match self.version {
            RestVersion::V0_0_38 => {
                let query = signal.map(|s| format!("?signal={s}")).unwrap_or_default();
                let what = format!("DELETE job {id}{query}");
                let answer =
                    self.request(Method::DELETE, &format!("{}/job/{id}{query}", self.version.prefix()), None).await?;
                if answer.status.is_success() {
                    return Ok(());
                }
                // An ended job needs neither cancelling nor draining.
                match v0_0_38::parse::<v0_0_38::Errors>(&answer.body) {
                    Ok(errors) if errors.job_unknown() => Ok(()),
                    _ => Err(self.refused(&what, &answer)),
                }
            }
        }
    }
}

/// The versions named in an OpenAPI description's paths (`/slurm/v0.0.40/ping` → `v0.0.40`).
fn versions_in_paths<'a>(paths: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut versions: Vec<String> = paths
        .filter_map(|p| p.strip_prefix("/slurm/"))
        .filter_map(|rest| rest.split('/').next())
        .filter(|v| v.starts_with('v'))
        .map(str::to_string)
        .collect();
    versions.sort();
    versions.dedup();
    versions
}

impl BatchSystem for SlurmRest {
    fn name(&self) -> &str {
        &self.name
    }

    fn submit<'a>(&'a self, job: &'a JobRequest) -> BatchFuture<'a, BatchJobId> {
        Box::pin(async move {
            super::sbatch::check_job(job).map_err(|e| match e {
                BatchError::Refused { detail, .. } => BatchError::Refused { backend: BACKEND, detail },
                other => other,
            })?;
            match self.version {
                RestVersion::V0_0_38 => {
                    let body = serde_json::to_vec(&v0_0_38::SubmitRequest::new(job, &self.config.environment))
                        .map_err(|e| BatchError::Protocol { backend: BACKEND, detail: e.to_string() })?;
                    let what = format!("submit job '{}'", job.name);
                    let answer = self
                        .request(Method::POST, &format!("{}/job/submit", self.version.prefix()), Some(body))
                        .await?;
                    match v0_0_38::parse::<v0_0_38::SubmitResponse>(&answer.body) {
                        Ok(v0_0_38::SubmitResponse { job_id: Some(id), errors })
                            if answer.status.is_success() && errors.errors.is_empty() =>
                        {
                            Ok(BatchJobId(id))
                        }
                        _ => Err(self.refused(&what, &answer)),
                    }
                }
            }
        })
    }

    fn jobs<'a>(&'a self, ids: &'a [BatchJobId]) -> BatchFuture<'a, Vec<BatchJob>> {
        Box::pin(async move {
            let mut jobs = Vec::with_capacity(ids.len());
            for chunk in ids.chunks(LOOKUPS_AT_ONCE) {
                jobs.extend(futures::future::try_join_all(chunk.iter().map(|id| self.job(*id))).await?);
            }
            Ok(jobs)
        })
    }

    fn cancel(&self, id: BatchJobId) -> BatchFuture<'_, ()> {
        Box::pin(self.delete(id, None))
    }

    fn signal(&self, id: BatchJobId, signal: JobSignal) -> BatchFuture<'_, ()> {
        let name = match signal {
            JobSignal::Drain => "SIGUSR1",
        };
        Box::pin(self.delete(id, Some(name)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::http::test_server::{localhost_tls, serve_on};
    use super::*;

    #[test]
    fn versions_parse_and_print() {
        assert_eq!("v0.0.38".parse::<RestVersion>(), Ok(RestVersion::V0_0_38));
        assert_eq!("0.0.38".parse::<RestVersion>(), Ok(RestVersion::V0_0_38));
        assert_eq!("openapi/v0.0.38".parse::<RestVersion>(), Ok(RestVersion::V0_0_38));
        let err = "v0.0.41".parse::<RestVersion>().unwrap_err();
        assert!(err.to_string().contains("known: v0.0.38"), "{err}");
        assert_eq!(RestVersion::V0_0_38.to_string(), "v0.0.38");
    }

    #[test]
    fn served_versions_are_read_from_openapi_paths() {
        let paths =
            ["/slurm/v0.0.38/ping", "/slurm/v0.0.38/jobs", "/slurmdb/v0.0.38/jobs", "/slurm/v0.0.40/ping", "/openapi"];
        assert_eq!(versions_in_paths(paths.into_iter()), ["v0.0.38", "v0.0.40"]);
    }

    #[test]
    fn only_web_urls_and_a_user_are_accepted() {
        let config = |url: &str| SlurmRestConfig::new(url, "alice", "/nonexistent");
        assert!(SlurmRest::with_version(config("http://127.0.0.1:6820/"), RestVersion::V0_0_38).is_ok());
        let err = SlurmRest::with_version(config("slurm:6820"), RestVersion::V0_0_38).unwrap_err();
        assert!(err.to_string().contains("not an http:// or https:// URL"), "{err}");
        let mut stray_ca = config("http://127.0.0.1:6820");
        stray_ca.ca_cert = Some("/etc/tela/ca.pem".into());
        let err = SlurmRest::with_version(stray_ca, RestVersion::V0_0_38).unwrap_err();
        assert!(err.to_string().contains("no URL is https://"), "{err}");
        let mut nobody = config("http://127.0.0.1:6820");
        nobody.user.clear();
        assert!(SlurmRest::with_version(nobody, RestVersion::V0_0_38).is_err());
    }

    #[test]
    fn the_token_is_reread_when_the_file_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("jwt");
        std::fs::write(&file, "SLURM_JWT=first\n").expect("write");
        let mut config = SlurmRestConfig::new("http://127.0.0.1:1", "alice", &file);
        config.version = Some(RestVersion::V0_0_38);
        let rest = SlurmRest::with_version(config, RestVersion::V0_0_38).expect("valid");
        assert_eq!(rest.token(false).expect("reads"), ("first".to_string(), true));
        assert_eq!(rest.token(false).expect("reads"), ("first".to_string(), false));
        std::fs::write(&file, "second-and-longer\n").expect("write");
        assert_eq!(rest.token(false).expect("reads").0, "second-and-longer");
        std::fs::write(&file, "\n").expect("write");
        assert!(rest.token(true).unwrap_err().to_string().contains("empty"));
        std::fs::remove_file(&file).expect("remove");
        assert!(rest.token(true).unwrap_err().to_string().contains("cannot read the token file"));
    }

    #[tokio::test]
    async fn an_unreachable_daemon_is_an_unreachable_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("jwt");
        std::fs::write(&file, "t\n").expect("write");
        // A port nothing listens on: bind one, then drop it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let mut config = SlurmRestConfig::new(format!("http://127.0.0.1:{port}"), "alice", &file);
        config.timeout = Duration::from_secs(5);
        let rest = SlurmRest::with_version(config, RestVersion::V0_0_38).expect("valid");
        let err = rest.jobs(&[BatchJobId(1)]).await.unwrap_err();
        assert!(matches!(err, BatchError::Unreachable { .. }), "{err}");
    }

    #[tokio::test]
    async fn slurmrestd_is_reached_over_https_with_the_site_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("jwt");
        std::fs::write(&file, "t\n").expect("write");
        let (acceptor, ca) = localhost_tls(dir.path());
        let (base, seen) = serve_on(|_head, _body| (200, r#"{"errors":[]}"#.into()), Some(acceptor)).await;
        let mut config = SlurmRestConfig::new(&base, "alice", &file);
        config.ca_cert = Some(ca);
        let rest = SlurmRest::with_version(config, RestVersion::V0_0_38).expect("valid");
        rest.cancel(BatchJobId(5)).await.expect("cancelled over https");
        let seen = seen.lock().expect("log").clone();
        assert!(
            seen[0].starts_with("DELETE /slurm/v0.0.38/job/5 ") && seen[0].contains("x-slurm-user-token: t"),
            "{seen:?}"
        );

        // The system's roots do not trust the site's self-signed certificate: the error says so.
        let rest = SlurmRest::with_version(SlurmRestConfig::new(&base, "alice", &file), RestVersion::V0_0_38);
        match rest {
            Ok(rest) => {
                let err = rest.cancel(BatchJobId(5)).await.unwrap_err();
                assert!(matches!(err, BatchError::Unreachable { .. }), "{err}");
                assert!(err.to_string().contains("TLS: certificate not trusted for host localhost"), "{err}");
            }
            Err(err) => assert!(err.to_string().contains("no trusted certificates"), "{err}"),
        }
    }
}
