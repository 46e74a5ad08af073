//! Plots of a comparison, drawn with plotters as SVG or PNG ([`Format::of`] a file's
//! extension), in memory: the caller writes the bytes where and how it writes its outputs.
//!
//! Two kinds: [`pairs`], two runs' times side by side per row with the second's ratio to the
//! first on a log axis, and [`ratios`], one ratio per row on a log axis (a fidelity card).
//! Ratios go on a log axis so that 2x slower and 2x faster are as far from 1 on either side.

use plotters::coord::combinators::BindKeyPoints;
use plotters::coord::ranged1d::SegmentValue;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Why a plot was not written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The file's extension names no format this module draws.
    #[error("{path}: plots are written as .svg or .png, not {ext:?}")]
    Format {
        /// The path asked for.
        path: String,
        /// Its extension.
        ext: String,
    },
    /// The bundled font did not load.
    #[error("the plots' bundled font did not load")]
    Font,
    /// Nothing to draw.
    #[error("nothing to plot: no row has a finite, positive value")]
    Empty,
    /// The backend failed to draw or encode.
    #[error("drawing the plot: {0}")]
    Draw(String),
}

/// One row of [`pairs`]: a label and the two runs' values (NaN where a run has none).
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    /// What the row is (an op, a signature).
    pub label: String,
    /// The first run's value.
    pub a: f64,
    /// The second run's value.
    pub b: f64,
}

/// One row of [`ratios`]: a label, the ratio, and a note drawn beside it (the two values).
#[derive(Clone, Debug, PartialEq)]
pub struct Ratio {
    /// What the row is (a figure of the card).
    pub label: String,
    /// Second over first.
    pub ratio: f64,
    /// Drawn after the ratio (e.g. "2.10 ms vs 1.95 ms").
    pub note: String,
}

/// What a plot is encoded as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// SVG text.
    Svg,
    /// A PNG image.
    Png,
}

impl Format {
    /// The format a file's extension names (.svg or .png, any case).
    pub fn of(path: &Path) -> Result<Format, PlotError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("svg") => Ok(Format::Svg),
            Some(e) if e.eq_ignore_ascii_case("png") => Ok(Format::Png),
            e => Err(PlotError::Format {
                path: path.display().to_string(),
                ext: e.unwrap_or("").to_string(),
            }),
        }
    }
}

/// Rows of times per iteration given in ms, put in µs where every one is under 1 ms (so that
/// the axis reads 120, not 0.12); the axis's title.
pub fn time_per_iteration(rows: &mut [Pair]) -> &'static str {
    let max = rows
        .iter()
        .flat_map(|r| [r.a, r.b])
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    if max >= 1.0 {
        return "ms per iteration";
    }
    for r in rows {
        r.a *= 1000.0;
        r.b *= 1000.0;
    }
    "µs per iteration"
}

/// The font every plot's text is laid out and drawn with, bundled so that a plot looks the
/// same on every machine and needs no system font (DejaVu Sans Mono; `fonts/LICENSE`).
/// Monospace, so that a label's width is its length.
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSansMono.ttf");

/// Registers [`FONT`] as "monospace", once per process.
fn register_font() -> Result<(), PlotError> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *DONE.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok())
    {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

const FAMILY: &str = "monospace";

/// A label at most `max` characters long: a long one keeps its start and end (an op's name
/// and its last arguments) around an ellipsis.
pub fn shorten(label: &str, max: usize) -> String {
    let n = label.chars().count();
    if n <= max || max < 5 {
        return label.to_string();
    }
    let head = (max - 1) * 2 / 3;
    let tail = max - 1 - head;
    let start: String = label.chars().take(head).collect();
    let end: String = label.chars().skip(n - tail).collect();
    format!("{start}…{end}")
}

/// A value with a unit, as many digits as it needs to be read (1234.5 ms, 1.23 ms, 0.0123 ms).
pub fn human(v: f64, unit: &str) -> String {
    let a = v.abs();
    let s = if !v.is_finite() {
        "-".to_string()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 || a == 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.2e}")
    };
    if unit.is_empty() {
        s
    } else {
        format!("{s} {unit}")
    }
}

