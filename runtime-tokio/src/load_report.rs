//! Load reports: what a serving node's engine says about its load, pushed to the gateways over
//! the node's own tunnel connections (not through membership gossip), and the table in which a
//! gateway keeps the latest report of each node.
//!
//! # On the wire
//!
//! A report is one datagram on a connection the node opened:
//!
//! ```text
//! [LOAD_REPORT_TAG = 0xF0][LOAD_REPORT_VERSION = 3][postcard(LoadReport)]
//! ```
//!
//! Version 2 added [`LoadReport::leaving_in_ms`] at the end, version 3 [`LoadReport::slots`]
//! after it; older reports (the same fields without them) are still read, as a node that is
//! not leaving and whose slots are unknown.
//!
//! The first byte keeps it apart from the core's membership datagrams, which start with the
//! core's wire version (`tela_core::WIRE_VERSION`, a small number counting up from 1):
//! the connection task hands tagged datagrams to [`LoadReports`] and everything else to the
//! core. A report of another version, or one that does not decode, is dropped without effect
//! (counted in [`LoadReports::rejected`]), so either side can move to a new version first. (A
//! gateway that predates load reports hands them to its core, which drops them as datagrams of
//! an unknown wire version without touching its state, and logs the rejection.) A
//! report holds at most [`MAX_MODELS`] models with names of at most [`MAX_MODEL_NAME`] bytes,
//! well under one datagram ([`MAX_DATAGRAM`]); [`encode`] drops what would not fit.
//!
//! # Order
//!
//! Datagrams may be lost or reordered. A report carries the reporting process's `epoch` (its
//! start, in ms since the UNIX epoch) and a sequence number counting up within it; the table
//! keeps a report only if `(epoch, seq)` is above the one it holds, so an old report never
//! replaces a newer one, and a restarted node's first report replaces its previous life's.
//!
//! # Freshness
//!
//! The table stamps each report with its local arrival time ([`ReceivedLoad::at`]); whoever
//! reads it judges how old is too old (the gateway ignores reports older than a few seconds:
//! `tela_gateway::routing`). Remote timestamps are never compared with local ones.
//!
//! # Handover
//!
//! A node whose walltime is near says so in every report ([`LoadReport::leaving_in_ms`]: how
//! long until it starts draining, from its `--handover-window` on), and gateways then give its
//! conversations to the nodes they will stay on (`tela_core::routing`, handover). Unlike the
//! load, that claim does not go stale after a few seconds: a node that will leave still will
//! when its reports pause. It holds until the moment it named has passed
//! ([`LoadReports::leaving_in`]), when the node is DOWN anyway.
//!
//! It can also stamp each report with a local count at its arrival
//! ([`LoadReports::count_local_with`], [`ReceivedLoad::local_at_arrival`]): a gateway records
//! how many of its own requests were in flight on the node then, so that it can tell the
//! engine's requests from other senders apart from its own, which it counts exactly itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tela_core::{NodeId, MAX_DATAGRAM};
use tela_core::{MAX_MODELS, MAX_MODEL_NAME};

/// First byte of a load-report datagram; the core's datagrams start with its wire version.
pub const LOAD_REPORT_TAG: u8 = 0xF0;
/// Second byte: the report format. Bumped on any incompatible change.
pub const LOAD_REPORT_VERSION: u8 = 3;
/// An older format, still read: a report without [`LoadReport::slots`].
const LOAD_REPORT_VERSION_2: u8 = 2;
/// The oldest format, still read: a report without [`LoadReport::leaving_in_ms`] either.
const LOAD_REPORT_VERSION_1: u8 = 1;

/// Reports older than this are dropped from the table when it is pruned.
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// The table is pruned of forgotten reports every this many arrivals.
const PRUNE_EVERY: u64 = 1024;

