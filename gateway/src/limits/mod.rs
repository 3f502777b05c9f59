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

mod batch;
mod bucket;
mod counters;
mod estimate;
mod headers;
mod key_limits;
mod period;

pub use batch::{BatchAdmission, BatchCharge};
pub use counters::{Admission, KeyCounters, KeyGuard, Refusal, Settlement};
pub use estimate::{estimate_tokens, DEFAULT_COMPLETION_TOKENS};
pub use headers::{format_reset, RateGauge, RateHeaders};
pub use key_limits::KeyLimits;
pub(crate) use period::{civil_from_days, days_from_civil};
pub use period::{Budget, GpuHours, Now, Period};

/// A moment for the tests of every part, on both clocks.
#[cfg(test)]
mod test_clock {
    use std::time::{Duration, Instant};

    use super::Now;

    /// `secs` after `base` (Unix time likewise after a fixed moment).
    pub(super) fn at(base: Instant, secs: f64) -> Now {
        // 2024-03-15 12:00 UTC, a Friday: budgets in the tests fall mid-period.
        Now { instant: base + Duration::from_secs_f64(secs), unix: 1_710_504_000 + secs as u64 }
    }
}
