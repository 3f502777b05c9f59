//! Batch inference's tables in the gateway's database ([`crate::db`], migration 2): uploaded
//! files, batches, and one row per request line with its result. Everything here is a plain
//! synchronous function over a [`Connection`]; callers run them off the async threads.
//!
//! # Tables
//!
//! | table | what |
//! |---|---|
//! | `batch_files` | an uploaded or produced file: `id` (`file-…`), `owner` (the SHA-256 of the key that uploaded it, empty on a gateway without keys), `purpose` (`batch`, `batch_output`), `filename`, `bytes`, `created_at`, `expires_at` (Unix seconds) and the `content` itself |
//! | `batches` | a batch: `seq` (its order, for listing), `id` (`batch_…`), `owner`, the key's `key_name`, `key_hash` (12 hex digits, as in the ledger) and `account`, `endpoint`, `input_file_id`, `completion_window`, `status`, `output_file_id`, `error_file_id`, `errors` (JSON, when validation refused the whole batch), `metadata` (JSON), and the time of each status (Unix seconds) |
//! | `batch_requests` | one line of a batch's input: its `line` number, `custom_id`, `model`, the request `body` sent to a node, its `state` — `pending`, `ok` (a 2xx answer: the output file) or `error` (any other answer or a line that could not be sent: the error file) — and `result`, its line of that file (until the batch ends and the files are written) |
//!
//! The usage ledger's `requests` gains `batch_id`: the batch a row's request belonged to, NULL
//! for interactive requests.
//!
//! # Exactly once
//!
//! A line is done only when its `state` leaves `pending`, and that update, the line's ledger
//! row and nothing else share one transaction ([`finish_line`]); the update applies only to a
//! line still pending. A gateway killed while requests are in flight restarts with those lines
//! still pending and sends them again; a line whose result was written is never sent again. The
//! output and error files are built from the finished lines, one line each, in input order.

use rusqlite::{params, Connection, OptionalExtension};

/// Migration 2 of [`crate::db::MIGRATIONS`]. Never edit it once released: add a migration.
pub const MIGRATION: &str = "CREATE TABLE batch_files (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        purpose TEXT NOT NULL,
        filename TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        content BLOB NOT NULL
    );
    CREATE INDEX batch_files_by_owner ON batch_files(owner, created_at);
    CREATE TABLE batches (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        owner TEXT NOT NULL,
        key_name TEXT,
        key_hash TEXT,
        account TEXT,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        output_file_id TEXT,
        error_file_id TEXT,
        errors TEXT,
        metadata TEXT,
        created_at INTEGER NOT NULL,
        in_progress_at INTEGER,
        finalizing_at INTEGER,
        completed_at INTEGER,
        failed_at INTEGER,
        expires_at INTEGER NOT NULL,
        expired_at INTEGER,
        cancelling_at INTEGER,
        cancelled_at INTEGER
    );
    CREATE INDEX batches_by_owner ON batches(owner, seq);
    CREATE INDEX batches_by_status ON batches(status);
    CREATE TABLE batch_requests (
        batch_seq INTEGER NOT NULL REFERENCES batches(seq) ON DELETE CASCADE,
        line INTEGER NOT NULL,
        custom_id TEXT,
        model TEXT,
        body BLOB,
        state TEXT NOT NULL,
        result TEXT,
        PRIMARY KEY (batch_seq, line)
    ) WITHOUT ROWID;
    CREATE INDEX batch_requests_by_state ON batch_requests(batch_seq, state);
    ALTER TABLE requests ADD COLUMN batch_id TEXT;";

/// A batch's status, as OpenAI names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Accepted; its lines are being checked.
    Validating,
    /// Refused as a whole at validation (`errors` says why).
    Failed,
    /// Its requests are being sent.
    InProgress,
    /// Every request has ended; the files are being written.
    Finalizing,
    /// Done: the output and error files are ready.
    Completed,
    /// Its completion window passed first: what was done is in the files.
    Expired,
    /// Cancelled by its owner; requests in flight are finishing.
    Cancelling,
    /// Cancelled: what was done is in the files.
    Cancelled,
}

