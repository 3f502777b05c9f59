//! The usage ledger: one row per API request in the gateway's database ([`crate::db`]) —
//! when it came, whose key, which account it is charged to, which model and node, the
//! engine's own token counts, how long it took and how it ended. `tela usage`
//! ([`crate::usage`]) reports from it.
//!
//! # Columns of `requests`
//!
//! | column | what |
//! |---|---|
//! | `time_ms` | when the request arrived, Unix milliseconds (UTC) |
//! | `key_name`, `key_hash`, `account` | the key's name and the first 12 hex digits of its SHA-256 (what its key-file line starts with), and the account its line charges; NULL on a gateway without keys |
//! | `model`, `endpoint`, `stream` | what was asked: the model, the path (`/v1/chat/completions`), and whether it streamed |
//! | `node` | the node that answered; NULL when the gateway answered itself (404, 429, 503) |
//! | `status`, `outcome` | the HTTP status sent, and `complete`, `broken` (cut after the first byte), `abandoned` (the client left) or `refused` (the gateway answered) |
//! | `prompt_tokens`, `completion_tokens` | the engine's `usage`; NULL when it reported none |
//! | `latency_ms`, `ttft_ms` | from the request's arrival to its last byte, and to the response's first byte |
//! | `provider` | the outside provider that answered or failed ([`crate::overflow`], its `[[overflow]]` name; `node` is then `overflow:<name>`); NULL when the federation answered |
//! | `batch_id` | the batch the request belonged to ([`crate::batch`], which writes its rows itself, with each result); NULL for interactive requests |
//!
//! For example, tokens per account today:
//! `SELECT account, SUM(prompt_tokens + completion_tokens) FROM requests WHERE time_ms >= 1000 * unixepoch('now', 'start of day') GROUP BY account;`
//!
//! # Off the request path
//!
//! A request's row is handed to a bounded channel ([`Ledger::record`] never waits) and one writer
//! thread inserts what has arrived, in one transaction, every [`FLUSH_EVERY`] (sooner when the
//! channel is half full) — so a crash or `kill -9` loses at most the rows of the last half second
//! (and, in WAL mode, never the file). A row wakes no thread: the writer sleeps until its flush is
//! due, so the ledger costs a request no context switch. When the channel is full the row is
//! dropped and counted (`tela_gateway_ledger_dropped_rows_total`) rather than slowing requests.
//! When the database cannot be written — a full disk, a read-only directory, a file taken away —
//! requests keep flowing: the writer counts each failure (`tela_gateway_ledger_errors_total`), logs
//! an error at most once a minute, keeps up to [`MAX_PENDING`] rows to write once it can, and
//! reopens the file every few seconds. Rows older than the retention period are deleted hourly.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use rusqlite::Connection;

mod charge;

pub use charge::{key_hash, on_end, Asked, Charge, Payer};

/// How often the writer commits what has arrived: the most a crash loses.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// Rows waiting in the channel before new ones are dropped.
const CHANNEL_ROWS: usize = 16 * 1024;

/// Rows waiting at which a request wakes the writer, which then flushes before its time.
const WAKE_AT: usize = CHANNEL_ROWS / 2;

/// Most rows kept in memory while the database cannot be written; older ones are dropped.
pub const MAX_PENDING: usize = 20_000;

/// How long after a failure the writer tries the file again.
const REOPEN_AFTER: Duration = Duration::from_secs(5);

/// How often old rows are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// At most one error line per this long.
const LOUD_EVERY: Duration = Duration::from_secs(60);

/// Where the ledger lives and how long it keeps rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerConfig {
    /// The database file.
    pub path: PathBuf,
    /// Rows older than this are deleted; `None` keeps them forever.
    pub retention: Option<Duration>,
}

impl LedgerConfig {
    /// The file `path`, keeping rows `retention_days` days (0: forever).
    pub fn new(path: PathBuf, retention_days: u32) -> LedgerConfig {
        let retention = (retention_days > 0).then(|| Duration::from_secs(u64::from(retention_days) * 86_400));
        LedgerConfig { path, retention }
    }
}

/// One request's row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Row {
    /// Arrival, Unix milliseconds.
    pub time_ms: i64,
    /// The key's name.
    pub key_name: Option<String>,
    /// The first 12 hex digits of the key's SHA-256.
    pub key_hash: Option<String>,
    /// The account charged.
    pub account: Option<String>,
    /// The model asked for.
    pub model: String,
    /// The node that answered.
    pub node: Option<String>,
    /// The path.
    pub endpoint: String,
    /// Whether it streamed.
    pub stream: bool,
    /// The HTTP status sent.
    pub status: u16,
    /// `complete`, `broken`, `abandoned` or `refused`.
    pub outcome: &'static str,
    /// The engine's prompt tokens.
    pub prompt_tokens: Option<u64>,
    /// The engine's completion tokens.
    pub completion_tokens: Option<u64>,
    /// Arrival to last byte.
    pub latency_ms: u64,
    /// Arrival to first byte.
    pub ttft_ms: Option<u64>,
    /// The overflow provider that answered or failed.
    pub provider: Option<String>,
}

