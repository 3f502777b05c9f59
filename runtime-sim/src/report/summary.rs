//! The human summary of a report: a few lines on stdout.

use super::Report;

/// ", 3 still pending at the end, the oldest 41000 ms old", or nothing when none were.
fn pending(count: u64, oldest_ms: f64) -> String {
    if count == 0 {
        return String::new();
    }
    format!(", {count} still pending at the end, the oldest {oldest_ms:.0} ms old")
}

impl Report {
    /// A few lines for humans.
    pub fn summary(&self) -> String {
        let c = &self.convergence;
        let d = &self.detection;
        let r = &self.requests;
        format!(
            "{scenario} seed {seed}{swarm}: {nodes} nodes, {sim:.0} s simulated in {wall:.1} s wall{setup} ({eps:.0} events/s; {wakes:.0}% timer wakes, {deliveries:.0}% datagrams), peak RSS {rss} MB, hash {hash}\n\
             {seconds}\n\
             {heap}\
             network: loss {loss:.3}, dup {dup:.3}, reorder {reo:.3}, {parts} partition(s), {idle} connection(s) timed out; max datagram {maxd} B; {bps:.0} B/s per node (steady {tail:.0})\n\
             convergence: p50 {c50:.0} ms, p99 {c99:.0} ms, max {c100:.0} ms over {cn} changes ({cinc} incomplete{cpend}); Serf 99.99% bound {serf:.0} ms; once formed: p50 {s50:.0} ms, p99 {s99:.0} ms over {sn}; apart from partitions: p50 {a50:.0} ms, p99 {a99:.0} ms, max {a100:.0} ms over {an} (to 99.99%: p99 {m99:.0} ms, max {m100:.0} ms)\n\
             detection: p50 {d50:.0} ms, max {d100:.0} ms over {dn} kills (gateways max {g100:.0} ms, {byc} at a connection's timeout; gateway registries max {r100:.0} ms; {dinc} incomplete, {drst} restarted first{dpend}); false unroutable {fu}, false DOWN {fd}, DOWN marks signed {dm}\n\
             requests: {sent} sent, {done} completed, {failed} failed ({nocap} no capacity, {mid} mid-stream), {retries} retries, {unf} unfinished\n\
             {drain}\n\
             jobs: {pre} preemptions ({pre_s} scheduled), {pkill} killed after the grace period, {wkill} killed at the walltime, {exits} clean exits\n\
             {spin}\
             {auth}\
             liveness: {live}\n\
             {verdict}",
            scenario = self.scenario,
            seed = self.seed,
            swarm = if self.swarm { " (swarm)" } else { "" },
            nodes = self.nodes,
            sim = self.sim_s,
            wall = self.wall_s,
            setup = if self.setup_wall_s >= 1.0 { format!(", {:.1} s of it forming", self.setup_wall_s) } else { String::new() },
            eps = self.events_per_s,
            wakes = self.events_by_kind.share(self.events_by_kind.wakes),
            deliveries = self.events_by_kind.share(self.events_by_kind.deliveries),
            rss = self.peak_rss_mb,
            seconds = self.seconds.line(),
            heap = self.heap.as_ref().map_or(String::new(), |h| format!("{}\n", h.line())),
            hash = self.hash,
            loss = self.network.loss,
            dup = self.network.duplicate,
            reo = self.network.reorder,
            parts = self.partitions,
            idle = self.connections_timed_out,
            maxd = self.max_datagram_bytes,
            bps = self.bytes_per_node_per_s,
            tail = self.bytes_per_node_per_s_tail,
            c50 = c.latency.p50_ms,
            c99 = c.latency.p99_ms,
            c100 = c.latency.p100_ms,
            cn = c.latency.count,
            cinc = c.incomplete,
            cpend = pending(c.pending_at_end, c.oldest_pending_ms),
            s50 = c.settled.p50_ms,
            s99 = c.settled.p99_ms,
            sn = c.settled.count,
            a50 = c.apart_from_partitions.p50_ms,
            a99 = c.apart_from_partitions.p99_ms,
            a100 = c.apart_from_partitions.p100_ms,
            an = c.apart_from_partitions.count,
            m99 = c.apart_from_partitions_9999.p99_ms,
            m100 = c.apart_from_partitions_9999.p100_ms,
            serf = c.serf_bound_ms,
            d50 = d.all_nodes.p50_ms,
            d100 = d.all_nodes.p100_ms,
            dn = d.all_nodes.count,
            g100 = d.gateways.p100_ms,
            byc = d.by_connection,
            r100 = d.gateways_registry.p100_ms,
            dinc = d.incomplete,
            drst = d.restarted_first,
            dpend = pending(d.pending_at_end, d.oldest_pending_ms),
            fu = d.false_unroutable,
            fd = d.false_down,
            dm = d.marks_signed,
            sent = r.sent,
            done = r.completed,
            failed = r.failed,
            nocap = r.no_capacity,
            mid = r.mid_stream,
            retries = r.retries,
            unf = r.unfinished,
            drain = self.drain.line(),
            pre = self.jobs.preemptions,
            pre_s = self.jobs.preemptions_scheduled,
            pkill = self.jobs.preempt_kills,
            wkill = self.jobs.walltime_kills,
            exits = self.jobs.clean_exits,
            spin = self.spin.as_ref().map_or(String::new(), |s| format!("{}\n", s.summary())),
            auth = self.authenticity.as_ref().map_or(String::new(), crate::liar::AuthReport::line),
            live = match self.liveness.converged_after_ms {
                Some(ms) => format!("all live replicas equal {:.0} ms after faults stopped (bound {} s)", ms, self.liveness.bound_s),
                None => format!("live replicas NOT equal within the run (bound {} s)", self.liveness.bound_s),
            },
            verdict = match (&self.violation, &self.aborted) {
                (Some(v), _) => format!("FAILED: {v}"),
                (None, Some(a)) => format!("ABORTED: {a}"),
                (None, None) if self.liveness.converged_after_ms.is_none() => "FAILED: liveness phase did not converge".to_string(),
                _ => "ok".to_string(),
            }
        )
    }
}
