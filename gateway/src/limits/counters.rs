//! One key's counters: admitting its interactive requests under `rpm`, `tpm`, `concurrent` and
//! `budget_tokens`, and the guard that releases each request and settles what it used.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::bucket::Bucket;
use super::headers::{format_reset, retry_after, RateHeaders};
use super::key_limits::KeyLimits;
use super::period::{Now, Period};
use crate::api_error::ApiError;

/// Tokens charged in one budget period (see [the module docs](super) on spreading it between gateways).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Spend {
    pub(super) period_start: u64,
    pub(super) tokens: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) requests: Bucket,
    pub(super) tokens: Bucket,
    pub(super) in_flight: u32,
    pub(super) spend: Spend,
    /// What the other gateways charged the key, as last heard ([`crate::budgets`]).
    pub(super) elsewhere: Spend,
    /// Batch tokens per minute: a bucket of its own, so batches never use the interactive one.
    pub(super) batch_tokens: Bucket,
    /// Batch tokens of the `batch_budget_tokens` period, on this gateway.
    pub(super) batch_spend: Spend,
}

impl Counters {
    /// The spend of the period holding `unix`, starting a new period if that one is over.
    pub(super) fn spend_in(&mut self, period: Period, unix: u64) -> &mut Spend {
        let (start, _) = period.bounds(unix);
        if self.spend.period_start != start {
            self.spend = Spend { period_start: start, tokens: 0 };
        }
        &mut self.spend
    }

    /// The spend of the period holding `unix` here and on the other gateways, as last heard.
    pub(super) fn federation_spend(&mut self, period: Period, unix: u64) -> u64 {
        let Spend { period_start: start, tokens: local } = *self.spend_in(period, unix);
        let elsewhere = self.elsewhere;
        local.saturating_add(if elsewhere.period_start == start { elsewhere.tokens } else { 0 })
    }

    fn headers(&mut self, limits: &KeyLimits, now: Instant) -> RateHeaders {
        let mut headers = RateHeaders::default();
        if let Some(limit) = limits.requests_per_minute {
            self.requests.drain(limit, now);
            headers.requests = Some(self.requests.gauge(limit));
        }
        if let Some(limit) = limits.tokens_per_minute {
            self.tokens.drain(limit, now);
            headers.tokens = Some(self.tokens.gauge(limit));
        }
        headers
    }
}

/// One key's counters (see [the module docs](super)); shared by every request of the key.
#[derive(Debug, Default)]
pub struct KeyCounters {
    inner: Mutex<Counters>,
}

/// An admitted request: the guard to hold until its response ends, and its headers.
#[derive(Debug)]
pub struct Admission {
    /// Releases the request's slot and charges its budget when dropped.
    pub guard: KeyGuard,
    /// The `x-ratelimit-*` headers after this request was charged.
    pub headers: RateHeaders,
}

/// A refused request.
#[derive(Debug)]
pub struct Refusal {
    /// The 429 to answer.
    pub error: ApiError,
    /// The `x-ratelimit-*` headers as they stand.
    pub headers: RateHeaders,
    /// Which limit refused it: `requests`, `tokens`, `concurrent`, `budget` or `too_large`.
    pub limit: &'static str,
}

