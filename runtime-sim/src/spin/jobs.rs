//! Jobs: what the gateway shows the spinner (the spin view), its decisions and the commands
//! they give (submit, cancel, drain) executed as simulated Slurm jobs, and each job's lifecycle —
//! queue wait, start as a fresh node, serving, and its end by walltime, preemption, cancel or
//! drain — with the caps (live jobs, budget, partition nodes) checked after every decision.

use super::{SimJob, MINUTE};
use crate::report_spin::SpinCommandRecord;
use crate::sim::{host_of, id_of, micros, Kind, Sim, Stop};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tela_core::spin::{JobId, JobStatus, SpinCommand, SpinView};
use tela_core::{Lifecycle, Model, Time};

fn uniform(rng: &mut ChaCha8Rng, [lo, hi]: [f64; 2]) -> f64 {
    if hi > lo {
        rng.random_range(lo..hi)
    } else {
        lo
    }
}

impl Sim {
    /// What the gateway observes, for the spinner.
    fn spin_view(&mut self) -> SpinView {
        let now = self.now;
        let gw = (0..self.sc.federation.gateways).find(|&g| self.hosts[g as usize].running());
        let spin = self.spin.as_mut().expect("spinning");
        let mut view = SpinView::default();
        for (m, model) in spin.plan.models.iter().enumerate() {
            let queued = spin.queued(m);
            view.demand.insert(model.name().to_string(), spin.meters[m].demand(Time(now), queued));
        }
        for (id, job) in spin.jobs.iter().filter(|(_, j)| j.ended.is_none()) {
            view.jobs.push(match job.host {
                None => JobStatus::queued(JobId(*id)),
                Some(h) => JobStatus::running(JobId(*id), Some(id_of(h))),
            });
        }
        view.shapes = spin.plan.shapes.clone();
        for (shape, used) in view.shapes.iter_mut().zip(&spin.used_nodes) {
            shape.free_nodes = shape.free_nodes.saturating_sub(*used);
        }
        if let Some(node) = gw.and_then(|g| self.hosts[g as usize].node.as_ref()) {
            // As the gateway's spinner sees them: one rule, in the core.
            let gateways = self.sc.federation.gateways;
            view.add_replicas(
                node.replica(),
                node.local_record().id,
                |m| spin.model_index(m).is_some(),
                |id| (0..gateways).map(|g| self.hosts[g as usize].load_of(host_of(id))).sum(),
            );
        }
        view
    }

    /// One decision of the spinner, and its commands executed.
    pub(crate) fn spin_decide(&mut self, periodic: bool) {
        if periodic {
            self.after(micros(self.spin_interval_s()), Kind::SpinTick);
        } else if let Some(spin) = self.spin.as_mut() {
            spin.decide_pending = false;
        }
        if self.spin.is_none() {
            return;
        }
        let view = self.spin_view();
        let now = self.now;
        let spin = self.spin.as_mut().expect("spinning");
        let commands = spin.spinner.decide(Time(now), &view);
        for c in commands {
            self.spin_execute(c);
        }
        self.spin_check_caps();
    }

    fn spin_check_caps(&mut self) {
        let spin = self.spin.as_mut().expect("spinning");
        let live = spin.live_jobs() as u32;
        spin.m.max_live_jobs = spin.m.max_live_jobs.max(live);
        let used = spin.spinner.budget_used_gpu_secs();
        spin.m.max_budget_gpu_s = spin.m.max_budget_gpu_s.max(used);
        let over =
            spin.used_nodes.iter().zip(&spin.plan.shapes).map(|(u, s)| i64::from(*u) - i64::from(s.free_nodes)).max();
        spin.m.max_nodes_over = spin.m.max_nodes_over.max(over.unwrap_or(0));
        let limits = spin.plan.limits;
        let mut broken = None;
        if live > limits.max_concurrent_jobs {
            broken = Some(format!(
                "spinner holds {live} live jobs, above max_concurrent_jobs {}",
                limits.max_concurrent_jobs
            ));
        } else if let Some(b) = limits.budget.filter(|b| used > b.gpu_hours * 3600) {
            broken = Some(format!(
                "spinner charged {:.1} GPU-hours in its window, above the budget of {}",
                used as f64 / 3600.0,
                b.gpu_hours
            ));
        } else if over.unwrap_or(0) > 0 {
            broken = Some("spinner jobs hold more nodes than a partition has".to_string());
        }
        if let Some(msg) = broken {
            self.fail(msg);
        }
    }