const A_COLOR: RGBColor = RGBColor(76, 114, 176);
const B_COLOR: RGBColor = RGBColor(221, 132, 82);
const BAR_RED: RGBColor = RGBColor(196, 78, 82);
const BAR_GREEN: RGBColor = RGBColor(85, 168, 104);
const LABEL_CHARS: usize = 64;
const ROW_PX: u32 = 34;

/// A figure that draws itself on any backend.
trait Figure {
    /// Its size in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws it on `root`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Renders `fig` in `format`.
fn render(format: Format, fig: &impl Figure) -> Result<Vec<u8>, PlotError> {
    register_font()?;
    let (w, h) = fig.size();
    match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
                fig.draw(&root).map_err(PlotError::Draw)?;
                root.present().map_err(|e| PlotError::Draw(e.to_string()))?;
            }
            Ok(svg.into_bytes())
        }
        Format::Png => {
            let mut rgb = vec![0u8; w as usize * h as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
                fig.draw(&root).map_err(PlotError::Draw)?;
                root.present().map_err(|e| PlotError::Draw(e.to_string()))?;
            }
            let mut png = Vec::new();
            image::ImageEncoder::write_image(
                image::codecs::png::PngEncoder::new(&mut png),
                &rgb,
                w,
                h,
                image::ColorType::Rgb8,
            )
            .map_err(|e| PlotError::Draw(e.to_string()))?;
            Ok(png)
        }
    }
}

/// A row axis of `n` segments: plotters counts a discrete range's values both ends included,
/// so `0..n` would leave an empty row on top (one row stays as `0..1`, whose top segment is
/// left blank).
fn rows_axis(
    n: usize,
) -> plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordusize> {
    (0..n.saturating_sub(1).max(1)).into_segmented()
}

/// A ratio as text: three decimals from 0.01 up, no decimals from 100, and two significant
/// digits outside 0.01..10^4 (3.1e-5x, not 0.000x).
fn ratio_text(r: f64) -> String {
    if !(0.01..1e4).contains(&r) {
        format!("{r:.1e}x")
    } else if r >= 100.0 {
        format!("{r:.0}x")
    } else {
        format!("{r:.3}x")
    }
}

/// A ratio axis's tick: as short as it reads (0.5x, 1x, 1.25x, 1e-4x).
fn tick_text(r: f64) -> String {
    if !(0.001..1e4).contains(&r) {
        return format!("{r:.0e}x");
    }
    let s = format!("{r:.3}");
    format!("{}x", s.trim_end_matches('0').trim_end_matches('.'))
}

/// Ticks of a ratio axis from `lo` to `hi`: 1, the ±10% and ±25% bands on a narrow axis, and
/// 1-2-5 steps.
fn ratio_ticks(lo: f64, hi: f64) -> Vec<f64> {
    // The bands where they have room: on a narrow axis.
    let mut v = if hi / lo < 5.0 {
        vec![0.8, 0.9, 1.0, 1.1, 1.25]
    } else {
        vec![1.0]
    };
    // 1-2-5 steps over a decade or so; wider, powers of ten, every other or third one over
    // many decades, so that about six labels share the axis without running into each other.
    let decades = (hi / lo).log10();
    let (steps, every): (&[f64], i32) = if decades <= 1.5 {
        (&[1.0, 2.0, 5.0], 1)
    } else {
        (&[1.0], (decades / 6.0).ceil().max(1.0) as i32)
    };
    for e in -12..=12 {
        if e % every == 0 {
            let p = 10f64.powi(e);
            v.extend(steps.iter().map(|s| s * p));
        }
    }
    v.retain(|&t| t >= lo && t <= hi);
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// The log axis's range for ratios: 1 and every ratio inside, with room for the notes.
fn ratio_range(ratios: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = ratios
        .filter(|r| r.is_finite() && *r > 0.0)
        .fold((1.0f64, 1.0f64), |(lo, hi), r| (lo.min(r), hi.max(r)));
    // Room for the values written right of the bars: a share of the axis, which is log-scaled
    // (a fixed factor is no room at all where the ratios span decades).
    let span = (hi / lo).max(1.5);
    (lo / span.powf(0.04), hi * span.powf(0.3).max(1.4))
}

/// How a ratio's bar is coloured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shading {
    /// By direction: right of 1 (the second run larger: slower, for times) red, left green. For
    /// two runs of one benchmark (`diff`).
    Direction,
    /// By closeness to 1: within ±10% green, beyond it red, whichever side. For a replay set
    /// beside its original, where neither side of 1 is better.
    Closeness,
}

