//! The FirecREST v2 backend: CSCS's REST front door to an HPC system, for gateways that reach
//! a cluster only through its FirecREST service (no Slurm commands, no slurmrestd).
//!
//! **Authentication** is OIDC client credentials: the backend posts `grant_type=client_credentials`
//! with its client id and secret (form encoded, `client_secret_post`) to the identity provider's
//! token URL, reads `access_token` and `expires_in`, and sends the token as a bearer token until
//! shortly before it expires ([`refresh_margin`]); a 401 from FirecREST fetches a new one and
//! repeats the request once. The secret comes from a file (re-read on every token request, so a
//! rotated secret takes effect) or an environment variable, and is never logged or printed.
//!
//! How each call maps onto FirecREST v2 (`{system}` is [`FirecrestConfig::system`]):
//! - **submit**: `POST /compute/{system}/jobs` with `{"job": {"name", "workingDirectory",
//!   "script", "env", "partition", "account"}}`, answered `{"jobId": "123"}`. v2 takes no
//!   resource fields, so the job's resources, time limit and walltime warning go into the
//!   script as `#SBATCH` lines right after its `#!` line — the same options the sbatch backend
//!   passes ([`super::sbatch::resource_args`]), `--signal=B:USR1@<drain>` included. v2 has no
//!   endpoint to signal a job, so that line is the walltime drain's trigger (with the node's own
//!   walltime timer, see `tela_runtime::walltime`).
//! - **jobs**: `GET /compute/{system}/jobs/{id}` per id (a few at a time). FirecREST answers
//!   from `sacct` and `squeue`; 404 means Slurm forgot the job: [`super::BatchState::Ended`].
//!   v2's job answer has no comment, so the node a running job became is read from the line
//!   the job template prints first (`tela: job <id> is node <hex>`): the job's output file from
//!   `GET /compute/{system}/jobs/{id}/metadata` (`standardOutput`), its first 4 KiB from
//!   `GET /filesystem/{system}/ops/view`. Once found it is kept, and reported as the job's
//!   comment (`tela-node=<hex>`) like the Slurm backends do; until then (or if the output file is
//!   outside FirecREST's file systems) the job's node is unknown.
//! - **cancel**: `DELETE /compute/{system}/jobs/{id}` (404: already gone, not an error).
//! - **signal** (a drain when demand went away): `PUT /compute/{system}/jobs/{id}/attach` with
//!   the command `scancel --batch --signal=USR1 <id>`, which FirecREST runs inside the job's
//!   allocation (`srun --overlap`): the batch shell alone gets SIGUSR1, as with the sbatch
//!   backend, and its trap passes it on to `tela node`.
//!
//! The request and answer shapes live in [`v2`]. Errors keep FirecREST's words (`message`, `causedBy`, or FastAPI's `detail`): a 401 says the
//! token was refused, other 4xx are [`BatchError::Refused`], 5xx and timeouts are
//! [`BatchError::Unreachable`]; the spinner logs them, shows the last one on `/status` and backs
//! off its submissions.
//!
//! FirecREST's URL and the token URL may each be `http://` or `https://` (real deployments and
//! their identity providers are HTTPS-only): HTTPS trusts the system's certificate store plus,
//! for a site with its own CA, the PEM file [`FirecrestConfig::ca_cert`]; the server's name is
//! the URL's host (SNI and certificate check). A handshake that fails is an
//! [`BatchError::Unreachable`] that says why (`TLS: certificate not trusted for host …`).
//!
//! ```no_run
//! use tela_batch::firecrest::{ClientSecret, Firecrest, FirecrestConfig};
//! use tela_batch::BatchSystem;
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = FirecrestConfig::new(
//!     "https://api.cscs.example/v2",
//!     "daint",
//!     "https://auth.cscs.example/realms/hpc/protocol/openid-connect/token",
//!     "tela-spinner",
//!     ClientSecret::File("/home/tela/.tela/firecrest-secret".into()),
//! );
//! let firecrest = Firecrest::new(config)?;
//! println!("{}", firecrest.name());
//! # Ok(()) }
//! ```

pub mod v2;

use super::http::{check_url, is_https, preview, tls_for, Answer, HttpClient};
use super::sbatch::{check_job, not_listed};
use super::{BatchError, BatchFuture, BatchJob, BatchJobId, BatchState, BatchSystem, JobRequest, JobSignal};
use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::Full;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};
use v2::{error_words, node_in_output, JobsAnswer, SubmitAnswer, SubmitRequest};