    fn spin_execute(&mut self, c: SpinCommand) {
        let now = self.now;
        let spin = self.spin.as_mut().expect("spinning");
        let name_of = |m: usize| spin.plan.models[m].name().to_string();
        let (kind, model) = match &c {
            SpinCommand::Submit { model, .. } => ("submit", model.clone()),
            SpinCommand::Cancel { job } => {
                ("cancel", spin.jobs.get(&job.0).map(|j| name_of(j.model)).unwrap_or_default())
            }
            SpinCommand::Drain { node } => {
                let job = spin.host_job.get(&host_of(node)).and_then(|id| spin.jobs.get(id));
                ("drain", job.map(|j| name_of(j.model)).unwrap_or_default())
            }
        };
        spin.m.commands.push(SpinCommandRecord { at_s: now as f64 / 1e6, kind, model });
        match c {
            SpinCommand::Submit { job, model, placement, walltime, .. } => {
                let Some(m) = spin.model_index(&model) else { return };
                spin.m.submits += 1;
                if let Some(at) = spin.last_release[m] {
                    if now - at < micros(spin.plan.models[m].policy.cooldown.as_secs_f64()) {
                        spin.m.submits_in_cooldown += 1;
                    }
                }
                let p = placement.shape;
                spin.used_nodes[p] += placement.pipeline_stages;
                spin.jobs.insert(
                    job.0,
                    SimJob {
                        model: m,
                        partition: p,
                        nodes: placement.pipeline_stages,
                        gpus: placement.gpus(),
                        walltime: micros(walltime.as_secs_f64()),
                        host: None,
                        started: None,
                        serving: false,
                        ended: None,
                    },
                );
                let wait = micros(uniform(&mut spin.rng, spin.plan.queue_wait_s[p]));
                self.after(wait, Kind::SpinStart(job.0 as u32));
            }
            SpinCommand::Cancel { job } => {
                spin.m.cancels += 1;
                let Some(j) = spin.jobs.get(&job.0).cloned() else { return };
                if j.ended.is_some() {
                    return;
                }
                spin.last_release[j.model] = Some(now);
                if !j.serving {
                    spin.m.cancelled_before_serving += 1;
                }
                match j.host {
                    None => self.spin_job_over(job.0, None),
                    Some(h) => {
                        self.stop_process(h, Stop::Exit);
                        self.spin_job_over(job.0, None);
                    }
                }
            }
            SpinCommand::Drain { node } => {
                spin.m.drains += 1;
                let h = host_of(&node);
                if let Some(&id) = spin.host_job.get(&h) {
                    let m = spin.jobs[&id].model;
                    spin.last_release[m] = Some(now);
                }
                self.t.drain_cause.insert(h, crate::track::DrainCause::Release);
                self.hosts[h as usize].ending = true;
                self.feed(h, tela_core::Input::DrainRequested);
            }
        }
    }