/// The ledger's own counters (registered in [`Metrics`](crate::metrics::Metrics)).
#[derive(Clone, Debug, Default)]
pub struct LedgerCounters {
    /// Rows committed.
    pub written: Counter,
    /// Rows lost: the channel was full, or too many waited for a failing database.
    pub dropped: Counter,
    /// Failed opens, writes and deletes.
    pub errors: Counter,
}

/// Where requests' rows go: a cheap handle on the writer thread (see the module docs).
#[derive(Clone)]
pub struct Ledger(Arc<Inner>);

struct Inner {
    tx: SyncSender<Row>,
    /// Shared with the writer.
    shared: Arc<Shared>,
    dropped: Counter,
    /// The writer, to wake early.
    writer: Option<std::thread::Thread>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What the writer and the request path share.
#[derive(Default)]
struct Shared {
    /// Set by [`Ledger::close`].
    stop: AtomicBool,
    /// Rows sent and not yet taken by the writer (counted before each send).
    queued: AtomicUsize,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ledger")
    }
}

impl Ledger {
    /// Starts the writer thread. Never fails: a file that cannot be opened now is reported
    /// and tried again, and requests are served meanwhile.
    pub fn start(config: LedgerConfig, counters: LedgerCounters) -> Ledger {
        let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_ROWS);
        let shared = Arc::new(Shared::default());
        let dropped = counters.dropped.clone();
        let writer = Writer::new(config, counters);
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tela-ledger".into())
            .spawn(move || writer.run(rx, &theirs))
            .map_err(|e| {
                tracing::error!("the usage ledger's writer thread could not start: {e}; usage is not recorded")
            })
            .ok();
        let writer = thread.as_ref().map(|t| t.thread().clone());
        Ledger(Arc::new(Inner { tx, shared, dropped, writer, thread: Mutex::new(thread) }))
    }

    /// Hands a row to the writer; drops it (counted) if the writer is that far behind. Wakes
    /// the writer only when half the channel's room is taken.
    pub fn record(&self, row: Row) {
        let queued = &self.0.shared.queued;
        let before = queued.fetch_add(1, Ordering::AcqRel);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.0.tx.try_send(row) {
            queued.fetch_sub(1, Ordering::AcqRel);
            self.0.dropped.inc();
        } else if before + 1 == WAKE_AT {
            self.wake_writer();
        }
    }

    fn wake_writer(&self) {
        if let Some(writer) = &self.0.writer {
            writer.unpark();
        }
    }

    /// Writes what is waiting and stops the writer (blocking: call it off the async threads).
    /// Rows recorded afterwards are dropped.
    pub fn close(&self) {
        self.0.shared.stop.store(true, Ordering::Release);
        self.wake_writer();
        let thread = self.0.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// The writer thread's state.
struct Writer {
    config: LedgerConfig,
    counters: LedgerCounters,
    conn: Option<Connection>,
    next_open: Instant,
    pending: Vec<Row>,
    next_prune: Instant,
    failing: bool,
    last_loud: Option<Instant>,
    quiet_errors: u64,
}

impl Writer {
    fn new(config: LedgerConfig, counters: LedgerCounters) -> Writer {
        let now = Instant::now();
        Writer {
            config,
            counters,
            conn: None,
            next_open: now,
            pending: Vec::new(),
            next_prune: now,
            failing: false,
            last_loud: None,
            quiet_errors: 0,
        }
    }

    fn run(mut self, rx: Receiver<Row>, shared: &Shared) {
        // Open at once, so that a bad path is reported when the gateway starts.
        let _ = self.connection(Instant::now());
        let mut next_flush = Instant::now() + FLUSH_EVERY;
        loop {
            // Sleeps until the flush is due (or `record` finds the channel half full, or
            // `close` is called): waiting on the channel itself would make every row wake
            // this thread.
            std::thread::park_timeout(next_flush.saturating_duration_since(Instant::now()));
            let mut closing = shared.stop.load(Ordering::Acquire);
            let before = self.pending.len();
            loop {
                match rx.try_recv() {
                    Ok(row) => self.pending.push(row),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closing = true;
                        break;
                    }
                }
            }
            shared.queued.fetch_sub(self.pending.len() - before, Ordering::AcqRel);
            let now = Instant::now();
            if closing || now >= next_flush || self.pending.len() >= WAKE_AT {
                self.flush(now);
                next_flush = now + FLUSH_EVERY;
            }
            if now >= self.next_prune {
                self.prune(now);
            }
            if closing {
                if !self.pending.is_empty() {
                    self.counters.dropped.inc_by(self.pending.len() as u64);
                    tracing::error!(
                        "the usage ledger {} lost {} row(s) at shutdown: the database could not be written",
                        self.config.path.display(),
                        self.pending.len()
                    );
                }
                return;
            }
        }
    }

    /// The open database, opening it if it is time to try.
    fn connection(&mut self, now: Instant) -> Option<&mut Connection> {
        if self.conn.is_none() && now >= self.next_open {
            match crate::db::open(&self.config.path) {
                Ok(conn) => {
                    if self.failing {
                        tracing::info!("the usage ledger {} is writable again", self.config.path.display());
                        self.failing = false;
                    }
                    self.conn = Some(conn);
                }
                Err(e) => {
                    self.fail(now, &e.to_string());
                    self.next_open = now + REOPEN_AFTER;
                }
            }
        }
        self.conn.as_mut()
    }

    fn flush(&mut self, now: Instant) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        // `Err(None)`: no connection (its failure was reported when opening it).
        let result = match self.connection(now) {
            Some(conn) => insert(conn, &pending).map_err(Some),
            None => Err(None),
        };
        match result {
            Ok(()) => {
                self.counters.written.inc_by(pending.len() as u64);
            }
            Err(e) => {
                self.pending = pending;
                if let Some(e) = e {
                    let message = format!("cannot write to the usage ledger {}: {e}", self.config.path.display());
                    self.fail(now, &message);
                    // Start afresh: the file may have been replaced or its disk remounted.
                    self.conn = None;
                    self.next_open = now + REOPEN_AFTER;
                }
                let excess = self.pending.len().saturating_sub(MAX_PENDING);
                if excess > 0 {
                    self.pending.drain(..excess);
                    self.counters.dropped.inc_by(excess as u64);
                }
            }
        }
    }

    /// Deletes rows older than the retention period, a slice at a time.
    fn prune(&mut self, now: Instant) {
        self.next_prune = now + PRUNE_EVERY;
        let Some(retention) = self.config.retention else { return };
        let cutoff = unix_ms(SystemTime::now().checked_sub(retention).unwrap_or(UNIX_EPOCH));
        let Some(conn) = self.connection(now) else { return };
        match delete_before(conn, cutoff) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!("usage ledger: deleted {n} row(s) older than {} days", retention.as_secs() / 86_400)
            }
            Err(e) => {
                let message = format!("cannot delete old rows of the usage ledger {}: {e}", self.config.path.display());
                self.fail(now, &message);
            }
        }
    }

    /// Counts a failure and says so loudly — once a minute at most.
    fn fail(&mut self, now: Instant, message: &str) {
        self.counters.errors.inc();
        self.failing = true;
        if self.last_loud.is_some_and(|t| now.saturating_duration_since(t) < LOUD_EVERY) {
            self.quiet_errors += 1;
            return;
        }
        tracing::error!(
            "{message}; requests are still served, but their usage is not recorded until this is fixed \
             ({} row(s) waiting, {} more error(s) since the last report)",
            self.pending.len(),
            self.quiet_errors
        );
        self.last_loud = Some(now);
        self.quiet_errors = 0;
    }
}