const BACKEND: &str = "firecrest";

/// Job lookups in flight at once.
const LOOKUPS_AT_ONCE: usize = 8;

/// How much of a job's output is read to find its node line.
const OUTPUT_HEAD: usize = 4096;

/// Where the OIDC client secret is kept.
#[derive(Clone, PartialEq, Eq)]
pub enum ClientSecret {
    /// A file whose first line is the secret (re-read on every token request).
    File(PathBuf),
    /// An environment variable of the gateway's process.
    Env(String),
}

impl fmt::Debug for ClientSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientSecret::File(p) => write!(f, "File({})", p.display()),
            ClientSecret::Env(v) => write!(f, "Env({v})"),
        }
    }
}

impl ClientSecret {
    /// The secret's value now.
    fn read(&self) -> Result<String, BatchError> {
        let refused = |detail: String| BatchError::Refused { backend: BACKEND, detail };
        let value = match self {
            ClientSecret::File(path) => std::fs::read_to_string(path)
                .map_err(|e| refused(format!("cannot read the client secret file {}: {e}", path.display())))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
            ClientSecret::Env(var) => std::env::var(var)
                .map_err(|_| refused(format!("the client secret variable {var} is not set")))?
                .trim()
                .to_string(),
        };
        if value.is_empty() {
            return Err(refused(format!("the client secret ({self:?}) is empty")));
        }
        Ok(value)
    }
}

/// Where FirecREST and its identity provider are, and who the backend is to them.
#[derive(Clone, Debug)]
pub struct FirecrestConfig {
    /// FirecREST's base URL, `http(s)://host:port` (a path prefix is kept, for a proxy).
    pub url: String,
    /// The system (cluster) name in FirecREST's paths.
    pub system: String,
    /// The identity provider's token endpoint.
    pub token_url: String,
    /// The OIDC client id.
    pub client_id: String,
    /// Where the client secret is.
    pub client_secret: ClientSecret,
    /// Longest one request may take, answer included.
    pub timeout: Duration,
    /// A PEM file of CA certificates trusted for `https://` URLs besides the system's.
    pub ca_cert: Option<PathBuf>,
}

impl FirecrestConfig {
    /// Settings with the defaults: 30 s per request, the system's CAs only.
    pub fn new(
        url: impl Into<String>,
        system: impl Into<String>,
        token_url: impl Into<String>,
        client_id: impl Into<String>,
        client_secret: ClientSecret,
    ) -> FirecrestConfig {
        FirecrestConfig {
            url: url.into(),
            system: system.into(),
            token_url: token_url.into(),
            client_id: client_id.into(),
            client_secret,
            timeout: Duration::from_secs(30),
            ca_cert: None,
        }
    }
}

/// An access token and when to stop using it.
struct AccessToken {
    value: String,
    refresh_at: Instant,
}

/// How long before its expiry a token is replaced: a minute (half its lifetime if shorter), so
/// that no request leaves with a token that expires on the way — FirecREST itself refuses
/// tokens with under 30 s left.
pub fn refresh_margin(lifetime: Duration) -> Duration {
    (lifetime / 2).min(Duration::from_secs(60))
}

/// The FirecREST v2 backend. See the module docs.
pub struct Firecrest {
    config: FirecrestConfig,
    base: String,
    name: String,
    client: HttpClient,
    token: tokio::sync::Mutex<Option<AccessToken>>,
    /// The comment (`tela-node=<hex>`) found in each running job's output, once found.
    nodes: std::sync::Mutex<BTreeMap<BatchJobId, String>>,
}

impl fmt::Debug for Firecrest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Firecrest")
            .field("url", &self.base)
            .field("system", &self.config.system)
            .finish_non_exhaustive()
    }
}

/// `application/x-www-form-urlencoded` encoding of one value.
fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => out.push(char::from(b)),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The token endpoint's answer (RFC 6749 §5.1 and §5.2).
#[derive(Debug, Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<f64>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    error_description: Option<String>,
}

/// A failed answer as a typed error: 5xx is the service failing, anything else a refusal.
fn failed(what: &str, answer: &Answer) -> BatchError {
    let said = error_words(&answer.body);
    let detail = format!("{what}: HTTP {}: {said}", answer.status);
    if answer.status == StatusCode::UNAUTHORIZED {
        BatchError::Refused {
            backend: BACKEND,
            detail: format!(
                "{detail} (the access token was refused even after a fresh one: check that FirecREST trusts the token issuer's key and the client's user)"
            ),
        }
    } else if answer.status.is_server_error() {
        BatchError::Unreachable { backend: BACKEND, detail: format!("FirecREST failed: {detail}") }
    } else {
        BatchError::Refused { backend: BACKEND, detail }
    }
}

