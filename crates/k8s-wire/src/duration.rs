//! Go-style durations, as Kubernetes flags and `metav1.Duration` spell them: parsing (`15s`,
//! `5m`, `1m30s`, `500ms`, `1h`) for flags and configuration, and formatting (`5m0s`, `15s`,
//! `1h0m0s`, `10.5s`) exactly like Go's `time.Duration.String()`, plus the PromQL form
//! (`5m`, `1m30s`) for range selectors.

use std::time::Duration;

/// Errors parsing a duration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// The text is not a duration.
    #[error("invalid duration {0:?}: expected a number with a unit (ms, s, m, h), e.g. 15s or 5m")]
    Invalid(String),
}

/// Parses a Go-style duration (`300ms`, `15s`, `5m`, `1h30m`, `1.5s`). A bare `0` is zero.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(text.to_string());
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(invalid)?;
        if num_len == 0 {
            return Err(invalid());
        }
        let number: f64 = rest[..num_len].parse().map_err(|_| invalid())?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > 1e12 {
        return Err(invalid());
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats like Go's `time.Duration.String()`: `5m0s`, `15s`, `1h0m0s`, `10.5s`, `250ms`, `0s`.
pub fn go_string(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (value, unit) = if nanos < 1_000 {
            (nanos as f64, "ns")
        } else if nanos < 1_000_000 {
            (nanos as f64 / 1e3, "µs")
        } else {
            (nanos as f64 / 1e6, "ms")
        };
        return format!("{}{unit}", trim_float(value));
    }
    let total_secs = d.as_secs();
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let secs = (total_secs % 60) as f64 + f64::from(d.subsec_nanos()) / 1e9;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&format!("{}s", trim_float(secs)));
    out
}

/// A duration given in seconds (a PromQL value), as `metav1.Duration` prints it, to the
/// millisecond (`21.5s`, `1m15.25s`); a negative value prints as `0s`.
pub fn seconds_string(seconds: f64) -> String {
    go_string(Duration::from_millis((seconds.max(0.0) * 1000.0).round() as u64))
}

/// A table cell for a duration in seconds, with one decimal and trailing zeros trimmed
/// (`32.1s`, `28s`).
pub fn seconds_cell(seconds: f64) -> String {
    let text = format!("{seconds:.1}");
    format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
}

/// Formats for a PromQL range selector: whole seconds, largest units first (`5m`, `1m30s`,
/// `1h`). Sub-second parts are rounded up to a whole second, the smallest PromQL step we use.
pub fn promql(d: Duration) -> String {
    let mut secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    if secs == 0 {
        secs = 1;
    }
    let mut out = String::new();
    for (unit, size) in [("h", 3600), ("m", 60), ("s", 1)] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    out
}

fn trim_float(value: f64) -> String {
    let text = format!("{value:.9}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    text.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert!(parse("").is_err());
        assert!(parse("5").is_err());
        assert!(parse("s").is_err());
        assert!(parse("5x").is_err());
        assert!(parse("-5s").is_err());
    }

    #[test]
    fn formats_like_go_and_for_promql() {
        // (milliseconds, Go's Duration.String(), PromQL's duration)
        let cases = [
            (300_000, "5m0s", "5m"),
            (90_000, "1m30s", "1m30s"),
            (15_000, "15s", "15s"),
            (3_600_000, "1h0m0s", "1h"),
            (10_500, "10.5s", "11s"),
            (1_500, "1.5s", "2s"),
            (250, "250ms", "1s"),
            (0, "0s", "1s"),
        ];
        for (ms, go, range) in cases {
            let d = Duration::from_millis(ms);
            assert_eq!((go_string(d).as_str(), promql(d).as_str()), (go, range), "{ms} ms");
        }
    }

    #[test]
    fn formats_seconds_as_durations_and_cells() {
        for (seconds, want) in [(21.5, "21.5s"), (28.0, "28s"), (75.25, "1m15.25s"), (-3.0, "0s")] {
            assert_eq!(seconds_string(seconds), want, "{seconds}");
        }
        for (seconds, want) in [(32.14, "32.1s"), (28.0, "28s"), (0.04, "0s")] {
            assert_eq!(seconds_cell(seconds), want, "{seconds}");
        }
    }
}
