//! Per-key limits: requests and tokens per minute, requests at once, and a token budget per
//! calendar period — with OpenAI's `x-ratelimit-*` headers on every response to a limited key
//! and a 429 in OpenAI's error shape, with `Retry-After`, when a limit is reached.
//!
//! A key's limits ([`KeyLimits`]) come from its line in the key file ([`crate::auth`]); its
//! counters ([`KeyCounters`]) live as long as its hash stays in the file, so a reload that
//! changes a key's limits, or other keys, does not hand it a fresh minute. The counters are
//! this gateway's own and live in memory: behind several gateways a key can make its rates at
//! each of them, and a restarted gateway starts every key's minute and budget afresh.
//!
//! # Requests and tokens per minute: token buckets
//!
//! Each is a bucket that holds `limit` units and refills continuously at `limit` per minute
//! (so a full bucket takes exactly one minute to refill from empty). A request takes one unit
//! of the request bucket and its token estimate from the token bucket; it is admitted only if
//! both hold enough, and charges neither when either refuses. This is OpenAI's own model:
//! bursts up to the limit, then a steady rate. The headers read the buckets just after the
//! request was charged (or refused); on responses that charge nothing (`/v1/models`, errors
//! answered before the limits are checked) they read them as they are:
//!
//! | header | value |
//! |---|---|
//! | `x-ratelimit-limit-requests` / `-tokens` | the limit per minute |
//! | `x-ratelimit-remaining-requests` / `-tokens` | whole units in the bucket now |
//! | `x-ratelimit-reset-requests` / `-tokens` | time until the bucket is full again, formatted as OpenAI does: `"20s"`, `"6m0s"`, `"1.5s"`, `"120ms"` |
//!
//! Headers appear only for the limits a key has. A refused request gets `Retry-After`: the
//! whole seconds until its bucket(s) hold enough for it (at least 1).
//!
//! A request's token estimate ([`estimate_tokens`]) is its text's characters / 4 (the strings
//! of `messages`, `prompt` and `input`; images and audio are not counted) plus its completion
//! allowance: `max_completion_tokens`, else `max_tokens`, else [`DEFAULT_COMPLETION_TOKENS`],
//! times `n`; embeddings have none. The estimate is charged when the request is admitted; when
//! its response ends, the engine's own `usage` (read from the body, or from a stream's final
//! usage event, which the gateway asks for: [`crate::body`]) replaces it through
//! [`Settlement::usage`], and the counters charge the difference. Without a usage (an engine
//! that reports none, a client that left early) the estimate stands. A request that no
//! node answered (a 404, a 503, a cut tunnel before the response began) is refunded its
//! tokens; it still counts as a request, as at OpenAI. A request whose estimate exceeds the
//! key's whole tokens-per-minute limit can never pass: it gets 429 without `Retry-After` and a
//! message saying to send less.
//!
//! # Requests at once
//!
//! An admitted request holds a [`KeyGuard`] that the response body keeps until it ends, fails
//! or is dropped because the client went away ([`crate::body`]; the same rule as the node's
//! in-flight guard in [`crate::routing`]), so the count can never leak. Over the limit: 429,
//! `Retry-After: 1`.
//!
//! # Token budgets
//!
//! `budget_tokens=N/day|week|month`: the tokens charged in the current UTC calendar day, ISO
//! week (from Monday) or month. A request is charged when its response ends (the estimate, or
//! the usage once known). Requests are refused — 429, OpenAI's `insufficient_quota`, with
//! `Retry-After` until the next period begins — once the period's spend has reached the
//! budget. On one gateway, a key overspends by at most what its requests in flight then use.
//!
//! The spend is kept per (key, period) as a counter that only grows within its period. Behind
//! several gateways, each publishes its own count per (key, gateway, period) and peers keep
//! the largest value heard from each gateway (a grow-only counter merged by max,
//! [`tela_core::spend`]); [`crate::budgets`] exchanges it and tells each key's counters what
//! the other gateways charged ([`KeyCounters::hear_elsewhere`]). A request is refused once this
//! gateway's own count plus the others' reaches the budget; [`crate::budgets`] states by how
//! much a key can overspend across gateways.

