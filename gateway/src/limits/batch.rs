//! Batch-token limits: `batch_tpm` pacing and the `batch_budget_tokens` budget, counted apart
//! from the key's interactive requests.

use std::sync::Arc;
use std::time::Duration;

use super::counters::{Counters, KeyCounters, Spend};
use super::key_limits::KeyLimits;
use super::period::{Now, Period};

impl Counters {
    /// The batch spend of the period holding `unix`, starting a new period if that one is over.
    fn batch_spend_in(&mut self, period: Period, unix: u64) -> &mut Spend {
        let (start, _) = period.bounds(unix);
        if self.batch_spend.period_start != start {
            self.batch_spend = Spend { period_start: start, tokens: 0 };
        }
        &mut self.batch_spend
    }
}

impl KeyCounters {
    /// Asks whether a batch request of key `name` estimated at `cost` tokens may be sent now
    /// (see "Batch requests" in [the module docs](super)), charging its batch bucket if so. Never
    /// touches the interactive buckets or the count of requests in flight.
    pub fn admit_batch(self: &Arc<Self>, name: &str, limits: &KeyLimits, cost: u64, now: Now) -> BatchAdmission {
        let mut c = self.lock();
        for (budget, spent, what) in [
            (limits.budget, limits.budget.map(|b| c.federation_spend(b.period, now.unix)), "budget"),
            (
                limits.batch_budget,
                limits.batch_budget.map(|b| c.batch_spend_in(b.period, now.unix).tokens),
                "batch budget",
            ),
        ] {
            let (Some(budget), Some(spent)) = (budget, spent) else { continue };
            if spent >= budget.tokens {
                return BatchAdmission::OverBudget(format!(
                    "key '{name}' has used its {what} of {} tokens per {} ({spent} used); the request was not sent. \
                     The {what} renews at the start of the next {} (UTC); submit the remaining requests again then, \
                     or ask the gateway's operator for a larger {what}.",
                    budget.tokens,
                    budget.period.as_str(),
                    budget.period.as_str(),
                ));
            }
        }
        if let Some(limit) = limits.batch_tokens_per_minute {
            c.batch_tokens.drain(limit, now.instant);
            // A request larger than the whole limit goes alone, once the bucket is empty.
            let wait = c.batch_tokens.wait_for(limit, cost.min(limit));
            if !wait.is_zero() {
                return BatchAdmission::Wait(wait);
            }
            c.batch_tokens.used += cost as f64;
        }
        drop(c);
        BatchAdmission::Send(BatchCharge {
            counters: self.clone(),
            estimate: cost,
            batch_tokens_per_minute: limits.batch_tokens_per_minute,
            budget: limits.budget.map(|b| b.period),
            batch_budget: limits.batch_budget.map(|b| b.period),
            settled: false,
        })
    }

    /// Batch tokens charged in the `period` holding `unix`, on this gateway.
    pub fn batch_spent(&self, period: Period, unix: u64) -> u64 {
        self.lock().batch_spend_in(period, unix).tokens
    }
}

/// Whether a batch request may be sent now.
#[derive(Debug)]
pub enum BatchAdmission {
    /// Send it; settle the charge when it is over.
    Send(BatchCharge),
    /// The key's `batch_tpm` holds no room for it yet: ask again after this long.
    Wait(Duration),
    /// The key's budget or batch budget is used up: the request fails, with this message.
    OverBudget(String),
}

/// A sent batch request's charge on its key: settled with what the node answered, or, when
/// dropped unsettled (the request was not answered), refunded.
#[derive(Debug)]
#[must_use = "an unsettled charge is refunded when dropped"]
pub struct BatchCharge {
    counters: Arc<KeyCounters>,
    estimate: u64,
    batch_tokens_per_minute: Option<u64>,
    budget: Option<Period>,
    batch_budget: Option<Period>,
    settled: bool,
}

impl BatchCharge {
    /// The request was answered successfully at `now`, with the engine's total tokens if it
    /// reported them (else the estimate stands): they are spent, in the budgets too.
    pub fn answered(mut self, usage: Option<u64>, now: Now) {
        self.settle(Some(usage.unwrap_or(self.estimate)), now);
    }