/// One model's load at an engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelLoad {
    /// The model (the engine's `model_name` label); empty when the engine does not say, as
    /// the llama.cpp server does not: then it is the whole engine.
    pub model: String,
    /// Requests the engine is running now.
    pub running: u32,
    /// Requests queued at the engine, waiting for a slot or for KV-cache room.
    pub waiting: u32,
    /// KV-cache usage in per-mille (0–1000), when the engine reports it.
    pub kv_permille: Option<u16>,
}

/// What a node's engine reported, as sent to the gateways.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadReport {
    /// The reporting process's start (ms since the UNIX epoch): orders reports across restarts.
    pub epoch: u64,
    /// Counts up by one per report within an epoch.
    pub seq: u64,
    /// Per model; at most [`MAX_MODELS`].
    pub models: Vec<ModelLoad>,
    /// Set while the node hands over, its walltime near: milliseconds from sending until it
    /// starts draining (0 once it has). Gateways rank it last for new conversations.
    pub leaving_in_ms: Option<u64>,
    /// How many requests the engine runs at once, when the node knows (its `--engine-slots`):
    /// a request beyond them queues at the engine. Gateways give a conversation to a node with
    /// room before a full one (`tela_core::routing`, room).
    pub slots: Option<u32>,
}

/// A version-2 report: [`LoadReport`] without `slots`.
#[derive(Deserialize)]
struct LoadReportV2 {
    epoch: u64,
    seq: u64,
    models: Vec<ModelLoad>,
    leaving_in_ms: Option<u64>,
}

/// A version-1 report: [`LoadReport`] without `leaving_in_ms` and `slots`.
#[derive(Deserialize)]
struct LoadReportV1 {
    epoch: u64,
    seq: u64,
    models: Vec<ModelLoad>,
}

/// A node's engine load summed over its models: the engine's slots and KV cache are shared by
/// every model it serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineLoad {
    /// Requests running, over all models.
    pub running: u32,
    /// Requests waiting, over all models.
    pub waiting: u32,
    /// The highest KV-cache usage of any model, per-mille, if any model reports one.
    pub kv_permille: Option<u16>,
    /// Requests the engine runs at once, if the node says ([`LoadReport::slots`]).
    pub slots: Option<u32>,
}

impl LoadReport {
    /// The engine's load over all its models.
    pub fn total(&self) -> EngineLoad {
        let none = EngineLoad { slots: self.slots, ..EngineLoad::default() };
        self.models.iter().fold(none, |acc, m| EngineLoad {
            running: acc.running.saturating_add(m.running),
            waiting: acc.waiting.saturating_add(m.waiting),
            kv_permille: acc.kv_permille.max(m.kv_permille),
            slots: acc.slots,
        })
    }
}

/// Why a load-report datagram was dropped. Dropping never changes the table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoadReportError {
    /// The datagram does not start with [`LOAD_REPORT_TAG`].
    #[error("not a load report")]
    NotAReport,
    /// Longer than any datagram may be.
    #[error("load report of {0} bytes exceeds the {MAX_DATAGRAM}-byte limit")]
    Oversized(usize),
    /// Another report format (a newer or older release).
    #[error("load report version {0} not supported (this node reads {LOAD_REPORT_VERSION})")]
    UnsupportedVersion(u8),
    /// The body does not decode, or breaks the limits.
    #[error("malformed load report: {0}")]
    Malformed(String),
}

/// Whether `datagram` is a load report (rather than a membership datagram for the core).
pub fn is_load_report(datagram: &[u8]) -> bool {
    datagram.first() == Some(&LOAD_REPORT_TAG)
}