//!
//! # Batch requests
//!
//! Requests of the key's batches ([`crate::batch`]) are sent by the batch runner, not by the
//! key's clients, and are kept apart from its interactive requests, so a big batch never
//! makes the same key's interactive requests wait or get 429:
//!
//! - `rpm`, `tpm` and `concurrent` count interactive requests only; batch requests take
//!   nothing from them and do not show in the `x-ratelimit-*` headers.
//! - `batch_tpm=N` paces the key's batch requests to `N` tokens per minute, in a bucket of
//!   its own that works as the interactive one does (each request's estimate charged when
//!   sent, corrected to the engine's usage when answered, refunded when not answered). A
//!   request that does not fit is not failed: the runner waits until it fits
//!   ([`KeyCounters::admit_batch`] says how long). One estimated at more than `N` goes alone
//!   once the bucket is empty, so every request is eventually sent.
//! - `budget_tokens` is the key's whole spend: batch tokens count toward it like interactive
//!   ones (so they are also in what [`crate::budgets`] exchanges between gateways, and a
//!   batch can use up the budget that interactive requests then find spent).
//! - `batch_budget_tokens=N/day|week|month` caps the batch part alone, on this gateway (it is
//!   not exchanged: a key's batches behind several gateways get it at each).
//!
//! A batch request is refused, once the period's spend reaches either budget, by an error
//! line in the batch's error file with code `budget_exceeded` (it is not retried); the batch
//! still completes, with those requests counted as failed. Only answered (2xx) batch requests
//! are charged to the budgets, when they end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::api_error::ApiError;

/// The completion tokens a request is assumed to ask for when it sets no `max_tokens`.
pub const DEFAULT_COMPLETION_TOKENS: u64 = 256;

/// The length of a rate window: limits are per minute.
const WINDOW: Duration = Duration::from_secs(60);

/// One key's limits, as its key-file line sets them; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// Requests per minute (`rpm=`).
    pub requests_per_minute: Option<u64>,
    /// Tokens per minute (`tpm=`).
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once (`concurrent=`).
    pub concurrent: Option<u32>,
    /// Tokens per calendar period (`budget_tokens=`), interactive and batch together.
    pub budget: Option<Budget>,
    /// Batch tokens per minute (`batch_tpm=`): paces the key's batches ([`KeyCounters::admit_batch`]).
    pub batch_tokens_per_minute: Option<u64>,
    /// Batch tokens per calendar period (`batch_budget_tokens=`).
    pub batch_budget: Option<Budget>,
    /// GPU-hours per calendar period of the jobs the spinner starts for the key's batch backlog
    /// (`batch_gpu_hours=`; see [`crate::spin::batch_demand`]).
    pub batch_gpu_hours: Option<GpuHours>,
}

impl KeyLimits {
    /// True when no limit on interactive requests is set: they are not counted at all (batch
    /// requests are counted by the batch runner whatever this says).
    pub fn is_unlimited(&self) -> bool {
        self.requests_per_minute.is_none()
            && self.tokens_per_minute.is_none()
            && self.concurrent.is_none()
            && self.budget.is_none()
    }

    /// Whether the batch runner must ask the key's counters before sending one of its requests.
    pub fn limits_batches(&self) -> bool {
        self.batch_tokens_per_minute.is_some() || self.batch_budget.is_some() || self.budget.is_some()
    }

    /// Whether a per-minute limit is set, so responses carry `x-ratelimit-*` headers.
    pub fn has_rates(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some()
    }

    /// Whether admitting a request needs its token estimate.
    pub fn counts_tokens(&self) -> bool {
        self.tokens_per_minute.is_some() || self.budget.is_some()
    }
}

/// A token budget per calendar period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Tokens per period.
    pub tokens: u64,
    /// The period.
    pub period: Period,
}

