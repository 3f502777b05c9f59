//! Batch inference: OpenAI's Batch API, run on the federation's spare capacity, kept in the
//! gateway's database so that a restart loses nothing.
//!
//! A client uploads a JSONL file of requests (`POST /v1/files`, purpose `batch`), creates a
//! batch over it (`POST /v1/batches`), polls it (`GET /v1/batches/{id}`) and downloads the
//! output and error files (`GET /v1/files/{id}/content`) — the calls, objects and statuses of
//! OpenAI's Batch API, so the official SDKs' `files.create`, `batches.create`, `retrieve` and
//! `files.content` work unchanged. Requests inside a batch may go to `/v1/chat/completions`,
//! `/v1/completions` and `/v1/embeddings`.
//!
//! - [`api`]: the HTTP endpoints, each key seeing only its own files and batches (404 for
//!   another key's).
//! - [`input`]: the checks of an input file, line by line.
//! - [`store`]: the tables, in the same SQLite file as the usage ledger, and the
//!   exactly-once rule (a request is done only once its result row is written).
//! - [`runner`]: the one task that moves batches through their statuses and sends their
//!   requests, at low priority ([`runner`]'s docs say how a node's room is judged).
//! - [`dispatch`]: one request through one node's tunnel, with the whole answer read.
//! - [`multipart`]: the upload's form.
//!
//! # One gateway per batch
//!
//! A batch lives on the gateway it was submitted to: its state is in that gateway's database,
//! and only that gateway runs it and answers for it (another gateway of the same federation
//! answers 404). Its requests still go to every node of the federation that serves their model
//! and has a tunnel to that gateway. A gateway that restarts with the same database resumes its
//! batches where they were.

pub mod api;
pub mod dispatch;
pub mod input;
pub mod multipart;
pub mod runner;
pub mod store;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;

/// Batch inference's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// The database (the usage ledger's file).
    pub path: PathBuf,
    /// The largest file a client may upload (413 above).
    pub max_file_bytes: usize,
    /// The most requests in one batch (the batch fails at validation above).
    pub max_requests: usize,
    /// How long uploaded and produced files are kept; `None` keeps them until deleted.
    pub file_expiry: Option<Duration>,
    /// Request slots per node for batch work: a node with `n` interactive requests in flight
    /// takes at most `node_slots - n` batch requests (see [`runner`]).
    pub node_slots: u32,
    /// The longest an upload's body may take to arrive.
    pub upload_timeout: Duration,
}

impl BatchConfig {
    /// The defaults, with the database at `path`: files up to 100 MiB and 50,000 requests,
    /// kept 30 days; 4 slots per node; uploads within 10 minutes.
    pub fn new(path: PathBuf) -> BatchConfig {
        BatchConfig {
            path,
            max_file_bytes: 100 * 1024 * 1024,
            max_requests: 50_000,
            file_expiry: Some(Duration::from_secs(30 * 86_400)),
            node_slots: 4,
            upload_timeout: Duration::from_secs(600),
        }
    }
}

/// What the endpoints and the runner share: the settings, the database connection and the
/// runner's wake-up.
pub struct BatchShared {
    /// The settings.
    pub config: BatchConfig,
    db: Arc<Mutex<Connection>>,
    /// Wakes the runner (a batch was created or cancelled).
    pub wake: tokio::sync::Notify,
}

impl std::fmt::Debug for BatchShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchShared").field("config", &self.config).finish_non_exhaustive()
    }
}

impl BatchShared {
    /// Opens the database (applying its migrations).
    pub fn open(config: BatchConfig) -> Result<BatchShared, crate::db::DbError> {
        let conn = crate::db::open(&config.path)?;
        Ok(BatchShared { config, db: Arc::new(Mutex::new(conn)), wake: tokio::sync::Notify::new() })
    }

    /// Opens the database for a starting gateway, off the async threads, trying a few times
    /// (another connection may be creating the file); `None`, with the reason logged, if it
    /// cannot: the gateway then serves without batches.
    pub async fn open_for_gateway(config: BatchConfig) -> Option<Arc<BatchShared>> {
        let path = config.path.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let mut tries = 0;
            loop {
                match BatchShared::open(config.clone()) {
                    Ok(b) => return Ok(b),
                    Err(e) if tries >= 4 => return Err(e),
                    Err(_) => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(100 * tries));
                    }
                }
            }
        })
        .await;
        match opened {
            Ok(Ok(b)) => {
                tracing::info!("batch inference: files, batches and results in {}", path.display());
                Some(Arc::new(b))
            }
            Ok(Err(e)) => {
                tracing::error!("batch inference is off: {e}");
                None
            }
            Err(e) => {
                tracing::error!("batch inference is off: opening its database failed: {e}");
                None
            }
        }
    }

    /// Runs `f` on the connection, off the async threads.
    pub async fn db<T, F>(&self, f: F) -> rusqlite::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = db.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn)
        })
        .await
        .unwrap_or_else(|e| Err(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))
    }

    /// When files made now expire, Unix seconds.
    pub fn file_expiry_from(&self, now: i64) -> Option<i64> {
        self.config.file_expiry.map(|d| now.saturating_add(i64::try_from(d.as_secs()).unwrap_or(i64::MAX)))
    }
}

/// A fresh id: `prefix` and 24 random hex digits (`file-…`, `batch_…`, `batch_req_…`).
pub fn new_id(prefix: &str) -> String {
    let n: u128 = rand::random();
    format!("{prefix}{:024x}", n >> 32)
}

/// Now, Unix seconds.
pub fn now_s() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