impl Status {
    /// OpenAI's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Validating => "validating",
            Status::Failed => "failed",
            Status::InProgress => "in_progress",
            Status::Finalizing => "finalizing",
            Status::Completed => "completed",
            Status::Expired => "expired",
            Status::Cancelling => "cancelling",
            Status::Cancelled => "cancelled",
        }
    }

    /// The status named `s`.
    pub fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "validating" => Status::Validating,
            "failed" => Status::Failed,
            "in_progress" => Status::InProgress,
            "finalizing" => Status::Finalizing,
            "completed" => Status::Completed,
            "expired" => Status::Expired,
            "cancelling" => Status::Cancelling,
            "cancelled" => Status::Cancelled,
            _ => return None,
        })
    }

    /// Whether the batch has ended for good.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Failed | Status::Completed | Status::Expired | Status::Cancelled)
    }
}

/// A file's description (without its content).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// `file-…`.
    pub id: String,
    /// Who may see it.
    pub owner: String,
    /// `batch` or `batch_output`.
    pub purpose: String,
    /// The name it was uploaded with.
    pub filename: String,
    /// Its size.
    pub bytes: i64,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds, when it is deleted.
    pub expires_at: Option<i64>,
}

impl FileMeta {
    /// OpenAI's file object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
        })
    }
}

/// Stores a file.
pub fn insert_file(conn: &Connection, meta: &FileMeta, content: &[u8]) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO batch_files (id, owner, purpose, filename, bytes, created_at, expires_at, content)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            meta.id,
            meta.owner,
            meta.purpose,
            meta.filename,
            meta.bytes,
            meta.created_at,
            meta.expires_at,
            content
        ],
    )?;
    Ok(())
}

const FILE_COLUMNS: &str = "id, owner, purpose, filename, bytes, created_at, expires_at";

fn file_meta(r: &rusqlite::Row<'_>) -> rusqlite::Result<FileMeta> {
    Ok(FileMeta {
        id: r.get(0)?,
        owner: r.get(1)?,
        purpose: r.get(2)?,
        filename: r.get(3)?,
        bytes: r.get(4)?,
        created_at: r.get(5)?,
        expires_at: r.get(6)?,
    })
}

/// `owner`'s file `id`, unless it expired before `now`.
pub fn file(conn: &Connection, owner: &str, id: &str, now: i64) -> rusqlite::Result<Option<FileMeta>> {
    conn.query_row(
        &format!(
            "SELECT {FILE_COLUMNS} FROM batch_files WHERE id = ?1 AND owner = ?2 AND (expires_at IS NULL OR expires_at > ?3)"
        ),
        params![id, owner, now],
        file_meta,
    )
    .optional()
}

/// The content of `owner`'s file `id`, unless it expired before `now`.
pub fn file_content(conn: &Connection, owner: &str, id: &str, now: i64) -> rusqlite::Result<Option<Vec<u8>>> {
    conn.query_row(
        "SELECT content FROM batch_files WHERE id = ?1 AND owner = ?2 AND (expires_at IS NULL OR expires_at > ?3)",
        params![id, owner, now],
        |r| r.get(0),
    )
    .optional()
}

/// `owner`'s files, newest first.
pub fn files(conn: &Connection, owner: &str, now: i64) -> rusqlite::Result<Vec<FileMeta>> {
    let mut statement = conn.prepare(&format!(
        "SELECT {FILE_COLUMNS} FROM batch_files WHERE owner = ?1 AND (expires_at IS NULL OR expires_at > ?2)
         ORDER BY created_at DESC, rowid DESC LIMIT 10000"
    ))?;
    let rows = statement.query_map(params![owner, now], file_meta)?;
    rows.collect()
}

/// Deletes `owner`'s file `id`; whether there was one.
pub fn delete_file(conn: &Connection, owner: &str, id: &str) -> rusqlite::Result<bool> {
    Ok(conn.execute("DELETE FROM batch_files WHERE id = ?1 AND owner = ?2", params![id, owner])? > 0)
}

/// Deletes the files that expired before `now`; gives how many.
pub fn delete_expired_files(conn: &Connection, now: i64) -> rusqlite::Result<usize> {
    conn.execute("DELETE FROM batch_files WHERE expires_at IS NOT NULL AND expires_at <= ?1", [now])
}

