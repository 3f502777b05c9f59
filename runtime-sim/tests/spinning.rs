//! The spinning-day scenario: the core's spin controller drives simulated Slurm jobs through a
//! day of bursty demand, and what a user or an operator would notice holds.

use tela_sim::{replay_command, Limits, Report, Scenario, Sim};

fn run(sc: Scenario, seed: u64) -> Report {
    Sim::new(sc, seed, false, Limits::default()).run()
}

#[test]
fn a_spinning_day_answers_every_request_and_leaks_no_job() {
    let sc = Scenario::load("spinning-day").expect("scenario");
    let longest_s = sc.workload.ttft_ms / 1e3
        + sc.spin.demand.iter().map(|d| f64::from(d.tokens[1])).fold(0.0, f64::max) / sc.workload.tokens_per_s;
    let window_covers = sc.protocol.drain_window_s >= longest_s && sc.jobs.preempt_grace_s >= longest_s;
    let plan = sc.spin.plan().expect("a valid [spin]");
    let (max_jobs, budget) = (plan.limits.max_concurrent_jobs, plan.limits.budget.expect("a budget").gpu_hours);
    let r = run(sc, 1);
    let replay = replay_command("spinning-day", 1, false);
    assert!(r.passed(), "{}\nreplay: {replay}", r.summary());
    let spin = r.spin.as_ref().expect("a spinning scenario reports spinning");
    let q = &r.requests;

    // Every request is answered: completed, or failed with a counted reason; none left hanging.
    assert!(q.sent > 100_000, "a day of demand: {}", r.summary());
    assert_eq!(q.unfinished, 0, "{}", r.summary());
    assert_eq!(q.completed + q.failed, q.sent, "{}", r.summary());
    let c = &spin.cold_start;
    let reasons = c.timed_out + c.refused + c.unrouted + q.no_capacity + q.mid_stream;
    assert!(q.failed <= reasons, "every failure has a reason: {}", r.summary());
    assert!(c.enqueued > 0 && c.served > 0, "cold starts happen and are served: {}", r.summary());
    assert!(c.p50_ms > 0.0 && c.p50_ms <= c.p99_ms, "{}", r.summary());

    // No job leak: demand stops in the evening, and by midnight every job has ended.
    assert!(spin.jobs.submitted > 10 && spin.jobs.preemptions > 0, "{}", r.summary());
    assert_eq!(spin.jobs.live_at_end, spin.jobs.min_replicas, "{}", r.summary());
    assert_eq!(
        spin.jobs.ended_walltime + spin.jobs.ended_preempted + spin.jobs.ended_drained + spin.jobs.cancels,
        spin.jobs.submitted - spin.jobs.live_at_end,
        "every submitted job ended once: {}",
        r.summary()
    );

    // The drain window and the preemption grace cover the longest request: nothing in flight is lost.
    assert!(window_covers, "the scenario should give drains room for the longest request");
    assert!(r.drain.in_flight > 0, "drains catch requests in flight: {}", r.summary());
    assert_eq!(r.drain.failed, 0, "{}", r.drain.line());
    assert_eq!(r.drain.completion_percent, 100.0, "{}", r.drain.line());

    // The caps hold (the run also fails at once if a decision breaks one).
    assert!(spin.jobs.max_live <= max_jobs);
    assert!(spin.jobs.max_budget_charged_gpu_hours <= budget as f64);
    // Placement uses more than one partition over the day.
    assert!(spin.partitions.iter().filter(|p| p.jobs > 0).count() >= 3, "{}", r.summary());
    // The oracle is a lower bound for a controller that cannot see the future.
    assert!(spin.gpu_hours.oracle > 0.0 && spin.gpu_hours.ratio >= 1.0, "{}", r.summary());
}

#[test]
fn spinning_is_deterministic() {
    // The first five hours hold a night-time cold start from zero, its jobs, and their release.
    let mut sc = Scenario::load("spinning-day").expect("scenario");
    sc.duration_s = 5.0 * 3600.0;
    sc.faults_until_s = sc.duration_s - 600.0;
    let a = run(sc.clone(), 3);
    let b = run(sc.clone(), 3);
    assert!(a.passed(), "{}", a.summary());
    assert!(a.spin.as_ref().is_some_and(|s| s.jobs.started > 0), "{}", a.summary());
    assert_eq!(a.hash, b.hash, "same scenario and seed diverged");
    assert_eq!(a.events, b.events);
    let c = run(sc, 4);
    assert_ne!(a.hash, c.hash, "a different seed is a different run");
}

#[test]
fn spin_sections_refuse_typos_and_nonsense() {
    // The same tables a gateway reads, checked by the same core functions.
    let base = "[[spin.partition]]\nname = \"p\"\nshape = \"a100-80x4\"\nnodes = 2\n\
                [[spin.model]]\nname = \"m\"\nparams = \"8B\"\nquantization = \"bf16\"\n";
    Scenario::parse(base).expect("a minimal spin section parses");
    let refused = |text: String, wanted: &str| {
        let e = Scenario::parse(&text).unwrap_err().to_string();
        assert!(e.contains(wanted), "wanted '{wanted}' in: {e}");
    };
    refused(format!("{base}walltime = 4\n"), "invalid type");
    refused(format!("{base}walltime_h = 4\n"), "unknown field");
    refused("[[spin.model]]\nname = \"m\"\nparams = \"8B\"\nquantization = \"bf16\"\n".into(), "spin.partition");
    refused(base.replace("bf16", "q3"), "spin.model[m].quantization: unknown quantization 'q3'");
    refused(base.replace("8B", "2000B"), "spin.model[m]: cannot be placed on any partition");
    refused(format!("{base}min_replicas = 5\n"), "spin.model[m].min_replicas: 5 is above max_replicas 4");
    refused(format!("{base}drain_window = \"0s\"\n"), "spin.model[m].drain_window: must be longer than zero");
    refused(format!("{base}[[spin.burst]]\nmodel = \"other\"\n"), "not a [[spin.model]]");
    refused(format!("{base}[[spin.demand]]\nmodel = \"other\"\n"), "not a [[spin.model]]");
    refused(format!("{base}[[spin.queue]]\npartition = \"q\"\nwait_s = [1, 2]\n"), "not a [[spin.partition]]");
    refused(format!("{base}[[spin.demand]]\nmodel = \"m\"\nactive_hours = [20, 3]\n"), "active_hours");
}
