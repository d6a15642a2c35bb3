//! The soak's arithmetic: least-squares slopes with their standard error and the "within noise"
//! rule, latency percentiles.

/// A least-squares line through samples `(hours, value)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slope {
    /// Change per hour.
    pub per_hour: f64,
    /// Standard error of [`Slope::per_hour`].
    pub std_error: f64,
    /// Half-width of the 95% confidence interval of the slope (Student's t, n − 2 degrees).
    pub ci95: f64,
    /// Standard deviation of the samples around the line.
    pub residual_sd: f64,
    /// Hours between the first and the last sample.
    pub span_hours: f64,
    /// Mean of the samples.
    pub mean: f64,
    /// Samples fitted.
    pub n: usize,
}

impl Slope {
    /// Fits `points` (hours, value); `None` with fewer than three points or no spread in time.
    pub fn fit(points: &[(f64, f64)]) -> Option<Self> {
        let n = points.len();
        if n < 3 {
            return None;
        }
        let nf = n as f64;
        let mean_t = points.iter().map(|p| p.0).sum::<f64>() / nf;
        let mean = points.iter().map(|p| p.1).sum::<f64>() / nf;
        let stt: f64 = points.iter().map(|p| (p.0 - mean_t).powi(2)).sum();
        if stt <= 0.0 {
            return None;
        }
        let per_hour = points.iter().map(|p| (p.0 - mean_t) * (p.1 - mean)).sum::<f64>() / stt;
        let intercept = mean - per_hour * mean_t;
        let sse: f64 = points.iter().map(|p| (p.1 - intercept - per_hour * p.0).powi(2)).sum();
        let residual_sd = (sse / (nf - 2.0)).sqrt();
        let std_error = residual_sd / stt.sqrt();
        let first = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let last = points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        Some(Self {
            per_hour,
            std_error,
            ci95: t95(n - 2) * std_error,
            residual_sd,
            span_hours: last - first,
            mean,
            n,
        })
    }

    /// The growth the slope implies over the measured span.
    pub fn growth_over_span(&self) -> f64 {
        self.per_hour * self.span_hours
    }

    /// "Within noise": the 95% confidence interval of the slope contains 0, or the growth it
    /// implies over the measured span is no more than twice the scatter of the samples around
    /// the line (a trend smaller than the noise it is measured in). A constant series passes.
    pub fn within_noise(&self) -> bool {
        self.per_hour.abs() <= self.ci95 || self.growth_over_span().abs() <= 2.0 * self.residual_sd
    }
}

/// Two-sided 95% quantile of Student's t with `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        d if d <= TABLE.len() => TABLE[d - 1],
        d if d <= 60 => 2.00,
        d if d <= 120 => 1.98,
        _ => 1.96,
    }
}

/// The `p` quantile (0–1) of `sorted` values (nearest rank); 0 when empty.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_fitted_exactly_and_a_leak_is_not_noise() {
        // 10 MB per hour over one hour, no scatter.
        let points: Vec<(f64, f64)> =
            (0..=60).map(|m| (m as f64 / 60.0, 100.0 + 10.0 * m as f64 / 60.0)).collect();
        let slope = Slope::fit(&points).unwrap();
        assert!((slope.per_hour - 10.0).abs() < 1e-9, "{slope:?}");
        assert!(slope.std_error < 1e-9, "{slope:?}");
        assert!((slope.span_hours - 1.0).abs() < 1e-12);
        assert!(!slope.within_noise(), "a steady leak is not noise: {slope:?}");
    }

    #[test]
    fn scatter_without_trend_is_within_noise() {
        // Alternating ±5 around 100: no trend.
        let points: Vec<(f64, f64)> =
            (0..40).map(|i| (i as f64 / 120.0, if i % 2 == 0 { 105.0 } else { 95.0 })).collect();
        let slope = Slope::fit(&points).unwrap();
        assert!(slope.per_hour.abs() < slope.ci95, "{slope:?}");
        assert!(slope.within_noise());
        // A constant passes too.
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 7.0)).collect();
        let slope = Slope::fit(&flat).unwrap();
        assert_eq!(slope.per_hour, 0.0);
        assert!(slope.within_noise());
    }

    #[test]
    fn too_few_points_fit_nothing_and_quantiles_take_the_nearest_rank() {
        assert_eq!(Slope::fit(&[(0.0, 1.0), (1.0, 2.0)]), None);
        assert_eq!(Slope::fit(&[(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]), None);
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&sorted, 0.99), 99.0);
        assert_eq!(quantile(&sorted, 0.5), 51.0);
        assert_eq!(quantile(&[], 0.99), 0.0);
    }
}