/// A batch as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchRow {
    /// Its order of creation.
    pub seq: i64,
    /// `batch_…`.
    pub id: String,
    /// Who may see it.
    pub owner: String,
    /// The key's name, for the ledger.
    pub key_name: Option<String>,
    /// The key's hash prefix, for the ledger.
    pub key_hash: Option<String>,
    /// The account charged, for the ledger.
    pub account: Option<String>,
    /// `/v1/chat/completions`, `/v1/completions` or `/v1/embeddings`.
    pub endpoint: String,
    /// The input file.
    pub input_file_id: String,
    /// As given, e.g. `24h`.
    pub completion_window: String,
    /// OpenAI's status name.
    pub status: String,
    /// The output file, once written.
    pub output_file_id: Option<String>,
    /// The error file, once written (none when nothing failed).
    pub error_file_id: Option<String>,
    /// Validation's errors, as OpenAI's `errors.data` JSON.
    pub errors: Option<String>,
    /// The client's metadata, JSON.
    pub metadata: Option<String>,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds.
    pub in_progress_at: Option<i64>,
    /// Unix seconds.
    pub finalizing_at: Option<i64>,
    /// Unix seconds.
    pub completed_at: Option<i64>,
    /// Unix seconds.
    pub failed_at: Option<i64>,
    /// Unix seconds: the end of its completion window.
    pub expires_at: i64,
    /// Unix seconds.
    pub expired_at: Option<i64>,
    /// Unix seconds.
    pub cancelling_at: Option<i64>,
    /// Unix seconds.
    pub cancelled_at: Option<i64>,
}

impl BatchRow {
    /// Its status (a name this build does not know reads as failed).
    pub fn status(&self) -> Status {
        Status::parse(&self.status).unwrap_or(Status::Failed)
    }

    /// OpenAI's batch object, with `counts`.
    pub fn json(&self, counts: Counts) -> serde_json::Value {
        let errors = self.errors.as_deref().and_then(|e| serde_json::from_str::<serde_json::Value>(e).ok());
        let metadata = self.metadata.as_deref().and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok());
        serde_json::json!({
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": errors.map(|data| serde_json::json!({"object": "list", "data": data})),
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": counts.total, "completed": counts.completed, "failed": counts.failed},
            "metadata": metadata,
        })
    }
}

const BATCH_COLUMNS: &str = "seq, id, owner, key_name, key_hash, account, endpoint, input_file_id, completion_window,
    status, output_file_id, error_file_id, errors, metadata, created_at, in_progress_at, finalizing_at, completed_at,
    failed_at, expires_at, expired_at, cancelling_at, cancelled_at";

fn batch_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<BatchRow> {
    Ok(BatchRow {
        seq: r.get(0)?,
        id: r.get(1)?,
        owner: r.get(2)?,
        key_name: r.get(3)?,
        key_hash: r.get(4)?,
        account: r.get(5)?,
        endpoint: r.get(6)?,
        input_file_id: r.get(7)?,
        completion_window: r.get(8)?,
        status: r.get(9)?,
        output_file_id: r.get(10)?,
        error_file_id: r.get(11)?,
        errors: r.get(12)?,
        metadata: r.get(13)?,
        created_at: r.get(14)?,
        in_progress_at: r.get(15)?,
        finalizing_at: r.get(16)?,
        completed_at: r.get(17)?,
        failed_at: r.get(18)?,
        expires_at: r.get(19)?,
        expired_at: r.get(20)?,
        cancelling_at: r.get(21)?,
        cancelled_at: r.get(22)?,
    })
}

/// A batch's `request_counts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Lines.
    pub total: i64,
    /// Lines answered with a 2xx.
    pub completed: i64,
    /// Lines in the error file.
    pub failed: i64,
}

/// The counts of batch `seq`.
pub fn counts(conn: &Connection, seq: i64) -> rusqlite::Result<Counts> {
    conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(state = 'ok'), 0), COALESCE(SUM(state = 'error'), 0)
         FROM batch_requests WHERE batch_seq = ?1",
        [seq],
        |r| Ok(Counts { total: r.get(0)?, completed: r.get(1)?, failed: r.get(2)? }),
    )
}

