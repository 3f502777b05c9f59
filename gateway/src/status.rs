//! What the gateway tells about the federation: `/health`, `/status` (JSON), `/v1/models`, and
//! the terminal table of `tela status --gateway URL`.
//!
//! `/status` lists every node in this gateway's registry replica:
//!
//! ```json
//! {"gateway": {"id": "…", "short": "…", "generation": 1, "state": "SERVE", "uptime_s": 12,
//!              "routing": "prefix"},
//!  "models": ["llama"],
//!  "nodes": [{"id": "…", "short": "1a2b3c4d", "role": "serving", "state": "SERVE",
//!             "generation": 1733, "models": ["llama"], "alive": true, "routable": true,
//!             "tunnel": true, "silent": false, "in_flight": 2, "reported_in_flight": 1,
//!             "load": 7, "handing_over": false, "leaving_in_ms": null,
//!             "engine": {"running": 4, "waiting": 3, "kv_permille": 612, "age_ms": 420,
//!                        "fresh": true, "seq": 118,
//!                        "models": [{"model": "llama", "running": 4, "waiting": 3, "kv_permille": 612}]},
//!             "gpus": {"model": "H100", "count": 4, "vram_mib": 81920}, "reach": "outbound-only"}]}
//! ```
//!
//! `routing` is the policy that picks among a model's nodes (`--routing`); `in_flight` is this
//! gateway's count; `engine` the node's last load report from its engine (`null` if none came),
//! its age here and whether it is young enough to count (`fresh`); `load` what the policy
//! balances, the two combined ([`crate::routing::combined_load`]); `reported_in_flight` what
//! the node last gossiped. `handing_over` says that the node told this gateway it leaves soon
//! (its walltime is near: new conversations go elsewhere, [`crate::routing::handing_over`]),
//! and `leaving_in_ms` how long until it starts draining, as far as this gateway can tell
//! (`null` when it does not hand over); the terminal table shows such a node as `leaving`.
//!
//! A gateway with `[[overflow]]` sections adds `overflow`, its outside providers (never their
//! keys) and what they served ([`crate::overflow`]):
//!
//! ```json
//! "overflow": [{"name": "cloud", "base_url": "https://api.example.com/v1", "models": ["gpt-4o-mini"],
//!               "after_wait_ms": 0, "requests": 12, "failed": 1, "in_flight": 2}]
//! ```
//!
//! A gateway that spins models adds `spin` ([`crate::spin::SpinShared::status_json`]):
//!
//! ```json
//! "spin": {"backend": "sbatch", "live_jobs": 1, "budget_used_gpu_hours": 4.0, "decisions": 12,
//!          "last_error": null,
//!          "models": [{"name": "llama", "wanted": 1, "supply": 1, "blocked": null, "queued": 3,
//!                      "in_flight": 0, "arrivals_per_min": 3, "p95_ttfb_ms": null}],
//!          "jobs": [{"job": 1, "batch_id": "4242", "model": "llama", "partition": "gpu",
//!                    "state": "RUNNING", "raw_state": "RUNNING", "node": "…", "node_short": "1a2b3c4d",
//!                    "hosts": ["gpu07"], "released": null, "age_s": 40}]}
//! ```

use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::Response;
use serde_json::{json, Value};
use tela_core::{Lifecycle, Reachability};
use tela_runtime::status::hex;

use crate::api_error::ApiError;
use crate::body::GatewayBody;
use crate::metrics::StateLabel;
use crate::service::Shared;

