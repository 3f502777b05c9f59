//! The liveness phase: after the faults stop, every live replica must hold the same view
//! within the scenario's bound.

use super::{micros, Kind, Sim};
use std::collections::BTreeSet;
use tela_core::Node;

impl Sim {
    pub(super) fn liveness_check(&mut self) {
        let Some(start) = self.t.liveness_started else {
            return;
        };
        if self.t.liveness_converged.is_some() {
            return;
        }
        let mut views = self.hosts.iter().filter_map(|h| h.node.as_ref()).map(|n| n.replica().view_hash());
        let first = views.next();
        if first.is_some() && views.all(|v| Some(v) == first) {
            self.t.liveness_converged = Some(self.now - start);
            return;
        }
        let bound = micros(self.sc.liveness_bound_s);
        if self.now - start > bound {
            if std::env::var_os("TELA_SIM_DEBUG").is_some() {
                self.debug_views();
            }
            let distinct: BTreeSet<u64> =
                self.hosts.iter().filter_map(|h| h.node.as_ref()).map(|n| n.replica().view_hash()).collect();
            self.fail(format!(
                "liveness: live replicas still differ {:.1} s after faults stopped (bound {} s; {} distinct views)",
                (self.now - start) as f64 / 1e6,
                self.sc.liveness_bound_s,
                distinct.len()
            ));
            return;
        }
        self.after(250_000, Kind::LivenessCheck);
    }

    /// Prints how the first few replicas differ from the most common view.
    fn debug_views(&self) {
        let live: Vec<&Node> = self.hosts.iter().filter_map(|h| h.node.as_ref()).collect();
        let mut counts: std::collections::BTreeMap<u64, usize> = Default::default();
        for n in &live {
            *counts.entry(n.replica().view_hash()).or_default() += 1;
        }
        let (&major, &k) = counts.iter().max_by_key(|(_, c)| **c).expect("live nodes");
        eprintln!("majority view held by {k} of {} live nodes", live.len());
        let reference = live.iter().find(|n| n.replica().view_hash() == major).expect("majority");
        for n in live.iter().filter(|n| n.replica().view_hash() != major).take(4) {
            let mine = n.replica().sorted_records();
            let theirs = reference.replica().sorted_records();
            let own = n.local_record();
            eprintln!(
                "node {} ({} records vs {}; itself gen {} {:?}, {:?}, {} connected, {:?}):",
                n.id(),
                mine.len(),
                theirs.len(),
                own.generation,
                own.state,
                own.reach,
                n.connected_peers().len(),
                n.stats()
            );
            let key = |r: &tela_core::SharedRecord| (r.id, r.generation, r.state, r.models.clone());
            let a: BTreeSet<_> = mine.iter().map(key).collect();
            let b: BTreeSet<_> = theirs.iter().map(key).collect();
            for d in a.symmetric_difference(&b).take(6) {
                let side = if a.contains(d) { "only here " } else { "only there" };
                eprintln!("  {side}: {} gen {} {:?}", d.0, d.1, d.2);
            }
        }
    }
}