/// One line of an input file, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// Its number in the file, from 1.
    pub line: i64,
    /// Its `custom_id`, if it had one.
    pub custom_id: Option<String>,
    /// Its model, if it had one.
    pub model: Option<String>,
    /// What to send (a request still to run), or its error file line (a line refused).
    pub work: Work,
}

/// What a line becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// A request body to send.
    Send(Vec<u8>),
    /// Refused at validation: its line of the error file.
    Refused(String),
}

/// Stores a new batch with its checked lines (or, when `errors` is set, none: it fails at
/// validation), in one transaction; gives its `seq`.
pub fn insert_batch(conn: &mut Connection, batch: &BatchRow, lines: &[Line]) -> rusqlite::Result<i64> {
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO batches (id, owner, key_name, key_hash, account, endpoint, input_file_id, completion_window,
             status, errors, metadata, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        params![
            batch.id,
            batch.owner,
            batch.key_name,
            batch.key_hash,
            batch.account,
            batch.endpoint,
            batch.input_file_id,
            batch.completion_window,
            batch.status,
            batch.errors,
            batch.metadata,
            batch.created_at,
            batch.expires_at
        ],
    )?;
    let seq = tx.last_insert_rowid();
    {
        let mut statement = tx.prepare(
            "INSERT INTO batch_requests (batch_seq, line, custom_id, model, body, state, result)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        for l in lines {
            let (body, state, result) = match &l.work {
                Work::Send(body) => (Some(body.as_slice()), "pending", None),
                Work::Refused(result) => (None, "error", Some(result.as_str())),
            };
            statement.execute(params![seq, l.line, l.custom_id, l.model, body, state, result])?;
        }
    }
    tx.commit()?;
    Ok(seq)
}

/// `owner`'s batch `id`.
pub fn batch(conn: &Connection, owner: &str, id: &str) -> rusqlite::Result<Option<BatchRow>> {
    conn.query_row(
        &format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1 AND owner = ?2"),
        params![id, owner],
        batch_row,
    )
    .optional()
}

/// Batch `seq`, whoever owns it.
pub fn batch_by_seq(conn: &Connection, seq: i64) -> rusqlite::Result<Option<BatchRow>> {
    conn.query_row(&format!("SELECT {BATCH_COLUMNS} FROM batches WHERE seq = ?1"), [seq], batch_row).optional()
}

/// Up to `limit` of `owner`'s batches, newest first, after the batch `after` if given; and
/// whether there are more.
pub fn batches(
    conn: &Connection,
    owner: &str,
    limit: usize,
    after: Option<&str>,
) -> rusqlite::Result<(Vec<BatchRow>, bool)> {
    let below: i64 = match after {
        Some(id) => conn
            .query_row("SELECT seq FROM batches WHERE id = ?1 AND owner = ?2", params![id, owner], |r| r.get(0))
            .optional()?
            .unwrap_or(i64::MAX),
        None => i64::MAX,
    };
    let mut statement = conn.prepare(&format!(
        "SELECT {BATCH_COLUMNS} FROM batches WHERE owner = ?1 AND seq < ?2 ORDER BY seq DESC LIMIT ?3"
    ))?;
    let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
    let mut rows: Vec<BatchRow> =
        statement.query_map(params![owner, below, fetch], batch_row)?.collect::<Result<_, _>>()?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    Ok((rows, more))
}

/// The batches not yet final, oldest first.
pub fn active(conn: &Connection) -> rusqlite::Result<Vec<BatchRow>> {
    let mut statement = conn.prepare(&format!(
        "SELECT {BATCH_COLUMNS} FROM batches
         WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling') ORDER BY seq"
    ))?;
    let rows = statement.query_map([], batch_row)?;
    rows.collect()
}