    /// A job leaves the queue: a fresh serving node starts.
    pub(crate) fn spin_start(&mut self, job: u64) {
        let now = self.now;
        let Some(spin) = self.spin.as_mut() else { return };
        let Some(j) = spin.jobs.get(&job) else { return };
        if j.ended.is_some() {
            return;
        }
        let (m, p, walltime) = (j.model, j.partition, j.walltime);
        let hardware = spin.plan.shapes[p].hardware.clone();
        let model = Model::named(spin.plan.models[m].name().to_string());
        let sites = self.sc.network.sites;
        let h = self.hosts.len() as u32;
        self.new_host(false, false, p as u32 % sites, hardware, vec![model]);
        self.hosts[h as usize].walltime = Some(now + walltime);
        let spin = self.spin.as_mut().expect("spinning");
        spin.host_job.insert(h, job);
        let j = spin.jobs.get_mut(&job).expect("listed");
        j.host = Some(h);
        j.started = Some(now);
        spin.m.started += 1;
        self.start(h);
    }

    /// The engine start-up range of a spinner job's host, if `h` is one.
    pub(crate) fn spin_startup(&self, h: u32) -> Option<[f64; 2]> {
        let spin = self.spin.as_ref()?;
        let job = spin.host_job.get(&h)?;
        Some(spin.plan.models[spin.jobs[job].model].demand.engine_startup_s)
    }

    /// The drain window of a spinner job's model, if `h` runs one and the model sets it.
    pub(crate) fn spin_drain_window(&self, h: u32) -> Option<std::time::Duration> {
        let spin = self.spin.as_ref()?;
        let job = spin.host_job.get(&h)?;
        spin.plan.models[spin.jobs[job].model].drain_window
    }

    /// Whether host `h` runs a spinner job.
    pub(crate) fn is_spin_host(&self, h: u32) -> bool {
        self.spin.as_ref().is_some_and(|s| s.host_job.contains_key(&h))
    }

    /// A spinner job's node started serving.
    pub(crate) fn spin_serving(&mut self, h: u32) {
        if let Some(spin) = self.spin.as_mut() {
            if let Some(j) = spin.host_job.get(&h).and_then(|id| spin.jobs.get_mut(id)) {
                if !j.serving {
                    j.serving = true;
                    spin.m.served += 1;
                }
            }
        }
    }

    /// A spinner job's process ended (walltime, kill after preemption, exit after its drain).
    pub(crate) fn spin_host_stopped(&mut self, h: u32, how: crate::track::DrainCause) {
        let Some(spin) = self.spin.as_mut() else { return };
        let Some(&job) = spin.host_job.get(&h) else { return };
        match how {
            crate::track::DrainCause::Walltime => spin.m.ended_walltime += 1,
            crate::track::DrainCause::Preemption => spin.m.ended_preempted += 1,
            crate::track::DrainCause::Release => spin.m.ended_drained += 1,
        }
        self.spin_job_over(job, Some(h));
    }

    fn spin_job_over(&mut self, job: u64, host: Option<u32>) {
        let now = self.now;
        let spin = self.spin.as_mut().expect("spinning");
        if let Some(h) = host {
            spin.host_job.remove(&h);
        }
        if let Some(j) = spin.jobs.get_mut(&job) {
            if j.ended.is_none() {
                j.ended = Some(now);
                spin.used_nodes[j.partition] = spin.used_nodes[j.partition].saturating_sub(j.nodes);
            }
        }
    }

    /// Slurm preempts one running spinner job, drawn uniformly. With none running (the night),
    /// the preemption waits ten minutes for one, until faults stop.
    pub(crate) fn spin_preempt(&mut self) {
        let Some(spin) = self.spin.as_ref() else { return };
        let eligible: Vec<u32> = spin
            .host_job
            .keys()
            .copied()
            .filter(|&h| self.hosts[h as usize].running() && self.hosts[h as usize].state < Lifecycle::Down)
            .collect();
        if eligible.is_empty() {
            if self.now + 10 * MINUTE < micros(self.sc.faults_until_s) {
                self.after(10 * MINUTE, Kind::SpinPreempt);
            }
            return;
        }
        let spin = self.spin.as_mut().expect("spinning");
        let h = eligible[spin.rng.random_range(0..eligible.len())];
        spin.m.preemptions += 1;
        self.preempt(h);
    }
}