impl Shading {
    fn color(self, r: f64) -> RGBColor {
        let good = match self {
            Shading::Direction => r <= 1.0,
            Shading::Closeness => (0.9..=1.1).contains(&r),
        };
        if good {
            BAR_GREEN
        } else {
            BAR_RED
        }
    }

    fn says(self) -> &'static str {
        match self {
            Shading::Direction => "log scale",
            Shading::Closeness => "log scale; green within 10% of 1",
        }
    }
}

/// Two runs side by side, one row per label: on the left each run's value (`unit`, a linear
/// axis from 0), on the right the second's ratio to the first (log axis, `ratio_desc` its
/// title; right of 1 the second is larger: slower, for times). `names`: the two runs, in the
/// legend.
pub fn pairs(
    format: Format,
    title: &str,
    unit: &str,
    names: (&str, &str),
    ratio_desc: &str,
    shading: Shading,
    rows: &[Pair],
) -> Result<Vec<u8>, PlotError> {
    let max = rows
        .iter()
        .flat_map(|r| [r.a, r.b])
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    if rows.is_empty() || max <= 0.0 {
        return Err(PlotError::Empty);
    }
    let labels: Vec<String> = rows
        .iter()
        .map(|r| shorten(&r.label, LABEL_CHARS))
        .collect();
    let label_px = 20 + 8 * labels.iter().map(|l| l.chars().count()).max().unwrap_or(8) as u32;
    let fig = Pairs {
        title,
        unit,
        names,
        ratio_desc,
        shading,
        rows,
        labels,
        label_px,
        max,
        range: ratio_range(rows.iter().map(|r| r.b / r.a)),
    };
    render(format, &fig)
}

struct Pairs<'a> {
    title: &'a str,
    unit: &'a str,
    names: (&'a str, &'a str),
    ratio_desc: &'a str,
    shading: Shading,
    rows: &'a [Pair],
    labels: Vec<String>,
    label_px: u32,
    max: f64,
    range: (f64, f64),
}

impl Figure for Pairs<'_> {
    fn size(&self) -> (u32, u32) {
        (self.label_px + 980, 110 + ROW_PX * self.rows.len() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let (rows, labels, names, n) = (self.rows, &self.labels, self.names, self.rows.len());
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(self.title, (FAMILY, 18))
            .map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(self.label_px + 560);
        let mut c = ChartBuilder::on(&left)
            .margin(8)
            .x_label_area_size(40)
            .y_label_area_size(self.label_px)
            .build_cartesian_2d(0.0..self.max * 1.08, rows_axis(n))
            .map_err(|e| e.to_string())?;
        c.configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if *i < n => labels[n - 1 - i].clone(),
                _ => String::new(),
            })
            .x_desc(self.unit)
            .x_label_formatter(&|v| human(*v, ""))
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 14))
            .draw()
            .map_err(|e| e.to_string())?;
        // The first row at the top.
        let bar = |i: usize, v: f64, first: bool, color: RGBColor| {
            let i = n - 1 - i;
            let (y0, y1) = if first {
                (SegmentValue::CenterOf(i), SegmentValue::Exact(i + 1))
            } else {
                (SegmentValue::Exact(i), SegmentValue::CenterOf(i))
            };
            let mut r = Rectangle::new(
                [(0.0, y0), (if v.is_finite() { v } else { 0.0 }, y1)],
                color.filled(),
            );
            r.set_margin(if first { 4 } else { 1 }, if first { 1 } else { 4 }, 0, 0);
            r
        };
        // The first run's bar above the second's, each with its legend entry.
        for (first, name, color) in [(true, names.0, A_COLOR), (false, names.1, B_COLOR)] {
            c.draw_series(
                rows.iter()
                    .enumerate()
                    .map(|(i, r)| bar(i, if first { r.a } else { r.b }, first, color)),
            )
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FAMILY, 13))
            .draw()
            .map_err(|e| e.to_string())?;
        ratio_panel(
            &right,
            self.ratio_desc,
            self.shading,
            self.range,
            &rows
                .iter()
                .map(|r| (r.b / r.a, String::new()))
                .collect::<Vec<_>>(),
            None,
        )
    }
}

