//! `--plot FILE.png|svg`: headline ratios uswap/kernel as bars, and a latency CDF of both
//! sides (from the percentile points the bench reports) when there is one (pmbench).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;
use std::path::Path;
use std::sync::OnceLock;

/// One bar: a headline number's ratio uswap/kernel.
#[derive(Debug, Clone)]
pub struct Bar {
    /// Short label under the bar.
    pub label: String,
    /// uswap / kernel.
    pub ratio: f64,
    /// Whether a ratio above 1 means uswap did better (`None`: neither).
    pub higher_is_better: Option<bool>,
}

/// A latency distribution given as (percentile in 0..100, latency in µs) points.
#[derive(Debug, Clone, Default)]
pub struct Cdf {
    /// Legend name.
    pub name: String,
    /// Points, any order.
    pub points: Vec<(f64, f64)>,
}

/// What to draw.
#[derive(Debug, Clone, Default)]
pub struct PlotInput {
    /// Title line.
    pub title: String,
    /// Bars (ratios).
    pub bars: Vec<Bar>,
    /// Latency CDFs (empty: no CDF panel).
    pub cdfs: Vec<Cdf>,
}

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
];

/// Register a system TrueType font as "sans-serif" (once); plotters draws no text without.
fn register_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let from_env = std::env::var("USWAP_PLOT_FONT").ok();
        let cands = from_env
            .iter()
            .map(String::as_str)
            .chain(FONT_PATHS.iter().copied());
        for p in cands {
            if let Ok(bytes) = std::fs::read(p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(
            "no TrueType font found for the plot (install fonts-dejavu-core, or set \
             USWAP_PLOT_FONT=/path/to/font.ttf)"
                .to_string(),
        )
    })
    .clone()
}

/// Draw `input` into `path` (PNG when it ends in .png, SVG when .svg).
pub fn draw(path: &Path, input: &PlotInput) -> Result<(), String> {
    register_font()?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let size = if input.cdfs.is_empty() {
        (1000, 600)
    } else {
        (1600, 600)
    };
    let r = match ext.as_str() {
        "png" => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_on(&root, input).and_then(|()| root.present().map_err(|e| e.to_string()))
        }
        "svg" => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw_on(&root, input).and_then(|()| root.present().map_err(|e| e.to_string()))
        }
        _ => {
            return Err(format!(
                "--plot {}: use a .png or .svg file name",
                path.display()
            ))
        }
    };
    r.map_err(|e| format!("plot {}: {e}", path.display()))
}

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    input: &PlotInput,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(&input.title, ("sans-serif", 24)).map_err(e)?;
    if input.cdfs.is_empty() {
        bars(&root, &input.bars)
    } else {
        let (l, r) = root.split_horizontally(root.dim_in_pixel().0 * 55 / 100);
        bars(&l, &input.bars)?;
        cdf(&r, &input.cdfs)
    }
}

const GOOD: RGBColor = RGBColor(46, 139, 87);
const BAD: RGBColor = RGBColor(200, 60, 50);
const NEUTRAL: RGBColor = RGBColor(90, 110, 160);