/// Encodes `report` as one datagram; models beyond [`MAX_MODELS`] and names longer than
/// [`MAX_MODEL_NAME`] are left out, so the result always fits [`MAX_DATAGRAM`].
pub fn encode(report: &LoadReport) -> Bytes {
    let mut bounded = report.clone();
    bounded.models.retain(|m| m.model.len() <= MAX_MODEL_NAME);
    bounded.models.truncate(MAX_MODELS);
    let mut out = vec![LOAD_REPORT_TAG, LOAD_REPORT_VERSION];
    // Serialising into a Vec cannot fail for these types.
    out.extend(postcard::to_allocvec(&bounded).unwrap_or_default());
    debug_assert!(out.len() <= MAX_DATAGRAM, "a bounded report fits one datagram");
    Bytes::from(out)
}

/// Decodes one load-report datagram; never panics.
pub fn decode(datagram: &[u8]) -> Result<LoadReport, LoadReportError> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(LoadReportError::Oversized(datagram.len()));
    }
    fn body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, LoadReportError> {
        let (value, rest): (T, _) =
            postcard::take_from_bytes(body).map_err(|e| LoadReportError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(LoadReportError::Malformed(format!("{} trailing bytes", rest.len())));
        }
        Ok(value)
    }
    let report = match datagram {
        [LOAD_REPORT_TAG, LOAD_REPORT_VERSION, rest @ ..] => body::<LoadReport>(rest)?,
        [LOAD_REPORT_TAG, LOAD_REPORT_VERSION_2, rest @ ..] => {
            let LoadReportV2 { epoch, seq, models, leaving_in_ms } = body(rest)?;
            LoadReport { epoch, seq, models, leaving_in_ms, slots: None }
        }
        [LOAD_REPORT_TAG, LOAD_REPORT_VERSION_1, rest @ ..] => {
            let LoadReportV1 { epoch, seq, models } = body(rest)?;
            LoadReport { epoch, seq, models, leaving_in_ms: None, slots: None }
        }
        [LOAD_REPORT_TAG, version, ..] => return Err(LoadReportError::UnsupportedVersion(*version)),
        _ => return Err(LoadReportError::NotAReport),
    };
    if report.models.len() > MAX_MODELS {
        return Err(LoadReportError::Malformed(format!("{} models (at most {MAX_MODELS})", report.models.len())));
    }
    if report.models.iter().any(|m| m.model.len() > MAX_MODEL_NAME || m.kv_permille.is_some_and(|k| k > 1000)) {
        return Err(LoadReportError::Malformed("a model name or KV usage out of range".into()));
    }
    Ok(report)
}

/// A report as received: the report and when it arrived here.
#[derive(Clone, Debug)]
pub struct ReceivedLoad {
    /// The report.
    pub report: LoadReport,
    /// Its local arrival time.
    pub at: Instant,
    /// The local count for the sending node when it arrived (see
    /// [`LoadReports::count_local_with`]; 0 without one).
    pub local_at_arrival: u32,
}

/// A node's fresh engine load, with the local count stamped on its report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreshLoad {
    /// The engine's load over its models.
    pub engine: EngineLoad,
    /// [`ReceivedLoad::local_at_arrival`].
    pub local_at_arrival: u32,
}

/// Counts something local per node (a gateway: its own requests in flight on the node).
type LocalCount = Box<dyn Fn(&NodeId) -> u32 + Send + Sync>;

impl ReceivedLoad {
    /// How old the report is at `now`.
    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.at)
    }
}

/// The latest load report of each node that sent one, shared between the connection tasks that
/// receive them and whoever routes by them. Holds one report per node; reports not refreshed
/// for a minute are forgotten.
#[derive(Default)]
pub struct LoadReports {
    latest: Mutex<HashMap<NodeId, ReceivedLoad>>,
    local_count: OnceLock<LocalCount>,
    arrivals: AtomicU64,
    rejected: AtomicU64,
}

impl std::fmt::Debug for LoadReports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadReports").field("latest", &self.latest).finish_non_exhaustive()
    }
}

impl LoadReports {
    /// Stamps every report from now on with `count(node)` at its arrival
    /// ([`ReceivedLoad::local_at_arrival`]). Set once; later calls are ignored.
    pub fn count_local_with(&self, count: impl Fn(&NodeId) -> u32 + Send + Sync + 'static) {
        let _ = self.local_count.set(Box::new(count));
    }

