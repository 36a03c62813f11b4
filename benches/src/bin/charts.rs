//! Draws the benchmark charts of README.md and BENCHMARKS.md as SVG files
//! from CSV data: the throughput of each library by threads (`scaling`),
//! hit ratio per trace (`hit_ratio`), the eviction lateness distribution
//! (the `lateness` example), and a read of one key through the near cache,
//! the `redis` crate's client-side cache and plain `GET`s (`near_cache`).
//!
//! ```text
//! cargo run -p expiremap-benches --bin charts [-- --data DIR --out DIR]
//! bash benches/charts.sh [run]    # `run`: rerun the benches first
//! ```
//!
//! `--data` defaults to `benches/data` (figures recorded from the tables of
//! BENCHMARKS.md, each file saying where from), `--out` to `docs/charts`.
//! A bench writes its CSV rows into `$BENCH_CSV_DIR` when that is set
//! (`expiremap_benches::csv_row`); a data file may start with `#` lines.

use plotters::prelude::*;
use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};

type Res<T = ()> = Result<T, Box<dyn Error>>;

const FONT: &str = "sans-serif";

/// One color per library or series, the same in every chart; ours first.
fn color(name: &str) -> RGBColor {
    match name {
        "expiremap" => RGBColor(0x1f, 0x5f, 0xbf),
        "expiremap-1" => RGBColor(0x6f, 0xa8, 0xdc),
        "expiremap-no-ttl" => RGBColor(0x2c, 0xa0, 0x8c),
        "moka" => RGBColor(0xd6, 0x60, 0x1c),
        "quick_cache" => RGBColor(0x7b, 0x3f, 0xa0),
        "dashmap" => RGBColor(0x88, 0x88, 0x88),
        "mini-moka" => RGBColor(0xe0, 0xa0, 0x30),
        // The `redis` crate's own client-side cache (near_cache.svg).
        "redis-client-cache" => RGBColor(0xc0, 0x39, 0x2b),
        other => {
            // Anything else (shard counts, benches): a spread of hues.
            const MORE: [RGBColor; 6] = [
                RGBColor(0x1f, 0x5f, 0xbf),
                RGBColor(0xd6, 0x60, 0x1c),
                RGBColor(0x2c, 0xa0, 0x2c),
                RGBColor(0x7b, 0x3f, 0xa0),
                RGBColor(0x88, 0x88, 0x88),
                RGBColor(0xe0, 0xa0, 0x30),
            ];
            let h = other.bytes().fold(0usize, |h, b| h * 31 + b as usize);
            MORE[h % MORE.len()]
        }
    }
}

/// A CSV file's rows as maps from its header's names; `#` lines skipped.
fn read_csv(path: &Path) -> Res<Vec<BTreeMap<String, String>>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let header: Vec<String> = lines
        .next()
        .ok_or_else(|| format!("{}: no header", path.display()))?
        .split(',')
        .map(|h| h.trim().to_string())
        .collect();
    Ok(lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(|c| c.trim().to_string()))
                .collect()
        })
        .collect())
}

fn num(row: &BTreeMap<String, String>, col: &str) -> Res<f64> {
    let cell = row.get(col).ok_or_else(|| format!("no column {col}"))?;
    Ok(cell.parse().map_err(|e| format!("{col} = {cell:?}: {e}"))?)
}

fn text(row: &BTreeMap<String, String>, col: &str) -> Res<String> {
    Ok(row
        .get(col)
        .ok_or_else(|| format!("no column {col}"))?
        .clone())
}

/// Names in their first-seen order.
fn ordered<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

