//! The soak's picture: resident memory, open descriptors, tokio tasks and p99 latency over time,
//! one panel each, with the fault windows shaded (plotters' SVG backend).

use plotters::prelude::*;

use super::{Fault, FaultKind, Sample, SoakError};

fn color(kind: FaultKind) -> RGBColor {
    match kind {
        FaultKind::Prometheus => RGBColor(214, 39, 40),
        FaultKind::Kubelet => RGBColor(255, 127, 14),
        FaultKind::ConfigValid => RGBColor(44, 160, 44),
        FaultKind::ConfigInvalid => RGBColor(148, 103, 189),
        FaultKind::Certificate => RGBColor(23, 190, 207),
        FaultKind::WatchGone => RGBColor(140, 86, 75),
    }
}

/// Instant faults (an edit, a rotation) get a visible band this wide, in minutes.
const INSTANT_MINUTES: f64 = 0.15;

fn failed<E: std::fmt::Display>(e: E) -> SoakError {
    SoakError::Plot(e.to_string())
}

/// The SVG document of `samples` and `faults`; `warm_up` (minutes) is drawn as a dashed line.
pub(super) fn svg(
    samples: &[Sample],
    faults: &[Fault],
    warm_up: f64,
    title: &str,
) -> Result<String, SoakError> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1000, 1100)).into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        let (head, body) = root.split_vertically(40);
        head.titled(title, ("sans-serif", 20)).map_err(failed)?;
        let minutes = |s: &Sample| s.at / 60.0;
        let x_max = samples.last().map_or(1.0, minutes).max(1.0);
        type Series = (&'static str, fn(&Sample) -> f64);
        let series: [Series; 4] = [
            ("resident memory (MiB)", |s| s.rss_bytes as f64 / (1024.0 * 1024.0)),
            ("open file descriptors", |s| s.fds as f64),
            ("tokio tasks alive", |s| s.tasks as f64),
            ("p99 latency (ms)", |s| s.p99_seconds * 1000.0),
        ];
        for (i, (panel, (name, value))) in body.split_evenly((4, 1)).iter().zip(series).enumerate() {
            let y_max = samples.iter().map(value).fold(0.0, f64::max).max(1.0) * 1.15;
            let mut chart = ChartBuilder::on(panel)
                .caption(name, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(28)
                .y_label_area_size(64)
                .build_cartesian_2d(0f64..x_max, 0f64..y_max)
                .map_err(failed)?;
            chart.configure_mesh().x_desc("minutes").light_line_style(WHITE).draw().map_err(failed)?;
            let mut labelled = std::collections::BTreeSet::new();
            for fault in faults {
                let c = color(fault.kind);
                let (start, end) =
                    (fault.start / 60.0, (fault.end / 60.0).max(fault.start / 60.0 + INSTANT_MINUTES));
                let band = chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(start, 0.0), (end, y_max)],
                        c.mix(0.25).filled(),
                    )))
                    .map_err(failed)?;
                if i == 0 && labelled.insert(fault.kind) {
                    band.label(fault.kind.name()).legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.mix(0.5).filled())
                    });
                }
            }
            chart
                .draw_series(LineSeries::new(
                    [(warm_up, 0.0), (warm_up, y_max)],
                    ShapeStyle::from(&BLACK.mix(0.4)).stroke_width(1),
                ))
                .map_err(failed)?;
            chart
                .draw_series(LineSeries::new(
                    samples.iter().map(|s| (minutes(s), value(s))),
                    BLUE.stroke_width(2),
                ))
                .map_err(failed)?;
            if i == 0 {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::LowerRight)
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK.mix(0.3))
                    .draw()
                    .map_err(failed)?;
            }
        }
        root.present().map_err(failed)?;
    }
    Ok(out)
}
