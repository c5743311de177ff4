//! The SVG figure of `compare`: every case as one point, ops/s (x, log)
//! against p99 latency in ms (y, log), etcd and metcd in two colours, one
//! marker shape per topology, each point labelled with its case number (the
//! case's row in the markdown tables).

use std::path::Path;

use plotters::prelude::*;

use crate::compare::{System, Table};

/// One point: system, members, case number (1-based), ops/s, p99 ms.
type Point = (System, usize, usize, f64, f64);

/// The points of `tables` that ran (failed cases and zero values skipped:
/// they have no place on a log scale).
fn points(tables: &[Table]) -> Vec<Point> {
    let mut out = Vec::new();
    for t in tables {
        for (i, row) in t.rows.iter().enumerate() {
            for system in System::ALL {
                if let Ok(s) = row.get(system) {
                    if s.ops_per_sec > 0.0 && s.p99_ms > 0.0 {
                        out.push((system, t.members, i + 1, s.ops_per_sec, s.p99_ms));
                    }
                }
            }
        }
    }
    out
}

/// A log axis range covering `values` with some room around them.
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 1.0..10.0;
    }
    (lo / 2.0)..(hi * 2.0)
}

fn colour(system: System) -> RGBColor {
    match system {
        System::Etcd => RGBColor(0x1f, 0x77, 0xb4),
        System::Metcd => RGBColor(0xd6, 0x27, 0x28),
    }
}

/// Writes the scatter plot of `tables` to `path`.
pub fn scatter(path: &Path, tables: &[Table]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let pts = points(tables);
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "etcd vs metcd: ops/s against p99 latency (labels: case number)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(
            log_range(pts.iter().map(|p| p.3)).log_scale(),
            log_range(pts.iter().map(|p| p.4)).log_scale(),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v}"))
        .x_desc("ops/s (log)")
        .y_desc("p99 latency, ms (log)")
        .draw()
        .map_err(|e| err(&e))?;
    let mut topologies: Vec<usize> = tables.iter().map(|t| t.members).collect();
    topologies.dedup();
    for (shape, &members) in topologies.iter().enumerate() {
        for system in System::ALL {
            let c = colour(system);
            let mine: Vec<(f64, f64)> = pts
                .iter()
                .filter(|p| p.0 == system && p.1 == members)
                .map(|p| (p.3, p.4))
                .collect();
            let label = format!(
                "{} {members} member{}",
                system.name(),
                if members == 1 { "" } else { "s" }
            );
            if shape % 2 == 0 {
                chart
                    .draw_series(mine.iter().map(|&xy| Circle::new(xy, 6, c.filled())))
                    .map_err(|e| err(&e))?
                    .label(label)
                    .legend(move |(x, y)| Circle::new((x, y), 6, c.filled()));
            } else {
                chart
                    .draw_series(
                        mine.iter()
                            .map(|&xy| TriangleMarker::new(xy, 8, c.filled())),
                    )
                    .map_err(|e| err(&e))?
                    .label(label)
                    .legend(move |(x, y)| TriangleMarker::new((x, y), 8, c.filled()));
            }
        }
    }
    chart
        .draw_series(pts.iter().map(|p| {
            Text::new(
                p.2.to_string(),
                (p.3 * 1.08, p.4 * 1.08),
                ("sans-serif", 13).into_font().color(&BLACK),
            )
        }))
        .map_err(|e| err(&e))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::compare::{Row, Summary};

    fn summary(ops_per_sec: f64, p99_ms: f64) -> Result<Summary, String> {
        Ok(Summary {
            ops_per_sec,
            p99_ms,
            ops: 1,
            errors: 0,
        })
    }

    fn tables() -> Vec<Table> {
        vec![Table {
            members: 1,
            rows: vec![
                Row {
                    case: "a".into(),
                    etcd: summary(1000.0, 2.0),
                    metcd: summary(5000.0, 0.5),
                },
                Row {
                    case: "b".into(),
                    etcd: Err("x".into()),
                    metcd: summary(0.0, 1.0),
                },
            ],
        }]
    }

    #[test]
    fn points_skip_failures_and_zeros() {
        let p = points(&tables());
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].0, System::Etcd);
        assert_eq!((p[1].2, p[1].3, p[1].4), (1, 5000.0, 0.5));
        let r = log_range(p.iter().map(|p| p.3));
        assert_eq!(r, 500.0..10_000.0);
        assert_eq!(log_range(std::iter::empty()), 1.0..10.0);
    }

    #[test]
    fn writes_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        scatter(&path, &tables()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.contains("metcd 1 member"));
    }
}
