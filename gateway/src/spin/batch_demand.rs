//! The batch API's backlog as spin demand, and the GPU-hours each key's backlog spent.
//!
//! With `[spin.batch]` set, every decision reads the backlog from the gateway's database:
//! the pending requests of batches `in_progress` (not past their completion window), per model
//! and per key. A spinnable model's backlog wants `ceil(pending / backlog_per_replica)`
//! replicas, at most `[spin.batch] max_replicas` — handed to the core as
//! [`Demand::batch_replicas`](tela_core::spin::Demand), low-priority demand: the replicas that serve
//! the model already absorb it (the core wants the larger of the interactive and the backlog
//! count, not their sum), interactive shortfalls are granted first, and a job started only for
//! the backlog is short (`job_walltime`) and backfill-friendly (`--time-min`). Once the backlog
//! is gone such a job is released like any idle replica.
//!
//! # Per-key GPU-hours (`batch_gpu_hours=N/day|week|month`)
//!
//! - **Attribution**: a job started for the backlog is charged to the key with the largest
//!   counted backlog of its model at submission (ties: the smallest hash prefix). Keys share a
//!   job's capacity; charging one key, not splitting, keeps the rule simple and a key's spend
//!   bounded by the jobs its own backlog led.
//! - **Charge**: GPUs × the time limit asked for, at submission (the most the job can use;
//!   a job Slurm shrinks or that drains early is not refunded). Charges are rows of table
//!   `spin_gpu_charges` (migration 4), so a restart keeps them.
//! - **Budget**: a key whose charges within the current UTC calendar period reach its
//!   `batch_gpu_hours` no longer counts toward the backlog: its batches still run on nodes that
//!   serve the model, but start no job. The check is before each decision, so one job may
//!   overshoot the budget by its own charge.
//!
//! Batches of no key (an open gateway), or of a key since removed from the key file, count and
//! have no budget.

use std::collections::BTreeMap;

use rusqlite::{params, Connection};

use super::config::BatchSpin;

/// Migration 4: the GPU-seconds charged to keys for jobs spun for their batch backlog.
pub const MIGRATION: &str = "CREATE TABLE spin_gpu_charges (
        id INTEGER PRIMARY KEY,
        key_hash TEXT NOT NULL,
        model TEXT NOT NULL,
        at INTEGER NOT NULL,
        gpu_secs INTEGER NOT NULL
    );
    CREATE INDEX spin_gpu_charges_by_key ON spin_gpu_charges(key_hash, at);";

/// Pending batch requests of one model and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BacklogEntry {
    /// The model the requests name.
    pub model: String,
    /// The hash prefix of the key that created the batch (`None`: no key).
    pub key_hash: Option<String>,
    /// Requests pending.
    pub pending: u64,
}

/// The pending requests of unfinished batches, per model and key, at Unix time `now`.
pub fn backlog(conn: &Connection, now: i64) -> rusqlite::Result<Vec<BacklogEntry>> {
    let mut statement = conn.prepare_cached(
        "SELECT r.model, b.key_hash, COUNT(*) FROM batch_requests r JOIN batches b ON b.seq = r.batch_seq
         WHERE b.status = 'in_progress' AND b.expires_at > ?1 AND r.state = 'pending' AND r.model IS NOT NULL
         GROUP BY r.model, b.key_hash",
    )?;
    let rows = statement.query_map([now], |r| {
        Ok(BacklogEntry { model: r.get(0)?, key_hash: r.get(1)?, pending: r.get::<_, i64>(2)?.max(0) as u64 })
    })?;
    rows.collect()
}

/// Records a charge of `gpu_secs` to `key_hash` for a job of `model` submitted at `at`.
pub fn charge(conn: &Connection, key_hash: &str, model: &str, at: i64, gpu_secs: u64) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO spin_gpu_charges (key_hash, model, at, gpu_secs) VALUES (?1, ?2, ?3, ?4)",
        params![key_hash, model, at, i64::try_from(gpu_secs).unwrap_or(i64::MAX)],
    )?;
    Ok(())
}

/// GPU-seconds charged to `key_hash` from `from` (inclusive) to `to` (exclusive), Unix seconds.
pub fn spent(conn: &Connection, key_hash: &str, from: i64, to: i64) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT COALESCE(SUM(gpu_secs), 0) FROM spin_gpu_charges WHERE key_hash = ?1 AND at >= ?2 AND at < ?3",
        params![key_hash, from, to],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n.max(0) as u64)
}

/// One model's backlog as the spinner counts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelBacklog {
    /// Pending requests that count (of keys within their GPU-hour budget).
    pub counted: u64,
    /// Pending requests of keys over their budget: they wait for nodes that exist.
    pub over_budget: u64,
    /// The key a job started now is charged to: the largest counted backlog.
    pub charge_to: Option<String>,
}

impl ModelBacklog {
    /// The replicas this backlog wants under `settings`.
    pub fn replicas(&self, settings: &BatchSpin) -> u32 {
        let per = u64::from(settings.backlog_per_replica.max(1));
        u32::try_from(self.counted.div_ceil(per)).unwrap_or(u32::MAX).min(settings.max_replicas)
    }
}

