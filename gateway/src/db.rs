//! The gateway's embedded database: one SQLite file (bundled SQLite, no server) that holds what
//! a gateway must keep across restarts — today the usage ledger ([`crate::ledger`]), batch
//! inference's files, batches and results ([`crate::batch`]) and the GPU-hours each key's batch
//! backlog spent on spun jobs ([`crate::spin::batch_demand`]).
//!
//! Every connection runs in WAL mode with `synchronous=NORMAL`: a commit is one append to the
//! write-ahead log, readers (`tela usage`) never block the writer, and a crash or `kill -9` of
//! the process loses no committed transaction and never leaves a corrupt file (a power cut may
//! lose the last commits, never the file).
//!
//! The schema is versioned: table `schema_version` lists every migration applied (its number,
//! name and time). [`open`] applies the pending ones of [`MIGRATIONS`] in one transaction, in
//! order, so a database is always at exactly one known version. A feature that needs tables
//! appends a migration with the next number; a migration, once released, is never edited. A
//! file written by a newer `tela` (a version this one does not know) is refused rather than
//! guessed at.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

/// How long a statement waits for another connection's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// One step of the schema.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    /// Its number: 1, 2, 3, ... in the order they apply.
    pub version: u32,
    /// What it adds, for `schema_version` and errors.
    pub name: &'static str,
    /// The statements.
    pub sql: &'static str,
}

/// The schema, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "usage ledger",
        // One row per API request; see `crate::ledger` for what each column holds.
        sql: "CREATE TABLE requests (
              id INTEGER PRIMARY KEY,
              time_ms INTEGER NOT NULL,
              key_name TEXT,
              key_hash TEXT,
              account TEXT,
              model TEXT NOT NULL,
              node TEXT,
              endpoint TEXT NOT NULL,
              stream INTEGER NOT NULL,
              status INTEGER NOT NULL,
              outcome TEXT NOT NULL,
              prompt_tokens INTEGER,
              completion_tokens INTEGER,
              latency_ms INTEGER NOT NULL,
              ttft_ms INTEGER
          );
          CREATE INDEX requests_by_time ON requests(time_ms);",
    },
    Migration {
        version: 2,
        name: "batch inference",
        // See `crate::batch::store` for what each table and column holds.
        sql: crate::batch::store::MIGRATION,
    },
    Migration {
        version: 3,
        name: "overflow provider",
        // The outside provider that answered a request, `crate::overflow`; NULL for the federation.
        sql: "ALTER TABLE requests ADD COLUMN provider TEXT;",
    },
    Migration {
        version: 4,
        name: "batch spin GPU-hours",
        // GPU-seconds charged per key for jobs spun for its batch backlog, `crate::spin::batch_demand`.
        sql: crate::spin::batch_demand::MIGRATION,
    },
];

/// The database could not be opened or brought to the current schema.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The file (or its directory) could not be opened or created.
    #[error("cannot open the database {path}: {source} (is the directory writable and the disk not full?)")]
    Open {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// There is no file to read.
    #[error("there is no database at {path}: give the file `tela gateway --ledger` writes")]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// Its directory could not be created.
    #[error("cannot create the directory of the database {path}: {source}")]
    Directory {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A newer `tela` wrote it.
    #[error(
        "the database {path} has schema version {found}, newer than this tela knows ({known}); \
         use the tela that wrote it, or another file"
    )]
    TooNew {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// The newest this build knows.
        known: u32,
    },
    /// The file is not at a version that has what the caller needs.
    #[error(
        "the database {path} has schema version {found}; it needs at least {needed} (open it once with `tela gateway`)"
    )]
    TooOld {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// The version needed.
        needed: u32,
    },
    /// A statement failed.
    #[error("database {path}: {source}")]
    Sql {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
}

impl DbError {
    fn sql(path: &Path) -> impl FnOnce(rusqlite::Error) -> DbError + '_ {
        move |source| DbError::Sql { path: path.to_path_buf(), source }
    }
}

/// The newest schema version this build knows.
pub fn current_version() -> u32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Opens (creating it and its directory if needed) the database at `path` for writing, in WAL
/// mode, and applies the pending migrations.
pub fn open(path: &Path) -> Result<Connection, DbError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| DbError::Directory { path: path.to_path_buf(), source })?;
    }
    let mut conn = Connection::open(path).map_err(|source| DbError::Open { path: path.to_path_buf(), source })?;
    configure(&conn, path)?;
    migrate(&mut conn, path, MIGRATIONS)?;
    Ok(conn)
}

/// Opens an existing database for reading only (as `tela usage` does), checking that its schema
/// is at least `needed` and no newer than this build knows. Applies nothing.
pub fn open_read_only(path: &Path, needed: u32) -> Result<Connection, DbError> {
    if !path.exists() {
        return Err(DbError::Missing { path: path.to_path_buf() });
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|source| DbError::Open { path: path.to_path_buf(), source })?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(DbError::sql(path))?;
    let found = version(&conn, path)?;
    if found > current_version() {
        return Err(DbError::TooNew { path: path.to_path_buf(), found, known: current_version() });
    }
    if found < needed {
        return Err(DbError::TooOld { path: path.to_path_buf(), found, needed });
    }
    Ok(conn)
}

