//! Small text helpers shared by the simulator's endpoints: Go-style float formatting (as
//! Prometheus' Go client writes samples), base64 and label-value escaping.

use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

/// Appends `v` formatted like Go's `strconv.FormatFloat(v, 'g', -1, 64)`, which is what the
/// Prometheus Go client (and so a kubelet) writes: shortest round-trip digits, exponent
/// notation (`1.253376e+07`) when the decimal exponent is below -4 or at least 6.
pub(crate) fn push_go_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
        return;
    }
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
        return;
    }
    if v == 0.0 {
        out.push('0');
        return;
    }
    // Rust's `{:e}` gives the shortest round-trip digits, like Go's precision -1.
    let sci = format!("{v:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    if !(-4..6).contains(&exp) {
        out.push_str(mantissa);
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        let _ = write!(out, "{:02}", exp.unsigned_abs());
    } else {
        // Display is also shortest round-trip and never uses an exponent.
        let _ = write!(out, "{v}");
    }
}

/// `v` formatted like Go's `%g` with shortest precision (see [`push_go_float`]).
#[cfg(test)]
pub(crate) fn go_float(v: f64) -> String {
    let mut s = String::new();
    push_go_float(&mut s, v);
    s
}

/// Appends `value` escaped for a Prometheus/OpenMetrics label value (`\\`, `\"`, `\n`).
pub(crate) fn push_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Standard base64 with padding (kubeconfig `certificate-authority-data`).
pub(crate) fn base64_std(data: &[u8]) -> String {
    STANDARD.encode(data)
}

/// URL-safe base64 without padding (continue tokens, like Go's `base64.RawURLEncoding`).
pub(crate) fn base64_url(data: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(data)
}

/// Decodes URL-safe base64 (padding optional); `None` on any invalid input.
pub(crate) fn base64_url_decode(s: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(s.trim_end_matches('=')).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_floats() {
        for (v, want) in [
            (0.0, "0"),
            (4.710169, "4.710169"),
            (357354.91027, "357354.91027"),
            (12533760.0, "1.253376e+07"),
            (1633252712.0, "1.633252712e+09"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (100000.0, "100000"),
            (1e6, "1e+06"),
            (1e21, "1e+21"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(go_float(v), want, "{v}");
        }
    }

    #[test]
    fn base64_round_trip() {
        assert_eq!(base64_std(b"hello"), "aGVsbG8=");
        assert_eq!(base64_std(b"hell"), "aGVsbA==");
        assert_eq!(base64_std(b"hel"), "aGVs");
        for data in [&b""[..], b"a", b"ab", b"abc", b"\xff\xfe\xfd\x00rv"] {
            assert_eq!(base64_url_decode(&base64_url(data)).as_deref(), Some(data));
        }
        assert_eq!(base64_url_decode("a$"), None);
    }
}