/// The backlog per model, leaving out the keys `over_budget` names.
pub fn tally(entries: &[BacklogEntry], over_budget: impl Fn(&str) -> bool) -> BTreeMap<String, ModelBacklog> {
    let mut models: BTreeMap<String, ModelBacklog> = BTreeMap::new();
    let mut per_key: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for e in entries {
        let m = models.entry(e.model.clone()).or_default();
        match e.key_hash.as_deref() {
            Some(key) if over_budget(key) => m.over_budget += e.pending,
            Some(key) => {
                m.counted += e.pending;
                *per_key.entry(&e.model).or_default().entry(key).or_default() += e.pending;
            }
            None => m.counted += e.pending,
        }
    }
    for (model, keys) in per_key {
        // The largest backlog; among equals, the smallest prefix (max_by_key keeps the last).
        let top = keys.iter().rev().max_by_key(|(_, n)| **n).map(|(k, _)| k.to_string());
        if let Some(m) = models.get_mut(model) {
            m.charge_to = top;
        }
    }
    models
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(model: &str, key: Option<&str>, pending: u64) -> BacklogEntry {
        BacklogEntry { model: model.into(), key_hash: key.map(Into::into), pending }
    }

    fn settings(per: u32, max: u32) -> BatchSpin {
        BatchSpin {
            backlog_per_replica: per,
            max_replicas: max,
            job_walltime: Duration::from_secs(3600),
            job_time_min: Duration::from_secs(1800),
        }
    }

    #[test]
    fn the_backlog_wants_replicas_per_threshold_up_to_the_cap() {
        let t = tally(&[entry("m", Some("aa"), 30), entry("m", Some("bb"), 45), entry("m", None, 5)], |_| false);
        let m = &t["m"];
        assert_eq!((m.counted, m.over_budget, m.charge_to.as_deref()), (80, 0, Some("bb")));
        assert_eq!(m.replicas(&settings(50, 4)), 2);
        assert_eq!(m.replicas(&settings(10, 3)), 3, "capped");
        assert_eq!(ModelBacklog::default().replicas(&settings(10, 3)), 0, "no backlog, no replica");
        let tie = tally(&[entry("m", Some("bb"), 5), entry("m", Some("aa"), 5)], |_| false);
        assert_eq!(tie["m"].charge_to.as_deref(), Some("aa"), "ties go to the smallest prefix");
    }

    #[test]
    fn a_key_over_its_budget_does_not_count_nor_get_charged() {
        let t = tally(&[entry("m", Some("aa"), 100), entry("m", Some("bb"), 3)], |k| k == "aa");
        let m = &t["m"];
        assert_eq!((m.counted, m.over_budget, m.charge_to.as_deref()), (3, 100, Some("bb")));
        let only = tally(&[entry("m", Some("aa"), 100)], |_| true);
        assert_eq!(only["m"].replicas(&settings(1, 4)), 0, "a spent key's backlog spins nothing");
    }

    #[test]
    fn charges_persist_and_sum_per_key_and_period() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gw.db");
        {
            let conn = crate::db::open(&path).expect("opens");
            charge(&conn, "aa", "m", 100, 3600).expect("charged");
            charge(&conn, "aa", "m", 200, 1800).expect("charged");
            charge(&conn, "bb", "m", 150, 60).expect("charged");
        }
        let conn = crate::db::open(&path).expect("opens again");
        assert_eq!(spent(&conn, "aa", 0, 1000).expect("sums"), 5400);
        assert_eq!(spent(&conn, "aa", 150, 1000).expect("sums"), 1800, "earlier periods do not count");
        assert_eq!(spent(&conn, "cc", 0, 1000).expect("sums"), 0);
    }

    #[test]
    fn pending_lines_of_running_batches_are_the_backlog() {
        use crate::batch::store::{self, BatchRow, Line, Status, Work};
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = crate::db::open(&dir.path().join("gw.db")).expect("opens");
        let lines = |model: &str| -> Vec<Line> {
            (1..=3)
                .map(|n| Line {
                    line: n,
                    custom_id: Some(format!("r{n}")),
                    model: Some(model.into()),
                    work: Work::Send(b"{}".to_vec()),
                })
                .collect()
        };
        let row = |id: &str, key: &str| BatchRow {
            id: id.into(),
            owner: key.into(),
            key_hash: Some(key.into()),
            endpoint: "/v1/chat/completions".into(),
            status: "validating".into(),
            expires_at: 10_000,
            ..BatchRow::default()
        };
        let a = store::insert_batch(&mut conn, &row("batch_a", "aa"), &lines("m")).expect("inserted");
        let b = store::insert_batch(&mut conn, &row("batch_b", "bb"), &lines("m")).expect("inserted");
        assert!(backlog(&conn, 0).expect("reads").is_empty(), "validating batches are not backlog yet");
        store::set_status(&conn, a, &[Status::Validating], Status::InProgress, 1).expect("moves");
        store::set_status(&conn, b, &[Status::Validating], Status::InProgress, 1).expect("moves");
        store::set_status(&conn, b, &[Status::InProgress], Status::Cancelling, 2).expect("moves");
        assert_eq!(backlog(&conn, 0).expect("reads"), [entry("m", Some("aa"), 3)]);
        assert!(backlog(&conn, 10_000).expect("reads").is_empty(), "past its window, not backlog");
    }
}
