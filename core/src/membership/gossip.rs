//! The gossip round and the membership's timers: each round pushes queued updates to random
//! peers (or pulls, on an outbound-only node), tells suspects of their suspicion, pays owed
//! answers and retries fetches; a round with nothing to do is skipped, and re-armed on its grid
//! once there is work again.

use super::suspicion::{MAX_NOTICES, NOTICE_INTERVAL};
use super::{repair_interval, Membership};
use crate::answers::Answer;
use crate::node::Node;
use crate::record::Reachability;
use crate::time::Time;
use crate::timer::Timer;
use crate::wire::ProbeBuilder;

impl Membership {
    /// Whether a gossip round would do anything: send queued updates, pull (an outbound-only
    /// node), notify suspects, retry fetches, or pay owed answers and renew a spent budget.
    /// A round that would do nothing is skipped, so an idle node sets no gossip wake.
    fn round_has_work(&self, outbound_only: bool) -> bool {
        outbound_only
            || self.records.len() + self.suspicions.len() > 0
            || !self.suspects.is_empty()
            || !self.fetching.is_empty()
            || self.answers.round_has_work()
    }
}

impl Node {
    /// The membership's share of [`Node::handle_timeouts`]: returns false for timers it does not
    /// own.
    pub(crate) fn membership_timer(&mut self, timer: Timer) -> bool {
        let st = &mut self.membership;
        let now = self.now;
        match timer {
            Timer::Probe => st.detector.on_timeout(&self.replica, now),
            Timer::Gossip => {
                let interval = st.settings.gossip_interval;
                let fanout = st.settings.gossip_fanout;
                let notice = (now >= st.next_notice && !st.suspects.is_empty())
                    .then(|| st.suspects.iter().take(MAX_NOTICES).copied().collect::<Vec<_>>());
                if notice.is_some() {
                    st.next_notice = now + NOTICE_INTERVAL;
                }
                self.answer_round();
                let st = &mut self.membership;
                if st.records.len() + st.suspicions.len() > 0 {
                    for peer in self.pick_peers(fanout) {
                        let b = ProbeBuilder::gossip(self.config.max_datagram);
                        if self.send_probe(peer, b, None, true) {
                            self.stats.gossip_rounds_sent += 1;
                        }
                    }
                } else if self.config.reach == Reachability::OutboundOnly {
                    // Nobody can gossip to us but our anchors: pull from as many peers as we
                    // would push to instead.
                    for peer in self.pick_peers(fanout) {
                        self.transmit(peer, ProbeBuilder::gossip(self.config.max_datagram).finish());
                        self.stats.gossip_rounds_sent += 1;
                    }
                }
                for id in notice.unwrap_or_default() {
                    if self.answer(id, Answer::Suspicion) {
                        self.stats.suspicion_notices += 1;
                    }
                }
                self.retry_fetches();
                let st = &mut self.membership;
                st.next_round = self.now + interval;
                if st.round_has_work(self.config.reach == Reachability::OutboundOnly) {
                    self.timers.set(Timer::Gossip, st.next_round);
                } else {
                    self.timers.stop(Timer::Gossip);
                }
            }
            Timer::AntiEntropy => {
                let (interval, ttl) = (repair_interval(&self.config.reach, &st.settings), st.settings.tombstone_ttl);
                self.sync_round(interval, ttl);
            }
            _ => return false,
        }
        true
    }

    /// Re-arms a sleeping gossip round at the next point of the round grid after now once it has work
    /// again, so that skipping idle rounds moves no round that has work. Called after every
    /// input.
    pub(super) fn wake_gossip(&mut self) {
        if self.timers.get(Timer::Gossip).is_some() {
            return;
        }
        let st = &self.membership;
        if !st.round_has_work(self.config.reach == Reachability::OutboundOnly) {
            return;
        }
        let step = u64::try_from(st.settings.gossip_interval.as_micros()).unwrap_or(u64::MAX).max(1);
        // The first grid point strictly after now: a round due at this very instant was skipped
        // as idle, and a wake at `now` would be a timer that has already passed.
        let behind = (self.now.as_micros() + 1).saturating_sub(st.next_round.as_micros());
        let at = Time(st.next_round.as_micros().saturating_add(behind.div_ceil(step).saturating_mul(step)));
        self.membership.next_round = at;
        self.timers.set(Timer::Gossip, at);
    }
}
