//! Token budgets that hold across gateways: each gateway's spend per key is exchanged with the
//! other gateways as a grow-only counter per (key, gateway), merged by max
//! ([`tela_core::spend`]), and each key's [`KeyCounters`](crate::limits::KeyCounters) learn
//! what the others charged, so that a key is refused everywhere once the federation-wide spend
//! reaches its `budget_tokens` (429 `insufficient_quota`, `Retry-After` until the period ends:
//! [`crate::limits`]). The count includes the key's batch tokens, which are charged to the same
//! budget ([`crate::limits`], "Batch requests"), so a batch on one gateway spends the budget
//! that all of them hold; `batch_budget_tokens` is not exchanged.
//!
//! # The exchange
//!
//! Every exchange period ([`DEFAULT_EXCHANGE`], `--budget-exchange`) a gateway writes its own
//! count of every key with a budget into its counter and sends the whole counter — its own
//! entries and those it heard — as spend datagrams (tag `0xF1`, at most 1,100 bytes each) on
//! its connections to the other gateways: the connections gateways keep to each other anyway
//! (`--join`, and every gateway the registry names), authenticated by the federation's join
//! secret and identities. Sending the full state each time makes a lost datagram harmless, and
//! relaying what it heard lets gateways that are not connected to each other still learn each
//! other's counts. An entry takes at most 52 bytes, so an exchange costs about
//! `keys with a budget × gateways × 52` bytes per connected gateway and period (1,000 keys and
//! three gateways: ~150 KB/s at the default 1 s). A datagram is merged the moment it arrives, and the keys' counters are told
//! at once. Spend datagrams from serving nodes are ignored: only gateways count spend.
//!
//! Keys are named on the wire by 16 bytes of a hash of their hash ([`spend_id`]), so the
//! datagrams never carry what a key file holds. A gateway restarted with the same identity
//! learns back its own previous count from its peers
//! ([`crate::limits::KeyCounters::raise_spent`]), so a restart does not hand a key a fresh
//! budget while another gateway remembers it.
//!
//! # How much a key can overspend
//!
//! Let `G` be the number of gateways, `T` the exchange period plus the one-way delay between
//! gateways, `S` the most tokens one gateway can admit for the key within any `T` (bounded by
//! the key's own `tpm`, `rpm` × request size, or what the clients send), and `F` the tokens of
//! the key's requests already in flight when its budget is reached. Then the federation charges
//! the key at most
//!
//! ```text
//! budget + (G − 1) × S + F
//! ```
//!
//! Why: take the gateway that admitted the key's last request, at time `t`. It admitted it
//! because its own count plus the others' as heard — which were at least their counts at
//! `t − T` — was below the budget. The others stopped admitting by `t`, so after `t − T` they
//! admitted at most `S` each; and this gateway's own count is exact. So the total is below the
//! budget plus what the other `G − 1` gateways admitted in that last `T`, plus what was in
//! flight. With the exchange never happening (a partition), each gateway still holds the
//! budget on its own: at most `G × budget + F` in all. Tested with two gateway processes in
//! `gateway/tests/processes/budgets_hold_across_gateways.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tela_core::spend::{SpendCounter, SpendId, SPEND_TAG};
use tela_core::{NodeId, Role};
use tela_runtime::RuntimeView;
use tokio_util::sync::CancellationToken;

use crate::auth::{Access, KeyEntry};
use crate::limits::Now;

/// How often a gateway sends its spend counts by default.
pub const DEFAULT_EXCHANGE: Duration = Duration::from_secs(1);

/// Entries of periods that began longer ago than this are forgotten (the longest period, a
/// month, is at most 31 days).
const FORGET_AFTER_S: u64 = 32 * 86_400;

/// The name of a key in the spend counter: 16 bytes of SHA-256 over a label and the key's
/// hash as the key file holds it.
pub fn spend_id(key_hash: &[u8; 32]) -> SpendId {
    let digest = Sha256::new().chain_update(b"tela spend id v1").chain_update(key_hash).finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    SpendId(id)
}

/// The keys with a budget, by spend id.
type Budgeted = HashMap<SpendId, Arc<KeyEntry>>;

/// One gateway's side of the exchange: its counter, who it is, and the keys it counts for.
pub struct BudgetExchange {
    counter: Mutex<SpendCounter>,
    /// The keys with a budget as of the last round (a key added since waits for the next).
    keys: Mutex<Arc<Budgeted>>,
    me: NodeId,
    access: Access,
    view: RuntimeView,
}

