//! The spin task: every `interval`, and at once when a request starts waiting, it refreshes
//! its jobs from the batch system, reads the batch backlog, builds the [`SpinView`], calls the
//! core's [`Spinner::decide`] and carries out the commands (submit, cancel, drain), backing off
//! after refused submissions.

use super::*;

/// The longest pause after failed submissions.
const MAX_SUBMIT_BACKOFF: Duration = Duration::from_secs(60);

/// The spin task: the plan, the spinner, the jobs it submitted and what it reads demand from.
pub(super) struct SpinTask {
    /// After a failed submission no decision is made before this instant; the pause doubles
    /// with every failure in a row (from the interval up to [`MAX_SUBMIT_BACKOFF`]), so that a
    /// refusing batch system is not asked again on every waiting request.
    pub(super) backoff: Option<(Instant, Duration)>,
    pub(super) plan: SpinPlan,
    pub(super) batch: Arc<dyn BatchSystem>,
    pub(super) spinner: Spinner,
    pub(super) jobs: BTreeMap<JobId, TrackedJob>,
    /// The batch backlog per model, read before each decision.
    pub(super) backlog: BTreeMap<String, ModelBacklog>,
    pub(super) spin: Arc<SpinShared>,
    pub(super) parts: GatewayParts,
}

impl SpinTask {
    pub(super) async fn run(mut self) {
        let mut last = Instant::now() - MIN_DECISION_GAP;
        loop {
            let gap = MIN_DECISION_GAP.saturating_sub(last.elapsed());
            tokio::select! {
                _ = self.parts.stop.cancelled() => return,
                _ = tokio::time::sleep(self.plan.interval) => {}
                _ = async { self.spin.wake.notified().await; tokio::time::sleep(gap).await } => {}
            }
            if self.backoff.is_some_and(|(until, _)| Instant::now() < until) {
                continue;
            }
            last = Instant::now();
            self.tick().await;
        }
    }

    fn error(&self, op: &'static str, message: String) {
        tracing::warn!("spinning: {message}");
        self.parts.metrics.spin_batch_errors.get_or_create(&OpLabel { op: op.into() }).inc();
        self.spin.report.lock().unwrap_or_else(PoisonError::into_inner).last_error = Some(message);
    }

    /// One decision: refresh the jobs, decide, execute.
    async fn tick(&mut self) {
        self.refresh_jobs().await;
        self.read_backlog().await;
        let view = self.view();
        let now = self.parts.view.clock().now();
        let commands = self.spinner.decide(now, &view);
        let mut refused = false;
        for command in commands {
            // One refusal is enough: the rest of this decision's submissions wait for the next
            // try (the spinner counts them as ended, so it asks again).
            if refused && matches!(command, SpinCommand::Submit { .. }) {
                continue;
            }
            refused |= !self.execute(command).await;
        }
        let mut report = self.spin.report.lock().unwrap_or_else(PoisonError::into_inner);
        report.decisions += 1;
        report.models = self
            .plan
            .models
            .iter()
            .map(|m| {
                let s = self.spinner.status(m.name()).cloned().unwrap_or_default();
                (m.name().to_string(), (s.wanted, s.supply, s.blocked.as_ref().map(blocked_text)))
            })
            .collect();
        report.jobs = self.jobs.iter().map(|(id, j)| (*id, j.clone())).collect();
        report.live_jobs = self.spinner.live_jobs();
        report.budget_used_gpu_secs = self.spinner.budget_used_gpu_secs();
        report.backlog = self.backlog.clone();
        for m in &self.plan.models {
            let queued = self.spin.room.queued(m.name());
            self.parts
                .metrics
                .cold_start_queued
                .get_or_create(&ModelLabel { model: m.name().into() })
                .set(queued as i64);
        }
    }

