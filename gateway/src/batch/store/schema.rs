//! The batch tables' migration: the SQL that creates `batch_files`, `batches` and
//! `batch_requests` and gives the ledger's `requests` its `batch_id`.

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

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use crate::batch::store::batches::batches;

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
}