fn configure(conn: &Connection, path: &Path) -> Result<(), DbError> {
    conn.busy_timeout(BUSY_TIMEOUT).map_err(DbError::sql(path))?;
    // `journal_mode` answers with the mode in force: anything but `wal` (a file system without
    // shared memory, say) is refused rather than silently losing WAL's guarantees.
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0)).map_err(DbError::sql(path))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(DbError::Sql {
            path: path.to_path_buf(),
            source: rusqlite::Error::InvalidParameterName(format!("journal_mode is '{mode}', WAL is needed")),
        });
    }
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(DbError::sql(path))?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(DbError::sql(path))?;
    Ok(())
}

/// The schema version of `conn`: the highest migration applied, 0 for a new file.
fn version(conn: &Connection, path: &Path) -> Result<u32, DbError> {
    let has_table: Option<i64> = conn
        .query_row("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'", [], |row| row.get(0))
        .optional()
        .map_err(DbError::sql(path))?;
    if has_table.is_none() {
        return Ok(0);
    }
    let v: Option<u32> =
        conn.query_row("SELECT MAX(version) FROM schema_version", [], |row| row.get(0)).map_err(DbError::sql(path))?;
    Ok(v.unwrap_or(0))
}

/// Applies the migrations of `migrations` newer than the file's version, all in one
/// transaction; gives the version reached.
pub fn migrate(conn: &mut Connection, path: &Path, migrations: &[Migration]) -> Result<u32, DbError> {
    let known = migrations.last().map_or(0, |m| m.version);
    // IMMEDIATE: two gateways opening one new file at once must not both apply migration 1.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(DbError::sql(path))?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version INTEGER PRIMARY KEY,
             name TEXT NOT NULL,
             applied_ms INTEGER NOT NULL
         )",
    )
    .map_err(DbError::sql(path))?;
    let found = version(&tx, path)?;
    if found > known {
        return Err(DbError::TooNew { path: path.to_path_buf(), found, known });
    }
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    for m in migrations.iter().filter(|m| m.version > found) {
        tx.execute_batch(m.sql).map_err(DbError::sql(path))?;
        tx.execute(
            "INSERT INTO schema_version (version, name, applied_ms) VALUES (?1, ?2, ?3)",
            (m.version, m.name, now_ms),
        )
        .map_err(DbError::sql(path))?;
        tracing::info!("database {}: applied schema version {} ({})", path.display(), m.version, m.name);
    }
    tx.commit().map_err(DbError::sql(path))?;
    Ok(known.max(found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_gets_every_migration_once_in_wal_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("gateway.db");
        let conn = open(&path).expect("opens, creating its directory");
        assert_eq!(version(&conn, &path).expect("version"), current_version());
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).expect("mode");
        assert_eq!(mode, "wal");
        let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).expect("synchronous");
        assert_eq!(sync, 1, "NORMAL");
        drop(conn);
        // Opening again applies nothing more.
        let conn = open(&path).expect("reopens");
        let applied: i64 = conn.query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0)).expect("count");
        assert_eq!(applied, MIGRATIONS.len() as i64);
    }

    #[test]
    fn later_migrations_apply_on_top_and_newer_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gateway.db");
        let mut conn = open(&path).expect("opens");
        conn.execute("INSERT INTO requests (time_ms, model, endpoint, stream, status, outcome, latency_ms) VALUES (1, 'm', '/v1/x', 0, 200, 'complete', 5)", [])
            .expect("a row");
        let mut next: Vec<Migration> = MIGRATIONS.to_vec();
        let v2 = current_version() + 1;
        next.push(Migration {
            version: v2,
            name: "a column",
            sql: "ALTER TABLE requests ADD COLUMN batch INTEGER NOT NULL DEFAULT 0",
        });
        assert_eq!(migrate(&mut conn, &path, &next).expect("migrates"), v2);
        let (model, batch): (String, i64) =
            conn.query_row("SELECT model, batch FROM requests", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("row kept");
        assert_eq!((model.as_str(), batch), ("m", 0));
        drop(conn);
        // This build knows fewer versions than the file has.
        match open(&path) {
            Err(DbError::TooNew { found, known, .. }) => assert_eq!((found, known), (v2, current_version())),
            other => panic!("expected TooNew, got {other:?}"),
        }
        assert!(matches!(open_read_only(&path, 1), Err(DbError::TooNew { .. })));
    }

    #[test]
    fn read_only_opens_refuse_files_without_the_schema() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("empty.db");
        Connection::open(&path).expect("create").execute_batch("CREATE TABLE other (x)").expect("table");
        assert!(matches!(open_read_only(&path, 1), Err(DbError::TooOld { found: 0, needed: 1, .. })));
        assert!(matches!(open_read_only(&dir.path().join("missing.db"), 1), Err(DbError::Missing { .. })));
    }
}