/// Inserts `rows` in one transaction.
pub fn insert(conn: &mut Connection, rows: &[Row]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    for r in rows {
        insert_row(&tx, r, None)?;
    }
    tx.commit()
}

/// Inserts one row, of batch `batch_id` if given (in the caller's transaction, if any).
pub fn insert_row(conn: &Connection, r: &Row, batch_id: Option<&str>) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached(
        "INSERT INTO requests (time_ms, key_name, key_hash, account, model, node, endpoint, stream, status,
             outcome, prompt_tokens, completion_tokens, latency_ms, ttft_ms, provider, batch_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )?;
    statement.execute(rusqlite::params![
        r.time_ms,
        r.key_name,
        r.key_hash,
        r.account,
        r.model,
        r.node,
        r.endpoint,
        r.stream,
        r.status,
        r.outcome,
        r.prompt_tokens.map(saturating_i64),
        r.completion_tokens.map(saturating_i64),
        saturating_i64(r.latency_ms),
        r.ttft_ms.map(saturating_i64),
        r.provider,
        batch_id,
    ])?;
    Ok(())
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Deletes the rows from before `cutoff_ms`; gives how many.
pub fn delete_before(conn: &Connection, cutoff_ms: i64) -> rusqlite::Result<usize> {
    let mut total = 0;
    loop {
        // In slices, so that a first prune of a large file does not hold one huge transaction.
        let n = conn.execute(
            "DELETE FROM requests WHERE id IN (SELECT id FROM requests WHERE time_ms < ?1 LIMIT 10000)",
            [cutoff_ms],
        )?;
        total += n;
        if n < 10_000 {
            return Ok(total);
        }
    }
}