/// GPU-hours per calendar period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuHours {
    /// GPU-hours per period.
    pub hours: u64,
    /// The period.
    pub period: Period,
}

/// A UTC calendar period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// From 00:00 UTC.
    Day,
    /// From Monday 00:00 UTC.
    Week,
    /// From the 1st, 00:00 UTC.
    Month,
}

impl Period {
    /// The name used in the key file.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// Parses `day`, `week` or `month`.
    pub fn parse(s: &str) -> Option<Period> {
        match s {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    /// The start and end (Unix seconds) of the period holding `unix`.
    pub fn bounds(self, unix: u64) -> (u64, u64) {
        const DAY: u64 = 86_400;
        let days = unix / DAY;
        let (start, end) = match self {
            Period::Day => (days, days + 1),
            Period::Week => {
                // 1970-01-01 was a Thursday: three days after a Monday.
                let monday = days.saturating_sub((days + 3) % 7);
                (monday, monday + 7)
            }
            Period::Month => {
                let (y, m, _) = civil_from_days(days as i64);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (days_from_civil(y, m, 1) as u64, days_from_civil(ny, nm, 1) as u64)
            }
        };
        (start * DAY, end * DAY)
    }
}

/// Year, month and day of a count of days since 1970-01-01 (H. Hinnant's algorithm).
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a date (the inverse of [`civil_from_days`]).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A moment, on both clocks the counters use: the monotonic one for the per-minute buckets
/// (immune to clock steps) and the calendar one for budget periods.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// For rates.
    pub instant: Instant,
    /// Unix seconds, for budget periods.
    pub unix: u64,
}

impl Now {
    /// The current moment.
    pub fn current() -> Now {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Now { instant: Instant::now(), unix }
    }
}

/// What a bucket looked like: one limit's three headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateGauge {
    /// The limit per minute.
    pub limit: u64,
    /// Whole units left now.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset: Duration,
}

/// The `x-ratelimit-*` headers of one response: one gauge per limit the key has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateHeaders {
    /// Requests per minute.
    pub requests: Option<RateGauge>,
    /// Tokens per minute.
    pub tokens: Option<RateGauge>,
}

impl RateHeaders {
    /// Adds the headers to `headers`.
    pub fn write(&self, headers: &mut HeaderMap) {
        for (kind, gauge) in [("requests", self.requests), ("tokens", self.tokens)] {
            let Some(g) = gauge else { continue };
            let mut put = |what: &str, value: String| {
                if let (Ok(name), Ok(value)) =
                    (HeaderName::try_from(format!("x-ratelimit-{what}-{kind}")), HeaderValue::try_from(value))
                {
                    headers.insert(name, value);
                }
            };
            put("limit", g.limit.to_string());
            put("remaining", g.remaining.to_string());
            put("reset", format_reset(g.reset));
        }
    }
}

/// A duration as OpenAI writes its reset headers (Go's notation, to the millisecond):
/// `"0s"`, `"120ms"`, `"1.5s"`, `"20s"`, `"6m0s"`, `"1h0m0s"`. Rounded up, so a client that
/// waits that long finds the bucket full.
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, minutes) = (ms / 3_600_000, ms / 60_000 % 60);
    let (secs, frac) = (ms / 1000 % 60, ms % 1000);
    let mut seconds = secs.to_string();
    if frac > 0 {
        let digits = format!("{frac:03}");
        seconds.push('.');
        seconds.push_str(digits.trim_end_matches('0'));
    }
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

/// Units used of a per-minute limit, draining at `limit` per minute.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    used: f64,
    at: Option<Instant>,
}

impl Bucket {
    fn per_second(limit: u64) -> f64 {
        limit as f64 / WINDOW.as_secs_f64()
    }

    /// How long `units` take to refill under `limit` (multiplied first: `1 * 60 / 3` is exactly
    /// 20 s, where `1 / (3 / 60)` is not).
    fn refill_time(limit: u64, units: f64) -> Duration {
        Duration::from_secs_f64((units * WINDOW.as_secs_f64() / limit as f64).max(0.0))
    }