    /// Takes a datagram from `from` that arrived at `now`; keeps it if it decodes and is newer
    /// than the report held. An error leaves the table as it was.
    pub fn receive(&self, from: NodeId, datagram: &[u8], now: Instant) -> Result<(), LoadReportError> {
        let report = decode(datagram).inspect_err(|_| {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        })?;
        let arrivals = self.arrivals.fetch_add(1, Ordering::Relaxed) + 1;
        // Before taking the table's lock: the count may take a lock of its own.
        let local_at_arrival = self.local_count.get().map_or(0, |count| count(&from));
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        if arrivals % PRUNE_EVERY == 0 {
            latest.retain(|_, r| r.age(now) < FORGET_AFTER);
        }
        match latest.get(&from) {
            Some(held) if (held.report.epoch, held.report.seq) >= (report.epoch, report.seq) => {}
            _ => {
                latest.insert(from, ReceivedLoad { report, at: now, local_at_arrival });
            }
        }
        Ok(())
    }

    /// `node`'s engine load, if its latest report is younger than `max_age` at `now`.
    pub fn fresh(&self, node: &NodeId, now: Instant, max_age: Duration) -> Option<FreshLoad> {
        let latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        latest
            .get(node)
            .filter(|r| r.age(now) < max_age)
            .map(|r| FreshLoad { engine: r.report.total(), local_at_arrival: r.local_at_arrival })
    }

    /// How long until `node` starts draining, if its latest report, however old, says it hands
    /// over: the time it named less the report's age, zero once that has passed. The claim
    /// lapses `grace` after the moment it named (the node is DOWN by then, and a later process
    /// with the same identity must not inherit it).
    pub fn leaving_in(&self, node: &NodeId, now: Instant, grace: Duration) -> Option<Duration> {
        let latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        let got = latest.get(node)?;
        let named = Duration::from_millis(got.report.leaving_in_ms?);
        let age = got.age(now);
        (age < named.saturating_add(grace)).then(|| named.saturating_sub(age))
    }

