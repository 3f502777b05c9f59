//! The `batch_requests` table: a batch's lines as checked ([`Line`], [`Work`]), its counts,
//! the lines still to send, and the one transaction that marks a line done.

use rusqlite::{params, Connection};

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