    /// Brings `used` up to `now` (time never goes backwards: an earlier `now` changes nothing).
    fn drain(&mut self, limit: u64, now: Instant) {
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.used = (self.used - elapsed * Bucket::per_second(limit)).max(0.0);
        }
        if self.at.map_or(true, |at| now > at) {
            self.at = Some(now);
        }
    }

    /// How long until `cost` more fits under `limit` (zero if it fits now).
    fn wait_for(&self, limit: u64, cost: u64) -> Duration {
        let excess = self.used + cost as f64 - limit as f64;
        if excess <= 0.0 {
            return Duration::ZERO;
        }
        Bucket::refill_time(limit, excess)
    }

    fn gauge(&self, limit: u64) -> RateGauge {
        let left = (limit as f64 - self.used).max(0.0);
        // A hair of float error must not read as one unit short.
        let remaining = (left + 1e-9).floor() as u64;
        RateGauge { limit, remaining, reset: Bucket::refill_time(limit, self.used) }
    }
}

/// Tokens charged in one budget period (see the module docs on spreading it between gateways).
#[derive(Clone, Copy, Debug, Default)]
struct Spend {
    period_start: u64,
    tokens: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: Bucket,
    tokens: Bucket,
    in_flight: u32,
    spend: Spend,
    /// What the other gateways charged the key, as last heard ([`crate::budgets`]).
    elsewhere: Spend,
    /// Batch tokens per minute: a bucket of its own, so batches never use the interactive one.
    batch_tokens: Bucket,
    /// Batch tokens of the `batch_budget_tokens` period, on this gateway.
    batch_spend: Spend,
}

impl Counters {
    /// The spend of the period holding `unix`, starting a new period if that one is over.
    fn spend_in(&mut self, period: Period, unix: u64) -> &mut Spend {
        let (start, _) = period.bounds(unix);
        if self.spend.period_start != start {
            self.spend = Spend { period_start: start, tokens: 0 };
        }
        &mut self.spend
    }

    /// The batch spend of the period holding `unix`, starting a new period if that one is over.
    fn batch_spend_in(&mut self, period: Period, unix: u64) -> &mut Spend {
        let (start, _) = period.bounds(unix);
        if self.batch_spend.period_start != start {
            self.batch_spend = Spend { period_start: start, tokens: 0 };
        }
        &mut self.batch_spend
    }

