//! The soak's arithmetic: least-squares slopes with their standard error and the "within noise"
//! rule, latency percentiles.

/// The smallest rise of resident memory's floor (MiB) read as growth: twice the largest rise
/// seen in the four-minute run without a leak (1.0 MiB, 2026-12-04; 0.76 in the failed `.ci/run`
/// of 2026-12-05, with a residual sd of 0.35). Over the hour's 50 fitted minutes it stands
/// for 2.4 MiB/h; over the short run's one minute between floors, a leak of more than 2 MiB a
/// minute.
pub const MEMORY_RESOLUTION_MIB: f64 = 2.0;

/// The largest lag-one autocorrelation [`Slope`] corrects for: beyond it the samples are so
/// dependent that a line through them says little either way, and the widening (4.4 times at
/// 0.9) is kept finite.
pub const MAX_LAG1: f64 = 0.9;

/// A least-squares line through samples `(hours, value)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slope {
    /// Change per hour.
    pub per_hour: f64,
    /// Standard error of [`Slope::per_hour`], widened for the residuals' autocorrelation
    /// ([`Slope::lag1`]).
    pub std_error: f64,
    /// Half-width of the 95% confidence interval of the slope (Student's t, n − 2 degrees, fewer
    /// the phase means a deseasonalized fit estimated, times the effective share of independent
    /// samples `(1 − r₁) / (1 + r₁)`).
    pub ci95: f64,
    /// Lag-one autocorrelation r₁ of the residuals in time order, 0 when negative, at most
    /// [`MAX_LAG1`]. Samples 10–30 s apart of a series that moves over minutes (memory,
    /// pooled connections) are not independent: with r₁ = 0.5 a least-squares interval that
    /// takes them as independent is √3 times too narrow. The standard error is widened by
    /// `√((1 + r₁) / (1 − r₁))` (an AR(1) trend test's effective sample size; Santer et al.,
    /// J. Geophys. Res. 105, 2000).
    pub lag1: f64,
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
        Self::fit_with(points, 0)
    }

    /// Fits `points` (hours, value, sampled every `step` hours from `start`) with the profile of
    /// a disturbance that repeats every `period` hours taken out: a line with one level per
    /// phase of the period, whose slope is that of the times and values each less the mean
    /// of their phase over the whole periods. The
    /// soak's faults recur on a fixed cycle and step descriptors, tasks and memory up and down
    /// with it; a plain line through a few cycles of such a sawtooth has a slope that is not a
    /// trend, while a leak, which adds the same amount each cycle, survives the subtraction.
    /// Points past the last whole period are left out; with fewer than two whole periods the
    /// profile cannot be told from a trend, and the plain [`Slope::fit`] is returned. The
    /// degrees of freedom are reduced by the phase means estimated.
    pub fn fit_deseasonalized(points: &[(f64, f64)], start: f64, period: f64, step: f64) -> Option<Self> {
        let phases = (period / step).round() as usize;
        // Whole periods covered: the last one ends with a point at its last phase.
        let last = points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        let periods = ((last - start + 1.5 * step) / period).floor();
        if phases < 2 || periods < 2.0 {
            return Self::fit(points);
        }
        let kept: Vec<(f64, f64)> = points
            .iter()
            .copied()
            .filter(|p| p.0 >= start && p.0 < start + periods * period - step / 2.0)
            .collect();
        // Per phase: the sums of times and values, and the count.
        let mut sums = vec![(0.0, 0.0, 0usize); phases];
        for p in &kept {
            let slot = &mut sums[phase(p.0, start, step, phases)];
            slot.0 += p.0;
            slot.1 += p.1;
            slot.2 += 1;
        }
        // Times and values less their phase's mean (Frisch–Waugh: the slope of the line with
        // one level per phase, so a trend is not half absorbed by the profile).
        let adjusted: Vec<(f64, f64)> = kept
            .iter()
            .map(|p| {
                let (times, values, count) = sums[phase(p.0, start, step, phases)];
                (p.0 - times / count as f64, p.1 - values / count as f64)
            })
            .collect();
        let mean = kept.iter().map(|p| p.1).sum::<f64>() / kept.len().max(1) as f64;
        let first = kept.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let last = kept.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        let used = sums.iter().filter(|(_, _, count)| *count > 0).count();
        Self::fit_with(&adjusted, used.saturating_sub(1)).map(|slope| Self {
            mean,
            span_hours: last - first,
            ..slope
        })
    }

    /// The fit, `lost` degrees of freedom fewer than a plain line's `n − 2`.
    fn fit_with(points: &[(f64, f64)], lost: usize) -> Option<Self> {
        let n = points.len();
        if n < 3 + lost {
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
        let residuals: Vec<f64> = points.iter().map(|p| p.1 - intercept - per_hour * p.0).collect();
        let sse: f64 = residuals.iter().map(|r| r * r).sum();
        let df = n - 2 - lost;
        let residual_sd = (sse / df as f64).sqrt();
        let lag1 = if sse > 0.0 {
            let lagged: f64 = residuals.windows(2).map(|w| w[0] * w[1]).sum();
            (lagged / sse).clamp(0.0, MAX_LAG1)
        } else {
            0.0
        };
        let independent = (1.0 - lag1) / (1.0 + lag1);
        let std_error = residual_sd / stt.sqrt() / independent.sqrt();
        let effective_df = ((df as f64 * independent).floor() as usize).max(1);
        let first = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let last = points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        Some(Self {
            per_hour,
            std_error,
            ci95: t95(effective_df) * std_error,
            lag1,
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

/// Whether a series grows: its slope with the fault cycle's profile taken out
/// ([`Slope::fit_deseasonalized`]) and its floor, the lowest value of the first and of the last
/// whole cycle after the warm-up.
///
/// A leak shows in both: the trend, and the floor, since what leaked is never given back. A
/// pool that grew in a burst (connections kept until their idle timeout, longer than a short
/// run's cycle) shows as a level shift that a few cycles' line takes for a trend, but the
/// floor stays: every cycle has a moment where the pool is empty (Prometheus restarted, its
/// connections closed). So a series grows only when the slope is beyond noise **and** the floor
/// rose by more than twice the residual scatter and by more than the series' resolution (one, for
/// a count: a descriptor opened between two quiet cycles is a step, not yet a rise;
/// [`MEMORY_RESOLUTION_MIB`] for resident memory).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trend {
    /// The deseasonalized slope.
    pub slope: Slope,
    /// The lowest value of the first and of the last whole cycle; `None` with fewer than two.
    pub floor: Option<(f64, f64)>,
    /// The smallest floor rise read as growth: 1 for a count ([`Trend::counting`]),
    /// [`MEMORY_RESOLUTION_MIB`] for resident memory ([`Trend::in_resident_mib`]), otherwise 0.
    pub resolution: f64,
}

impl Trend {
    /// The trend of `points` (hours, value) sampled every `step` hours from `start`, with a fault
    /// cycle of `period` hours; `None` when too few points to fit a line.
    pub fn fit(points: &[(f64, f64)], start: f64, period: f64, step: f64) -> Option<Self> {
        let slope = Slope::fit_deseasonalized(points, start, period, step)?;
        let cycles = Cycle::of(points, start, period, step);
        let floor = match cycles.as_slice() {
            [first, .., last] => Some((first.low, last.low)),
            _ => None,
        };
        Some(Self { slope, floor, resolution: 0.0 })
    }

    /// The trend of the second half of the whole cycles of `points` (as [`Trend::fit`]), and the
    /// hour that half starts at: whether a series that rose early has settled since. `None` with
    /// fewer than four whole cycles (two per half, for a floor).
    pub fn of_second_half(points: &[(f64, f64)], start: f64, period: f64, step: f64) -> Option<(f64, Self)> {
        let whole = Cycle::of(points, start, period, step).len();
        if whole < 4 {
            return None;
        }
        let from = start + (whole / 2) as f64 * period;
        let later: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.0 >= from - step / 2.0).collect();
        Some((from, Self::fit(&later, from, period, step)?))
    }

    /// The same trend, of a count (descriptors, tasks, entries): its floor rising by one is the
    /// smallest step it can take, which the residual scatter of a quiet count (a fraction of
    /// one) cannot tell from a single connection opened between two cycles.
    pub fn counting(self) -> Self {
        Self { resolution: 1.0, ..self }
    }

    /// The same trend, of resident memory in MiB: its floor must rise by more than
    /// [`MEMORY_RESOLUTION_MIB`], beyond the allocator settling towards the highest concurrency
    /// seen so far, which a short run's smooth samples (a residual scatter of a few tenths of a
    /// MiB) cannot tell from a leak.
    pub fn in_resident_mib(self) -> Self {
        Self { resolution: MEMORY_RESOLUTION_MIB, ..self }
    }

    /// How much the floor rose from the first whole cycle to the last (0 with fewer than two).
    pub fn floor_rise(&self) -> f64 {
        self.floor.map_or(0.0, |(first, last)| last - first)
    }

    /// Not growing: the slope within noise ([`Slope::within_noise`]), or the floor risen by no
    /// more than twice the residual scatter or than the resolution, whichever is larger. Without
    /// two whole cycles, the slope alone.
    pub fn within_noise(&self) -> bool {
        self.slope.within_noise()
            || self.floor.is_some()
                && self.floor_rise() <= (2.0 * self.slope.residual_sd).max(self.resolution)
    }
}

/// One whole fault cycle's samples: their lowest value, mean and highest. A leak lifts the lows
/// cycle after cycle; an allocator settling towards the highest concurrency seen lifts them in
/// steps that become rarer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cycle {
    /// The lowest sample.
    pub low: f64,
    /// The mean of the samples.
    pub mean: f64,
    /// The highest sample.
    pub high: f64,
}

impl Cycle {
    /// The whole cycles of `period` hours of `points` (hours, value) sampled every `step` hours
    /// from `start`, in order; a last cycle still under way is left out.
    pub fn of(points: &[(f64, f64)], start: f64, period: f64, step: f64) -> Vec<Self> {
        let last = points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        let whole = ((last - start + 1.5 * step) / period).floor().max(0.0) as usize;
        (0..whole)
            .filter_map(|cycle| {
                let from = start + cycle as f64 * period - step / 2.0;
                let to = from + period;
                let values: Vec<f64> =
                    points.iter().filter(|p| p.0 >= from && p.0 < to).map(|p| p.1).collect();
                (!values.is_empty()).then(|| Self {
                    low: values.iter().copied().fold(f64::INFINITY, f64::min),
                    mean: values.iter().sum::<f64>() / values.len() as f64,
                    high: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                })
            })
            .collect()
    }
}

/// The phase (0..`phases`) of the sample at `t`, sampled every `step` from `start`.
fn phase(t: f64, start: f64, step: f64, phases: usize) -> usize {
    (((t - start) / step).round().max(0.0) as usize) % phases
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
    fn cycles_are_whole_and_give_each_its_low_mean_and_high() {
        // Sampled every 0.1 h from 1.0, a cycle of 0.5 h: five samples per cycle, 0..4 then
        // 10..14, and a third cycle cut short after three samples.
        let points: Vec<(f64, f64)> = (0..13)
            .map(|i| (1.0 + 0.1 * i as f64, if i < 5 { i as f64 } else { 10.0 + (i - 5) as f64 }))
            .collect();
        let cycles = Cycle::of(&points, 1.0, 0.5, 0.1);
        assert_eq!(cycles.len(), 2, "{cycles:?}");
        assert_eq!((cycles[0].low, cycles[0].mean, cycles[0].high), (0.0, 2.0, 4.0));
        assert_eq!((cycles[1].low, cycles[1].mean, cycles[1].high), (10.0, 12.0, 14.0));
        let trend = Trend::fit(&points, 1.0, 0.5, 0.1).unwrap();
        assert_eq!(trend.floor, Some((0.0, 10.0)));
        assert!(Cycle::of(&points[..4], 1.0, 0.5, 0.1).is_empty());
    }

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

    /// Two cycles of the short soak: a sample every 5 s from 60 s, a fault cycle of 60 s in
    /// which descriptors drop to 57 when Prometheus restarts and climb back to 65 as its pooled
    /// connections are opened again, plus `leak` per second.
    fn sawtooth(leak: f64) -> Vec<(f64, f64)> {
        const CYCLE: [f64; 12] = [57.0, 57.0, 58.0, 59.0, 60.0, 61.0, 62.0, 63.0, 64.0, 65.0, 65.0, 65.0];
        (0..24)
            .map(|i| {
                let t = 60.0 + 5.0 * i as f64;
                (t / 3600.0, CYCLE[i % 12] + leak * (t - 60.0))
            })
            .collect()
    }

    #[test]
    fn a_periodic_sawtooth_is_not_a_trend_once_its_profile_is_removed_but_a_leak_still_is() {
        let (start, period, step) = (60.0 / 3600.0, 60.0 / 3600.0, 5.0 / 3600.0);
        // A line through two cycles of the sawtooth has a slope that is no trend.
        let plain = Slope::fit(&sawtooth(0.0)).unwrap();
        assert!(plain.per_hour > 100.0, "{plain:?}");
        let adjusted = Slope::fit_deseasonalized(&sawtooth(0.0), start, period, step).unwrap();
        assert!(adjusted.per_hour.abs() < 1e-9 && adjusted.residual_sd < 1e-9, "{adjusted:?}");
        assert!(adjusted.within_noise(), "{adjusted:?}");
        assert_eq!((adjusted.n, adjusted.mean), (24, plain.mean));
        // One descriptor leaked every 10 s (12 over the two minutes) on top of the sawtooth.
        let leaking = Slope::fit_deseasonalized(&sawtooth(0.1), start, period, step).unwrap();
        assert!(!leaking.within_noise(), "{leaking:?}");
        assert!((leaking.per_hour - 360.0).abs() < 1e-6, "the leak's own slope: {leaking:?}");
        // A point past the last whole cycle is left out; less than two cycles is a plain fit.
        let mut longer = sawtooth(0.0);
        longer.push((180.0 / 3600.0, 99.0));
        assert_eq!(Slope::fit_deseasonalized(&longer, start, period, step), Some(adjusted));
        let one_cycle = &sawtooth(0.0)[..12];
        assert_eq!(Slope::fit_deseasonalized(one_cycle, start, period, step), Slope::fit(one_cycle));
    }

    #[test]
    fn a_pool_that_grew_in_a_burst_is_no_leak_but_a_rising_floor_is() {
        let (start, period, step) = (60.0 / 3600.0, 60.0 / 3600.0, 5.0 / 3600.0);
        // Two cycles: 58 descriptors when Prometheus restarts, 61 after; late in the second
        // cycle a burst opens 5 more connections that stay (idle timeout 90 s).
        let pooled: Vec<(f64, f64)> = (0..24)
            .map(|i| {
                let value = match (i % 12, i) {
                    (0..=1, _) => 58.0,
                    (_, 15..) => 66.0,
                    _ => 61.0,
                };
                ((60.0 + 5.0 * i as f64) / 3600.0, value)
            })
            .collect();
        let trend = Trend::fit(&pooled, start, period, step).unwrap();
        // Taken as independent samples, a line takes the step for growth; its residuals follow
        // their neighbours (r₁ above 0.5), and the widened interval holds it within noise too.
        let lag1 = trend.slope.lag1;
        let unwidened = trend.slope.std_error * ((1.0 - lag1) / (1.0 + lag1)).sqrt();
        assert!(trend.slope.per_hour > 2.2 * unwidened, "{trend:?}");
        assert!(lag1 > 0.5, "{trend:?}");
        assert!(trend.slope.within_noise(), "{trend:?}");
        assert_eq!(trend.floor, Some((58.0, 58.0)));
        assert!(trend.within_noise(), "{trend:?}");
        // The same, but every value one higher per 10 s: the floor rises with it.
        let leaking: Vec<(f64, f64)> =
            pooled.iter().map(|&(t, v)| (t, v + ((t * 3600.0 - 60.0) / 10.0).floor())).collect();
        let trend = Trend::fit(&leaking, start, period, step).unwrap();
        assert_eq!(trend.floor, Some((58.0, 64.0)));
        assert!(!trend.within_noise(), "{trend:?}");
        // One cycle: no floor to compare, the slope decides.
        let one = Trend::fit(&pooled[..12], start, period, step).unwrap();
        assert_eq!(one.floor, None);
        assert_eq!(one.within_noise(), one.slope.within_noise());
    }

    /// Open descriptors of the 20-minute soak at 10,000 pods without faults (2026-12-05), one
    /// sample every 10 s from the end of the 200 s warm-up: 369 for most of the first cycle, 370
    /// from 370 s with a dip back to 369 at 460–560 s, 371 for the last two samples.
    fn quiet_descriptors() -> Vec<(f64, f64)> {
        (20..120)
            .map(|i| {
                let t = 10.0 * f64::from(i);
                let fds = match i {
                    37..=45 | 57.. => 370.0,
                    _ => 369.0,
                };
                (t / 3600.0, if i >= 118 { 371.0 } else { fds })
            })
            .collect()
    }

    #[test]
    fn a_count_whose_floor_steps_by_one_is_not_growing_but_two_steps_are() {
        let (start, period, step) = (200.0 / 3600.0, 200.0 / 3600.0, 10.0 / 3600.0);
        let measured = Trend::fit(&quiet_descriptors(), start, period, step).unwrap();
        // What the run reported: a slope beyond noise and a floor one above, against a residual
        // sd of about 0.3, so without a resolution it is judged growing.
        assert!(!measured.slope.within_noise(), "{measured:?}");
        assert_eq!(measured.floor, Some((369.0, 370.0)));
        assert!(measured.slope.residual_sd < 0.5, "{measured:?}");
        assert!(!measured.within_noise(), "{measured:?}");
        let counted = measured.counting();
        assert!(counted.within_noise(), "one descriptor is a step, not a rise: {counted:?}");
        // A descriptor leaked every 5 minutes: the floor of the last cycle is two or more higher.
        let leaking: Vec<(f64, f64)> = quiet_descriptors()
            .into_iter()
            .map(|(t, v)| (t, v + ((t * 3600.0 - 200.0) / 300.0).floor()))
            .collect();
        let trend = Trend::fit(&leaking, start, period, step).unwrap().counting();
        assert!(trend.floor_rise() >= 2.0, "{trend:?}");
        assert!(!trend.within_noise(), "{trend:?}");
    }

    /// Resident memory (MiB) of the four-minute run after its warm-up: a sample every 5 s from
    /// 120 s over two 60 s cycles, settling from 55.0 by 0.06 MiB a sample with a scatter of
    /// about 0.1 that does not repeat with the cycle, as in the `.ci/run` that failed on 2026-12-05 (slope +55 MiB/h, floor +0.76),
    /// plus `leak` MiB per minute.
    fn settling_memory(leak: f64) -> Vec<(f64, f64)> {
        (0..24u32)
            .map(|i| {
                let t = 120.0 + 5.0 * f64::from(i);
                let scatter = [0.1, -0.2, 0.05, 0.15, -0.1][i as usize % 5];
                (t / 3600.0, 55.0 + 0.06 * f64::from(i) + scatter + leak * (t - 120.0) / 60.0)
            })
            .collect()
    }

    #[test]
    fn resident_memory_settling_by_a_fraction_of_a_mib_is_not_growing_but_a_leak_of_mibs_is() {
        let (start, period, step) = (120.0 / 3600.0, 60.0 / 3600.0, 5.0 / 3600.0);
        let measured = Trend::fit(&settling_memory(0.0), start, period, step).unwrap();
        assert!(!measured.slope.within_noise(), "{measured:?}");
        assert!((0.5..1.0).contains(&measured.floor_rise()), "{measured:?}");
        assert!(!measured.within_noise(), "without a resolution the settling reads as growth");
        assert!(measured.in_resident_mib().within_noise(), "{measured:?}");
        // 3 MiB a minute: the floor one minute later is about 3.4 higher.
        let leaking = Trend::fit(&settling_memory(3.0), start, period, step).unwrap().in_resident_mib();
        assert!(leaking.floor_rise() > MEMORY_RESOLUTION_MIB, "{leaking:?}");
        assert!(!leaking.within_noise(), "{leaking:?}");
    }

    /// The standard error of a plain least-squares line through `points`, samples taken as
    /// independent.
    fn independent_std_error(points: &[(f64, f64)], residual_sd: f64) -> f64 {
        let mean_t = points.iter().map(|p| p.0).sum::<f64>() / points.len() as f64;
        residual_sd / points.iter().map(|p| (p.0 - mean_t).powi(2)).sum::<f64>().sqrt()
    }

    #[test]
    fn memory_that_rose_then_settled_grows_over_the_run_but_not_over_its_second_half() {
        // Eight cycles of 10 samples: the level rises 1 MiB per cycle for four, then stays, with
        // a sawtooth of ±2 within each cycle (the refreshes); a leak keeps rising throughout.
        let (start, period, step) = (0.0, 1.0, 0.1);
        let series = |per_cycle_after_four: f64| -> Vec<(f64, f64)> {
            (0..80u32)
                .map(|i| {
                    let (cycle, phase) = (f64::from(i / 10), f64::from(i % 10));
                    let level = cycle.min(4.0) + (cycle - 4.0).max(0.0) * per_cycle_after_four;
                    (f64::from(i) * step, 70.0 + level + if phase < 5.0 { phase } else { 9.0 - phase } - 2.0)
                })
                .collect()
        };
        let settled = series(0.0);
        let whole = Trend::fit(&settled, start, period, step).unwrap().in_resident_mib();
        assert!(!whole.within_noise(), "{whole:?}");
        let (from, later) = Trend::of_second_half(&settled, start, period, step).unwrap();
        assert!((from - 4.0).abs() < 1e-9, "{from}");
        let later = later.in_resident_mib();
        assert!(later.within_noise(), "{later:?}");
        assert_eq!(later.floor, Some((72.0, 72.0)));

        let leak = series(1.0);
        let (_, later) = Trend::of_second_half(&leak, start, period, step).unwrap();
        assert!(!later.in_resident_mib().within_noise(), "{later:?}");
        // Three whole cycles cannot be halved into two of two.
        assert_eq!(Trend::of_second_half(&settled[..30], start, period, step), None);
    }

    #[test]
    fn residuals_that_follow_their_neighbours_widen_the_interval_and_alternating_ones_do_not() {
        // No trend, a wave of 8 samples: each residual close to the one before (r₁ = cos 45°).
        let wave: Vec<(f64, f64)> = (0..96u32)
            .map(|i| (f64::from(i) / 360.0, (f64::from(i) * std::f64::consts::FRAC_PI_4).sin()))
            .collect();
        let slope = Slope::fit(&wave).unwrap();
        assert!((0.6..0.8).contains(&slope.lag1), "{slope:?}");
        let naive = independent_std_error(&wave, slope.residual_sd);
        let widening = ((1.0 + slope.lag1) / (1.0 - slope.lag1)).sqrt();
        assert!((slope.std_error / naive - widening).abs() < 1e-9, "{slope:?}");
        // Fewer independent samples, fewer degrees of freedom: t above its value at 94.
        assert!(slope.ci95 > 1.99 * slope.std_error, "{slope:?}");
        // Residuals alternating in sign are no less independent than independent ones.
        let alternating: Vec<(f64, f64)> =
            (0..96u32).map(|i| (f64::from(i) / 360.0, if i % 2 == 0 { 1.0 } else { -1.0 })).collect();
        let slope = Slope::fit(&alternating).unwrap();
        assert_eq!(slope.lag1, 0.0);
        assert!((slope.std_error - independent_std_error(&alternating, slope.residual_sd)).abs() < 1e-12);
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
