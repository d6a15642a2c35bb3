//! Kubernetes `resource.Quantity` strings: canonical serialization, parsing, and the human cells
//! of the table columns.
//!
//! The canonical forms follow apimachinery (`pkg/api/resource/quantity.go`, `CanonicalizeBytes`;
//! docs/wire.md, "Quantity"): values are first rounded **up** (away from zero) to a whole nano unit, then
//! written with no fractional digits and the largest suffix that keeps the mantissa whole
//! (`0.25` → `250m`, `1500000` → `1500k`, `134217728` bytes → `128Mi`).
//!
//! We do not use the `kube_quantity` crate: its `Display` keeps the parsed form (`1.5Gi` stays
//! `1.5Gi`) instead of the canonical one that kube-apiserver and metrics-server send, and our
//! values come from `f64` computations rather than from parsed strings anyway. The arithmetic is
//! done in integer nano units (`i128`) from the value's decimal digits (rounded to 15 significant
//! digits, which absorbs `f64` noise such as `0.1 + 0.2`), so float noise never leaks into a
//! suffix choice.
//!
//! The `*_cell` functions format table cells the way `kubectl top` prints them (CPU as
//! `MilliValue()` + `m`, memory as `Value() / 2^20` + `Mi`); a non-finite input yields
//! [`NONE_CELL`], as a field without data would.

/// Nano units per unit: the precision of a Quantity.
const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// Significant digits kept from an `f64` before rounding: an `f64` carries 15 to 17, and
/// arithmetic noise lives in the last ones (`0.1 + 0.2` is `0.30000000000000004`). Keeping 15
/// snaps such noise to the intended decimal while a real fraction of a nano still rounds up.
const SIGNIFICANT_DIGITS: usize = 15;

/// What a table prints for a field without data (like kubectl).
pub const NONE_CELL: &str = "<none>";

/// Decimal SI suffixes by power of ten, from nano to exa.
const DECIMAL_SUFFIXES: [(i32, &str); 10] =
    [(-9, "n"), (-6, "u"), (-3, "m"), (0, ""), (3, "k"), (6, "M"), (9, "G"), (12, "T"), (15, "P"), (18, "E")];

/// Binary SI suffixes by power of two.
const BINARY_SUFFIXES: [(i32, &str); 7] =
    [(0, ""), (10, "Ki"), (20, "Mi"), (30, "Gi"), (40, "Ti"), (50, "Pi"), (60, "Ei")];

/// Errors from [`parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string is empty.
    #[error("quantity is empty")]
    Empty,
    /// The numeric part is not `[+-]digits[.digits]`.
    #[error("quantity {0:?}: invalid number")]
    InvalidNumber(String),
    /// The suffix is none of the binary, decimal SI or exponent suffixes.
    #[error("quantity {0:?}: unknown suffix")]
    UnknownSuffix(String),
}

/// Result alias for this module.
pub type Result<T, E = QuantityError> = std::result::Result<T, E>;

/// Converts to whole nano units, rounding up (away from zero) like apimachinery's
/// `Round(Nano, RoundUp)`. The value is first taken as its decimal rounded to
/// [`SIGNIFICANT_DIGITS`], so the conversion is exact decimal arithmetic on integers and float
/// noise never becomes an extra `1n`. `None` for NaN and infinities; huge values saturate.
fn to_nanos(value: f64) -> Option<i128> {
    if !value.is_finite() {
        return None;
    }
    // A whole float is an exact integer (byte counts above 2^53 included): no noise to absorb.
    if value.fract() == 0.0 && value.abs() < 1e28 {
        return Some(value as i128 * NANOS_PER_UNIT);
    }
    // `d.dddddddddddddde<exp>`: exactly SIGNIFICANT_DIGITS digits and a decimal exponent.
    let text = format!("{:.*e}", SIGNIFICANT_DIGITS - 1, value.abs());
    let (mantissa, exponent) = text.split_once('e')?;
    let exponent: i32 = exponent.parse().ok()?;
    let digits: i128 = mantissa.replace('.', "").parse().ok()?;
    // Power of ten of the last digit, counted in nanos.
    let shift = exponent - (SIGNIFICANT_DIGITS as i32 - 1) + 9;
    let nanos = if digits == 0 {
        0
    } else if shift >= 0 {
        // i128 holds about 1.7e38; the digits are below 1e15.
        if shift > 23 { i128::MAX } else { digits * 10i128.pow(shift.unsigned_abs()) }
    } else if shift < -30 {
        // Far below a nano: rounds up to one.
        1
    } else {
        div_round_up(digits, 10i128.pow(shift.unsigned_abs()))
    };
    Some(if value.is_sign_negative() { -nanos } else { nanos })
}