impl KeyCounters {
    pub(super) fn lock(&self) -> MutexGuard<'_, Counters> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a request of key `name` that is estimated at `cost` tokens, charging it, or says
    /// which limit refuses it (charging nothing).
    pub fn admit(
        self: &Arc<Self>,
        name: &str,
        limits: &KeyLimits,
        cost: u64,
        now: Now,
    ) -> Result<Admission, Box<Refusal>> {
        let mut c = self.lock();
        let headers = c.headers(limits, now.instant);
        let refuse = |error: ApiError, limit: &'static str| Err(Box::new(Refusal { error, headers, limit }));
        if let Some(max) = limits.concurrent {
            if c.in_flight >= max {
                return refuse(
                    ApiError::rate_limited(
                        "requests",
                        format!(
                            "Rate limit reached for key '{name}' on concurrent requests: Limit {max}, In flight {}. \
                             Please try again when one of them has finished.",
                            c.in_flight
                        ),
                        Some(1),
                    ),
                    "concurrent",
                );
            }
        }
        if let Some(budget) = limits.budget {
            let spent = c.federation_spend(budget.period, now.unix);
            if spent >= budget.tokens {
                let (_, end) = budget.period.bounds(now.unix);
                let wait = Duration::from_secs(end.saturating_sub(now.unix));
                return refuse(
                    ApiError::quota_exceeded(
                        format!(
                            "key '{name}' has used its budget of {} tokens per {} ({spent} used); it renews at the \
                             start of the next {} (UTC), in {}. Ask the gateway's operator for a larger budget.",
                            budget.tokens,
                            budget.period.as_str(),
                            budget.period.as_str(),
                            format_reset(wait)
                        ),
                        retry_after(wait),
                    ),
                    "budget",
                );
            }
        }
        if let Some(limit) = limits.tokens_per_minute {
            if cost > limit {
                return refuse(
                    ApiError::rate_limited(
                        "tokens",
                        format!(
                            "Request too large for key '{name}' on tokens per min (TPM): Limit {limit}, Requested \
                             {cost}. Send a shorter prompt or a lower max_tokens."
                        ),
                        None,
                    ),
                    "too_large",
                );
            }
        }
        let wait_requests = limits.requests_per_minute.map_or(Duration::ZERO, |l| c.requests.wait_for(l, 1));
        let wait_tokens = limits.tokens_per_minute.map_or(Duration::ZERO, |l| c.tokens.wait_for(l, cost));
        let wait = wait_requests.max(wait_tokens);
        if !wait.is_zero() {
            let (kind, what, limit, used, requested) = if !wait_requests.is_zero() {
                let limit = limits.requests_per_minute.unwrap_or_default();
                ("requests", "requests per min (RPM)", limit, c.requests.used, 1)
            } else {
                let limit = limits.tokens_per_minute.unwrap_or_default();
                ("tokens", "tokens per min (TPM)", limit, c.tokens.used, cost)
            };
            return refuse(
                ApiError::rate_limited(
                    kind,
                    format!(
                        "Rate limit reached for key '{name}' on {what}: Limit {limit}, Used {}, Requested {requested}. \
                         Please try again in {}.",
                        used.ceil() as u64,
                        format_reset(wait)
                    ),
                    retry_after(wait),
                ),
                kind,
            );
        }
        if limits.requests_per_minute.is_some() {
            c.requests.used += 1.0;
        }
        if limits.tokens_per_minute.is_some() {
            c.tokens.used += cost as f64;
        }
        c.in_flight += 1;
        let headers = c.headers(limits, now.instant);
        drop(c);
        let guard = KeyGuard {
            counters: self.clone(),
            estimate: cost,
            tokens_per_minute: limits.tokens_per_minute,
            budget: limits.budget.map(|b| b.period),
            settlement: Settlement::default(),
            released: false,
        };
        Ok(Admission { guard, headers })
    }

    /// The headers as they stand at `now`, charging nothing (for responses that are not
    /// inference requests, such as `/v1/models`).
    pub fn headers(&self, limits: &KeyLimits, now: Instant) -> RateHeaders {
        self.lock().headers(limits, now)
    }

    /// Requests admitted and not yet ended.
    pub fn in_flight(&self) -> u32 {
        self.lock().in_flight
    }

    /// Tokens charged in the `period` holding `unix`, on this gateway.
    pub fn spent(&self, period: Period, unix: u64) -> u64 {
        self.lock().spend_in(period, unix).tokens
    }

    /// Tokens charged in the `period` holding `unix` on every gateway: this one's own count
    /// plus the others' as last heard ([`KeyCounters::hear_elsewhere`]).
    pub fn federation_spent(&self, period: Period, unix: u64) -> u64 {
        self.lock().federation_spend(period, unix)
    }

    /// The other gateways' spend for the period starting at `period_start` (Unix seconds), as
    /// just heard; a count for an older period, or lower than the one held, changes nothing.
    pub fn hear_elsewhere(&self, period_start: u64, tokens: u64) {
        let mut c = self.lock();
        let held = c.elsewhere;
        if (period_start, tokens) > (held.period_start, held.tokens) {
            c.elsewhere = Spend { period_start, tokens };
        }
    }