    /// The spend of the period holding `unix` here and on the other gateways, as last heard.
    fn federation_spend(&mut self, period: Period, unix: u64) -> u64 {
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

/// One key's counters (see the module docs); shared by every request of the key.
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
    fn lock(&self) -> MutexGuard<'_, Counters> {
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

impl KeyCounters {
    /// Asks whether a batch request of key `name` estimated at `cost` tokens may be sent now
    /// (see "Batch requests" in the module docs), charging its batch bucket if so. Never
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

/// Retry-After for a wait: whole seconds, rounded up, at least 1.
fn retry_after(wait: Duration) -> Option<u32> {
    let secs = wait.as_nanos().div_ceil(1_000_000_000).max(1);
    Some(u32::try_from(secs).unwrap_or(u32::MAX))
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

/// The tokens a request is estimated to use (see the module docs): text characters / 4 plus
/// its completion allowance. `path` tells embeddings (no completion) from the rest.
pub fn estimate_tokens(path: &str, body: &[u8]) -> u64 {
    #[derive(Deserialize, Default)]
    struct Fields {
        #[serde(default)]
        messages: Option<TextChars>,
        #[serde(default)]
        prompt: Option<TextChars>,
        #[serde(default)]
        input: Option<TextChars>,
        #[serde(default)]
        max_tokens: Option<u64>,
        #[serde(default)]
        max_completion_tokens: Option<u64>,
        #[serde(default)]
        n: Option<u64>,
    }
    let Ok(f) = serde_json::from_slice::<Fields>(body) else {
        // Not the shape expected: charge by size rather than not at all.
        return (body.len() as u64).div_ceil(4).max(1);
    };
    let chars: u64 = [f.messages, f.prompt, f.input].into_iter().flatten().map(|t| t.0).sum();
    let completion = if path.ends_with("/embeddings") {
        0
    } else {
        let each = f.max_completion_tokens.or(f.max_tokens).unwrap_or(DEFAULT_COMPLETION_TOKENS);
        each.saturating_mul(f.n.unwrap_or(1).clamp(1, 128))
    };
    chars.div_ceil(4).saturating_add(completion).max(1)
}

/// The characters of every string in a JSON value, except those under keys that carry images,
/// audio or files (their tokens are not a function of their text).
struct TextChars(u64);

/// Keys whose values are media, not text.
const MEDIA_KEYS: &[&str] = &["image_url", "input_audio", "audio_url", "video_url", "file"];

impl<'de> Deserialize<'de> for TextChars {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TextChars, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = u64;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
                Ok(s.chars().count() as u64)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<u64, E> {
                Ok(4)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<u64, E> {
                // A token id of a pre-tokenized prompt: four characters' worth, one token.
                Ok(4)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_none<E: de::Error>(self) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
                let mut n = 0u64;
                while let Some(TextChars(c)) = seq.next_element()? {
                    n = n.saturating_add(c);
                }
                Ok(n)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
                let mut n = 0u64;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if MEDIA_KEYS.contains(&key.as_ref()) {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        n = n.saturating_add(map.next_value::<TextChars>()?.0);
                    }
                }
                Ok(n)
            }
        }
        deserializer.deserialize_any(V).map(TextChars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, secs: f64) -> Now {
        // 2024-03-15 12:00 UTC, a Friday: budgets in the tests fall mid-period.
        Now { instant: base + Duration::from_secs_f64(secs), unix: 1_710_504_000 + secs as u64 }
    }

    fn limits(rpm: Option<u64>, tpm: Option<u64>) -> KeyLimits {
        KeyLimits { requests_per_minute: rpm, tokens_per_minute: tpm, ..KeyLimits::default() }
    }

    #[test]
    fn resets_are_written_as_openai_writes_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(1), "1ms"),
            (Duration::from_millis(120), "120ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(8640), "8.64s"),
            (Duration::from_secs(20), "20s"),
            (Duration::from_secs(360), "6m0s"),
            (Duration::from_millis(90_500), "1m30.5s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(26 * 3600 + 61), "26h1m1s"),
        ];
        for (d, text) in cases {
            assert_eq!(format_reset(d), text, "{d:?}");
        }
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
    fn estimates_count_text_and_the_completion_allowance() {
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":10}"#;
        assert_eq!(estimate_tokens("/v1/chat/completions", chat), 3 + 10, "12 chars ('user' + 8) / 4, + 10");
        let parts = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},
                        {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAAAAAAAAAAAAAA"}}]}],
                        "max_completion_tokens":5,"max_tokens":99,"n":2}"#;
        assert_eq!(estimate_tokens("/v1/chat/completions", parts), 6 + 10, "image bytes are not text; n=2");
        let prompt = br#"{"model":"m","prompt":"abcdefgh"}"#;
        assert_eq!(estimate_tokens("/v1/completions", prompt), 2 + DEFAULT_COMPLETION_TOKENS);
        let embed = br#"{"model":"m","input":["abcd","efgh"]}"#;
        assert_eq!(estimate_tokens("/v1/embeddings", embed), 2);
        assert_eq!(estimate_tokens("/v1/completions", br#"{"prompt":[1,2,3],"max_tokens":1}"#), 3 + 1);
        assert_eq!(estimate_tokens("/v1/completions", br#"{"prompt": 5}"#), 1 + DEFAULT_COMPLETION_TOKENS);
        assert_eq!(estimate_tokens("/v1/embeddings", b"not json at all!"), 4, "odd bodies by size");
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
