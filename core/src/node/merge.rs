//! Records from peers into the replica: each one that would change something is checked
//! ([`crate::auth`]), an echo of this node's own record that it does not hold is refuted, and
//! authentic news is merged, spread and reported.

use super::{Event, Node, Output};
use crate::auth::{self, Forgery};
use crate::record::{Record, SharedRecord};

impl Node {
    /// Merges a record from a peer; echoes of our own record that we do not hold are refuted.
    ///
    /// Only records that would change something are checked ([`crate::auth::check`]), and a
    /// forged one is counted and dropped without touching the replica.
    pub(crate) fn absorb(&mut self, record: Record) {
        self.absorb_news(record, true);
    }

    /// [`Node::absorb`]; with `spread` false, news is merged but not gossiped on (the records
    /// of a bulk transfer, old news to everyone but this replica).
    pub(crate) fn absorb_news(&mut self, record: Record, spread: bool) {
        if let Some(before) = self.news_in(&record) {
            let shared = self.config.interner.record(record);
            self.merge_news(shared, before, spread);
        }
    }

    /// Whether `record` is authentic news for this replica: `Some` with the generation held
    /// before (if any) when it is, `None` when it changes nothing or is forged. Echoes of our own
    /// record that we do not hold are refuted here.
    pub(super) fn news_in(&mut self, record: &Record) -> Option<Option<u64>> {
        if record.id == self.config.id {
            let local = self.replica.local();
            if !local.dominates(record) && self.authentic(record, local.same_owner_version(record)) {
                self.refute(record.generation);
                self.refuted();
            }
            return None;
        }
        // One lookup: most records received are already held (the epidemic sends each many times).
        let (owner_known, before) = match self.replica.get(&record.id).map(|s| s.record()) {
            Some(k) if k.dominates(record) => return None,
            Some(k) => (k.same_owner_version(record), Some(k.generation)),
            None => (false, None),
        };
        self.authentic(record, owner_known).then_some(before)
    }

    /// Merges an authentic record that [`Node::news_in`] found to be news.
    pub(crate) fn merge_news(&mut self, record: SharedRecord, before: Option<u64>, spread: bool) {
        let id = record.id;
        let merged = self.replica.merge(self.now, record);
        if merged.changed {
            self.stats.records_changed += 1;
            self.record_changed(id, before, spread);
        }
        if merged.new_node {
            self.outputs.push_back(Output::Event(Event::Discovered(id)));
        }
        if let Some(routable) = merged.routable {
            self.emit_routable(id, routable);
        }
    }

    /// Checks a record that would change the replica, counting a forgery. The owner's
    /// signature is not checked again when the replica already holds exactly this owner's version
    /// (`owner_known`: a record that only gained a DOWN mark).
    fn authentic(&mut self, record: &Record, owner_known: bool) -> bool {
        let verdict = if owner_known {
            auth::check_marks(record, &self.config.verifier)
        } else {
            auth::check(record, &self.config.verifier)
        };
        match verdict {
            Ok(()) => true,
            Err(Forgery::Owner) => {
                self.stats.records_forged += 1;
                false
            }
            Err(Forgery::State | Forgery::Mark) => {
                self.stats.marks_forged += 1;
                false
            }
        }
    }
}