    /// Asks the batch system about every job it has an id for; forgets the ended ones.
    async fn refresh_jobs(&mut self) {
        let ids: Vec<BatchJobId> = self.jobs.values().filter_map(|j| j.batch).collect();
        if ids.is_empty() {
            return;
        }
        match self.batch.jobs(&ids).await {
            Ok(listed) => {
                for job in listed {
                    let Some(tracked) = self.jobs.values_mut().find(|j| j.batch == Some(job.id)) else { continue };
                    if tracked.state != Some(job.state) {
                        tracing::info!(
                            model = tracked.model,
                            "job {} ({}) is {}{}",
                            job.id,
                            tracked.model,
                            job.raw_state,
                            if job.hosts.is_empty() { String::new() } else { format!(" on {}", job.hosts.join(",")) }
                        );
                    }
                    tracked.state = Some(job.state);
                    tracked.raw_state = job.raw_state.clone();
                    if let Some(node) = job.node() {
                        tracked.node = Some(node);
                    }
                    if !job.hosts.is_empty() {
                        tracked.hosts = job.hosts.clone();
                    }
                }
            }
            Err(e) => self.error("jobs", format!("cannot list the jobs: {e}")),
        }
        self.jobs.retain(|_, j| j.state != Some(BatchState::Ended));
    }

    /// Reads the batch backlog of the spinnable models, leaving out keys over their
    /// `batch_gpu_hours` ([`batch_demand`]); on a database error the last reading stays.
    async fn read_backlog(&mut self) {
        let (Some(_), Some(batch)) = (self.plan.batch, self.parts.batch.clone()) else { return };
        // The budgets of the keys now in the key file: (hash prefix match, GPU-seconds, period).
        let keys = match &self.parts.access {
            Access::Keys(keys) => Some(keys.load()),
            Access::Open => None,
        };
        let now = crate::batch::now_s();
        let read = batch
            .db(move |c| {
                let entries = batch_demand::backlog(c, now)?;
                let mut over: Vec<String> = Vec::new();
                let hashes: BTreeSet<&str> = entries.iter().filter_map(|e| e.key_hash.as_deref()).collect();
                for hash in hashes {
                    let Some(entry) = keys.as_ref().and_then(|k| k.entry_by_hash_prefix(hash).cloned()) else {
                        continue;
                    };
                    let Some(budget) = entry.limits.batch_gpu_hours else { continue };
                    let (from, to) = budget.period.bounds(u64::try_from(now).unwrap_or(0));
                    let spent = batch_demand::spent(
                        c,
                        hash,
                        i64::try_from(from).unwrap_or(i64::MAX),
                        i64::try_from(to).unwrap_or(i64::MAX),
                    )?;
                    if spent >= budget.hours.saturating_mul(3600) {
                        over.push(hash.to_string());
                    }
                }
                Ok((entries, over))
            })
            .await;
        match read {
            Ok((entries, over)) => {
                let tallied = batch_demand::tally(&entries, |k| over.iter().any(|o| o == k));
                self.backlog = tallied.into_iter().filter(|(m, _)| self.spin.is_spinnable(m)).collect();
            }
            Err(e) => self.error("backlog", format!("cannot read the batch backlog: {e}")),
        }
    }

    /// What the spinner looks at.
    fn view(&self) -> SpinView {
        let snapshot = self.parts.view.snapshot();
        let me = self.parts.view.node_id();
        let mut view = SpinView::default();
        for m in &self.plan.models {
            let queued = u32::try_from(self.spin.room.queued(m.name())).unwrap_or(u32::MAX);
            let demand = Demand {
                batch_replicas: match (&self.plan.batch, self.backlog.get(m.name())) {
                    (Some(settings), Some(b)) => b.replicas(settings),
                    _ => 0,
                },
                ..self.spin.demand.measure(m.name(), queued)
            };
            if !demand.is_idle() || demand.p95_latency.is_some() {
                view.demand.insert(m.name().to_string(), demand);
            }
        }
        view.add_replicas(snapshot.replica(), me, |m| self.spin.is_spinnable(m), |id| self.parts.load.get(id));
        for (id, j) in &self.jobs {
            view.jobs.push(match j.state {
                None | Some(BatchState::Pending) => JobStatus::queued(*id),
                Some(_) => JobStatus::running(*id, j.node),
            });
        }
        view.shapes = self
            .plan
            .partitions
            .iter()
            .map(|p| {
                let used: u32 = self.jobs.values().filter(|j| j.partition == p.name).map(|j| j.nodes).sum();
                p.shape(p.nodes.saturating_sub(used))
            })
            .collect();
        view
    }