    /// `node`'s latest report, however old.
    pub fn latest(&self, node: &NodeId) -> Option<ReceivedLoad> {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner).get(node).cloned()
    }

    /// Datagrams dropped because they did not decode (another version, malformed).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(epoch: u64, seq: u64, running: u32) -> LoadReport {
        LoadReport {
            epoch,
            seq,
            models: vec![ModelLoad { model: "llama".into(), running, waiting: 2, kv_permille: Some(400) }],
            leaving_in_ms: None,
            slots: None,
        }
    }

    #[test]
    fn reports_round_trip_and_stay_apart_from_core_datagrams() {
        let r = LoadReport {
            epoch: 1_733_000_000_000,
            seq: 7,
            models: vec![
                ModelLoad { model: "a".into(), running: 3, waiting: 1, kv_permille: Some(250) },
                ModelLoad { model: "b".into(), running: 1, waiting: 0, kv_permille: Some(900) },
                ModelLoad { model: String::new(), running: 0, waiting: 4, kv_permille: None },
            ],
            leaving_in_ms: Some(240_000),
            slots: Some(16),
        };
        let bytes = encode(&r);
        assert!(is_load_report(&bytes));
        assert!(bytes.len() < 64, "a report is tiny: {} bytes", bytes.len());
        assert_eq!(decode(&bytes), Ok(r.clone()));
        assert_eq!(r.total(), EngineLoad { running: 4, waiting: 5, kv_permille: Some(900), slots: Some(16) });
        assert_ne!(LOAD_REPORT_TAG, tela_core::WIRE_VERSION);
        assert!(!is_load_report(&[tela_core::WIRE_VERSION, 0, 0]));
    }

    #[test]
    fn the_largest_report_fits_one_datagram() {
        let models = (0..MAX_MODELS + 3)
            .map(|i| ModelLoad {
                model: format!("{i}").repeat(MAX_MODEL_NAME + usize::from(i == 0)),
                running: u32::MAX,
                waiting: u32::MAX,
                kv_permille: Some(1000),
            })
            .collect();
        let bytes = encode(&LoadReport {
            epoch: u64::MAX,
            seq: u64::MAX,
            models,
            leaving_in_ms: Some(u64::MAX),
            slots: Some(u32::MAX),
        });
        assert!(bytes.len() <= MAX_DATAGRAM, "{} bytes", bytes.len());
        let back = decode(&bytes).expect("decodes");
        assert_eq!(back.models.len(), MAX_MODELS, "the over-long name is left out, then the list is capped");
        assert!(back.models.iter().all(|m| m.model.len() == MAX_MODEL_NAME));
    }

    #[test]
    fn bad_datagrams_are_typed_errors_and_change_nothing() {
        let table = LoadReports::default();
        let node = NodeId([1; 16]);
        let now = Instant::now();
        let good = encode(&report(1, 1, 3));
        let mut other_version = good.to_vec();
        other_version[1] = 4;
        let mut trailing = good.to_vec();
        trailing.push(0);
        let mut kv_out_of_range = report(1, 1, 3);
        kv_out_of_range.models[0].kv_permille = Some(1001);
        for (bytes, want) in [
            (vec![], LoadReportError::NotAReport),
            (vec![3, 1, 2], LoadReportError::NotAReport),
            (vec![LOAD_REPORT_TAG], LoadReportError::NotAReport),
            (other_version, LoadReportError::UnsupportedVersion(4)),
            (vec![LOAD_REPORT_TAG; MAX_DATAGRAM + 1], LoadReportError::Oversized(MAX_DATAGRAM + 1)),
        ] {
            assert_eq!(table.receive(node, &bytes, now), Err(want));
        }
        for bytes in [trailing, good[..good.len() - 1].to_vec(), encode(&kv_out_of_range).to_vec()] {
            assert!(matches!(table.receive(node, &bytes, now), Err(LoadReportError::Malformed(_))));
        }
        assert!(table.latest(&node).is_none());
        assert_eq!(table.rejected(), 8);
    }

    #[test]
    fn version_2_reports_are_read_with_unknown_slots() {
        #[derive(Serialize)]
        struct V2 {
            epoch: u64,
            seq: u64,
            models: Vec<ModelLoad>,
            leaving_in_ms: Option<u64>,
        }
        let r = LoadReport { leaving_in_ms: Some(9), ..report(5, 6, 1) };
        let mut bytes = vec![LOAD_REPORT_TAG, 2];
        let v2 = V2 { epoch: 5, seq: 6, models: r.models.clone(), leaving_in_ms: Some(9) };
        bytes.extend(postcard::to_allocvec(&v2).expect("encodes"));
        assert_eq!(decode(&bytes), Ok(r.clone()));
        let mut v3 = encode(&LoadReport { slots: Some(1), ..r }).to_vec();
        v3[1] = 2;
        assert!(matches!(decode(&v3), Err(LoadReportError::Malformed(_))), "a newer body is refused, not misread");
    }

    #[test]
    fn version_1_reports_are_read_as_not_leaving() {
        #[derive(Serialize)]
        struct V1 {
            epoch: u64,
            seq: u64,
            models: Vec<ModelLoad>,
        }
        let r = report(5, 6, 1);
        let mut bytes = vec![LOAD_REPORT_TAG, 1];
        bytes.extend(postcard::to_allocvec(&V1 { epoch: 5, seq: 6, models: r.models.clone() }).expect("encodes"));
        assert_eq!(decode(&bytes), Ok(r.clone()));
        // A newer body under the version-1 byte has trailing fields: refused, not misread.
        let mut v3 = encode(&LoadReport { leaving_in_ms: Some(9), ..r }).to_vec();
        v3[1] = 1;
        assert!(matches!(decode(&v3), Err(LoadReportError::Malformed(_))));
    }

    #[test]
    fn a_handover_holds_until_the_moment_it_named_even_when_reports_pause() {
        let table = LoadReports::default();
        let node = NodeId([5; 16]);
        let grace = Duration::from_secs(3);
        let t0 = Instant::now();
        table.receive(node, &encode(&report(1, 1, 0)), t0).expect("kept");
        assert_eq!(table.leaving_in(&node, t0, grace), None, "not leaving");
        let leaving = LoadReport { leaving_in_ms: Some(10_000), ..report(1, 2, 0) };
        table.receive(node, &encode(&leaving), t0).expect("kept");
        assert_eq!(table.leaving_in(&node, t0, grace), Some(Duration::from_secs(10)));
        // Long after the load went stale, the node still leaves, sooner.
        let t6 = t0 + Duration::from_secs(6);
        assert_eq!(table.fresh(&node, t6, grace), None);
        assert_eq!(table.leaving_in(&node, t6, grace), Some(Duration::from_secs(4)));
        // Past the moment it named, it holds for the grace and then lapses.
        assert_eq!(table.leaving_in(&node, t0 + Duration::from_secs(12), grace), Some(Duration::ZERO));
        assert_eq!(table.leaving_in(&node, t0 + Duration::from_secs(13), grace), None);
        assert_eq!(table.leaving_in(&NodeId([6; 16]), t0, grace), None, "no report");
    }

    #[test]
    fn newer_reports_win_and_old_ones_go_stale() {
        let table = LoadReports::default();
        let node = NodeId([2; 16]);
        let t0 = Instant::now();
        table.receive(node, &encode(&report(10, 5, 3)), t0).expect("kept");
        // Reordered: an older report arriving later does not replace the newer one.
        table.receive(node, &encode(&report(10, 4, 9)), t0).expect("decodes");
        assert_eq!(table.fresh(&node, t0, Duration::from_secs(3)).map(|l| l.engine.running), Some(3));
        // A restarted node (later epoch) starts its count again and still wins.
        let t1 = t0 + Duration::from_secs(1);
        table.receive(node, &encode(&report(11, 0, 1)), t1).expect("kept");
        assert_eq!(table.fresh(&node, t1, Duration::from_secs(3)).map(|l| l.engine.running), Some(1));
        // Three seconds after it arrived, the report no longer counts.
        let t4 = t1 + Duration::from_secs(3);
        assert_eq!(
            table.fresh(&node, t4 - Duration::from_millis(1), Duration::from_secs(3)).map(|l| l.engine.running),
            Some(1)
        );
        assert_eq!(table.fresh(&node, t4, Duration::from_secs(3)), None);
        assert_eq!(table.latest(&node).map(|r| r.age(t4)), Some(Duration::from_secs(3)), "still shown, with its age");
        assert!(table.fresh(&NodeId([3; 16]), t1, Duration::from_secs(3)).is_none());
    }

    #[test]
    fn reports_are_stamped_with_the_local_count_at_arrival() {
        let table = LoadReports::default();
        let node = NodeId([4; 16]);
        let t0 = Instant::now();
        table.receive(node, &encode(&report(1, 1, 3)), t0).expect("kept");
        assert_eq!(table.latest(&node).map(|r| r.local_at_arrival), Some(0), "no count set");
        table.count_local_with(move |id| if *id == node { 2 } else { 9 });
        table.receive(node, &encode(&report(1, 2, 3)), t0).expect("kept");
        let fresh = table.fresh(&node, t0, Duration::from_secs(3)).expect("fresh");
        assert_eq!(fresh.local_at_arrival, 2);
        assert_eq!(fresh.engine, EngineLoad { running: 3, waiting: 2, kv_permille: Some(400), slots: None });
    }
}