/// Throughput by threads, one panel per workload, one line per library
/// (threads on a log2 axis).
fn scaling(data: &Path, out: &Path) -> Res {
    let rows = read_csv(&data.join("scaling.csv"))?;
    let mut cells = Vec::new();
    for r in &rows {
        cells.push((
            text(r, "workload")?,
            text(r, "library")?,
            num(r, "threads")?,
            num(r, "mops")?,
        ));
    }
    let works = ordered(cells.iter().map(|c| &c.0));
    let libs = ordered(cells.iter().map(|c| &c.1));
    let max_threads = cells.iter().map(|c| c.2).fold(1.0, f64::max);
    let cols = works.len().min(2);
    let rows_n = works.len().div_ceil(cols);
    let path = out.join("scaling.svg");
    let root = SVGBackend::new(&path, (900, 330 * rows_n as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled(
        "Throughput by threads (total Mops/s, 10^6 entries; higher is better)",
        (FONT, 20),
    )?;
    let panels = body.split_evenly((rows_n, cols));
    let x_max = max_threads.log2().max(1.0);
    for (k, (work, area)) in works.iter().zip(panels.iter()).enumerate() {
        let here: Vec<_> = cells.iter().filter(|c| &c.0 == work).collect();
        let y_max = here.iter().map(|c| c.3).fold(0.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(work, (FONT, 18))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(-0.1..x_max + 0.1, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_labels(x_max as usize + 1)
            .x_label_formatter(&|x| format!("{}", 2f64.powf(x.round()) as u64))
            .x_desc("threads")
            .y_desc("Mops/s")
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        for lib in &libs {
            let mut pts: Vec<(f64, f64)> = here
                .iter()
                .filter(|c| &c.1 == lib)
                .map(|c| (c.2.log2(), c.3))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if pts.is_empty() {
                continue;
            }
            let c = color(lib);
            let width = if lib == "expiremap" { 3 } else { 2 };
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(width)))?
                .label(lib.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(width))
                });
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
        // One legend: the colors are the same in every panel.
        if k == 0 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .label_font((FONT, 13))
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}

/// Hit ratio per trace, a dot per cache (the axis starts near the lowest
/// ratio: the points between caches are what differ).
fn hit_ratio(data: &Path, out: &Path) -> Res {
    let rows = read_csv(&data.join("hit_ratio.csv"))?;
    let mut cells = Vec::new();
    for r in &rows {
        cells.push((
            text(r, "trace")?,
            text(r, "cache")?,
            num(r, "hit_ratio_pct")?,
        ));
    }
    let traces = ordered(cells.iter().map(|c| &c.0));
    let caches = ordered(cells.iter().map(|c| &c.1));
    let lo = cells.iter().map(|c| c.2).fold(100.0, f64::min);
    let hi = cells.iter().map(|c| c.2).fold(0.0, f64::max);
    let path = out.join("hit_ratio.svg");
    let root = SVGBackend::new(&path, (900, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = traces.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Hit ratio per trace (%, one thread, get + put on a miss; higher is better)",
            (FONT, 20),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.5..n - 0.5, (lo - 3.0).floor()..(hi + 3.0).ceil())?;
    let names = traces.clone();
    chart
        .configure_mesh()
        .x_labels(traces.len())
        .x_label_formatter(&move |x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .disable_x_mesh()
        .y_desc("hit ratio, %")
        .x_desc("trace")
        .draw()?;
    let step = 0.6 / caches.len().max(1) as f64;
    for (k, cache) in caches.iter().enumerate() {
        let c = color(cache);
        let dx = (k as f64 - (caches.len() as f64 - 1.0) / 2.0) * step;
        let pts: Vec<(f64, f64)> = cells
            .iter()
            .filter(|x| &x.1 == cache)
            .filter_map(|x| {
                traces
                    .iter()
                    .position(|t| t == &x.0)
                    .map(|i| (i as f64 + dx, x.2))
            })
            .collect();
        chart
            .draw_series(pts.iter().map(|&p| {
                EmptyElement::at(p)
                    + Rectangle::new([(-5, -5), (5, 5)], c.filled())
                    + Text::new(format!("{:.1}", p.1), (-12, -20), (FONT, 11).into_font())
            }))?
            .label(cache.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font((FONT, 13))
        .draw()?;
    root.present()?;
    Ok(())
}

/// Lateness (received - deadline) at each percentile, a line per shard
/// count, with the targets (p99 <= 5 ms, max <= 10 ms).
fn lateness(data: &Path, out: &Path) -> Res {
    let rows = read_csv(&data.join("lateness.csv"))?;
    let mut cells = Vec::new();
    for r in &rows {
        cells.push((text(r, "shards")?, num(r, "percentile")?, num(r, "ms")?));
    }
    let mut pcts: Vec<f64> = cells.iter().map(|c| c.1).collect();
    pcts.sort_by(f64::total_cmp);
    pcts.dedup();
    let shards = ordered(cells.iter().map(|c| &c.0));
    let y_max = cells.iter().map(|c| c.2).fold(10.0, f64::max) * 1.1;
    let path = out.join("lateness.svg");
    let root = SVGBackend::new(&path, (900, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = pcts.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Eviction lateness, 10^6 entries, TTLs over 1 s (ms after the deadline; lower is better)",
            (FONT, 18),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(-0.3..n - 0.7, 0.0..y_max)?;
    let labels = pcts.clone();
    chart
        .configure_mesh()
        .x_labels(pcts.len())
        .x_label_formatter(&move |x| {
            let i = x.round();
            match labels.get(i as usize) {
                Some(_) if (x - i).abs() > 0.01 || i < 0.0 => String::new(),
                Some(p) if *p >= 100.0 => "max".to_string(),
                Some(p) => format!("p{p}"),
                None => String::new(),
            }
        })
        .disable_x_mesh()
        .x_desc("percentile of the events")
        .y_desc("ms late")
        .draw()?;
    // The targets, as dashed marks at their percentiles.
    let target = |p: f64| pcts.iter().position(|&x| x == p).map(|i| i as f64);
    for (p, ms, what) in [
        (99.0, 5.0, "p99 target 5 ms"),
        (100.0, 10.0, "max target 10 ms"),
    ] {
        if let Some(i) = target(p) {
            chart.draw_series(DashedLineSeries::new(
                vec![(i - 0.25, ms), (i + 0.25, ms)],
                6,
                4,
                RED.stroke_width(2),
            ))?;
            chart.draw_series(std::iter::once(Text::new(
                what,
                (i - 0.45, ms + y_max * 0.06),
                (FONT, 12).into_font().color(&RED),
            )))?;
        }
    }
    const LINES: [RGBColor; 6] = [
        RGBColor(0x1f, 0x5f, 0xbf),
        RGBColor(0xd6, 0x60, 0x1c),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x7b, 0x3f, 0xa0),
        RGBColor(0x88, 0x88, 0x88),
        RGBColor(0xe0, 0xa0, 0x30),
    ];
    for (k, s) in shards.iter().enumerate() {
        let c = LINES[k % LINES.len()];
        let mut pts: Vec<(f64, f64)> = cells
            .iter()
            .filter(|x| &x.0 == s)
            .filter_map(|x| pcts.iter().position(|&p| p == x.1).map(|i| (i as f64, x.2)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let label = format!("{s} shard{}", if s == "1" { "" } else { "s" });
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font((FONT, 13))
        .draw()?;
    root.present()?;
    Ok(())
}

/// The near cache's read against the `redis` crate's client-side cache and
/// plain Redis reads: each row's spread over rounds (or runs) as a bar on
/// a log scale of nanoseconds.
fn near_cache(data: &Path, out: &Path) -> Res {
    let rows = read_csv(&data.join("near_cache.csv"))?;
    let mut bars = Vec::new();
    for r in &rows {
        bars.push((text(r, "bench")?, num(r, "low_ns")?, num(r, "high_ns")?));
    }
    let lo = bars.iter().map(|b| b.1).fold(f64::MAX, f64::min) / 2.0;
    let hi = bars.iter().map(|b| b.2).fold(0.0, f64::max) * 3.0;
    let path = out.join("near_cache.svg");
    let root = SVGBackend::new(&path, (900, 120 + 55 * bars.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = bars.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "One key read: near cache, redis crate's client-side cache, GET on loopback (ns, log scale; spread)",
            (FONT, 16),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(290)
        .build_cartesian_2d((lo..hi).log_scale(), -0.5..n - 0.5)?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&move |y| {
            let i = y.round();
            if (y - i).abs() < 0.01 && i >= 0.0 && i < names.len() as f64 {
                names[names.len() - 1 - i as usize].clone()
            } else {
                String::new()
            }
        })
        .x_label_formatter(&|x| {
            if *x >= 1e3 {
                format!("{} µs", x / 1e3)
            } else {
                format!("{x} ns")
            }
        })
        .disable_y_mesh()
        .x_desc("time per read")
        .draw()?;
    for (i, (name, lo, hi)) in bars.iter().enumerate() {
        let c = if name.starts_with("near hit") {
            color("expiremap")
        } else if name.contains("client-side cache") {
            color("redis-client-cache")
        } else {
            color("dashmap")
        };
        // The file's first row at the top.
        let y = n - 1.0 - i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(*lo, y - 0.3), (*hi, y + 0.3)],
            c.filled(),
        )))?;
        // A spread too narrow to see still shows where it is.
        chart.draw_series(std::iter::once(Circle::new(
            ((lo * hi).sqrt(), y),
            4,
            c.filled(),
        )))?;
        let what = if *hi >= 1e3 {
            format!("{:.1}–{:.1} µs", lo / 1e3, hi / 1e3)
        } else {
            format!("{lo}–{hi} ns")
        };
        chart.draw_series(std::iter::once(Text::new(
            what,
            (hi * 1.15, y + 0.1),
            (FONT, 12).into_font(),
        )))?;
    }
    root.present()?;
    Ok(())
}

/// The output folder's charts, each drawn by its function; a data file
/// that is missing is reported and its chart skipped.
fn main() -> Res {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut data = root.join("data");
    let mut out = root.join("../docs/charts");
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        match (pair[0].as_str(), pair.get(1)) {
            ("--data", Some(d)) => data = PathBuf::from(d),
            ("--out", Some(o)) => out = PathBuf::from(o),
            _ => {
                eprintln!("usage: charts [--data DIR] [--out DIR]");
                std::process::exit(2);
            }
        }
    }
    std::fs::create_dir_all(&out)?;
    type Draw = fn(&Path, &Path) -> Res;
    let charts: [(&str, Draw); 4] = [
        ("scaling", scaling),
        ("hit_ratio", hit_ratio),
        ("lateness", lateness),
        ("near_cache", near_cache),
    ];
    let mut failed = false;
    for (name, draw) in charts {
        match draw(&data, &out) {
            Ok(()) => println!("{}", out.join(format!("{name}.svg")).display()),
            Err(e) => {
                eprintln!("{name}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
