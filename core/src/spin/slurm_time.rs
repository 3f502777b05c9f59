//! Slurm's way of writing a duration (`squeue %L`, `TimeLimit=`, `sbatch --time`), read by the
//! node for its walltime and by the batch backends for a job's time left.

use core::time::Duration;

/// Parses Slurm's duration forms — `minutes`, `minutes:seconds`, `hours:minutes:seconds`,
/// `days-hours`, `days-hours:minutes`, `days-hours:minutes:seconds` — into `Some(duration)`,
/// and `UNLIMITED` / `INFINITE` / `NOT_SET` into `Ok(None)`-like `Some(None)`. Anything else
/// (`INVALID`, garbage) is `None`.
pub fn parse_slurm_duration(s: &str) -> Option<Option<Duration>> {
    let s = s.trim();
    if matches!(s, "UNLIMITED" | "INFINITE" | "NOT_SET" | "Partition_Limit") {
        return Some(None);
    }
    let num = |p: &str| -> Option<u64> {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())).then(|| p.parse().ok()).flatten()
    };
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (num(d)?, Some(r)),
        None => (0, None),
    };
    let secs = match rest {
        // With days: hours[:minutes[:seconds]].
        Some(r) => {
            let parts: Vec<&str> = r.split(':').collect();
            match parts.as_slice() {
                [h] => num(h)? * 3600,
                [h, m] => num(h)? * 3600 + num(m)? * 60,
                [h, m, sec] => num(h)? * 3600 + num(m)? * 60 + num(sec)?,
                _ => return None,
            }
        }
        // Without: minutes, minutes:seconds or hours:minutes:seconds.
        None => {
            let parts: Vec<&str> = s.split(':').collect();
            match parts.as_slice() {
                [m] => num(m)? * 60,
                [m, sec] => num(m)? * 60 + num(sec)?,
                [h, m, sec] => num(h)? * 3600 + num(m)? * 60 + num(sec)?,
                _ => return None,
            }
        }
    };
    Some(Some(Duration::from_secs(days * 86_400 + secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_durations_parse() {
        let d = |s| parse_slurm_duration(s).and_then(|x| x).map(|d| d.as_secs());
        assert_eq!(d("45"), Some(45 * 60));
        assert_eq!(d("45:30"), Some(45 * 60 + 30));
        assert_eq!(d("1:02:03"), Some(3723));
        assert_eq!(d("2-00:00:01"), Some(2 * 86_400 + 1));
        assert_eq!(d("1-12"), Some(86_400 + 12 * 3600));
        assert_eq!(d("1-12:30"), Some(86_400 + 12 * 3600 + 30 * 60));
        assert_eq!(parse_slurm_duration("UNLIMITED"), Some(None));
        assert_eq!(parse_slurm_duration("NOT_SET"), Some(None));
        for bad in ["INVALID", "", "1:2:3:4", "x-1", "-5", "1h"] {
            assert_eq!(parse_slurm_duration(bad), None, "{bad}");
        }
    }
}