fn bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, bars: &[Bar]) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    let bars: Vec<&Bar> = bars
        .iter()
        .filter(|b| b.ratio.is_finite() && b.ratio > 0.0)
        .collect();
    if bars.is_empty() {
        area.draw(&Text::new(
            "no ratios to plot",
            (50, 50),
            ("sans-serif", 20),
        ))
        .map_err(e)?;
        return Ok(());
    }
    let lo = bars.iter().map(|b| b.ratio).fold(1.0f64, f64::min) / 1.8;
    let hi = bars.iter().map(|b| b.ratio).fold(1.0f64, f64::max) * 1.8;
    let n = bars.len() as u32;
    // Row i from the top is segment n-1-i, so the first bar is drawn at the top.
    let row = |i: usize| n - 1 - i as u32;
    let labels: Vec<String> = bars.iter().rev().map(|b| b.label.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            "uswap / kernel (log scale; green = uswap better)",
            ("sans-serif", 18),
        )
        .margin(14)
        .x_label_area_size(45)
        .y_label_area_size(150)
        // Integer ranges are inclusive in plotters: 0..n-1 gives n rows.
        .build_cartesian_2d(
            (lo..hi).log_scale(),
            (0..n.saturating_sub(1).max(1)).into_segmented(),
        )
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n as usize)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc("ratio uswap / kernel")
        .x_label_formatter(&|v| format!("{v:.2}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let color = match b.higher_is_better {
                Some(h) if (b.ratio >= 1.0) == h => GOOD,
                Some(_) => BAD,
                None => NEUTRAL,
            };
            let (x0, x1) = if b.ratio >= 1.0 {
                (1.0, b.ratio)
            } else {
                (b.ratio, 1.0)
            };
            let mut r = Rectangle::new(
                [
                    (x0, SegmentValue::Exact(row(i))),
                    (x1, SegmentValue::Exact(row(i) + 1)),
                ],
                color.filled(),
            );
            r.set_margin(6, 6, 0, 0);
            r
        }))
        .map_err(e)?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Exact(n))],
            BLACK.stroke_width(2),
        )))
        .map_err(e)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let (x, h) = if b.ratio >= 1.0 {
                (b.ratio * 1.03, HPos::Left)
            } else {
                (b.ratio / 1.03, HPos::Right)
            };
            Text::new(
                format!("{:.2}x", b.ratio),
                (x, SegmentValue::CenterOf(row(i))),
                TextStyle::from(("sans-serif", 15).into_font()).pos(Pos::new(h, VPos::Center)),
            )
        }))
        .map_err(e)?;
    Ok(())
}

/// Percentile (0..100) → "nines" (−log10 of the tail fraction): 50 → 0.3, 99 → 2.
fn nines(p: f64) -> f64 {
    -(1.0 - (p / 100.0).min(0.99999)).log10()
}

fn cdf<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, cdfs: &[Cdf]) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    let pts: Vec<(f64, f64)> = cdfs
        .iter()
        .flat_map(|c| c.points.iter().copied())
        .filter(|(p, us)| p.is_finite() && us.is_finite() && *us > 0.0)
        .collect();
    if pts.is_empty() {
        return Ok(());
    }
    let xlo = pts.iter().map(|p| p.1).fold(f64::MAX, f64::min) / 1.5;
    let xhi = pts.iter().map(|p| p.1).fold(0.0f64, f64::max) * 1.5;
    let yhi = pts.iter().map(|p| nines(p.0)).fold(1.0f64, f64::max) + 0.3;
    let mut chart = ChartBuilder::on(area)
        .caption("access latency CDF", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((xlo..xhi).log_scale(), 0.0..yhi)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .y_desc("percentile")
        .x_label_formatter(&|v| {
            if *v >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        })
        .y_labels((yhi.floor() as usize) + 1)
        .y_label_formatter(&|v| {
            let p = 100.0 * (1.0 - 10f64.powf(-v));
            if p < 99.0 {
                format!("{p:.0}%")
            } else {
                format!("{p:.1}%")
            }
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    let colors = [BAD, NEUTRAL, GOOD, BLACK];
    for (i, c) in cdfs.iter().enumerate() {
        let color = colors[i % colors.len()];
        let mut p: Vec<(f64, f64)> = c
            .points
            .iter()
            .filter(|(_, us)| *us > 0.0)
            .map(|(p, us)| (*us, nines(*p)))
            .collect();
        p.sort_by(|a, b| a.1.total_cmp(&b.1));
        chart
            .draw_series(LineSeries::new(p.clone(), color.stroke_width(3)))
            .map_err(e)?
            .label(c.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart
            .draw_series(p.iter().map(|&xy| Circle::new(xy, 5, color.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(e)?;
    Ok(())
}