fn json_response(value: &Value) -> Response<GatewayBody> {
    let mut response = Response::new(GatewayBody::full(value.to_string()));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `GET /health`: liveness and counts only.
pub fn health(shared: &Shared) -> Response<GatewayBody> {
    let snapshot = shared.view.snapshot();
    let serving = snapshot.replica().slots().iter().filter(|s| s.is_routable()).count();
    json_response(&json!({"status": "ok", "serving_nodes": serving}))
}

/// `GET /status`: the federation table as JSON (see the module docs).
pub fn status(shared: &Shared) -> Response<GatewayBody> {
    json_response(&status_json(shared))
}

/// The `/status` document.
pub fn status_json(shared: &Shared) -> Value {
    let snapshot = shared.view.snapshot();
    let local = snapshot.local();
    let now = std::time::Instant::now();
    let mut nodes: Vec<Value> = snapshot
        .replica()
        .slots()
        .iter()
        .map(|slot| {
            let r = slot.record();
            let connection = shared.view.connection(&r.id).filter(|c| c.close_reason().is_none());
            let tunnel = connection.is_some();
            let silent = connection.is_some_and(|c| shared.silent.is_silent(&r.id, &c));
            let engine = shared.view.load_reports().latest(&r.id).map(|got| {
                let total = got.report.total();
                json!({
                    "running": total.running,
                    "waiting": total.waiting,
                    "kv_permille": total.kv_permille,
                    "slots": total.slots,
                    "age_ms": u64::try_from(got.age(now).as_millis()).unwrap_or(u64::MAX),
                    "fresh": got.age(now) < crate::routing::REPORT_MAX_AGE,
                    "seq": got.report.seq,
                    "models": got.report.models.iter().map(|m| json!({
                        "model": m.model, "running": m.running, "waiting": m.waiting, "kv_permille": m.kv_permille,
                    })).collect::<Vec<_>>(),
                })
            });
            let leaving_in = shared.view.load_reports().leaving_in(&r.id, now, crate::routing::REPORT_MAX_AGE);
            json!({
                "id": hex(&r.id),
                "short": r.id.to_string(),
                "role": format!("{:?}", r.role).to_lowercase(),
                "state": r.state.as_str(),
                "generation": r.generation,
                "models": r.models.as_slice().iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
                "alive": slot.is_alive(),
                "routable": slot.is_routable(),
                "tunnel": tunnel,
                "silent": silent,
                "in_flight": shared.load.get(&r.id),
                "reported_in_flight": r.load.in_flight,
                "load": crate::routing::node_load(&shared.view, &shared.load, &r.id, now),
                "handing_over": leaving_in.is_some(),
                "leaving_in_ms": leaving_in.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                "engine": engine,
                "gpus": {
                    "model": format!("{:?}", r.hardware.gpu),
                    "count": r.hardware.gpu_count,
                    "vram_mib": r.hardware.vram_mib,
                },
                "reach": match &r.reach {
                    Reachability::Public(a) => a.clone(),
                    Reachability::OutboundOnly => "outbound-only".to_string(),
                },
                "self": r.id == local.id,
            })
        })
        .collect();
    nodes.sort_by(|a, b| (a["role"].as_str(), a["short"].as_str()).cmp(&(b["role"].as_str(), b["short"].as_str())));
    let mut status = json!({
        "gateway": {
            "id": hex(&local.id),
            "short": local.id.to_string(),
            "generation": local.generation,
            "state": local.state.as_str(),
            "uptime_s": shared.started.elapsed().as_secs(),
            "routing": shared.routing.as_str(),
        },
        "models": crate::routing::models(&snapshot),
        "nodes": nodes,
    });
    if let Some(spin) = &shared.spin {
        status["spin"] = spin.status_json();
    }
    if let Some(overflow) = &shared.overflow {
        status["overflow"] = overflow.status_json();
    }
    status
}

/// The models a client may ask for: those some routable node serves, and the spinnable ones.
fn known_models(shared: &Shared, snapshot: &tela_runtime::status::RegistrySnapshot) -> Vec<String> {
    let mut names = crate::routing::models(snapshot);
    if let Some(spin) = &shared.spin {
        names.extend(spin.models().cloned());
        names.sort();
        names.dedup();
    }
    names
}

/// Sets the per-state node gauges from the latest snapshot (called at scrape time).
pub fn refresh_node_gauges(shared: &Shared) {
    let snapshot = shared.view.snapshot();
    for state in [Lifecycle::Join, Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left] {
        let n = snapshot.replica().slots().iter().filter(|s| s.record().state == state).count();
        shared.metrics.nodes.get_or_create(&StateLabel { state: state.as_str().to_string() }).set(n as i64);
    }
}

fn model_object(name: &str, created: u64) -> Value {
    json!({"id": name, "object": "model", "created": created, "owned_by": "tela"})
}

fn created() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `GET /v1/models`: every model some routable node serves, and every spinnable model (served
/// on demand).
pub fn models(shared: &Shared) -> Response<GatewayBody> {
    let snapshot = shared.view.snapshot();
    let now = created();
    let data: Vec<Value> = known_models(shared, &snapshot).iter().map(|m| model_object(m, now)).collect();
    shared.metrics.count("-", 200);
    json_response(&json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`.
pub fn model(shared: &Shared, id: &str) -> Response<GatewayBody> {
    let snapshot = shared.view.snapshot();
    let known = known_models(shared, &snapshot);
    if known.iter().any(|m| m == id) {
        json_response(&model_object(id, created()))
    } else {
        shared.answer_error(ApiError::unknown_model(id, &known), "unknown")
    }
}

/// A table for people from a `/status` document.
pub fn format_table(status: &Value) -> String {
    let g = &status["gateway"];
    let mut out = format!(
        "gateway {} generation {} {}, up {}s, routing {}; models: {}\n",
        g["short"].as_str().unwrap_or("?"),
        g["generation"],
        g["state"].as_str().unwrap_or("?"),
        g["uptime_s"],
        g["routing"].as_str().unwrap_or("?"),
        status["models"].as_array().map_or(String::new(), |m| m
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(", "))
    );
    out.push_str(&format!(
        "{:<9} {:<8} {:<6} {:<9} {:<6} {:>9}  {:<16} {:<14} models\n",
        "node", "role", "state", "routable", "tunnel", "in-flight", "gpus", "generation"
    ));
    for n in status["nodes"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let models: Vec<&str> =
            n["models"].as_array().map(|m| m.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let routable = match tela_runtime::status::routable_label(n) {
            "yes" if n["handing_over"] == true => "leaving",
            label => label,
        };
        let gpus = match n["gpus"]["count"].as_u64() {
            Some(0) | None => "-".to_string(),
            Some(c) => format!("{}x {}", c, n["gpus"]["model"].as_str().unwrap_or("?")),
        };
        out.push_str(&format!(
            "{:<9} {:<8} {:<6} {:<9} {:<6} {:>9}  {:<16} {:<14} {}\n",
            n["short"].as_str().unwrap_or("?"),
            n["role"].as_str().unwrap_or("?"),
            n["state"].as_str().unwrap_or("?"),
            routable,
            if n["self"] == true {
                "-"
            } else if n["silent"] == true {
                "silent"
            } else if n["tunnel"] == true {
                "yes"
            } else {
                "no"
            },
            n["in_flight"].to_string(),
            gpus,
            n["generation"].to_string(),
            models.join(",")
        ));
    }
    for p in status["overflow"].as_array().map(Vec::as_slice).unwrap_or_default() {
        out.push_str(&format!(
            "overflow {} {}: {} requests, {} failed, {} in flight; models {}\n",
            p["name"].as_str().unwrap_or("?"),
            p["base_url"].as_str().unwrap_or("?"),
            p["requests"],
            p["failed"],
            p["in_flight"],
            p["models"].as_array().map_or(String::new(), |m| m
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","))
        ));
    }
    out
}

/// `tela status --gateway URL`: fetches `/status` over HTTP or HTTPS and returns the document.
/// HTTPS trusts the system's certificate store, plus `ca_cert` (PEM) when given.
pub async fn fetch_status(
    url: &str,
    api_key: Option<&str>,
    ca_cert: Option<&std::path::Path>,
    timeout: Duration,
) -> anyhow::Result<Value> {
    use anyhow::Context as _;
    use http_body_util::BodyExt;
    let base = url.trim_end_matches('/');
    let uri: http::Uri = format!("{base}/status").parse().with_context(|| format!("'{url}' is not a URL"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => anyhow::bail!("'{url}' is not an http:// or https:// URL"),
    };
    let host = uri.host().context("the gateway URL has no host")?.to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let run = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .with_context(|| format!("cannot connect to {host}:{port}"))?;
        let mut req = http::Request::get(uri.path()).header("host", format!("{host}:{port}"));
        if let Some(key) = api_key {
            req = req.header("authorization", format!("Bearer {key}"));
        }
        let req = req.body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let response = if https {
            let tls = crate::client_tls::connector(ca_cert)?;
            let name = rustls_pki_types::ServerName::try_from(host.clone())
                .with_context(|| format!("'{host}' is not a valid TLS server name"))?;
            let stream = tls.connect(name, tcp).await.with_context(|| format!("TLS handshake with {host}:{port}"))?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
            let _driver = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(conn));
            let response = sender.send_request(req).await?;
            let status = response.status();
            (status, response.into_body().collect().await?.to_bytes())
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
            let _driver = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(conn));
            let response = sender.send_request(req).await?;
            let status = response.status();
            (status, response.into_body().collect().await?.to_bytes())
        };
        let (status, body) = response;
        let value: Value = serde_json::from_slice(&body)
            .with_context(|| format!("the gateway answered {status} with a body that is not JSON"))?;
        if !status.is_success() {
            let message = value["error"]["message"].as_str().unwrap_or("no message");
            anyhow::bail!("the gateway answered {status}: {message} (pass --api-key or TELA_API_KEY)");
        }
        Ok(value)
    };
    tokio::time::timeout(timeout, run).await.map_err(|_| anyhow::anyhow!("no answer from {url} within {timeout:?}"))?
}