/// The ratio of each row on a log axis from 1, coloured by `shading`, the ratio written at the
/// bar's end with its note. With `labels`, the rows are labelled
/// there; without, they line up with a panel beside it.
fn ratio_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    desc: &str,
    shading: Shading,
    (lo, hi): (f64, f64),
    rows: &[(f64, String)],
    labels: Option<(&[String], u32)>,
) -> Result<(), String> {
    let n = rows.len();
    let mut b = ChartBuilder::on(area);
    b.margin(8).x_label_area_size(40);
    if let Some((_, px)) = labels {
        b.y_label_area_size(px);
    } else {
        b.y_label_area_size(0);
    }
    let mut c = b
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(ratio_ticks(lo, hi)),
            rows_axis(n),
        )
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = labels.map(|(l, _)| l.to_vec()).unwrap_or_default();
    c.configure_mesh()
        .disable_y_mesh()
        // Never 0: plotters 0.3.7 loops forever computing no key points on a segmented axis.
        .y_labels(n.max(1))
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) if *i < n => {
                names.get(n - 1 - i).cloned().unwrap_or_default()
            }
            _ => String::new(),
        })
        .x_desc(format!("{desc} ({})", shading.says()))
        .x_label_formatter(&|v| tick_text(*v))
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 14))
        .draw()
        .map_err(|e| e.to_string())?;
    // The first row at the top.
    let at = |i: usize| n - 1 - i;
    c.draw_series(rows.iter().enumerate().filter_map(|(i, (r, _))| {
        let i = at(i);
        (r.is_finite() && *r > 0.0).then(|| {
            let color = shading.color(*r);
            let mut rect = Rectangle::new(
                [
                    (1.0, SegmentValue::Exact(i)),
                    (*r, SegmentValue::Exact(i + 1)),
                ],
                color.filled(),
            );
            rect.set_margin(6, 6, 0, 0);
            rect
        })
    }))
    .map_err(|e| e.to_string())?;
    c.draw_series(rows.iter().enumerate().map(|(i, (r, note))| {
        let i = at(i);
        let known = r.is_finite() && *r > 0.0;
        let text = match (known, note.is_empty()) {
            (true, _) => ratio_text(*r),
            (false, true) => "no ratio".to_string(),
            (false, false) => format!("no ratio: {note}"),
        };
        {
            Text::new(
                text,
                (
                    if known { r.max(1.0) } else { 1.0 } * 1.02,
                    SegmentValue::CenterOf(i),
                ),
                TextStyle::from((FAMILY, 12).into_font()).pos(
                    plotters::style::text_anchor::Pos::new(
                        plotters::style::text_anchor::HPos::Left,
                        plotters::style::text_anchor::VPos::Center,
                    ),
                ),
            )
        }
    }))
    .map_err(|e| e.to_string())?;
    c.draw_series(LineSeries::new(
        [(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Exact(n))],
        BLACK.stroke_width(1),
    ))
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// One ratio per row on a log axis from 1 (a fidelity card: replay over original per
/// figure), each labelled with its note.
pub fn ratios(
    format: Format,
    title: &str,
    desc: &str,
    rows: &[Ratio],
) -> Result<Vec<u8>, PlotError> {
    if !rows.iter().any(|r| r.ratio.is_finite() && r.ratio > 0.0) {
        return Err(PlotError::Empty);
    }
    // The note in the label column, where it has room whatever the ratio.
    let labels: Vec<String> = rows
        .iter()
        .map(|r| {
            let l = if r.note.is_empty() {
                r.label.clone()
            } else {
                format!("{}: {}", r.label, r.note)
            };
            shorten(&l, 2 * LABEL_CHARS)
        })
        .collect();
    let label_px = 20 + 8 * labels.iter().map(|l| l.chars().count()).max().unwrap_or(8) as u32;
    let fig = Ratios {
        title,
        desc,
        data: rows.iter().map(|r| (r.ratio, String::new())).collect(),
        range: ratio_range(rows.iter().map(|r| r.ratio)),
        labels,
        label_px,
    };
    render(format, &fig)
}

