//! The batch runner: one task per gateway that moves every unfinished batch in the database
//! through its statuses and sends its requests to nodes with room.
//!
//! Each round (on a wake-up from the endpoints, when a request ends, and every [`TICK`]):
//!
//! - `validating` → `in_progress` (the lines were checked and stored when the batch was
//!   created), or `failed` when validation refused the whole file;
//! - `in_progress`: pending lines are sent, oldest batch first, while some node serving their
//!   model has room; once no line is pending or in flight → `finalizing` → `completed`, with
//!   the output and error files written; past its completion window it stops sending and, its
//!   requests in flight over, ends `expired`;
//! - `cancelling`: nothing new is sent; once its requests in flight are over → `cancelled`.
//!
//! A line is in flight only in memory: a gateway killed mid-batch restarts with those lines
//! still pending in the database, and this task sends them again (see [`super::store`]).
//!
//! # Spare capacity only
//!
//! Batch work never waits in front of an interactive request: interactive requests are
//! forwarded as they arrive, and batch requests are only sent to a node whose load leaves
//! room. A node's interactive load is its load as routing sees it
//! ([`crate::routing::node_load`]: this gateway's in-flight requests plus what the engine's own
//! load report says others sent) less this runner's batch requests on it; with
//! [`BatchConfig::node_slots`](super::BatchConfig::node_slots) `= s`, a node with `i`
//! interactive requests takes at most `s − i` batch requests — none once `i ≥ s`. A node whose
//! engine runs fewer requests at once than that (its `--engine-slots`, or an engine with
//! requests waiting: [`crate::routing::engine_slots`]) has that many slots instead, so batch
//! work never queues at the engine in front of an interactive request. Since batch
//! requests count in the node's load, interactive routing also prefers nodes without batch
//! work. A line that could not be sent (the node broke off, drained, answered 502/503/429) is
//! tried again, on any node with room, after [`RETRY_AFTER`] doubled with each try, up to
//! [`MAX_TRIES`] times before it goes to the error file. A line whose model no node with a
//! tunnel here serves just waits (until its batch expires): no try is spent.
//!
//! Batch usage is counted like interactive usage: a row per answered request in the ledger
//! (written with the result, marked with `batch_id`) and the per-key and per-model token
//! counters of `/metrics`.
//!
//! # The key's limits
//!
//! Batch requests never take from the key's interactive `rpm`, `tpm` or `concurrent`. Before
//! each line is sent, the key's counters are asked ([`KeyCounters::admit_batch`], rules in
//! [`crate::limits`]): under the key's `batch_tpm` a line that does not fit waits, and the
//! batch's later lines with it (so the batch keeps its order), until a later round finds room;
//! once the key's `budget_tokens` or `batch_budget_tokens` is spent, each line still pending
//! goes to the error file with code `budget_exceeded` when its turn comes. The key is found by
//! the hash digits the batch was created with, in the key file as it is now (a key since
//! removed from the file is not limited here: it cannot create batches any more, but its
//! running ones finish).
//!
//! [`KeyCounters::admit_batch`]: crate::limits::KeyCounters::admit_batch

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tela_core::routing::Prefix;
use tela_core::NodeId;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::store::{self, BatchRow, Pending, Status};
use super::{now_s, BatchShared};
use crate::auth::{Access, KeyEntry};
use crate::limits::{BatchAdmission, BatchCharge, Now};
use crate::routing::{Choice, Target};
use crate::service::Shared;

/// How often the runner looks again without being woken.
pub const TICK: Duration = Duration::from_millis(250);

/// Sends of one line before it goes to the error file.
pub const MAX_TRIES: u32 = 5;

/// The pause before a line that was not answered is sent again, doubled with each try.
pub const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The least time between two rounds.
const MIN_ROUND: Duration = Duration::from_millis(20);

/// Pending lines read at once per batch.
const PAGE: usize = 256;

/// How often expired files are deleted.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Starts the runner; it stops when `stop` is cancelled or the handle dropped.
pub fn start(shared: Arc<Shared>, batch: Arc<BatchShared>, stop: CancellationToken) -> AbortOnDropHandle<()> {
    let runner = Runner {
        shared,
        batch,
        in_flight: HashMap::new(),
        on_node: Arc::default(),
        tries: HashMap::new(),
        tasks: JoinSet::new(),
    };
    AbortOnDropHandle::new(tokio::spawn(runner.run(stop)))
}