    /// Where `model`'s job on `placement` starts soonest: asks the batch system about every
    /// candidate partition (bounded by `start_estimate_timeout`), records and logs the choice,
    /// and returns the placement moved there. See [`queue`].
    async fn choose_partition(&mut self, model: &str, placement: Placement, walltime: Duration) -> Placement {
        let timeout = self.plan.start_estimate_timeout;
        if timeout.is_zero() {
            return placement;
        }
        let free = |name: &str| {
            let used: u32 = self.jobs.values().filter(|j| j.partition == name).map(|j| j.nodes).sum();
            self.plan.partition(name).map_or(0, |p| p.nodes.saturating_sub(used))
        };
        let partitions = queue::candidates(&self.plan, model, &placement, free);
        if partitions.is_empty() {
            return placement;
        }
        let asked_at = SystemTime::now();
        let candidates =
            queue::estimate(self.batch.as_ref(), &self.plan, model, &placement, walltime, &partitions, timeout).await;
        let fallback = candidates.iter().position(|c| c.partition == placement.shape_name).unwrap_or(0);
        let index = queue::choose(&candidates, fallback);
        let failed: Vec<String> = candidates
            .iter()
            .filter_map(|c| match &c.estimate {
                queue::Estimate::Failed(e) => Some(format!("{}: {e}", c.partition)),
                _ => None,
            })
            .collect();
        if !failed.is_empty() {
            tracing::warn!(model, "spinning: no start estimate for '{model}' from {}", failed.join("; "));
        }
        let partition = partitions[index];
        let choice = queue::Choice {
            partition: partition.name.clone(),
            estimated_start: match candidates[index].estimate {
                queue::Estimate::At(t) => Some(t),
                _ => None,
            },
            asked_at,
            candidates,
        };
        tracing::info!(model, "placing '{model}' on {}", choice.summary());
        let moved = queue::moved(&placement, &self.plan, partition);
        self.spin.report.lock().unwrap_or_else(PoisonError::into_inner).choices.insert(model.to_string(), choice);
        moved
    }

    /// Charges `gpu_secs` of backlog job `job` of `model` to the key with the largest backlog
    /// of the model ([`batch_demand`]'s rule), in the database.
    async fn charge_backlog(&mut self, job: JobId, model: &str, gpu_secs: u64) {
        let Some(hash) = self.backlog.get(model).and_then(|b| b.charge_to.clone()) else { return };
        let Some(batch) = self.parts.batch.clone() else { return };
        let name = match &self.parts.access {
            Access::Keys(keys) => keys.load().entry_by_hash_prefix(&hash).map(|e| e.name.clone()),
            Access::Open => None,
        };
        let name = name.unwrap_or_else(|| format!("sha256:{hash}"));
        if let Some(j) = self.jobs.get_mut(&job) {
            j.charged_to = Some(name.clone());
        }
        let (m, at) = (model.to_string(), crate::batch::now_s());
        match batch.db(move |c| batch_demand::charge(c, &hash, &m, at, gpu_secs)).await {
            Ok(()) => tracing::info!(
                model,
                "charged {:.2} GPU-hours of job {} for '{model}' to key {name}",
                gpu_secs as f64 / 3600.0,
                job.0
            ),
            Err(e) => self.error("charge", format!("cannot record the GPU-hours of a backlog job for '{model}': {e}")),
        }
    }