/// Unix milliseconds of `t`.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The default database file: `gateway.db` beside the gateway's identity key.
pub fn default_path(identity: &Path) -> PathBuf {
    identity.with_file_name("gateway.db")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(time_ms: i64, key: &str, prompt: u64) -> Row {
        Row {
            time_ms,
            key_name: Some(key.into()),
            key_hash: Some("0123456789ab".into()),
            account: Some("proj".into()),
            model: "m".into(),
            node: Some("n1".into()),
            endpoint: "/v1/chat/completions".into(),
            stream: false,
            status: 200,
            outcome: "complete",
            prompt_tokens: Some(prompt),
            completion_tokens: Some(2),
            latency_ms: 10,
            ttft_ms: None,
            provider: None,
        }
    }

    fn count(path: &Path) -> i64 {
        let conn = crate::db::open_read_only(path, 1).expect("opens");
        conn.query_row("SELECT COUNT(*) FROM requests", [], |r| r.get(0)).expect("count")
    }

    fn wait_for(what: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if what() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn rows_are_committed_in_batches_within_the_flush_interval() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gateway.db");
        let counters = LedgerCounters::default();
        let ledger = Ledger::start(LedgerConfig::new(path.clone(), 0), counters.clone());
        let sent = Instant::now();
        for i in 0..1000 {
            ledger.record(row(1_700_000_000_000 + i, "a", 1));
        }
        assert!(wait_for(|| counters.written.get() == 1000), "written: {}", counters.written.get());
        // Committed without waiting for shutdown, within a flush interval or so.
        assert!(sent.elapsed() < FLUSH_EVERY * 8, "{:?}", sent.elapsed());
        assert_eq!(count(&path), 1000);
        ledger.record(row(1, "b", 1));
        ledger.close();
        assert_eq!(count(&path), 1001, "close writes what is waiting");
        ledger.record(row(2, "b", 1));
        assert_eq!(counters.dropped.get(), 1, "after close, rows are dropped and counted");
        assert_eq!(counters.errors.get(), 0);
    }

    #[test]
    fn an_unwritable_file_counts_errors_keeps_rows_and_recovers() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A regular file where the directory should be: nobody, root included, can create it.
        let blocker = dir.path().join("blocked");
        std::fs::write(&blocker, "not a directory").expect("file");
        let path = blocker.join("gateway.db");
        let counters = LedgerCounters::default();
        let ledger = Ledger::start(LedgerConfig::new(path.clone(), 0), counters.clone());
        for i in 0..10 {
            ledger.record(row(i, "a", 1));
        }
        assert!(wait_for(|| counters.errors.get() >= 1), "the failure is counted");
        assert_eq!(counters.written.get(), 0);
        // The directory becomes possible: the rows kept are written on a later try.
        std::fs::remove_file(&blocker).expect("remove");
        assert!(wait_for(|| counters.written.get() == 10), "written after recovery: {}", counters.written.get());
        ledger.close();
        assert_eq!(count(&path), 10);
        assert_eq!(counters.dropped.get(), 0);
    }

    #[test]
    fn retention_deletes_old_rows_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gateway.db");
        let now = unix_ms(SystemTime::now());
        let day = 86_400_000;
        {
            let mut conn = crate::db::open(&path).expect("opens");
            insert(&mut conn, &[row(now - 100 * day, "old", 1), row(now - 89 * day, "recent", 1), row(now, "new", 1)])
                .expect("insert");
        }
        // The writer prunes when it starts, then hourly.
        let counters = LedgerCounters::default();
        let ledger = Ledger::start(LedgerConfig::new(path.clone(), 90), counters.clone());
        ledger.close();
        let conn = crate::db::open_read_only(&path, 1).expect("opens");
        let mut keys: Vec<String> = conn
            .prepare("SELECT key_name FROM requests ORDER BY time_ms")
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("query")
            .map(|r| r.expect("row"))
            .collect();
        keys.sort();
        assert_eq!(keys, ["new", "recent"]);
        assert_eq!(delete_before(&conn_rw(&path), now + 1).expect("delete"), 2);
        assert_eq!(LedgerConfig::new(path, 0).retention, None, "0 keeps rows forever");
    }

    fn conn_rw(path: &Path) -> Connection {
        crate::db::open(path).expect("opens")
    }
}
