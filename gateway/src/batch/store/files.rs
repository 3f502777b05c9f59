//! The `batch_files` table: uploaded input files and the output and error files a batch
//! produces, read and deleted per owner, and dropped once expired.

use rusqlite::{params, Connection, OptionalExtension};

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
