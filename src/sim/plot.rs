//! SVG plots with plotters' SVG backend. Text is written as SVG `<text>` elements and laid
//! out with plotters' built-in size estimate (no `ttf` feature), so no system font is
//! needed to draw; the viewer picks a sans-serif font.
//!
//! * [`plot_sim`] — per policy: load (bucket mean, and each bucket's min–max band so that
//!   averaging hides no peak) vs VM capacity (ready VMs · r_max) and the function share
//!   over time, and a cost comparison (LIBRA §IV, Fig. 5–7 style).
//! * [`plot_cost`] — FaaS-only, IaaS-only (as steps: whole VMs) and hybrid cost per hour
//!   over the request rate, with the CIP (LIBRA §II, Fig. 1b/1d).
//!
//! Legends sit in the upper left, above the data (the y axes have headroom for them).

use std::path::Path;

use plotters::prelude::*;

use super::costmodel::CostReport;
use super::engine::PolicyRun;
use super::error::SimError;

/// Picks one cost column of a row.
type CostColumn = fn(&super::costmodel::CostRow) -> f64;

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

fn err(path: &Path, e: impl std::fmt::Display) -> SimError {
    SimError::Plot {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// Average `ys` into at most `n` buckets of consecutive points (x = bucket's last x).
fn downsample(points: &[(f64, f64)], n: usize) -> Vec<(f64, f64)> {
    if points.len() <= n || n == 0 {
        return points.to_vec();
    }
    let per = points.len().div_ceil(n);
    points
        .chunks(per)
        .map(|c| {
            let y = c.iter().map(|p| p.1).sum::<f64>() / c.len() as f64;
            (c[c.len() - 1].0, y)
        })
        .collect()
}

/// Per bucket of at most `n` buckets of consecutive points: `(last x, min y, max y)` —
/// the band that shows what averaging hides (a one-second peak of 1,168 req/s in a
/// 30-second bucket averaging 488).
fn min_max_bands(points: &[(f64, f64)], n: usize) -> Vec<(f64, f64, f64)> {
    let per = points.len().div_ceil(n.max(1)).max(1);
    points
        .chunks(per)
        .map(|c| {
            let lo = c.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
            let hi = c.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            (c[c.len() - 1].0, lo, hi)
        })
        .collect()
}

/// The closed outline of a band: its upper edge left to right, its lower edge back.
fn band_polygon(bands: &[(f64, f64, f64)]) -> Vec<(f64, f64)> {
    bands
        .iter()
        .map(|&(x, _, hi)| (x, hi))
        .chain(bands.iter().rev().map(|&(x, lo, _)| (x, lo)))
        .collect()
}

/// IaaS-only cost per hour as the step function it is: `ceil(rate / r_max)` VMs, each new
/// VM paid from just above a multiple of r_max (LIBRA §II), up to `x_max`.
fn iaas_steps(r_max: f64, vm_hourly: f64, x_max: f64) -> Vec<(f64, f64)> {
    let mut points = vec![(0.0, 0.0)];
    if !(r_max.is_finite() && r_max > 0.0) {
        return points;
    }
    let mut k = 0.0_f64;
    while k * r_max < x_max && k < 100_000.0 {
        let x0 = k * r_max;
        let x1 = ((k + 1.0) * r_max).min(x_max);
        let y = (k + 1.0) * vm_hourly;
        points.push((x0, y));
        points.push((x1, y));
        k += 1.0;
    }
    points
}

/// Draw the simulation plot for `runs` into `path` (SVG). Capacity is ready VMs × the
/// r_max in force at each epoch's end (it moves with `libra.r_max_adaptive`).
///
/// # Errors
/// [`SimError::Plot`] if drawing or writing fails.
pub fn plot_sim(runs: &[PolicyRun], path: &Path) -> Result<(), SimError> {
    let n = runs.len().max(1);
    let height = 260 * n as u32 + 320;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let (top, bottom) = root.split_vertically(260 * n as u32);
    let rows = top.split_evenly((n, 1));
    for (run, area) in runs.iter().zip(rows.iter()) {
        let s = &run.series;
        let load_points: Vec<(f64, f64)> = s.iter().map(|r| (r.time_s, r.load as f64)).collect();
        let load = downsample(&load_points, 1500);
        let load_band = min_max_bands(&load_points, 1500);
        let cap: Vec<(f64, f64)> = downsample(
            &s.iter()
                .map(|r| (r.time_s, f64::from(r.vms_ready) * r.r_max_rps))
                .collect::<Vec<_>>(),
            1500,
        );
        let share: Vec<(f64, f64)> = downsample(
            &s.iter()
                .map(|r| {
                    let f = if r.load == 0 {
                        0.0
                    } else {
                        r.function_calls as f64 / r.load as f64
                    };
                    (r.time_s, f.min(1.0))
                })
                .collect::<Vec<_>>(),
            1500,
        );
        let x_max = s.last().map_or(1.0, |r| r.time_s).max(1.0);
        // Headroom above the highest point (the band's peak, not the bucket mean) keeps
        // the legend in the upper left off the data.
        let y_max = load_band
            .iter()
            .map(|b| b.2)
            .chain(cap.iter().map(|p| p.1))
            .fold(1.0, f64::max)
            * 1.4;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{}: load vs VM capacity (req/s), function share (right axis)",
                    run.report.name
                ),
                ("sans-serif", 16),
            )
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .right_y_label_area_size(50)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|e| err(path, e))?
            .set_secondary_coord(0.0..x_max, 0.0..1.0);
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("req/s")
            .draw()
            .map_err(|e| err(path, e))?;
        chart
            .configure_secondary_axes()
            .y_desc("function share")
            .draw()
            .map_err(|e| err(path, e))?;
        chart
            .draw_series(std::iter::once(Polygon::new(
                band_polygon(&load_band),
                COLORS[0].mix(0.25).filled(),
            )))
            .map_err(|e| err(path, e))?
            .label("load, min–max per bucket")
            .legend(|(x, y)| {
                Rectangle::new([(x, y - 4), (x + 20, y + 4)], COLORS[0].mix(0.25).filled())
            });
        chart
            .draw_series(LineSeries::new(load, &COLORS[0]))
            .map_err(|e| err(path, e))?
            .label("load, bucket mean")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], COLORS[0]));
        chart
            .draw_series(LineSeries::new(cap, &COLORS[1]))
            .map_err(|e| err(path, e))?
            .label("VM capacity")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], COLORS[1]));
        chart
            .draw_secondary_series(LineSeries::new(share, &COLORS[2]))
            .map_err(|e| err(path, e))?
            .label("function share")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], COLORS[2]));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(path, e))?;
    }
    // Cost comparison: stacked VM + function cost per policy.
    let max_cost = runs
        .iter()
        .map(|r| r.report.cost_usd.total)
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.15;
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            "cost (USD): VM (orange) + function (green)",
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n as f64, 0.0..max_cost)
        .map_err(|e| err(path, e))?;
    let names: Vec<String> = runs.iter().map(|r| r.report.name.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = (x - 0.5).round();
            if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("USD")
        .draw()
        .map_err(|e| err(path, e))?;
    for (i, r) in runs.iter().enumerate() {
        let x0 = i as f64 + 0.2;
        let x1 = i as f64 + 0.8;
        let vm = r.report.cost_usd.vm;
        let total = r.report.cost_usd.total;
        chart
            .draw_series([
                Rectangle::new([(x0, 0.0), (x1, vm)], COLORS[1].filled()),
                Rectangle::new([(x0, vm), (x1, total)], COLORS[2].filled()),
            ])
            .map_err(|e| err(path, e))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("${total:.2}"),
                (x0, total + max_cost * 0.02),
                ("sans-serif", 14),
            )))
            .map_err(|e| err(path, e))?;
    }
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// Draw the cost curves of `report` into `path` (SVG).
///
/// # Errors
/// [`SimError::Plot`] if drawing or writing fails.
pub fn plot_cost(report: &CostReport, path: &Path) -> Result<(), SimError> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let x_max = report.rows.last().map_or(1.0, |r| r.rate_rps).max(1.0);
    // Headroom keeps the legend (upper left) above the curves, which start at zero.
    let y_max = report
        .rows
        .iter()
        .flat_map(|r| {
            [
                r.faas_usd_per_hour,
                r.iaas_usd_per_hour,
                r.hybrid_usd_per_hour,
            ]
        })
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.3;
    let caption = match report.cip_rps {
        Some(c) => format!("cost per hour vs request rate (CIP = {c:.2} req/s)"),
        None => "cost per hour vs request rate (no CIP)".to_string(),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("requests/s")
        .y_desc("USD per hour")
        .draw()
        .map_err(|e| err(path, e))?;
    let series: [(&str, CostColumn); 3] = [
        ("FaaS only", |r| r.faas_usd_per_hour),
        ("IaaS only", |r| r.iaas_usd_per_hour),
        ("hybrid", |r| r.hybrid_usd_per_hour),
    ];
    for (i, (name, f)) in series.iter().enumerate() {
        let color = COLORS[i];
        let points: Vec<(f64, f64)> = if i == 1 {
            iaas_steps(report.inputs.r_max_rps, report.inputs.vm_hourly_usd, x_max)
        } else {
            report.rows.iter().map(|r| (r.rate_rps, f(r))).collect()
        };
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| err(path, e))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    if let Some(c) = report.cip_rps {
        chart
            .draw_series(LineSeries::new(
                [(c, 0.0), (c, y_max)],
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(|e| err(path, e))?
            .label("CIP")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_keep_the_peak_the_mean_hides() {
        // 30 points of 488 with one of 1,168: one bucket; the mean is ~511, the band's top
        // is the peak.
        let mut pts: Vec<(f64, f64)> = (0..30).map(|i| (f64::from(i), 488.0)).collect();
        pts[7].1 = 1168.0;
        let mean = downsample(&pts, 1)[0].1;
        let band = min_max_bands(&pts, 1);
        assert!(mean < 520.0, "{mean}");
        assert_eq!(band, vec![(29.0, 488.0, 1168.0)]);
        let poly = band_polygon(&min_max_bands(&pts, 3));
        assert_eq!(poly.len(), 6);
    }

    #[test]
    fn iaas_cost_is_drawn_as_whole_vm_steps() {
        // r_max 16, $0.10/h, up to 40 req/s: 1 VM on (0, 16], 2 on (16, 32], 3 above.
        let s = iaas_steps(16.0, 0.10, 40.0);
        assert_eq!(
            s,
            vec![
                (0.0, 0.0),
                (0.0, 0.1),
                (16.0, 0.1),
                (16.0, 0.2),
                (32.0, 0.2),
                (32.0, 0.30000000000000004),
                (40.0, 0.30000000000000004)
            ]
        );
    }
}
