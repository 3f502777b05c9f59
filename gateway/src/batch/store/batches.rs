//! The `batches` table: a batch's row and [`Status`], its creation with its lines, its reads
//! and listings, and its moves from status to status.

use rusqlite::{params, Connection, OptionalExtension};

use super::requests::{Counts, Line, Work};

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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::batch::store) fn sample(seq_id: &str) -> BatchRow {
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