/// Divides rounding away from zero.
fn div_round_up(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d == 0 {
        q
    } else if n > 0 {
        q + 1
    } else {
        q - 1
    }
}

/// `mantissa` with every factor of `base` stripped while a larger suffix remains, followed by
/// the suffix reached (`suffixes[0]` for none stripped).
fn with_suffix(mut mantissa: i128, base: i128, suffixes: &[(i32, &str)]) -> String {
    let mut index = 0;
    while index + 1 < suffixes.len() && mantissa % base == 0 {
        mantissa /= base;
        index += 1;
    }
    let suffix = suffixes.get(index).map_or("", |(_, s)| *s);
    format!("{mantissa}{suffix}")
}

/// Canonical DecimalSI text of a value in nano units (`14000000` → `14m`, `2051777` →
/// `2051777n`): exact, for values counted in whole nano units such as nanocores.
pub fn format_decimal_nanos(nanos: i128) -> String {
    if nanos == 0 {
        return "0".to_owned();
    }
    with_suffix(nanos, 1000, &DECIMAL_SUFFIXES)
}

/// Canonical DecimalSI form of `value`, with nano precision, rounding up to `1n` like
/// apimachinery: `0.25` → `250m`, `2` → `2`, `1500000` → `1500k`, `0.001234567` →
/// `1234567n`. NaN and infinities (which a Quantity cannot hold) give `0`; callers omit such
/// fields instead.
pub fn decimal_si(value: f64) -> String {
    format_decimal_nanos(to_nanos(value).unwrap_or(0))
}

/// Canonical BinarySI form of a byte count: whole values of at least 1024 in magnitude strip
/// factors of 1024 (`134217728` → `128Mi`, `12533760` → `12240Ki`); smaller or fractional
/// values are written as DecimalSI (`512` → `512`, `1000` → `1k`), as apimachinery does.
pub fn binary_si(bytes: f64) -> String {
    let nanos = to_nanos(bytes).unwrap_or(0);
    if nanos % NANOS_PER_UNIT != 0 || nanos.abs() < 1024 * NANOS_PER_UNIT {
        return format_decimal_nanos(nanos);
    }
    with_suffix(nanos / NANOS_PER_UNIT, 1024, &BINARY_SUFFIXES)
}

/// Parses any valid Quantity (`<signedNumber><suffix>`; binary `Ki`…`Ei`, decimal `n`…`E`,
/// or an exponent `e<int>`/`E<int>`) into its value. Non-canonical forms (`1.5`, `0.5Gi`,
/// `12e6`, `.5`) are accepted, as apimachinery accepts them.
pub fn parse(s: &str) -> Result<f64> {
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let (negative, unsigned) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_len = unsigned.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
    let (number, suffix) = unsigned.split_at(number_len);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    let dots = number.len() - digits;
    if digits == 0 || dots > 1 {
        return Err(QuantityError::InvalidNumber(s.to_owned()));
    }
    // Normalize `5.` and `.5` so the float parser sees a plain decimal.
    let mut mantissa = String::with_capacity(number.len() + 2);
    if number.starts_with('.') {
        mantissa.push('0');
    }
    mantissa.push_str(number);
    if number.ends_with('.') {
        mantissa.push('0');
    }

    let magnitude = if let Some((power, _)) =
        BINARY_SUFFIXES.iter().find(|(power, name)| *power > 0 && *name == suffix)
    {
        parse_float(&mantissa, s)? * 2f64.powi(*power)
    } else if let Some((exponent, _)) = DECIMAL_SUFFIXES.iter().find(|(_, name)| *name == suffix) {
        parse_float(&format!("{mantissa}e{exponent}"), s)?
    } else if let Some(exponent) =
        suffix.strip_prefix('e').or_else(|| suffix.strip_prefix('E')).filter(|e| !e.is_empty())
    {
        let exponent: i32 = exponent.parse().map_err(|_| QuantityError::UnknownSuffix(s.to_owned()))?;
        parse_float(&format!("{mantissa}e{exponent}"), s)?
    } else {
        return Err(QuantityError::UnknownSuffix(s.to_owned()));
    };
    Ok(if negative { -magnitude } else { magnitude })
}