impl BudgetExchange {
    /// The exchange of the gateway whose anchor runtime is `view`, for the keys of `access`;
    /// takes the spend datagrams that arrive on the runtime's connections from now on.
    pub fn start(view: RuntimeView, access: Access) -> Arc<BudgetExchange> {
        let exchange = Arc::new(BudgetExchange {
            counter: Mutex::new(SpendCounter::new()),
            keys: Mutex::default(),
            me: view.node_id(),
            access,
            view: view.clone(),
        });
        let weak = Arc::downgrade(&exchange);
        view.tagged().handle(SPEND_TAG, move |peer, datagram| {
            if let Some(exchange) = weak.upgrade() {
                exchange.receive(peer, datagram, Now::current());
            }
        });
        exchange
    }

    fn counter(&self) -> MutexGuard<'_, SpendCounter> {
        self.counter.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every key with a budget, by its spend id.
    fn budgeted(&self) -> Budgeted {
        let Access::Keys(keys) = &self.access else { return Budgeted::new() };
        let keys = keys.load();
        keys.entries().filter(|(_, e)| e.limits.budget.is_some()).map(|(hash, e)| (spend_id(hash), e.clone())).collect()
    }

    /// Tells each of `keys`' counters what the other gateways charged it (and, after a
    /// restart, what this gateway itself had).
    fn tell_keys<'a>(
        &self,
        keys: impl Iterator<Item = (&'a SpendId, &'a Arc<KeyEntry>)>,
        counter: &SpendCounter,
        now: Now,
    ) {
        for (id, entry) in keys {
            let Some(budget) = entry.limits.budget else { continue };
            let (start, _) = budget.period.bounds(now.unix);
            let elsewhere = counter.spent_elsewhere(*id, start, self.me);
            let own = counter.tally(*id, self.me).filter(|t| t.period == start).map_or(0, |t| t.tokens);
            entry.counters().raise_spent(budget.period, now.unix, own);
            entry.counters().hear_elsewhere(start, elsewhere);
        }
    }

    /// Takes a spend datagram from `peer`; one from a serving node, or one that does not
    /// decode, changes nothing.
    pub fn receive(&self, peer: NodeId, datagram: &[u8], now: Now) {
        let snapshot = self.view.snapshot();
        if snapshot.replica().get(&peer).is_some_and(|s| s.record().role == Role::Serving) {
            tracing::debug!(%peer, "ignored spend counts from serving node {peer}: only gateways count spend");
            return;
        }
        let mut counter = self.counter();
        let changed = match counter.receive(datagram) {
            Ok(changed) => changed,
            Err(e) => {
                tracing::debug!(%peer, "dropped spend counts from {peer}: {e}");
                return;
            }
        };
        if changed.is_empty() {
            return;
        }
        // Only the keys whose counts moved: a datagram arrives per gateway and chunk each period.
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner).clone();
        self.tell_keys(changed.iter().filter_map(|id| keys.get_key_value(id)), &counter, now);
    }

    /// One exchange: writes this gateway's counts into the counter, tells the keys, and
    /// returns the datagrams to send.
    pub fn round(&self, now: Now) -> Vec<Vec<u8>> {
        let keys = Arc::new(self.budgeted());
        *self.keys.lock().unwrap_or_else(PoisonError::into_inner) = keys.clone();
        let mut counter = self.counter();
        counter.forget_before(now.unix.saturating_sub(FORGET_AFTER_S));
        for (id, entry) in keys.iter() {
            let Some(budget) = entry.limits.budget else { continue };
            let (start, _) = budget.period.bounds(now.unix);
            counter.observe(*id, self.me, start, entry.counters().spent(budget.period, now.unix));
        }
        self.tell_keys(keys.iter(), &counter, now);
        counter.encode()
    }

    /// The key's spend in `period_start` over every gateway, as this gateway knows it.
    pub fn spent(&self, id: SpendId, period_start: u64) -> u64 {
        self.counter().spent(id, period_start)
    }
}

/// Runs the exchange every `every` until `stop`.
pub async fn run(exchange: Arc<BudgetExchange>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {
                for datagram in exchange.round(Now::current()) {
                    exchange.view.send_to_gateways(&bytes::Bytes::from(datagram));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_ids_are_stable_distinct_and_not_the_key_hash() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        assert_eq!(spend_id(&a), spend_id(&a));
        assert_ne!(spend_id(&a), spend_id(&b));
        assert_ne!(spend_id(&a).0[..], a[..16]);
    }
}