    /// `spent`: the tokens used, or `None` to refund the estimate.
    fn settle(&mut self, spent: Option<u64>, now: Now) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let mut c = self.counters.lock();
        if let Some(limit) = self.batch_tokens_per_minute {
            c.batch_tokens.drain(limit, now.instant);
            let charged = spent.unwrap_or(0);
            c.batch_tokens.used = (c.batch_tokens.used + charged as f64 - self.estimate as f64).max(0.0);
        }
        let Some(spent) = spent else { return };
        if let Some(period) = self.budget {
            let spend = c.spend_in(period, now.unix);
            spend.tokens = spend.tokens.saturating_add(spent);
        }
        if let Some(period) = self.batch_budget {
            let spend = c.batch_spend_in(period, now.unix);
            spend.tokens = spend.tokens.saturating_add(spent);
        }
    }
}

impl Drop for BatchCharge {
    fn drop(&mut self) {
        self.settle(None, Now::current());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use crate::limits::test_clock::at;
    use crate::limits::Budget;

    #[test]
    fn batch_requests_have_their_own_minute_and_count_toward_the_budget() {
        let counters = Arc::new(KeyCounters::default());
        let budget = Budget { tokens: 10_000, period: Period::Day };
        let l = KeyLimits {
            tokens_per_minute: Some(100),
            budget: Some(budget),
            batch_tokens_per_minute: Some(600),
            batch_budget: Some(Budget { tokens: 1_000, period: Period::Day }),
            ..KeyLimits::default()
        };
        let t0 = Instant::now();
        let send = |cost, now| match counters.admit_batch("k", &l, cost, now) {
            BatchAdmission::Send(charge) => charge,
            other => panic!("expected to send, got {other:?}"),
        };
        let a = send(400, at(t0, 0.0));
        let b = send(200, at(t0, 0.0));
        // The batch bucket is full; the interactive one is untouched.
        match counters.admit_batch("k", &l, 100, at(t0, 0.0)) {
            BatchAdmission::Wait(wait) => assert_eq!(wait, Duration::from_secs(10), "100 of 600/min"),
            other => panic!("expected to wait, got {other:?}"),
        }
        let interactive = counters.admit("k", &l, 100, at(t0, 0.0)).expect("batches leave the interactive minute");
        assert_eq!(interactive.headers.tokens.map(|g| g.remaining), Some(0));
        assert_eq!(counters.in_flight(), 1, "batch requests are not in flight for `concurrent`");
        drop(interactive);
        // Answered with usage: corrected and charged to both budgets; unanswered: refunded.
        a.answered(Some(300), at(t0, 0.0));
        drop(b);
        let unix = at(t0, 0.0).unix;
        assert_eq!((counters.spent(Period::Day, unix), counters.batch_spent(Period::Day, unix)), (300, 300));
        let c = send(300, at(t0, 0.0));
        assert!(matches!(counters.admit_batch("k", &l, 1, at(t0, 0.0)), BatchAdmission::Wait(_)));
        assert!(matches!(counters.admit_batch("k", &l, 1, at(t0, 0.2)), BatchAdmission::Send(_)), "it refills");
        // A request above the whole limit goes alone once the bucket is empty.
        c.answered(None, at(t0, 0.1));
        assert!(matches!(counters.admit_batch("k", &l, 5_000, at(t0, 10.0)), BatchAdmission::Wait(_)));
        let huge = send(5_000, at(t0, 60.0));
        huge.answered(Some(700), at(t0, 60.0));
        // 300 + 300 + 700 = 1300 batch tokens: the batch budget (1000) is spent, the key's is not.
        match counters.admit_batch("k", &l, 1, at(t0, 200.0)) {
            BatchAdmission::OverBudget(message) => assert!(message.contains("batch budget of 1000"), "{message}"),
            other => panic!("expected the batch budget to refuse, got {other:?}"),
        }
        assert_eq!(counters.spent(Period::Day, unix), 1300);
        counters.admit("k", &l, 10, at(t0, 200.0)).expect("interactive requests still have the key's budget");
        // Batch spend counts toward the key's whole budget: interactive requests find it spent.
        let whole = KeyLimits { budget: Some(Budget { tokens: 1_300, period: Period::Day }), ..KeyLimits::default() };
        let refused = counters.admit("k", &whole, 1, at(t0, 200.0)).expect_err("the batch used the budget");
        assert_eq!(refused.limit, "budget");
        assert!(matches!(counters.admit_batch("k", &whole, 1, at(t0, 200.0)), BatchAdmission::OverBudget(_)));
    }
}
