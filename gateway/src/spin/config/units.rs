//! Values written with a unit: durations (`"15m"`), sizes (`"4GiB"`), parameter counts (`"8B"`).

use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, ConfigError};

/// A duration written the human way: `"90s"`, `"15m"`, `"4h"`, `"1h 30m"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map(Dur).map_err(|e| {
            serde::de::Error::custom(format!("'{text}' is not a duration ({e}); write e.g. \"90s\", \"15m\" or \"4h\""))
        })
    }
}

/// A size written with a unit: `"512MiB"`, `"4GiB"`, `"1.5GiB"` (MB and GB are read as MiB and GiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mib(pub u64);

impl<'de> Deserialize<'de> for Mib {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Mib, D::Error> {
        let text = String::deserialize(d)?;
        parse_mib(&text).map(Mib).ok_or_else(|| {
            serde::de::Error::custom(format!("'{text}' is not a size; write e.g. \"512MiB\" or \"4GiB\""))
        })
    }
}

fn parse_mib(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "mib" | "mb" | "m" => 1.0,
        "gib" | "gb" | "g" => 1024.0,
        "tib" | "tb" | "t" => 1024.0 * 1024.0,
        _ => return None,
    };
    let mib = number * factor;
    (mib.is_finite() && mib >= 0.0).then(|| mib.ceil() as u64)
}

/// A parameter count: `"8B"`, `"70B"`, `"135M"`, `"0.5B"`; in millions.
pub(super) fn parse_params(text: &str) -> Option<u64> {
    let t = text.trim();
    let (number, factor) = match t.chars().last()?.to_ascii_uppercase() {
        'B' => (&t[..t.len() - 1], 1000.0),
        'M' => (&t[..t.len() - 1], 1.0),
        _ => return None,
    };
    let millions = number.trim().parse::<f64>().ok()? * factor;
    (millions.is_finite() && millions >= 1.0).then(|| millions.round() as u64)
}

/// `value`, which must be longer than zero, or `default` when it is not given.
pub(super) fn positive(key: &str, value: Option<Dur>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(Dur(d)) if d.is_zero() => Err(invalid(key, "must be longer than zero")),
        Some(Dur(d)) => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_parameter_counts_read_their_units() {
        assert_eq!(parse_mib("512MiB"), Some(512));
        assert_eq!(parse_mib("1.5GiB"), Some(1536));
        assert_eq!(parse_mib("2 GB"), Some(2048));
        assert_eq!(parse_mib("2"), None);
        assert_eq!(parse_params("8B"), Some(8000));
        assert_eq!(parse_params("0.5B"), Some(500));
        assert_eq!(parse_params("135M"), Some(135));
        assert_eq!(parse_params("8"), None);
    }
}
