//! The Batch API's endpoints, in OpenAI's shapes:
//!
//! | path | what |
//! |---|---|
//! | `POST /v1/files` | upload a JSONL file (multipart form, `purpose=batch`); 413 above the size cap |
//! | `GET /v1/files` | the key's files |
//! | `GET /v1/files/{id}`, `DELETE /v1/files/{id}` | one file's description; delete it |
//! | `GET /v1/files/{id}/content` | its content (input, output or error file) |
//! | `POST /v1/batches` | create a batch: `input_file_id`, `endpoint`, `completion_window` (e.g. `24h`), `metadata` |
//! | `GET /v1/batches` | the key's batches, newest first (`limit` 1–100, default 20; `after`) |
//! | `GET /v1/batches/{id}` | one batch with its `request_counts` |
//! | `POST /v1/batches/{id}/cancel` | cancel it: `cancelling`, then `cancelled` once its requests in flight are over |
//!
//! Files and batches belong to the key that made them (its SHA-256; on a gateway without keys,
//! to everyone): another key gets the same 404 as for an id that does not exist. Every error is
//! OpenAI's error object ([`ApiError`]).

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::store::{self, BatchRow, FileMeta, Status};
use super::{new_id, now_s, BatchShared};
use crate::api_error::ApiError;
use crate::auth::Caller;
use crate::body::GatewayBody;
use crate::service::Shared;

/// The endpoints a batch's requests may go to.
pub const ENDPOINTS: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// Whether `path` is one of the Batch API's.
pub fn serves(path: &str) -> bool {
    matches!(path, "/v1/files" | "/v1/batches") || path.starts_with("/v1/files/") || path.starts_with("/v1/batches/")
}

fn not_found(what: &str, id: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        code: "not_found",
        message: format!("no such {what}: '{id}' (or it belongs to another key, or was made on another gateway)"),
        param: Some("id"),
        retry_after: None,
    }
}