    /// Raises this gateway's own count for the `period` holding `unix` to at least `tokens`: a
    /// restarted gateway learns back from its peers what it had charged before.
    pub fn raise_spent(&self, period: Period, unix: u64, tokens: u64) {
        let mut c = self.lock();
        let spend = c.spend_in(period, unix);
        spend.tokens = spend.tokens.max(tokens);
    }
}

/// What became of an admitted request, told by whoever learns it; read when its
/// [`KeyGuard`] is released.
#[derive(Clone, Debug, Default)]
pub struct Settlement(Arc<SettlementState>);

#[derive(Debug)]
struct SettlementState {
    answered: AtomicBool,
    usage: AtomicU64,
}

impl Default for SettlementState {
    fn default() -> Self {
        SettlementState { answered: AtomicBool::new(false), usage: AtomicU64::new(u64::MAX) }
    }
}

impl Settlement {
    /// A node answered the request successfully: its tokens are spent (else they are refunded).
    pub fn answered(&self) {
        self.0.answered.store(true, Ordering::Release);
    }

    /// The engine reported the request's total tokens: they replace the estimate.
    pub fn usage(&self, total_tokens: u64) {
        self.0.usage.store(total_tokens.min(u64::MAX - 1), Ordering::Release);
    }

    fn outcome(&self) -> (bool, Option<u64>) {
        let usage = self.0.usage.load(Ordering::Acquire);
        (self.0.answered.load(Ordering::Acquire), (usage != u64::MAX).then_some(usage))
    }
}

/// An admitted request's hold on its key's counters: releases its slot when dropped, charges
/// the budget the tokens it used, and corrects (or refunds) its per-minute token charge.
#[derive(Debug)]
#[must_use = "the request counts as in flight only while the guard is held"]
pub struct KeyGuard {
    counters: Arc<KeyCounters>,
    estimate: u64,
    tokens_per_minute: Option<u64>,
    budget: Option<Period>,
    settlement: Settlement,
    released: bool,
}

impl KeyGuard {
    /// Where the request's outcome is told.
    pub fn settlement(&self) -> Settlement {
        self.settlement.clone()
    }

    /// Releases the request at `now` (dropping the guard does this at the current time).
    pub fn release_at(mut self, now: Now) {
        self.release(now);
    }

    fn release(&mut self, now: Now) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let (answered, usage) = self.settlement.outcome();
        let mut c = self.counters.lock();
        c.in_flight = c.in_flight.saturating_sub(1);
        if let Some(limit) = self.tokens_per_minute {
            c.tokens.drain(limit, now.instant);
            let charged = if answered { usage.unwrap_or(self.estimate) } else { 0 };
            c.tokens.used = (c.tokens.used + charged as f64 - self.estimate as f64).max(0.0);
        }
        if let (Some(period), true) = (self.budget, answered) {
            let spend = c.spend_in(period, now.unix);
            spend.tokens = spend.tokens.saturating_add(usage.unwrap_or(self.estimate));
        }
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        self.release(Now::current());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::test_clock::at;
    use crate::limits::{Budget, RateGauge};

    fn limits(rpm: Option<u64>, tpm: Option<u64>) -> KeyLimits {
        KeyLimits { requests_per_minute: rpm, tokens_per_minute: tpm, ..KeyLimits::default() }
    }

