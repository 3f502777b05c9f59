//! The failure detector's glue: its actions become probe datagrams (each carrying what fits of
//! the piggyback queues) and queued suspicions, its events registry changes (a confirmed
//! failure a DOWN mark, a suspect unroutable until refuted).

use super::QueuedSuspicion;
use crate::answers::Answer;
use crate::id::NodeId;
use crate::node::Node;
use crate::record::Lifecycle;
use crate::swim::{Action, Event as SwimEvent};
use crate::time::Time;
use crate::timer::Timer;
use crate::wire::ProbeBuilder;

/// Running suspicions repeated on each ping, besides the queue's items: a node that missed a
/// refutation learns of it from the next peer it probes (which answers the stale suspicion).
const SUSPICIONS_PER_PING: usize = 2;

impl Node {
    /// Turns the detector's actions into datagrams and queued updates and its events into
    /// registry changes, then re-arms its timer; then wakes a sleeping gossip round if it has
    /// work. Called after every input.
    pub(crate) fn drive_detector(&mut self) {
        if self.exited {
            return;
        }
        self.drive_detector_actions();
        self.wake_gossip();
    }

    fn drive_detector_actions(&mut self) {
        let me = self.config.id;
        let limit = self.config.max_datagram;
        loop {
            let st = &mut self.membership;
            if let Some(action) = st.detector.poll_action() {
                match action {
                    // Probes are never empty, so always sent.
                    Action::SendPing { to, seq } => {
                        self.send_probe(to, ProbeBuilder::ping(limit, seq), Some(to), false);
                    }
                    Action::SendPingReq { via, target, seq } => {
                        self.send_probe(via, ProbeBuilder::ping_req(limit, target, seq), None, false);
                    }
                    Action::SendAck { to, seq } => {
                        self.send_probe(to, ProbeBuilder::ack(limit, seq), None, false);
                    }
                    Action::SendNack { to, seq } => {
                        self.send_probe(to, ProbeBuilder::nack(limit, seq), None, false);
                    }
                    Action::GossipSuspect { id, incarnation } => {
                        let generation = self.replica.get(&id).map(|s| s.record().generation);
                        if let Some(generation) = generation {
                            self.membership.suspicions.push(QueuedSuspicion::new(
                                id,
                                generation,
                                incarnation,
                                me,
                                self.now,
                            ));
                        }
                    }
                    // The node handles suspicions of itself in `on_suspicion`; the detector only
                    // raises this if it was told about one.
                    Action::GossipAlive { incarnation } => {
                        self.update_local(|r| r.heartbeat = r.heartbeat.max(incarnation));
                    }
                }
                continue;
            }
            if let Some(event) = st.detector.poll_event() {
                match event {
                    SwimEvent::Confirm(id) => {
                        st.suspects.remove(&id);
                        self.confirm_down(id);
                    }
                    SwimEvent::Suspect(id) => {
                        st.suspects.insert(id);
                        self.stats.suspicions_raised += 1;
                        if self.answer(id, Answer::Suspicion) {
                            self.stats.suspicion_notices += 1;
                        }
                        // A suspect gets no new requests while the suspicion runs: a request
                        // sent to a node that has died would only fail over later.
                        if let Some(flip) = self.replica.set_alive(&id, false) {
                            self.emit_routable(id, flip);
                        }
                    }
                    SwimEvent::Alive(id) => {
                        st.suspects.remove(&id);
                        if let Some(flip) = self.replica.set_alive(&id, true) {
                            self.emit_routable(id, flip);
                        }
                    }
                }
                continue;
            }
            let next = st.detector.next_deadline();
            if next == Time::NEVER {
                self.timers.stop(Timer::Probe);
            } else {
                self.timers.set(Timer::Probe, next);
            }
            return;
        }
    }

    /// The detector confirmed `id` failed: mark its record DOWN in the same generation.
    pub(super) fn confirm_down(&mut self, id: NodeId) {
        let Some(record) = self.replica.get(&id).map(|s| s.record().clone()) else { return };
        if record.state >= Lifecycle::Down {
            return;
        }
        self.stats.confirmed_down += 1;
        // The detector has no member for the local node, so never confirms it.
        debug_assert_ne!(id, self.config.id, "the detector confirmed the local node");
        let down = record.with_down_mark(self.config.identity.mark_down(&record));
        // A mark this node has just signed, on the version its replica holds, is news by
        // construction and needs no check. Checking it cost a signature verification per
        // confirmation, and a partition makes confirmations by the hundred thousand.
        let shared = self.config.interner.record(down);
        self.merge_news(shared, Some(record.generation), true);
    }

    /// Sends one SWIM datagram: the header in `b`, then (for a ping to a suspect) the suspicion
    /// of the target, then suspicions and records from the queues. A gossip datagram with
    /// nothing in it is not sent. Returns whether a datagram was sent.
    pub(crate) fn send_probe(
        &mut self,
        to: NodeId,
        mut b: ProbeBuilder,
        buddy: Option<NodeId>,
        skip_empty: bool,
    ) -> bool {
        let n = self.replica.len();
        if let Some(target) = buddy {
            // Lifeguard's buddy system: the suspect hears of the suspicion at once. Other running
            // suspicions ride along too, so that a peer that holds the refutation answers it.
            let suspects = &self.membership.suspects;
            let others = suspects.iter().filter(|s| **s != target).take(SUSPICIONS_PER_PING);
            for id in suspects.get(&target).into_iter().chain(others) {
                if let Some(item) = self.own_suspicion(*id) {
                    b.push(&item);
                }
            }
        }
        let (now, st) = (self.now, &mut self.membership);
        st.suspicions.fill(b.budget(), n, |s, _| {
            b.push(&s.piggyback(now));
        });
        st.records.fill(b.budget(), n, |r, sends| {
            if r.is_eager(sends) {
                b.push_encoded(r.encoded());
            } else {
                b.push(&r.announcement());
            }
        });
        if skip_empty && b.is_empty() {
            return false;
        }
        self.transmit(to, b.finish());
        true
    }
}
