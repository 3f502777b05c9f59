//! The once-a-second sample: bandwidth, progress lines on long runs, the heap sample with the
//! most bytes live, and the resource guards that stop a run.

use super::{Kind, Sim, PROGRESS_EVERY_S};

impl Sim {
    pub(super) fn sample(&mut self) {
        self.t.on_second(self.now, self.events);
        let wall = self.started.elapsed().as_secs_f64();
        if wall >= self.progress_at {
            self.progress_at = wall + PROGRESS_EVERY_S;
            eprintln!(
                "{} seed {}: {:.0} of {:.0} simulated s after {wall:.0} s wall ({} events, {} MB)",
                self.sc.name,
                self.seed,
                self.now as f64 / 1e6,
                self.sc.duration_s,
                self.events,
                crate::report::current_rss_mb()
            );
        }
        crate::liar::tick(self);
        if self.t.seconds % 5 == 0 {
            self.sample_heap();
            if self.t.tracing {
                let running = || self.hosts.iter().filter_map(|h| h.node.as_ref());
                let nodes = running().count();
                let (records, suspicions) =
                    running().map(|n| n.swim_queued()).fold((0, 0), |(r, s), (qr, qs)| (r + qr, s + qs));
                let per = nodes.max(1) as f64;
                let senders = running().map(|n| crate::traffic::Senders::of(n.stats())).sum();
                eprintln!(
                    "at {} s, queued per node: {:.1} records, {:.1} suspicions; {}\n  {}",
                    self.t.seconds,
                    records as f64 / per,
                    suspicions as f64 / per,
                    self.t.traffic.window(nodes, 5),
                    self.t.traffic.senders_window(senders, nodes, 5),
                );
            }
            let rss = crate::report::current_rss_mb();
            if rss > self.limits.max_rss_mb {
                self.aborted =
                    Some(format!("resident memory {rss} MB exceeded the {} MB limit", self.limits.max_rss_mb));
            }
            if self.started.elapsed().as_secs_f64() > self.limits.max_wall_s {
                self.aborted = Some(format!("wall time exceeded {} s", self.limits.max_wall_s));
            }
        }
        self.after(1_000_000, Kind::Sample);
    }

    /// Sums the running nodes' tables; keeps the sample if it has the most bytes live so far.
    fn sample_heap(&mut self) {
        let running = || self.hosts.iter().filter_map(|h| h.node.as_ref());
        let sample = crate::heap::HeapSample::take(
            self.t.seconds,
            running().map(|n| n.heap_bytes()).sum(),
            running().count(),
            running().map(|n| n.replica().len() as u64).sum(),
            crate::pool::pooled_records(),
        );
        if self.t.tracing {
            eprintln!("{}", sample.line());
        }
        let size = |s: &crate::heap::HeapSample| (s.live_bytes, s.tables_total());
        if self.heap.as_ref().map_or(true, |kept| size(&sample) > size(kept)) {
            self.heap = Some(sample);
        }
    }
}