    /// Executes one command; `false` when a submission failed.
    async fn execute(&mut self, command: SpinCommand) -> bool {
        match command {
            SpinCommand::Submit { job, model, placement, walltime, batch: for_backlog } => {
                let placement = self.choose_partition(&model, placement, walltime).await;
                let Some(spec) = self.plan.model(&model) else { return true };
                let Some(partition) = self.plan.partition(&placement.shape_name) else { return true };
                let time_min = self.plan.batch.filter(|_| for_backlog).map(|b| b.job_time_min);
                let request = match job::render(&self.plan.job, partition, spec, &placement, walltime, time_min) {
                    Ok(r) => r,
                    Err(e) => {
                        // Checked with the configuration, so not expected; the job counts as ended.
                        self.error("submit", format!("cannot render the job for '{model}': {e}"));
                        return true;
                    }
                };
                self.jobs.insert(
                    job,
                    TrackedJob {
                        model: model.clone(),
                        partition: partition.name.clone(),
                        nodes: placement.pipeline_stages,
                        batch: None,
                        state: None,
                        raw_state: "SUBMITTING".into(),
                        node: None,
                        hosts: Vec::new(),
                        submitted: Instant::now(),
                        released: None,
                        for_backlog,
                        charged_to: None,
                    },
                );
                match self.batch.submit(&request).await {
                    Ok(id) => {
                        let kind = if for_backlog { "batch-backlog job" } else { "job" };
                        tracing::info!(model, "submitted {kind} {id} for '{model}': {placement}");
                        if for_backlog {
                            let gpu_secs = u64::from(placement.gpus()) * walltime.as_secs().max(1);
                            self.charge_backlog(job, &model, gpu_secs).await;
                        }
                        self.parts.metrics.spin_submits.get_or_create(&ModelLabel { model: model.clone() }).inc();
                        self.backoff = None;
                        if let Some(j) = self.jobs.get_mut(&job) {
                            j.batch = Some(id);
                            j.state = Some(BatchState::Pending);
                            j.raw_state = "PENDING".into();
                        }
                        true
                    }
                    Err(e) => {
                        // Not listed from now on: the spinner counts it as ended.
                        self.jobs.remove(&job);
                        let pause = self.backoff.map_or(self.plan.interval, |(_, d)| (d * 2).min(MAX_SUBMIT_BACKOFF));
                        self.backoff = Some((Instant::now() + pause, pause));
                        self.error(
                            "submit",
                            format!(
                                "cannot submit a job for '{model}': {e} (next try in {})",
                                humantime::format_duration(pause)
                            ),
                        );
                        false
                    }
                }
            }
            SpinCommand::Cancel { job } => {
                let Some(tracked) = self.jobs.get_mut(&job) else { return true };
                tracked.released = Some("cancelled");
                let (model, batch) = (tracked.model.clone(), tracked.batch);
                let Some(id) = batch else { return true };
                match self.batch.cancel(id).await {
                    Ok(()) => {
                        tracing::info!(model, "cancelled job {id} of '{model}' (not needed any more)");
                        self.parts.metrics.spin_cancels.get_or_create(&ModelLabel { model }).inc();
                    }
                    Err(e) => self.error("cancel", format!("cannot cancel job {id} of '{model}': {e}")),
                }
                true
            }
            SpinCommand::Drain { node } => {
                let Some(tracked) = self.jobs.values_mut().find(|j| j.node == Some(node)) else {
                    self.error("drain", format!("no job of this gateway runs node {node}; not drained"));
                    return true;
                };
                tracked.released = Some("drained");
                let (model, batch) = (tracked.model.clone(), tracked.batch);
                let Some(id) = batch else { return true };
                match self.batch.signal(id, JobSignal::Drain).await {
                    Ok(()) => {
                        tracing::info!(model, "draining node {node} (job {id}) of '{model}': demand went away");
                        self.parts.metrics.spin_drains.get_or_create(&ModelLabel { model }).inc();
                    }
                    Err(e) => self.error("drain", format!("cannot signal job {id} of '{model}' to drain: {e}")),
                }
                true
            }
        }
    }
}
