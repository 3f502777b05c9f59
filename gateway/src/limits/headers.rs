//! The `x-ratelimit-*` headers of a limited key's responses, and the waits they and
//! `Retry-After` state.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};

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

/// Retry-After for a wait: whole seconds, rounded up, at least 1.
pub(super) fn retry_after(wait: Duration) -> Option<u32> {
    let secs = wait.as_nanos().div_ceil(1_000_000_000).max(1);
    Some(u32::try_from(secs).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