/// Parses a plain decimal (already validated) into a float.
fn parse_float(text: &str, original: &str) -> Result<f64> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| QuantityError::InvalidNumber(original.to_owned()))
}

/// CPU cell like `kubectl top`: millicores rounded up (`MilliValue()`) + `m`, e.g. `250m`.
pub fn cpu_cell(cores: f64) -> String {
    match to_nanos(cores) {
        Some(nanos) => format!("{}m", div_round_up(nanos, 1_000_000)),
        None => NONE_CELL.to_owned(),
    }
}

/// Memory cell like `kubectl top`: whole mebibytes (`Value() / 2^20`, `Value()` rounding up
/// and the division truncating) + `Mi`, e.g. `168Mi`.
pub fn memory_cell(bytes: f64) -> String {
    match to_nanos(bytes) {
        Some(nanos) => {
            let value = div_round_up(nanos, NANOS_PER_UNIT);
            format!("{}Mi", value / (1 << 20))
        }
        None => NONE_CELL.to_owned(),
    }
}

/// Rate cell with up to two decimals and trailing zeros trimmed: `12.5`, `0.25`, `3`.
pub fn rate_cell(per_sec: f64) -> String {
    if !per_sec.is_finite() {
        return NONE_CELL.to_owned();
    }
    let text = format!("{per_sec:.2}");
    let trimmed = text.trim_end_matches('0').trim_end_matches('.');
    if trimmed == "-0" { "0".to_owned() } else { trimmed.to_owned() }
}