/// Moves batch `seq` from `from` to `to` at `now` (setting `to`'s time); whether it moved.
pub fn set_status(conn: &Connection, seq: i64, from: &[Status], to: Status, now: i64) -> rusqlite::Result<bool> {
    let column = match to {
        Status::InProgress => "in_progress_at",
        Status::Failed => "failed_at",
        Status::Finalizing => "finalizing_at",
        Status::Cancelling => "cancelling_at",
        Status::Completed => "completed_at",
        Status::Expired => "expired_at",
        Status::Cancelled => "cancelled_at",
        Status::Validating => "created_at",
    };
    let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    let placeholders = (0..from.len()).map(|i| format!("?{}", i + 4)).collect::<Vec<_>>().join(", ");
    let sql = format!("UPDATE batches SET status = ?1, {column} = ?2 WHERE seq = ?3 AND status IN ({placeholders})");
    let to_name = to.as_str();
    let mut values: Vec<&dyn rusqlite::ToSql> = vec![&to_name, &now, &seq];
    values.extend(from.iter().map(|s| s as &dyn rusqlite::ToSql));
    Ok(conn.execute(&sql, values.as_slice())? > 0)
}

/// A line waiting to be sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// Its number.
    pub line: i64,
    /// Its `custom_id`.
    pub custom_id: String,
    /// Its model.
    pub model: String,
    /// The body to send.
    pub body: Vec<u8>,
}

/// Up to `limit` pending lines of batch `seq` numbered above `after`, in order.
pub fn pending(conn: &Connection, seq: i64, after: i64, limit: usize) -> rusqlite::Result<Vec<Pending>> {
    let mut statement = conn.prepare_cached(
        "SELECT line, COALESCE(custom_id, ''), COALESCE(model, ''), body FROM batch_requests
         WHERE batch_seq = ?1 AND state = 'pending' AND line > ?2 ORDER BY line LIMIT ?3",
    )?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = statement.query_map(params![seq, after, limit], |r| {
        Ok(Pending { line: r.get(0)?, custom_id: r.get(1)?, model: r.get(2)?, body: r.get(3)? })
    })?;
    rows.collect()
}

/// Whether batch `seq` has pending lines.
pub fn has_pending(conn: &Connection, seq: i64) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM batch_requests WHERE batch_seq = ?1 AND state = 'pending')",
        [seq],
        |r| r.get(0),
    )
}

/// Records line `line` of batch `seq` as done — `ok` or not — with its file line `result` and,
/// if a node answered, its ledger row, in one transaction. Does nothing (and says so) if the
/// line is no longer pending.
pub fn finish_line(
    conn: &mut Connection,
    seq: i64,
    line: i64,
    ok: bool,
    result: &str,
    usage: Option<&crate::ledger::Row>,
    batch_id: &str,
) -> rusqlite::Result<bool> {
    let tx = conn.transaction()?;
    let changed = tx.execute(
        "UPDATE batch_requests SET state = ?1, result = ?2, body = NULL
         WHERE batch_seq = ?3 AND line = ?4 AND state = 'pending'",
        params![if ok { "ok" } else { "error" }, result, seq, line],
    )?;
    if changed == 0 {
        return Ok(false);
    }
    if let Some(r) = usage {
        crate::ledger::insert_row(&tx, r, Some(batch_id))?;
    }
    tx.commit()?;
    Ok(true)
}