/// How one sent line ended.
struct Done {
    seq: i64,
    line: i64,
    custom_id: String,
    /// Why it must be sent again, if it must.
    retry: Option<String>,
}

/// Batch requests in flight per node.
type OnNode = Arc<Mutex<HashMap<NodeId, u32>>>;

/// One batch request counted on its node until dropped.
struct Slot {
    on_node: OnNode,
    node: NodeId,
}

impl Slot {
    fn take(on_node: &OnNode, node: NodeId) -> Slot {
        *on_node.lock().unwrap_or_else(PoisonError::into_inner).entry(node).or_default() += 1;
        Slot { on_node: on_node.clone(), node }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.on_node.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.node) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.node);
            }
        }
    }
}

struct Runner {
    shared: Arc<Shared>,
    batch: Arc<BatchShared>,
    /// Lines in flight, per batch.
    in_flight: HashMap<i64, HashSet<i64>>,
    on_node: OnNode,
    /// Failed sends per (batch, line), and when the line may be sent again.
    tries: HashMap<(i64, i64), (u32, Instant)>,
    tasks: JoinSet<Done>,
}

impl Runner {
    async fn run(mut self, stop: CancellationToken) {
        let mut next_sweep = Instant::now();
        let mut last_round: Option<Instant> = None;
        loop {
            // Requests ending one by one must not each cost a round of queries.
            if let Some(wait) = last_round.map(|t| MIN_ROUND.saturating_sub(t.elapsed())) {
                tokio::time::sleep(wait).await;
            }
            last_round = Some(Instant::now());
            if Instant::now() >= next_sweep {
                next_sweep = Instant::now() + SWEEP_EVERY;
                match self.batch.db(|c| store::delete_expired_files(c, now_s())).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("batch: deleted {n} expired file(s)"),
                    Err(e) => tracing::warn!("batch: cannot delete expired files: {e}"),
                }
            }
            if let Err(e) = self.round().await {
                tracing::error!("batch: the gateway's database failed: {e}; batches wait until it works again");
            }
            tokio::select! {
                () = stop.cancelled() => break,
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Ok(done) = done {
                        self.ended(done).await;
                    }
                    while let Some(Ok(done)) = self.tasks.try_join_next() {
                        self.ended(done).await;
                    }
                }
                () = self.batch.wake.notified() => {}
                () = tokio::time::sleep(TICK) => {}
            }
        }
        // Requests in flight are abandoned: their lines stay pending for the next start.
        self.tasks.abort_all();
    }

    fn flying(&self, seq: i64) -> usize {
        self.in_flight.get(&seq).map_or(0, HashSet::len)
    }

    async fn round(&mut self) -> rusqlite::Result<()> {
        let active = self.batch.db(|c| store::active(c)).await?;
        let now = now_s();
        for b in active {
            let seq = b.seq;
            match b.status() {
                Status::Validating => {
                    let to = if b.errors.is_some() { Status::Failed } else { Status::InProgress };
                    self.batch.db(move |c| store::set_status(c, seq, &[Status::Validating], to, now)).await?;
                    self.batch.wake.notify_one();
                }
                Status::InProgress if now >= b.expires_at => {
                    if self.flying(seq) == 0 {
                        self.finalize(b, Status::Expired).await?;
                    }
                }
                Status::InProgress => {
                    self.send_pending(&b).await?;
                    if self.flying(seq) == 0 && !self.batch.db(move |c| store::has_pending(c, seq)).await? {
                        self.batch
                            .db(move |c| store::set_status(c, seq, &[Status::InProgress], Status::Finalizing, now))
                            .await?;
                        self.finalize(b, Status::Completed).await?;
                    }
                }
                Status::Finalizing => self.finalize(b, Status::Completed).await?,
                Status::Cancelling => {
                    if self.flying(seq) == 0 {
                        self.finalize(b, Status::Cancelled).await?;
                    }
                }
                Status::Failed | Status::Completed | Status::Expired | Status::Cancelled => {}
            }
        }
        Ok(())
    }

    async fn finalize(&mut self, b: BatchRow, status: Status) -> rusqlite::Result<()> {
        let now = now_s();
        let expires = self.batch.file_expiry_from(now);
        let id = b.id.clone();
        self.in_flight.remove(&b.seq);
        self.tries.retain(|(seq, _), _| *seq != b.seq);
        self.batch.db(move |c| store::finalize(c, &b, status, now, expires)).await?;
        tracing::info!("batch {id} {}", status.as_str());
        Ok(())
    }

    /// The entry of the key that created `b`, if it is in the key file and has limits that
    /// apply to batches.
    fn limited_key(&self, b: &BatchRow) -> Option<Arc<KeyEntry>> {
        let Access::Keys(keys) = &self.shared.access else { return None };
        let prefix = b.key_hash.as_deref()?;
        keys.load().entry_by_hash_prefix(prefix).filter(|e| e.limits.limits_batches()).cloned()
    }

    /// Sends pending lines of `b` while nodes have room and the key's batch limits allow.
    async fn send_pending(&mut self, b: &BatchRow) -> rusqlite::Result<()> {
        let seq = b.seq;
        let key = self.limited_key(b);
        let mut after = 0;
        let mut blocked: HashSet<String> = HashSet::new();
        loop {
            let page = self.batch.db(move |c| store::pending(c, seq, after, PAGE)).await?;
            let full = page.len() == PAGE;
            let mut sent = 0;
            for p in page {
                after = p.line;
                if self.in_flight.get(&seq).is_some_and(|s| s.contains(&p.line))
                    || blocked.contains(&p.model)
                    || self.tries.get(&(seq, p.line)).is_some_and(|(_, at)| *at > Instant::now())
                {
                    continue;
                }
                let charge = match &key {
                    None => None,
                    Some(entry) => {
                        let cost = crate::limits::estimate_tokens(&b.endpoint, &p.body);
                        match entry.counters().admit_batch(&entry.name, &entry.limits, cost, Now::current()) {
                            BatchAdmission::Send(charge) => Some(charge),
                            // Paced: the next round (at most a TICK away) asks again.
                            BatchAdmission::Wait(_) => return Ok(()),
                            BatchAdmission::OverBudget(message) => {
                                let result =
                                    store::error_line(Some(&p.custom_id), "budget_exceeded", &message, Some(p.line));
                                let line = p.line;
                                self.batch
                                    .db(move |c| store::finish_line(c, seq, line, false, &result, None, ""))
                                    .await?;
                                continue;
                            }
                        }
                    }
                };
                match self.pick(&p.model) {
                    Some(choice) => {
                        self.spawn(b, p, choice, charge);
                        sent += 1;
                    }
                    None => {
                        blocked.insert(p.model.clone());
                    }
                }
            }
            if !full || sent == 0 {
                return Ok(());
            }
        }
    }

    /// A node serving `model` with room for one more batch request, if any.
    fn pick(&self, model: &str) -> Option<Choice> {
        let shared = &self.shared;
        let view = shared.anchor_view();
        let snapshot = view.snapshot();
        let prefix = Prefix::default();
        let mut full: Vec<NodeId> = Vec::new();
        for _ in 0..64 {
            let choice = crate::routing::choose(
                &view,
                &snapshot,
                &shared.load,
                &shared.silent,
                shared.routing,
                Target { model, prefix: &prefix },
                &full,
            )
            .ok()?;
            let mine =
                self.on_node.lock().unwrap_or_else(PoisonError::into_inner).get(&choice.node).copied().unwrap_or(0);
            let host = crate::routing::host_state(&view, &shared.load, &choice.node, Instant::now());
            let interactive = host.in_flight.saturating_sub(mine);
            let slots = host.slots.map_or(self.batch.config.node_slots, |s| s.min(self.batch.config.node_slots));
            if mine < slots.saturating_sub(interactive) {
                return Some(choice);
            }
            full.push(choice.node);
        }
        None
    }

    /// Sends line `p` of `b` to `choice`'s node; `charge`, the line's charge on its key, is
    /// settled when a node answers it and refunded when none does.
    fn spawn(&mut self, b: &BatchRow, p: Pending, choice: Choice, charge: Option<BatchCharge>) {
        self.in_flight.entry(b.seq).or_default().insert(p.line);
        let slot = Slot::take(&self.on_node, choice.node);
        let (shared, batch) = (self.shared.clone(), self.batch.clone());
        let b = b.clone();
        self.tasks.spawn(async move {
            let _slot = slot;
            let arrived = SystemTime::now();
            let started = Instant::now();
            let (seq, line, custom_id) = (b.seq, p.line, p.custom_id.clone());
            let answer = match super::dispatch::send(&shared, &choice, &b.endpoint, &p.body).await {
                Ok(a) => a,
                Err(retry) => return Done { seq, line, custom_id, retry: Some(retry.0) },
            };
            let ok = (200..300).contains(&answer.status);
            if let (Some(charge), true) = (charge, ok) {
                let usage = &answer.body["usage"];
                let total = usage["total_tokens"].as_u64().or_else(|| {
                    let prompt = usage["prompt_tokens"].as_u64()?;
                    Some(prompt.saturating_add(usage["completion_tokens"].as_u64().unwrap_or(0)))
                });
                charge.answered(total, Now::current());
            }
            let request_id = super::new_id("req_");
            let result = store::response_line(&p.custom_id, answer.status, &request_id, &answer.body);
            let usage = &answer.body["usage"];
            let tokens = |k: &str| usage[k].as_u64();
            let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            let row = crate::ledger::Row {
                time_ms: crate::ledger::unix_ms(arrived),
                key_name: b.key_name.clone(),
                key_hash: b.key_hash.clone(),
                account: b.account.clone(),
                model: p.model.clone(),
                node: Some(choice.node.to_string()),
                endpoint: b.endpoint.clone(),
                stream: false,
                status: answer.status,
                outcome: "complete",
                prompt_tokens: tokens("prompt_tokens"),
                completion_tokens: tokens("completion_tokens").or_else(|| tokens("prompt_tokens").map(|_| 0)),
                latency_ms: millis(started.elapsed()),
                ttft_ms: Some(millis(answer.first_byte)),
                provider: None,
            };
            let id = b.id.clone();
            let counted = (row.prompt_tokens.unwrap_or(0), row.completion_tokens.unwrap_or(0));
            match batch.db(move |c| store::finish_line(c, seq, line, ok, &result, Some(&row), &id)).await {
                Ok(true) => {
                    count(&shared, b.key_name.as_deref(), &p.model, counted);
                    Done { seq, line, custom_id, retry: None }
                }
                Ok(false) => Done { seq, line, custom_id, retry: None },
                Err(e) => Done { seq, line, custom_id, retry: Some(format!("its result could not be written: {e}")) },
            }
        });
    }

    async fn ended(&mut self, done: Done) {
        if let Some(set) = self.in_flight.get_mut(&done.seq) {
            set.remove(&done.line);
        }
        let Some(reason) = done.retry else {
            self.tries.remove(&(done.seq, done.line));
            return;
        };
        let (tries, again_at) = self.tries.entry((done.seq, done.line)).or_insert((0, Instant::now()));
        *tries += 1;
        // A node that fails at once must not use up a line's tries in a few milliseconds.
        *again_at = Instant::now() + RETRY_AFTER * 2u32.pow((*tries - 1).min(6));
        tracing::info!("batch request '{}' (try {tries}) was not answered: {reason}", done.custom_id);
        if *tries < MAX_TRIES {
            return;
        }
        self.tries.remove(&(done.seq, done.line));
        let message = format!("the request was sent {MAX_TRIES} times and never answered; the last time: {reason}");
        let result = store::error_line(Some(&done.custom_id), "request_failed", &message, Some(done.line));
        let (seq, line) = (done.seq, done.line);
        if let Err(e) = self.batch.db(move |c| store::finish_line(c, seq, line, false, &result, None, "")).await {
            tracing::error!("batch: cannot record a failed request: {e}");
        }
    }
}

/// Counts an answered batch request's tokens in `/metrics`, per model and key.
fn count(shared: &Shared, key: Option<&str>, model: &str, (prompt, completion): (u64, u64)) {
    use crate::metrics::{KeyLabel, KeyTokenLabels, ModelTokenLabels};
    let metrics = &shared.metrics;
    for (kind, n) in [("prompt", prompt), ("completion", completion)] {
        if n == 0 {
            continue;
        }
        metrics.model_tokens.get_or_create(&ModelTokenLabels { model: model.to_string(), kind: kind.into() }).inc_by(n);
        if let Some(key) = key {
            metrics.key_tokens.get_or_create(&KeyTokenLabels { key: key.to_string(), kind: kind.into() }).inc_by(n);
        }
    }
    if let Some(key) = key {
        metrics.key_requests.get_or_create(&KeyLabel { key: key.to_string() }).inc();
    }
}