fn database(e: rusqlite::Error) -> ApiError {
    ApiError::internal(format!("the gateway's batch database failed: {e}; retry, or ask the operator"))
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<GatewayBody> {
    let mut response = Response::new(GatewayBody::full(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Who owns what the caller makes and may see: the SHA-256 line of the key it presented, or
/// the empty string on a gateway without keys.
fn owner(caller: &Caller, headers: &HeaderMap) -> String {
    if caller.entry().is_none() {
        return String::new();
    }
    let presented = match (headers.get("authorization"), headers.get("api-key")) {
        (Some(h), _) => h
            .to_str()
            .ok()
            .and_then(|h| h.trim().split_once(' '))
            .map(|(_, key)| key.trim().to_string())
            .unwrap_or_default(),
        (None, Some(k)) => String::from_utf8_lossy(k.as_bytes()).trim().to_string(),
        (None, None) => String::new(),
    };
    crate::auth::key_line(&presented)
}

/// Serves one Batch API request from `caller` (already authenticated).
pub async fn handle(shared: &Shared, request: Request<Incoming>, caller: &Caller) -> Response<GatewayBody> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let Some(batch) = shared.batch.clone() else {
        let error = ApiError {
            status: StatusCode::NOT_FOUND,
            ..ApiError::bad_request(
                "batch_disabled",
                "this gateway runs no batches: it keeps no database (it was started with --no-ledger or --no-batch, \
                 or its database could not be opened; see its log)",
            )
        };
        return shared.answer_error(error, "-");
    };
    let owner = owner(caller, request.headers());
    let query = request.uri().query().unwrap_or("").to_string();
    let segments: Vec<String> = path.trim_start_matches("/v1/").split('/').map(str::to_string).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let result = match (segments.as_slice(), &method) {
        (["files"], &Method::POST) => upload(&batch, request, owner).await,
        (["files"], &Method::GET) => list_files(&batch, owner).await,
        (["files", id], &Method::GET) => file(&batch, owner, id).await,
        (["files", id], &Method::DELETE) => delete_file(&batch, owner, id).await,
        (["files", id, "content"], &Method::GET) => content(&batch, owner, id).await,
        (["batches"], &Method::POST) => create(shared, &batch, request, caller, owner).await,
        (["batches"], &Method::GET) => list(&batch, owner, &query).await,
        (["batches", id], &Method::GET) => retrieve(&batch, owner, id).await,
        (["batches", id, "cancel"], &Method::POST) => cancel(&batch, owner, id).await,
        (["files"] | ["batches"], m) => Err(ApiError::method_not_allowed(m, &path, "GET or POST")),
        (["files", _], m) => Err(ApiError::method_not_allowed(m, &path, "GET or DELETE")),
        (["files", _, "content"] | ["batches", _], m) => Err(ApiError::method_not_allowed(m, &path, "GET")),
        (["batches", _, "cancel"], m) => Err(ApiError::method_not_allowed(m, &path, "POST")),
        (_, m) => Err(ApiError::no_such_path(m, &path)),
    };
    match result {
        Ok(response) => {
            shared.metrics.count("-", response.status().as_u16());
            response
        }
        Err(e) => shared.answer_error(e, "-"),
    }
}

async fn read_all(body: Incoming, max: usize, timeout: std::time::Duration) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(timeout, Limited::new(body, max).collect()).await {
        Err(_) => Err(ApiError::body_timeout(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(ApiError::too_large(max)),
        Ok(Err(e)) => {
            Err(ApiError::bad_request("body_read_failed", format!("the request body could not be read: {e}")))
        }
    }
}

/// Room for the form's framing around a file of the largest size.
const FORM_OVERHEAD: usize = 64 * 1024;

async fn upload(
    batch: &BatchShared,
    request: Request<Incoming>,
    owner: String,
) -> Result<Response<GatewayBody>, ApiError> {
    let max = batch.config.max_file_bytes;
    let content_type = request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let boundary =
        super::multipart::boundary(&content_type).map_err(|e| ApiError::bad_request("invalid_form", e.to_string()))?;
    let declared =
        request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let too_large = || ApiError {
        param: Some("file"),
        message: format!("the file exceeds this gateway's limit of {max} bytes for batch input files; split it"),
        ..ApiError::too_large(max)
    };
    if declared.is_some_and(|n| n > (max + FORM_OVERHEAD) as u64) {
        return Err(too_large());
    }
    let body = read_all(request.into_body(), max + FORM_OVERHEAD, batch.config.upload_timeout).await.map_err(|e| {
        if e.status == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            e
        }
    })?;
    let parts =
        super::multipart::parse(&body, &boundary).map_err(|e| ApiError::bad_request("invalid_form", e.to_string()))?;
    let purpose =
        parts.iter().find(|p| p.name == "purpose").map(|p| String::from_utf8_lossy(p.data).trim().to_string());
    match purpose.as_deref() {
        Some("batch") => {}
        Some(other) => {
            return Err(ApiError::bad_param(
                "purpose",
                format!("this gateway keeps files only for purpose 'batch', not '{other}'"),
            ))
        }
        None => return Err(ApiError::bad_param("purpose", "the form has no 'purpose'; send purpose=batch")),
    }
    let file = parts
        .iter()
        .find(|p| p.name == "file")
        .ok_or_else(|| ApiError::bad_param("file", "the form has no 'file' part with the JSONL content"))?;
    if file.data.len() > max {
        return Err(too_large());
    }
    let start = file.data.as_ptr() as usize - body.as_ptr() as usize;
    let content = body.slice(start..start + file.data.len());
    let now = now_s();
    let meta = FileMeta {
        id: new_id("file-"),
        owner,
        purpose: "batch".into(),
        filename: file.filename.clone().unwrap_or_else(|| "upload.jsonl".into()),
        bytes: i64::try_from(content.len()).unwrap_or(i64::MAX),
        created_at: now,
        expires_at: batch.file_expiry_from(now),
    };
    let answer = meta.json();
    batch.db(move |c| store::insert_file(c, &meta, &content)).await.map_err(database)?;
    Ok(json(StatusCode::OK, &answer))
}

async fn list_files(batch: &BatchShared, owner: String) -> Result<Response<GatewayBody>, ApiError> {
    let files = batch.db(move |c| store::files(c, &owner, now_s())).await.map_err(database)?;
    let data: Vec<serde_json::Value> = files.iter().map(FileMeta::json).collect();
    Ok(json(StatusCode::OK, &serde_json::json!({"object": "list", "data": data, "has_more": false})))
}

async fn file(batch: &BatchShared, owner: String, id: &str) -> Result<Response<GatewayBody>, ApiError> {
    let key = id.to_string();
    let meta = batch.db(move |c| store::file(c, &owner, &key, now_s())).await.map_err(database)?;
    let meta = meta.ok_or_else(|| not_found("file", id))?;
    Ok(json(StatusCode::OK, &meta.json()))
}

async fn delete_file(batch: &BatchShared, owner: String, id: &str) -> Result<Response<GatewayBody>, ApiError> {
    let key = id.to_string();
    let deleted = batch.db(move |c| store::delete_file(c, &owner, &key)).await.map_err(database)?;
    if !deleted {
        return Err(not_found("file", id));
    }
    Ok(json(StatusCode::OK, &serde_json::json!({"id": id, "object": "file", "deleted": true})))
}

async fn content(batch: &BatchShared, owner: String, id: &str) -> Result<Response<GatewayBody>, ApiError> {
    let key = id.to_string();
    let content = batch.db(move |c| store::file_content(c, &owner, &key, now_s())).await.map_err(database)?;
    let content = content.ok_or_else(|| not_found("file", id))?;
    let mut response = Response::new(GatewayBody::full(content));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    Ok(response)
}

/// The body of `POST /v1/batches`.
#[derive(serde::Deserialize)]
struct Create {
    input_file_id: Option<String>,
    endpoint: Option<String>,
    completion_window: Option<String>,
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The longest completion window a batch may ask for.
const MAX_WINDOW: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);

async fn create(
    shared: &Shared,
    batch: &BatchShared,
    request: Request<Incoming>,
    caller: &Caller,
    owner: String,
) -> Result<Response<GatewayBody>, ApiError> {
    let key_hash = crate::ledger::key_hash(
        request.headers().get("authorization").map(|h| h.as_bytes()),
        request.headers().get("api-key").map(|h| h.as_bytes()),
    );
    let body = read_all(request.into_body(), shared.limits.max_body_bytes, shared.limits.body_timeout).await?;
    let asked: Create = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("the request body is not valid JSON: {e}")))?;
    let input_file_id = asked
        .input_file_id
        .ok_or_else(|| ApiError::bad_param("input_file_id", "give the 'input_file_id' of an uploaded file"))?;
    let endpoint = asked.endpoint.unwrap_or_default();
    if !ENDPOINTS.contains(&endpoint.as_str()) {
        return Err(ApiError::bad_param(
            "endpoint",
            format!("'{endpoint}' is not an endpoint batches run on: use one of {}", ENDPOINTS.join(", ")),
        ));
    }
    let window_text = asked.completion_window.unwrap_or_else(|| "24h".into());
    let window =
        humantime::parse_duration(&window_text).ok().filter(|w| !w.is_zero() && *w <= MAX_WINDOW).ok_or_else(|| {
            ApiError::bad_param(
                "completion_window",
                format!("'{window_text}' is not a completion window of up to 7 days, such as 24h"),
            )
        })?;
    let (file_owner, file_id) = (owner.clone(), input_file_id.clone());
    let found = batch
        .db(move |c| {
            let meta = store::file(c, &file_owner, &file_id, now_s())?;
            let content = match &meta {
                Some(_) => store::file_content(c, &file_owner, &file_id, now_s())?,
                None => None,
            };
            Ok(meta.zip(content))
        })
        .await
        .map_err(database)?;
    let Some((meta, content)) = found else {
        return Err(ApiError { param: Some("input_file_id"), ..not_found("file", &input_file_id) });
    };
    if meta.purpose != "batch" {
        return Err(ApiError::bad_param(
            "input_file_id",
            format!("file '{input_file_id}' has purpose '{}', not 'batch'", meta.purpose),
        ));
    }
    // Models: those the key may use that some node serves or the gateway may spin up now.
    let scope = caller.models().clone();
    let served = crate::routing::models(&shared.view.snapshot());
    let spin = shared.spin.clone();
    let model_ok = move |m: &str| {
        scope.allows(m) && (served.iter().any(|s| s == m) || spin.as_ref().is_some_and(|s| s.is_spinnable(m)))
    };
    let max_requests = batch.config.max_requests;
    let ep = endpoint.clone();
    let checked = tokio::task::spawn_blocking(move || super::input::check(&content, &ep, max_requests, model_ok))
        .await
        .map_err(|e| ApiError::internal(format!("checking the input file failed: {e}")))?;
    let (lines, errors) = match checked {
        Ok(lines) => (lines, None),
        Err(refusal) => (Vec::new(), Some(refusal.to_string())),
    };
    let now = now_s();
    let entry = caller.entry();
    let row = BatchRow {
        id: new_id("batch_"),
        owner,
        key_name: entry.map(|e| e.name.clone()),
        key_hash,
        account: entry.and_then(|e| e.account.clone()),
        endpoint,
        input_file_id,
        completion_window: window_text,
        status: Status::Validating.as_str().into(),
        errors,
        metadata: asked.metadata.map(|m| serde_json::Value::Object(m).to_string()),
        created_at: now,
        expires_at: now.saturating_add(i64::try_from(window.as_secs()).unwrap_or(i64::MAX)),
        ..BatchRow::default()
    };
    let mut stored = row.clone();
    let total = i64::try_from(lines.len()).unwrap_or(i64::MAX);
    let refused =
        i64::try_from(lines.iter().filter(|l| matches!(l.work, store::Work::Refused(_))).count()).unwrap_or(0);
    stored.seq = batch.db(move |c| store::insert_batch(c, &row, &lines)).await.map_err(database)?;
    batch.wake.notify_one();
    tracing::info!("batch {} created: {total} request(s) to {}", stored.id, stored.endpoint);
    let counts = store::Counts { total, completed: 0, failed: refused };
    Ok(json(StatusCode::OK, &stored.json(counts)))
}

async fn with_counts(batch: &BatchShared, owner: String, id: &str) -> Result<(BatchRow, store::Counts), ApiError> {
    let key = id.to_string();
    let found = batch
        .db(move |c| {
            let Some(b) = store::batch(c, &owner, &key)? else { return Ok(None) };
            let counts = store::counts(c, b.seq)?;
            Ok(Some((b, counts)))
        })
        .await
        .map_err(database)?;
    found.ok_or_else(|| not_found("batch", id))
}

async fn retrieve(batch: &BatchShared, owner: String, id: &str) -> Result<Response<GatewayBody>, ApiError> {
    let (b, counts) = with_counts(batch, owner, id).await?;
    Ok(json(StatusCode::OK, &b.json(counts)))
}

async fn list(batch: &BatchShared, owner: String, query: &str) -> Result<Response<GatewayBody>, ApiError> {
    let mut limit = 20usize;
    let mut after: Option<String> = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "limit" => {
                limit = v.parse().ok().filter(|n| (1..=100).contains(n)).ok_or_else(|| {
                    ApiError::bad_param("limit", format!("limit '{v}' must be a number from 1 to 100"))
                })?;
            }
            "after" => after = Some(v.to_string()).filter(|a| !a.is_empty()),
            _ => {}
        }
    }
    let (rows, more) = batch
        .db(move |c| {
            let (rows, more) = store::batches(c, &owner, limit, after.as_deref())?;
            let with: Vec<(BatchRow, store::Counts)> =
                rows.into_iter().map(|b| store::counts(c, b.seq).map(|n| (b, n))).collect::<Result<_, _>>()?;
            Ok((with, more))
        })
        .await
        .map_err(database)?;
    let data: Vec<serde_json::Value> = rows.iter().map(|(b, n)| b.json(*n)).collect();
    let first = rows.first().map(|(b, _)| b.id.clone());
    let last = rows.last().map(|(b, _)| b.id.clone());
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more}),
    ))
}

async fn cancel(batch: &BatchShared, owner: String, id: &str) -> Result<Response<GatewayBody>, ApiError> {
    let (b, _) = with_counts(batch, owner.clone(), id).await?;
    match b.status() {
        Status::Validating | Status::InProgress => {
            let seq = b.seq;
            batch
                .db(move |c| {
                    store::set_status(c, seq, &[Status::Validating, Status::InProgress], Status::Cancelling, now_s())
                })
                .await
                .map_err(database)?;
            batch.wake.notify_one();
        }
        Status::Cancelling | Status::Cancelled => {}
        done => {
            return Err(ApiError::bad_request(
                "batch_not_cancellable",
                format!("batch '{id}' is {} and can no longer be cancelled", done.as_str()),
            ))
        }
    }
    let (b, counts) = with_counts(batch, owner, id).await?;
    Ok(json(StatusCode::OK, &b.json(counts)))
}