/// Ends batch `seq` as `status` (completed, expired or cancelled) at `now`: lines still pending
/// go to the error file with `code`, the output and error files are written (an error file only
/// when some line failed), and the batch names them — all in one transaction; the lines then
/// keep their state but not their results, which are in the files. `files_expire_at` is the
/// files' expiry.
pub fn finalize(
    conn: &mut Connection,
    batch: &BatchRow,
    status: Status,
    now: i64,
    files_expire_at: Option<i64>,
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    let code = match status {
        Status::Expired => {
            Some(("batch_expired", "this request was not run before the batch's completion window ended"))
        }
        Status::Cancelled => Some(("batch_cancelled", "this request was not run: the batch was cancelled")),
        _ => None,
    };
    if let Some((code, message)) = code {
        let unrun: Vec<(i64, Option<String>)> = {
            let mut s =
                tx.prepare("SELECT line, custom_id FROM batch_requests WHERE batch_seq = ?1 AND state = 'pending'")?;
            let rows = s.query_map([batch.seq], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        for (line, custom_id) in unrun {
            let result = error_line(custom_id.as_deref(), code, message, Some(line));
            tx.execute(
                "UPDATE batch_requests SET state = 'error', result = ?1, body = NULL WHERE batch_seq = ?2 AND line = ?3",
                params![result, batch.seq, line],
            )?;
        }
    }
    let file_of = |state: &str, suffix: &str| -> rusqlite::Result<Option<String>> {
        let mut content = Vec::new();
        {
            let mut s = tx.prepare(
                "SELECT COALESCE(result, '') FROM batch_requests WHERE batch_seq = ?1 AND state = ?2 ORDER BY line",
            )?;
            let mut rows = s.query(params![batch.seq, state])?;
            while let Some(r) = rows.next()? {
                let line: String = r.get(0)?;
                content.extend_from_slice(line.as_bytes());
                content.push(b'\n');
            }
        }
        if content.is_empty() {
            return Ok(None);
        }
        let meta = FileMeta {
            id: super::new_id("file-"),
            owner: batch.owner.clone(),
            purpose: "batch_output".into(),
            filename: format!("{}_{suffix}.jsonl", batch.id),
            bytes: i64::try_from(content.len()).unwrap_or(i64::MAX),
            created_at: now,
            expires_at: files_expire_at,
        };
        insert_file(&tx, &meta, &content)?;
        Ok(Some(meta.id))
    };
    let output = file_of("ok", "output")?;
    let errors = file_of("error", "error")?;
    // The files now hold the results: the lines keep only what the counts need.
    tx.execute("UPDATE batch_requests SET result = NULL WHERE batch_seq = ?1", [batch.seq])?;
    let time_column = match status {
        Status::Expired => "expired_at",
        Status::Cancelled => "cancelled_at",
        _ => "completed_at",
    };
    tx.execute(
        &format!(
            "UPDATE batches SET status = ?1, output_file_id = ?2, error_file_id = ?3,
                 finalizing_at = COALESCE(finalizing_at, ?4), {time_column} = ?4 WHERE seq = ?5"
        ),
        params![status.as_str(), output, errors, now, batch.seq],
    )?;
    tx.commit()
}

/// A line of the error file for a request that was not answered: OpenAI's shape, with
/// `custom_id` kept (null when the line had none) and, as a hint, the input line number.
pub fn error_line(custom_id: Option<&str>, code: &str, message: &str, line: Option<i64>) -> String {
    serde_json::json!({
        "id": super::new_id("batch_req_"),
        "custom_id": custom_id,
        "response": null,
        "error": {"code": code, "message": message, "line": line},
    })
    .to_string()
}

/// A line of the output (2xx) or error file for a request a node answered.
pub fn response_line(custom_id: &str, status_code: u16, request_id: &str, body: &serde_json::Value) -> String {
    serde_json::json!({
        "id": super::new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": request_id, "body": body},
        "error": null,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seq_id: &str) -> BatchRow {
        BatchRow {
            id: seq_id.into(),
            owner: "o".into(),
            endpoint: "/v1/chat/completions".into(),
            input_file_id: "file-x".into(),
            completion_window: "24h".into(),
            status: Status::Validating.as_str().into(),
            created_at: 100,
            expires_at: 100 + 86_400,
            ..BatchRow::default()
        }
    }

    #[test]
    fn lines_finish_once_and_files_hold_each_line_once_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = crate::db::open(&dir.path().join("gateway.db")).expect("opens");
        let lines = vec![
            Line { line: 1, custom_id: Some("a".into()), model: Some("m".into()), work: Work::Send(b"{}".to_vec()) },
            Line {
                line: 2,
                custom_id: None,
                model: None,
                work: Work::Refused(error_line(None, "invalid_json", "bad", Some(2))),
            },
            Line { line: 3, custom_id: Some("c".into()), model: Some("m".into()), work: Work::Send(b"{}".to_vec()) },
        ];
        let seq = insert_batch(&mut conn, &sample("batch_1"), &lines).expect("insert");
        assert!(set_status(&conn, seq, &[Status::Validating], Status::InProgress, 101).expect("status"));
        assert!(!set_status(&conn, seq, &[Status::Validating], Status::InProgress, 101).expect("status"), "once");
        let todo = pending(&conn, seq, 0, 10).expect("pending");
        assert_eq!(todo.iter().map(|p| p.custom_id.as_str()).collect::<Vec<_>>(), ["a", "c"]);
        let body = serde_json::json!({"ok": true});
        let row =
            crate::ledger::Row { model: "m".into(), endpoint: "/v1/chat/completions".into(), ..Default::default() };
        assert!(finish_line(&mut conn, seq, 3, true, &response_line("c", 200, "r", &body), Some(&row), "batch_1")
            .expect("finish"));
        assert!(
            !finish_line(&mut conn, seq, 3, true, &response_line("c", 200, "r", &body), Some(&row), "batch_1")
                .expect("finish"),
            "a finished line is not finished twice"
        );
        assert_eq!(counts(&conn, seq).expect("counts"), Counts { total: 3, completed: 1, failed: 1 });
        let batch = batch_by_seq(&conn, seq).expect("read").expect("there");
        finalize(&mut conn, &batch, Status::Cancelled, 200, None).expect("finalize");
        let batch = batch_by_seq(&conn, seq).expect("read").expect("there");
        assert_eq!((batch.status(), batch.cancelled_at), (Status::Cancelled, Some(200)));
        let output = file_content(&conn, "o", batch.output_file_id.as_deref().expect("output"), 0).expect("read");
        let errors = file_content(&conn, "o", batch.error_file_id.as_deref().expect("errors"), 0).expect("read");
        let text = String::from_utf8(output.expect("output")).expect("utf-8");
        assert_eq!(text.lines().count(), 1, "{text}");
        let errors = String::from_utf8(errors.expect("errors")).expect("utf-8");
        let codes: Vec<String> = errors
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["error"]["code"].to_string())
            .collect();
        assert_eq!(codes, ["\"batch_cancelled\"", "\"invalid_json\""], "in input order");
        assert!(file_content(&conn, "someone else", batch.output_file_id.as_deref().expect("id"), 0)
            .expect("read")
            .is_none());
        let batch_rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM requests WHERE batch_id = 'batch_1'", [], |r| r.get(0))
            .expect("count");
        assert_eq!(batch_rows, 1, "one ledger row, written with the result");
    }

    #[test]
    fn a_ledger_of_schema_1_gains_the_batch_tables_and_keeps_its_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gateway.db");
        {
            let mut conn = Connection::open(&path).expect("create");
            crate::db::migrate(&mut conn, &path, &crate::db::MIGRATIONS[..1]).expect("schema 1");
            conn.execute(
                "INSERT INTO requests (time_ms, model, endpoint, stream, status, outcome, latency_ms)
                 VALUES (1, 'm', '/v1/chat/completions', 0, 200, 'complete', 5)",
                [],
            )
            .expect("an interactive row");
        }
        let conn = crate::db::open(&path).expect("upgrades");
        let (rows, batch): (i64, Option<String>) = conn
            .query_row("SELECT COUNT(*), MAX(batch_id) FROM requests", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("rows");
        assert_eq!((rows, batch), (1, None), "kept, and marked interactive");
        assert!(batches(&conn, "o", 10, None).expect("the batch tables exist").0.is_empty());
    }

    #[test]
    fn lists_page_newest_first_per_owner() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = crate::db::open(&dir.path().join("gateway.db")).expect("opens");
        for i in 0..5 {
            insert_batch(&mut conn, &sample(&format!("batch_{i}")), &[]).expect("insert");
        }
        let mut other = sample("batch_other");
        other.owner = "p".into();
        insert_batch(&mut conn, &other, &[]).expect("insert");
        let (page, more) = batches(&conn, "o", 2, None).expect("list");
        assert_eq!(page.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["batch_4", "batch_3"]);
        assert!(more);
        let (page, more) = batches(&conn, "o", 10, Some("batch_3")).expect("list");
        assert_eq!(page.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["batch_2", "batch_1", "batch_0"]);
        assert!(!more);
        assert!(batch(&conn, "o", "batch_other").expect("read").is_none());
    }
}
