//! UTC calendar periods and what is counted per period (token budgets, GPU-hours), and [`Now`],
//! the moment on both clocks the counters read.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

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