    #[test]
    fn requests_per_minute_refill_and_their_headers_say_so() {
        let counters = Arc::new(KeyCounters::default());
        let l = limits(Some(3), None);
        let t0 = Instant::now();
        let mut guards = Vec::new();
        for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
            let a = counters.admit("k", &l, 0, at(t0, 0.0)).expect("within the limit");
            let g = a.headers.requests.expect("requests headers");
            assert_eq!((g.limit, g.remaining), (3, remaining));
            // Each request takes 20 s of refill (3 a minute).
            assert_eq!(g.reset, Duration::from_secs(20 * (i as u64 + 1)));
            assert_eq!(a.headers.tokens, None, "no token limit, no token headers");
            guards.push(a.guard);
        }
        let refused = counters.admit("k", &l, 0, at(t0, 0.0)).expect_err("the fourth in a minute");
        assert_eq!(refused.limit, "requests");
        assert_eq!(refused.error.status, http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.error.code, "rate_limit_exceeded");
        assert_eq!(refused.error.kind, "requests");
        assert_eq!(refused.error.retry_after, Some(20));
        assert!(refused.error.message.contains("Limit 3, Used 3, Requested 1"), "{}", refused.error.message);
        assert_eq!(refused.headers.requests.map(|g| g.remaining), Some(0));
        // 5 s later the next one is 15 s away; 20 s later one fits again.
        assert_eq!(counters.admit("k", &l, 0, at(t0, 5.0)).expect_err("still full").error.retry_after, Some(15));
        let again = counters.admit("k", &l, 0, at(t0, 20.0)).expect("refilled by one");
        assert_eq!(again.headers.requests.map(|g| (g.remaining, g.reset)), Some((0, Duration::from_secs(60))));
        // A minute after the last, the bucket is full: nothing to reset.
        let h = counters.headers(&l, t0 + Duration::from_secs(80));
        assert_eq!(h.requests, Some(RateGauge { limit: 3, remaining: 3, reset: Duration::ZERO }));
    }

    #[test]
    fn tokens_are_charged_refunded_and_corrected() {
        let counters = Arc::new(KeyCounters::default());
        let l = limits(None, Some(600));
        let t0 = Instant::now();
        let a = counters.admit("k", &l, 500, at(t0, 0.0)).expect("fits");
        assert_eq!(a.headers.tokens.map(|g| (g.remaining, g.reset)), Some((100, Duration::from_secs(50))));
        let refused = counters.admit("k", &l, 200, at(t0, 0.0)).expect_err("100 left, 200 asked");
        assert_eq!((refused.limit, refused.error.kind), ("tokens", "tokens"));
        assert_eq!(refused.error.retry_after, Some(10), "100 tokens refill in 10 s at 600/min");
        let too_large = counters.admit("k", &l, 601, at(t0, 0.0)).expect_err("never fits");
        assert_eq!((too_large.limit, too_large.error.retry_after), ("too_large", None));
        // No node answered: the estimate comes back.
        a.guard.release_at(at(t0, 0.0));
        assert_eq!(counters.headers(&l, t0).tokens.map(|g| g.remaining), Some(600));
        // Answered, with the engine's usage: the difference is charged.
        let b = counters.admit("k", &l, 500, at(t0, 0.0)).expect("fits again");
        b.guard.settlement().answered();
        b.guard.settlement().usage(50);
        b.guard.release_at(at(t0, 0.0));
        assert_eq!(counters.headers(&l, t0).tokens.map(|g| g.remaining), Some(550));
        // Answered, usage unknown: the estimate stands.
        let c = counters.admit("k", &l, 100, at(t0, 0.0)).expect("fits");
        c.guard.settlement().answered();
        c.guard.release_at(at(t0, 0.0));
        assert_eq!(counters.headers(&l, t0).tokens.map(|g| g.remaining), Some(450));
    }

    #[test]
    fn concurrent_requests_are_released_when_their_guard_drops() {
        let counters = Arc::new(KeyCounters::default());
        let l = KeyLimits { concurrent: Some(2), ..KeyLimits::default() };
        let now = at(Instant::now(), 0.0);
        let a = counters.admit("k", &l, 1, now).expect("first");
        let b = counters.admit("k", &l, 1, now).expect("second");
        assert_eq!(a.headers, RateHeaders::default(), "no rate limit, no headers");
        let refused = counters.admit("k", &l, 1, now).expect_err("a third at once");
        assert_eq!((refused.limit, refused.error.retry_after), ("concurrent", Some(1)));
        assert_eq!(counters.in_flight(), 2);
        drop(a);
        assert_eq!(counters.in_flight(), 1);
        let c = counters.admit("k", &l, 1, now).expect("a slot is free again");
        drop((b, c));
        assert_eq!(counters.in_flight(), 0);
    }

    #[test]
    fn budgets_hold_for_their_calendar_period() {
        // 2024-03-15 12:00 UTC, a Friday.
        let t = 1_710_504_000;
        assert_eq!(Period::Day.bounds(t), (1_710_460_800, 1_710_547_200));
        assert_eq!(Period::Week.bounds(t), (1_710_115_200, 1_710_720_000), "Monday 11 to Monday 18 March");
        assert_eq!(Period::Month.bounds(t), (1_709_251_200, 1_711_929_600), "1 March to 1 April");
        assert_eq!(Period::Month.bounds(951_782_400).1, 951_868_800, "29 Feb 2000 ends a leap month");
        assert_eq!(Period::Month.bounds(1_702_000_000).1, 1_704_067_200, "December ends with the year");
        assert_eq!(Period::Week.bounds(0).0, 0, "never before 1970");

        let counters = Arc::new(KeyCounters::default());
        let l = KeyLimits { budget: Some(Budget { tokens: 1000, period: Period::Day }), ..KeyLimits::default() };
        let t0 = Instant::now();
        let now = at(t0, 0.0);
        let a = counters.admit("k", &l, 600, now).expect("budget left");
        let b = counters.admit("k", &l, 600, now).expect("spend counts when responses end");
        for g in [a.guard, b.guard] {
            g.settlement().answered();
            g.release_at(now);
        }
        assert_eq!(counters.spent(Period::Day, now.unix), 1200, "an overspend by what was in flight");
        let refused = counters.admit("k", &l, 1, now).expect_err("spent");
        assert_eq!((refused.limit, refused.error.code), ("budget", "insufficient_quota"));
        assert_eq!(refused.error.retry_after, Some(12 * 3600), "until midnight UTC");
        // A request no node answered costs nothing.
        let next_day = Now { instant: t0, unix: now.unix + 12 * 3600 };
        let c = counters.admit("k", &l, 900, next_day).expect("a new day");
        c.guard.release_at(next_day);
        assert_eq!(counters.spent(Period::Day, next_day.unix), 0);
    }

    #[test]
    fn budgets_count_what_other_gateways_charged() {
        let counters = Arc::new(KeyCounters::default());
        let l = KeyLimits { budget: Some(Budget { tokens: 1000, period: Period::Day }), ..KeyLimits::default() };
        let now = at(Instant::now(), 0.0);
        let (start, _) = Period::Day.bounds(now.unix);
        let a = counters.admit("k", &l, 300, now).expect("budget left");
        a.guard.settlement().answered();
        a.guard.release_at(now);
        // Others' spend of a past period, or lower than heard before, changes nothing.
        counters.hear_elsewhere(start - 86_400, 5000);
        counters.admit("k", &l, 1, now).expect("yesterday's spend does not count").guard.release_at(now);
        counters.hear_elsewhere(start, 700);
        counters.hear_elsewhere(start, 100);
        assert_eq!(
            (counters.spent(Period::Day, now.unix), counters.federation_spent(Period::Day, now.unix)),
            (300, 1000)
        );
        let refused = counters.admit("k", &l, 1, now).expect_err("the federation spent the budget");
        assert_eq!((refused.limit, refused.error.code), ("budget", "insufficient_quota"));
        assert!(refused.error.message.contains("1000 used"), "{}", refused.error.message);
        // A restarted gateway learns back its own count; it never moves down.
        counters.raise_spent(Period::Day, now.unix, 250);
        assert_eq!(counters.spent(Period::Day, now.unix), 300);
        counters.raise_spent(Period::Day, now.unix, 400);
        assert_eq!(counters.spent(Period::Day, now.unix), 400);
    }

    #[test]
    fn limits_changed_by_a_reload_apply_to_the_same_counters() {
        let counters = Arc::new(KeyCounters::default());
        let t0 = Instant::now();
        let g = counters.admit("k", &limits(Some(10), None), 0, at(t0, 0.0)).expect("fits");
        drop(g);
        // Lowered to 1 a minute: the request already made counts against it.
        let refused = counters.admit("k", &limits(Some(1), None), 0, at(t0, 1.0)).expect_err("the minute is used");
        assert_eq!(refused.headers.requests.map(|g| g.remaining), Some(0));
    }
}