/// Percentage cell with one decimal from a ratio: `0.04` → `4.0%`.
pub fn percent_cell(ratio: f64) -> String {
    if !ratio.is_finite() {
        return NONE_CELL.to_owned();
    }
    let text = format!("{:.1}%", ratio * 100.0);
    if text == "-0.0%" { "0.0%".to_owned() } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_si_canonical_examples() {
        let cases: &[(f64, &str)] = &[
            (0.25, "250m"),
            (1.5, "1500m"),
            (2.0, "2"),
            (1000.0, "1k"),
            (1_500_000.0, "1500k"),
            (0.001_234_567, "1234567n"),
            (0.001_234, "1234u"),
            (0.005, "5m"),
            (0.0, "0"),
            (-0.0, "0"),
            (12.5, "12500m"),
            (42.0, "42"),
            (0.0001, "100u"),
            (2e18, "2E"),
            (2e21, "2000E"),
            (0.1 + 0.2, "300m"),
            (-0.25, "-250m"),
            (-1500.0, "-1500"),
            (-2000.0, "-2k"),
        ];
        for (value, want) in cases {
            assert_eq!(decimal_si(*value), *want, "decimal_si({value})");
        }
    }

    #[test]
    fn decimal_si_rounds_up_to_a_nano() {
        assert_eq!(decimal_si(1e-10), "1n");
        assert_eq!(decimal_si(1.0000000001), "1000000001n");
        assert_eq!(decimal_si(-1e-10), "-1n");
        assert_eq!(decimal_si(0.0012345674), "1234568n");
    }

    #[test]
    fn decimal_si_of_non_finite_is_zero() {
        assert_eq!(decimal_si(f64::NAN), "0");
        assert_eq!(decimal_si(f64::INFINITY), "0");
    }

    #[test]
    fn binary_si_canonical_examples() {
        let cases: &[(f64, &str)] = &[
            (134_217_728.0, "128Mi"),
            (12_533_760.0, "12240Ki"),
            (1.5 * f64::from(1u32 << 30), "1536Mi"),
            (512.0, "512"),
            (1000.0, "1k"),
            (1024.0, "1Ki"),
            (1025.0, "1025"),
            (1_000_000.0, "1000000"),
            (1.5, "1500m"),
            (1536.5, "1536500m"),
            (0.0, "0"),
            (-2048.0, "-2Ki"),
            (f64::from(1u32 << 30) * f64::from(1u32 << 30) * 4.0, "4Ei"),
        ];
        for (value, want) in cases {
            assert_eq!(binary_si(*value), *want, "binary_si({value})");
        }
    }

    #[test]
    fn parse_accepts_every_suffix() {
        let cases: &[(&str, f64)] = &[
            ("250m", 0.25),
            ("1500m", 1.5),
            ("2", 2.0),
            ("1k", 1000.0),
            ("1500k", 1_500_000.0),
            ("1234567n", 0.001_234_567),
            ("1234u", 0.001_234),
            ("5m", 0.005),
            ("0", 0.0),
            ("12500m", 12.5),
            ("42", 42.0),
            ("1M", 1e6),
            ("1G", 1e9),
            ("1T", 1e12),
            ("1P", 1e15),
            ("1E", 1e18),
            ("1Ki", 1024.0),
            ("128Mi", 134_217_728.0),
            ("1.5Gi", 1_610_612_736.0),
            ("1Ti", 1_099_511_627_776.0),
            ("1Pi", 1_125_899_906_842_624.0),
            ("1Ei", 1_152_921_504_606_846_976.0),
            ("12e6", 12e6),
            ("1e3", 1000.0),
            ("1E3", 1000.0),
            ("5e-3", 0.005),
            ("1.5", 1.5),
            (".5", 0.5),
            ("5.", 5.0),
            ("+3", 3.0),
            ("-2", -2.0),
            ("-0.5Gi", -536_870_912.0),
        ];
        for (text, want) in cases {
            let got = parse(text).unwrap_or_else(|e| panic!("parse({text}): {e}"));
            assert!((got - want).abs() <= want.abs() * 1e-15, "parse({text}) = {got}, want {want}");
        }
    }

    #[test]
    fn parse_rejects_invalid_input() {
        assert_eq!(parse(""), Err(QuantityError::Empty));
        for bad in ["m", "-", "1.2.3", "1x", "1Ki2", "1e", "1 m", " 1", "1e3.5", "abc", "1ei"] {
            assert!(parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn canonical_forms_round_trip() {
        for value in [0.25, 1.5, 1_500_000.0, 0.001_234_567, 12.5, 134_217_728.0, 6.616_273_408e9] {
            let back = parse(&decimal_si(value)).unwrap();
            assert!((back - value).abs() <= value * 1e-12, "{value}");
            let back = parse(&binary_si(value)).unwrap();
            assert!((back - value).abs() <= value * 1e-12, "{value}");
        }
    }

    #[test]
    fn cells_like_kubectl_top() {
        let check = |cell: fn(f64) -> String, cases: &[(f64, &str)]| {
            for (value, want) in cases {
                assert_eq!(cell(*value), *want, "{value}");
            }
        };
        check(cpu_cell, &[(0.25, "250m"), (0.0, "0m"), (2.0, "2000m")]);
        check(cpu_cell, &[(0.001_234, "2m"), (0.000_001_234, "1m")]); // rounded up
        check(memory_cell, &[(176_160_768.0, "168Mi")]);
        check(memory_cell, &[(176_160_768.0 + 1_048_575.0, "168Mi"), (1000.0, "0Mi")]); // truncated
        check(rate_cell, &[(12.5, "12.5"), (0.25, "0.25"), (3.0, "3"), (0.0, "0"), (100.0, "100")]);
        check(rate_cell, &[(1.999, "2"), (-0.001, "0")]); // rounded
        check(percent_cell, &[(0.04, "4.0%"), (0.0, "0.0%"), (0.2, "20.0%"), (1.0, "100.0%")]);
        check(percent_cell, &[(0.0123, "1.2%")]); // rounded
    }

    #[test]
    fn cells_of_non_finite_are_none() {
        assert_eq!(cpu_cell(f64::NAN), NONE_CELL);
        assert_eq!(memory_cell(f64::INFINITY), NONE_CELL);
        assert_eq!(rate_cell(f64::NAN), NONE_CELL);
        assert_eq!(percent_cell(f64::NEG_INFINITY), NONE_CELL);
    }
}