impl Firecrest {
    /// A backend for `config` (no request is made: the first call fetches a token).
    pub fn new(config: FirecrestConfig) -> Result<Firecrest, BatchError> {
        let base = check_url(BACKEND, &config.url, "the FirecREST URL", "https://api.example.org/v2")?;
        let token_url = check_url(BACKEND, &config.token_url, "the token URL", "https://idp.example.org/token")?;
        let tls = tls_for(BACKEND, is_https(&base) || is_https(&token_url), config.ca_cert.as_deref())?;
        let bad = |detail: &str| Err(BatchError::Refused { backend: BACKEND, detail: detail.into() });
        if config.system.trim().is_empty() || config.system.contains(['/', '?', '#', ' ']) {
            return bad("the system name must be one path segment (the cluster's name in FirecREST)");
        }
        if config.client_id.trim().is_empty() {
            return bad("no OIDC client id");
        }
        Ok(Firecrest {
            name: format!("{BACKEND} v2 ({})", config.system),
            client: HttpClient::new(BACKEND, config.timeout, tls),
            base,
            config,
            token: tokio::sync::Mutex::new(None),
            nodes: std::sync::Mutex::new(BTreeMap::new()),
        })
    }

    /// A valid access token: the cached one, or a new one when it is due (or `force`).
    async fn access_token(&self, force: bool) -> Result<String, BatchError> {
        let mut cached = self.token.lock().await;
        if let Some(t) = cached.as_ref().filter(|t| !force && Instant::now() < t.refresh_at) {
            return Ok(t.value.clone());
        }
        let secret = self.config.client_secret.read()?;
        let form = format!(
            "grant_type=client_credentials&client_id={}&client_secret={}",
            form_encode(&self.config.client_id),
            form_encode(&secret)
        );
        let url = self.config.token_url.trim();
        let request = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| BatchError::Refused {
                backend: BACKEND,
                detail: format!("cannot build the token request: {e}"),
            })?;
        let what = format!("token request to {url}");
        let started = Instant::now();
        let answer = self.client.exchange(&what, request).await?;
        let parsed = serde_json::from_slice::<TokenAnswer>(&answer.body).ok();
        let refused = |said: String| BatchError::Refused {
            backend: BACKEND,
            detail: format!(
                "{what}: HTTP {}: {said} (check the client id and secret of [spin.backend])",
                answer.status
            ),
        };
        match parsed {
            Some(TokenAnswer { access_token: Some(value), expires_in, .. })
                if answer.status.is_success() && !value.is_empty() =>
            {
                // No expires_in: assume five minutes, and refresh on the first 401 anyway.
                let lifetime = expires_in
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .map_or(Duration::from_secs(300), |s| Duration::from_secs_f64(s.min(1e7)));
                let refresh_at = started + lifetime - refresh_margin(lifetime);
                *cached = Some(AccessToken { value: value.clone(), refresh_at });
                Ok(value)
            }
            Some(TokenAnswer { error: Some(error), error_description, .. }) => {
                Err(refused(format!("{error}{}", error_description.map(|d| format!(": {d}")).unwrap_or_default())))
            }
            _ if answer.status.is_server_error() => Err(BatchError::Unreachable {
                backend: BACKEND,
                detail: format!("{what}: HTTP {}: {}", answer.status, preview(&answer.body)),
            }),
            _ if answer.status.is_success() => Err(BatchError::Protocol {
                backend: BACKEND,
                detail: format!("{what}: no access_token in '{}'", preview(&answer.body)),
            }),
            _ => Err(refused(preview(&answer.body))),
        }
    }

    /// One request to FirecREST, repeated once with a fresh token after a 401.
    async fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Answer, BatchError> {
        let body = body.map(Bytes::from);
        let token = self.access_token(false).await?;
        let answer = self.send(&method, path, body.clone(), &token).await?;
        if answer.status == StatusCode::UNAUTHORIZED {
            let token = self.access_token(true).await?;
            return self.send(&method, path, body, &token).await;
        }
        Ok(answer)
    }

    async fn send(&self, method: &Method, path: &str, body: Option<Bytes>, token: &str) -> Result<Answer, BatchError> {
        let url = format!("{}{path}", self.base);
        let mut request = Request::builder()
            .method(method.clone())
            .uri(&url)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body.unwrap_or_default())).map_err(|e| BatchError::Refused {
            backend: BACKEND,
            detail: format!("cannot build a request for {url}: {e} (does the token hold odd characters?)"),
        })?;
        self.client.exchange(&format!("{method} {url}"), request).await
    }

    fn jobs_path(&self) -> String {
        format!("/compute/{}/jobs", self.config.system)
    }

    async fn job(&self, id: BatchJobId) -> Result<BatchJob, BatchError> {
        let what = format!("GET job {id}");
        let answer = self.request(Method::GET, &format!("{}/{id}", self.jobs_path()), None).await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(not_listed(id));
        }
        if !answer.status.is_success() {
            return Err(failed(&what, &answer));
        }
        let parsed: JobsAnswer = serde_json::from_slice(&answer.body).map_err(|e| BatchError::Protocol {
            backend: BACKEND,
            detail: format!("{what}: {e} in '{}'", preview(&answer.body)),
        })?;
        let jobs = parsed.jobs.unwrap_or_default();
        let mut job = jobs
            .iter()
            .find(|j| j.id() == Some(id.0))
            .map_or_else(|| not_listed(id), |j| j.to_batch_job(id, SystemTime::now()));
        let known = self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&id).cloned();
        match known {
            Some(comment) => job.comment = comment,
            None if job.state == BatchState::Running => {
                // Not finding it yet is normal (the node has not started); an error only means
                // "unknown for now": the next poll tries again.
                match self.node_comment(id).await {
                    Ok(Some(comment)) => {
                        self.nodes
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(id, comment.clone());
                        job.comment = comment;
                    }
                    Ok(None) => {}
                    Err(e) => tracing::debug!("firecrest: the node of job {id} is not known yet: {e}"),
                }
            }
            None => {}
        }
        if !job.state.is_live() {
            self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
        }
        Ok(job)
    }

    /// The `tela-node=<hex>` comment read from the job's output, if it is there yet.
    async fn node_comment(&self, id: BatchJobId) -> Result<Option<String>, BatchError> {
        let answer = self.request(Method::GET, &format!("{}/{id}/metadata", self.jobs_path()), None).await?;
        if !answer.status.is_success() {
            return Err(failed(&format!("GET job {id} metadata"), &answer));
        }
        let value: serde_json::Value = serde_json::from_slice(&answer.body)
            .map_err(|e| BatchError::Protocol { backend: BACKEND, detail: e.to_string() })?;
        let Some(output) = value["jobs"][0]["standardOutput"].as_str().filter(|p| p.starts_with('/')) else {
            return Ok(None);
        };
        let path =
            format!("/filesystem/{}/ops/view?path={}&size={OUTPUT_HEAD}", self.config.system, form_encode(output));
        let answer = self.request(Method::GET, &path, None).await?;
        if !answer.status.is_success() {
            return Err(failed(&format!("view {output}"), &answer));
        }
        let value: serde_json::Value = serde_json::from_slice(&answer.body)
            .map_err(|e| BatchError::Protocol { backend: BACKEND, detail: e.to_string() })?;
        Ok(value["output"].as_str().and_then(|text| node_in_output(text, id)))
    }
}