struct Ratios<'a> {
    title: &'a str,
    desc: &'a str,
    data: Vec<(f64, String)>,
    range: (f64, f64),
    labels: Vec<String>,
    label_px: u32,
}

impl Figure for Ratios<'_> {
    fn size(&self) -> (u32, u32) {
        (self.label_px + 640, 110 + ROW_PX * self.data.len() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(self.title, (FAMILY, 18))
            .map_err(|e| e.to_string())?;
        ratio_panel(
            &root,
            self.desc,
            Shading::Closeness,
            self.range,
            &self.data,
            Some((&self.labels, self.label_px)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_labels_keep_their_start_and_end() {
        let l = "aten::addmm.default(float32[64],float32[32,128],float32[128,64]@[1,128],1,1)";
        let s = shorten(l, 40);
        assert_eq!(s.chars().count(), 40);
        assert!(
            s.starts_with("aten::addmm.default(") && s.ends_with(",1,1)"),
            "{s}"
        );
        assert_eq!(shorten("aten::mm", 40), "aten::mm");
    }

    /// A ratio axis over many decades keeps to a few ticks (their labels ran into each other
    /// at 1-2-5 steps), and a narrow one keeps the ±10% and ±25% bands.
    #[test]
    fn ratio_axes_have_few_enough_ticks_to_read() {
        for (lo, hi) in [
            (2e-5, 20.0),
            (1e-9, 1e3),
            (0.3, 1.6),
            (0.8, 1.3),
            (0.62, 1.3),
            (1.0, 1e12),
        ] {
            let (lo, hi) = ratio_range([lo, hi].into_iter());
            let t = ratio_ticks(lo, hi);
            assert!((3..=8).contains(&t.len()), "{lo}..{hi}: {t:?}");
            assert!(t.contains(&1.0), "{t:?}");
        }
        assert!(ratio_ticks(0.7, 1.4).contains(&1.1));
    }

    /// Tiny ratios keep two digits instead of reading 0.000x; ticks are short.
    #[test]
    fn ratios_read_at_every_size() {
        assert_eq!(ratio_text(3.1e-5), "3.1e-5x");
        assert_eq!(ratio_text(0.538), "0.538x");
        assert_eq!(ratio_text(1234.0), "1234x");
        assert_eq!(ratio_text(2.5e8), "2.5e8x");
        assert_eq!(tick_text(1e8), "1e8x");
        assert_eq!(tick_text(1.0), "1x");
        assert_eq!(tick_text(1.25), "1.25x");
        assert_eq!(tick_text(0.001), "0.001x");
        assert_eq!(tick_text(1e-4), "1e-4x");
    }

    #[test]
    fn values_keep_their_digits() {
        assert_eq!(human(13562.04, "ms"), "13562 ms");
        assert_eq!(human(1.234, "ms"), "1.23 ms");
        assert_eq!(human(0.0123, ""), "1.23e-2");
        assert_eq!(human(f64::NAN, "ms"), "- ms");
    }

    #[test]
    fn an_svg_names_its_rows_and_axes_and_an_unknown_extension_is_refused() {
        let rows = vec![
            Pair {
                label: "aten::mm x3".into(),
                a: 13562.0,
                b: 12000.0,
            },
            Pair {
                label: "aten::add x8".into(),
                a: 1.5,
                b: 3.0,
            },
        ];
        let svg = pairs(
            Format::of(Path::new("pairs.svg")).unwrap(),
            "iteration 2.0 ms vs 2.1 ms",
            "ms per iteration",
            ("A", "B"),
            "B / A",
            Shading::Direction,
            &rows,
        )
        .unwrap();
        let s = String::from_utf8(svg).unwrap();
        for want in [
            "aten::mm x3",
            "aten::add x8",
            "ms per iteration",
            "B / A (log scale)",
            "2.000x",
            "0.885x",
        ] {
            assert!(s.contains(want), "{want} missing");
        }
        let e = Format::of(Path::new("x.pdf")).unwrap_err();
        assert!(matches!(e, PlotError::Format { .. }), "{e}");
        let e = pairs(
            Format::Svg,
            "t",
            "ms",
            ("A", "B"),
            "B / A",
            Shading::Direction,
            &[],
        )
        .unwrap_err();
        assert!(matches!(e, PlotError::Empty), "{e}");
    }

    /// Two runs of one benchmark are coloured by which is faster; a replay beside its original
    /// by how close it is, whichever side of 1.
    #[test]
    fn bars_are_coloured_by_direction_or_by_closeness() {
        assert_eq!(Shading::Direction.color(0.5), BAR_GREEN);
        assert_eq!(Shading::Direction.color(1.2), BAR_RED);
        assert_eq!(Shading::Closeness.color(0.95), BAR_GREEN);
        assert_eq!(Shading::Closeness.color(1.08), BAR_GREEN);
        assert_eq!(Shading::Closeness.color(0.5), BAR_RED);
        assert_eq!(Shading::Closeness.color(1.2), BAR_RED);
    }

    #[test]
    fn times_under_a_millisecond_go_to_microseconds() {
        let pair = |a, b| Pair {
            label: "x".into(),
            a,
            b,
        };
        let mut small = vec![pair(0.5, 0.25), pair(f64::NAN, 0.1)];
        assert_eq!(time_per_iteration(&mut small), "µs per iteration");
        assert_eq!((small[0].a, small[0].b, small[1].b), (500.0, 250.0, 100.0));
        let mut large = vec![pair(0.5, 2.0)];
        assert_eq!(time_per_iteration(&mut large), "ms per iteration");
        assert_eq!((large[0].a, large[0].b), (0.5, 2.0));
    }
}

#[cfg(test)]
mod png_tests {
    use super::*;

    /// Renders both kinds to PNG (where a font is found), for a test to check and a person to
    /// look at: `MYSTIQUE_PLOT_DIR=DIR` keeps them there.
    #[test]
    fn both_kinds_render_to_png() {
        let keep = std::env::var_os("MYSTIQUE_PLOT_DIR").map(std::path::PathBuf::from);
        let dir = keep
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("mq-png-{}", std::process::id())));
        std::fs::create_dir_all(&dir).unwrap();
        let rows = vec![
            Pair {
                label: "aten::addmm.default(float32[64],float32[32,128],float32[128,64]@[1,128],1,1) x3"
                    .into(),
                a: 13562.0,
                b: 12000.0,
            },
            Pair { label: "aten::add x8".into(), a: 1.5, b: 3.0 },
            Pair { label: "aten::relu x4".into(), a: 400.0, b: 390.0 },
        ];
        let card = vec![
            Ratio {
                label: "iteration_ms".into(),
                ratio: 1.075,
                note: "0.225 ms vs 0.209 ms".into(),
            },
            Ratio {
                label: "peak_memory_bytes".into(),
                ratio: 0.74,
                note: "48 KiB vs 66 KiB".into(),
            },
            Ratio {
                label: "cpu_ms".into(),
                ratio: f64::NAN,
                note: "not recorded".into(),
            },
        ];
        let (p1, p2) = (dir.join("pairs.png"), dir.join("card.png"));
        let pairs_png = pairs(
            Format::Png,
            "iteration 2.0 ms (A) vs 2.1 ms (B)",
            "ms per iteration",
            ("A", "B"),
            "B / A",
            Shading::Direction,
            &rows,
        )
        .unwrap();
        let card_png = ratios(
            Format::Png,
            "fidelity card: replay / original",
            "replay / original",
            &card,
        )
        .unwrap();
        for (p, b, fig_w) in [(&p1, &pairs_png, 980), (&p2, &card_png, 640)] {
            std::fs::write(p, b).unwrap();
            assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{}", p.display());
            // The IHDR chunk's width: the label column and the panels.
            let w = u32::from_be_bytes(b[16..20].try_into().unwrap());
            assert!(w > fig_w, "{} is {w} px wide", p.display());
        }
        if keep.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