impl BatchSystem for Firecrest {
    fn name(&self) -> &str {
        &self.name
    }

    fn submit<'a>(&'a self, job: &'a JobRequest) -> BatchFuture<'a, BatchJobId> {
        Box::pin(async move {
            check_job(job).map_err(|e| match e {
                BatchError::Refused { detail, .. } => BatchError::Refused { backend: BACKEND, detail },
                other => other,
            })?;
            let body = serde_json::to_vec(&SubmitRequest::new(job)?)
                .map_err(|e| BatchError::Protocol { backend: BACKEND, detail: e.to_string() })?;
            let what = format!("submit job '{}'", job.name);
            let answer = self.request(Method::POST, &self.jobs_path(), Some(body)).await?;
            if !answer.status.is_success() {
                return Err(failed(&what, &answer));
            }
            let id = serde_json::from_slice::<SubmitAnswer>(&answer.body).ok().and_then(|a| match a.job_id? {
                serde_json::Value::String(s) => s.trim().parse().ok(),
                serde_json::Value::Number(n) => n.as_u64(),
                _ => None,
            });
            id.map(BatchJobId).ok_or_else(|| BatchError::Protocol {
                backend: BACKEND,
                detail: format!("{what}: no job id in '{}'", preview(&answer.body)),
            })
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
        Box::pin(async move {
            let answer = self.request(Method::DELETE, &format!("{}/{id}", self.jobs_path()), None).await?;
            // An ended job needs no cancelling.
            if answer.status.is_success() || answer.status == StatusCode::NOT_FOUND {
                return Ok(());
            }
            Err(failed(&format!("DELETE job {id}"), &answer))
        })
    }

    fn signal(&self, id: BatchJobId, signal: JobSignal) -> BatchFuture<'_, ()> {
        let name = match signal {
            JobSignal::Drain => "USR1",
        };
        Box::pin(async move {
            let body = serde_json::json!({ "command": format!("scancel --batch --signal={name} {id}") });
            let answer = self
                .request(Method::PUT, &format!("{}/{id}/attach", self.jobs_path()), Some(body.to_string().into_bytes()))
                .await?;
            if answer.status.is_success() {
                return Ok(());
            }
            Err(failed(&format!("signal job {id} (attach scancel --batch --signal={name})"), &answer))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::http::test_server::{localhost_tls, serve_on};
    use super::*;

    #[test]
    fn failed_answers_are_typed_by_status() {
        let unauthorized =
            Answer { status: StatusCode::UNAUTHORIZED, body: Bytes::from_static(b"{\"message\":\"bad token\"}") };
        let err = failed("GET job 3", &unauthorized);
        assert!(matches!(err, BatchError::Refused { .. }) && err.to_string().contains("bad token"), "{err}");
        let down = Answer { status: StatusCode::BAD_GATEWAY, body: Bytes::new() };
        assert!(matches!(failed("GET job 3", &down), BatchError::Unreachable { .. }));
    }

    #[test]
    fn tokens_are_replaced_before_they_expire() {
        assert_eq!(refresh_margin(Duration::from_secs(3600)), Duration::from_secs(60));
        assert_eq!(refresh_margin(Duration::from_secs(90)), Duration::from_secs(45));
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn only_web_urls_and_a_plain_system_name_are_accepted() {
        let config = |url: &str, system: &str| {
            FirecrestConfig::new(url, system, "http://127.0.0.1:1/token", "c", ClientSecret::Env("X".into()))
        };
        assert!(Firecrest::new(config("http://127.0.0.1:8000/", "daint")).is_ok());
        let err = Firecrest::new(config("ftp://api.cscs.ch", "daint")).unwrap_err();
        assert!(
            err.to_string().contains("the FirecREST URL 'ftp://api.cscs.ch' is not an http:// or https://"),
            "{err}"
        );
        assert!(Firecrest::new(config("http://127.0.0.1:8000", "a/b")).is_err());
        let mut no_client = config("http://127.0.0.1:8000", "daint");
        no_client.client_id.clear();
        assert!(Firecrest::new(no_client).is_err());
    }

    #[test]
    fn secrets_come_from_files_and_never_show_in_debug_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("secret");
        std::fs::write(&file, "s3cr3t\n").expect("write");
        let secret = ClientSecret::File(file.clone());
        assert_eq!(secret.read().expect("reads"), "s3cr3t");
        let config = FirecrestConfig::new("http://127.0.0.1:1", "d", "http://127.0.0.1:1/t", "c", secret);
        let backend = Firecrest::new(config.clone()).expect("valid");
        assert!(!format!("{config:?} {backend:?}").contains("s3cr3t"));
        std::fs::write(&file, "\n").expect("write");
        assert!(ClientSecret::File(file).read().unwrap_err().to_string().contains("empty"));
        let missing = ClientSecret::Env("TELA_TEST_SURELY_UNSET_SECRET".into()).read().unwrap_err();
        assert!(missing.to_string().contains("not set"), "{missing}");
    }

    #[tokio::test]
    async fn an_unreachable_token_endpoint_is_an_unreachable_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("secret");
        std::fs::write(&file, "s\n").expect("write");
        let mut config = FirecrestConfig::new(
            format!("http://127.0.0.1:{port}"),
            "d",
            format!("http://127.0.0.1:{port}/token"),
            "c",
            ClientSecret::File(file),
        );
        config.timeout = Duration::from_secs(5);
        let backend = Firecrest::new(config).expect("valid");
        let err = backend.jobs(&[BatchJobId(1)]).await.unwrap_err();
        assert!(matches!(err, BatchError::Unreachable { .. }) && err.to_string().contains("token request"), "{err}");
    }

    /// A loopback HTTP/1.1 server for one test: answers each request with `answer(head, body)`
    /// and keeps every request it got.
    async fn serve(
        answer: impl Fn(&str, &str) -> (u16, String) + Send + Sync + 'static,
    ) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        serve_on(answer, None).await
    }

    #[tokio::test]
    async fn tokens_are_cached_and_a_refused_one_is_replaced_once() {
        let issued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = issued.clone();
        let (base, seen) = serve(move |head, _body| {
            if head.starts_with("POST /token") {
                let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                return (200, format!(r#"{{"access_token":"t{n}","token_type":"Bearer","expires_in":3600}}"#));
            }
            if head.contains("authorization: Bearer t1") || head.contains("Authorization: Bearer t1") {
                return (401, r#"{"errorType":"error","message":"Access token expired"}"#.into());
            }
            (200, r#"{"jobs":[{"jobId":"5","status":{"state":"PENDING"},"nodes":"None assigned"}]}"#.into())
        })
        .await;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("secret");
        std::fs::write(&file, "s/x y\n").expect("write");
        let config = FirecrestConfig::new(&base, "s", format!("{base}/token"), "tela", ClientSecret::File(file));
        let backend = Firecrest::new(config).expect("valid");

        let jobs = backend.jobs(&[BatchJobId(5)]).await.expect("listed after one refresh");
        assert_eq!(jobs[0].state, BatchState::Pending);
        assert_eq!(issued.load(std::sync::atomic::Ordering::SeqCst), 2, "t1 refused, t2 fetched");
        backend.jobs(&[BatchJobId(5)]).await.expect("listed");
        assert_eq!(issued.load(std::sync::atomic::Ordering::SeqCst), 2, "the good token is kept");

        let seen = seen.lock().expect("log").clone();
        let token_request = seen.iter().find(|r| r.starts_with("POST /token")).expect("a token request");
        assert!(
            token_request.ends_with("grant_type=client_credentials&client_id=tela&client_secret=s%2Fx+y"),
            "{token_request}"
        );
        assert!(seen.iter().any(|r| r.starts_with("GET /compute/s/jobs/5 ")), "{seen:?}");
    }

    #[tokio::test]
    async fn the_token_and_the_jobs_are_fetched_over_https_with_the_site_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (acceptor, ca) = localhost_tls(dir.path());
        let (base, seen) = serve_on(
            |head, _body| {
                if head.starts_with("POST /token") {
                    return (200, r#"{"access_token":"t1","expires_in":3600}"#.into());
                }
                (200, r#"{"jobs":[{"jobId":"7","status":{"state":"PENDING"},"nodes":"None assigned"}]}"#.into())
            },
            Some(acceptor),
        )
        .await;
        let file = dir.path().join("secret");
        std::fs::write(&file, "s\n").expect("write");
        let mut config =
            FirecrestConfig::new(&base, "s", format!("{base}/token"), "tela", ClientSecret::File(file.clone()));
        config.ca_cert = Some(ca);
        let backend = Firecrest::new(config).expect("valid");
        let jobs = backend.jobs(&[BatchJobId(7)]).await.expect("listed over https");
        assert_eq!(jobs[0].state, BatchState::Pending);
        let seen = seen.lock().expect("log").clone();
        assert!(seen[0].starts_with("POST /token") && seen[0].ends_with("client_secret=s"), "{seen:?}");
        assert!(seen.iter().any(|r| r.starts_with("GET /compute/s/jobs/7 ") && r.contains("Bearer t1")), "{seen:?}");

        // Another site's CA does not make the service trusted: the token request says why.
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let (_, other_ca) = localhost_tls(elsewhere.path());
        let mut config = FirecrestConfig::new(&base, "s", format!("{base}/token"), "tela", ClientSecret::File(file));
        config.ca_cert = Some(other_ca);
        let err = Firecrest::new(config).expect("valid").jobs(&[BatchJobId(7)]).await.unwrap_err();
        assert!(matches!(err, BatchError::Unreachable { .. }), "{err}");
        assert!(
            err.to_string().contains("token request to https://localhost")
                && err.to_string().contains("TLS: certificate not trusted for host localhost"),
            "{err}"
        );
    }
}
