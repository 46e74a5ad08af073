//! The fidelity card: the original and the replay side by side, figure by figure, each with
//! the basis both sides were measured on (the Mystique paper's figures: time, memory, CPU, and
//! on a GPU its activity and NVML's counters). `compare` prints it and writes it as `card` in
//! `--json`; a figure one side did not record has `null` there, and its basis says why.

use serde::Serialize;
use std::io::Write;

/// One figure of the card.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// The original's value, where it was recorded.
    pub original: Option<f64>,
    /// The replay's, where it was measured.
    pub replay: Option<f64>,
    /// replay / original, where both are known and the original's is not 0.
    pub ratio: Option<f64>,
    /// What each side was measured on.
    pub basis: String,
}

impl Figure {
    pub fn new(original: Option<f64>, replay: Option<f64>, basis: impl Into<String>) -> Figure {
        let finite = |v: Option<f64>| v.filter(|x| x.is_finite());
        let (original, replay) = (finite(original), finite(replay));
        let ratio = match (original, replay) {
            (Some(o), Some(r)) if o != 0.0 => Some(r / o),
            _ => None,
        };
        Figure {
            original,
            replay,
            ratio,
            basis: basis.into(),
        }
    }
}

/// The card: its figures in the order they print, by name.
#[derive(Clone, Debug, Default)]
pub struct Card {
    pub figures: Vec<(&'static str, Figure, Unit)>,
}

/// How a figure prints.
#[derive(Clone, Copy, Debug)]
pub enum Unit {
    Ms,
    Bytes,
    Count,
    Percent,
    Watts,
}

impl Card {
    pub fn push(&mut self, name: &'static str, unit: Unit, f: Figure) {
        self.figures.push((name, f, unit));
    }

    /// `{"iteration_ms": {"original": .., "replay": .., "ratio": .., "basis": ".."}, ...}`.
    pub fn json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (name, f, _) in &self.figures {
            m.insert(
                (*name).to_string(),
                serde_json::to_value(f).unwrap_or_default(),
            );
        }
        serde_json::Value::Object(m)
    }

    /// The card as a table, the bases below it.
    pub fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(out, "fidelity card")?;
        writeln!(
            out,
            "  {:<20} {:>14} {:>14} {:>8}",
            "figure", "original", "replay", "ratio"
        )?;
        for (k, (name, f, unit)) in self.figures.iter().enumerate() {
            let v = |x: Option<f64>| x.map_or("-".to_string(), |x| unit.show(x));
            writeln!(
                out,
                "  {:<20} {:>14} {:>14} {:>8}  [{}]",
                name,
                v(f.original),
                v(f.replay),
                f.ratio.map_or("-".to_string(), |r| format!("{r:.3}")),
                k + 1
            )?;
        }
        for (k, (_, f, _)) in self.figures.iter().enumerate() {
            writeln!(out, "  [{}] {}", k + 1, f.basis)?;
        }
        Ok(())
    }

    /// The figure named `name`, where the card has it.
    pub fn figure(&self, name: &str) -> Option<&Figure> {
        self.figures
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, f, _)| f)
    }

    /// `compare --card-plot`: each figure's ratio, replay over original, on a log axis, its
    /// two values beside it (a figure one side did not measure is listed without a bar),
    /// titled by the trace's file name.
    pub fn plot(&self, out: &std::path::Path, trace_name: &str) -> anyhow::Result<()> {
        let rows: Vec<metrics::plot::Ratio> = self
            .figures
            .iter()
            .map(|(name, f, unit)| {
                let v = |x: Option<f64>| x.map_or("not measured".to_string(), |x| unit.show(x));
                metrics::plot::Ratio {
                    label: name.to_string(),
                    ratio: f.ratio.unwrap_or(f64::NAN),
                    note: format!("replay {} vs original {}", v(f.replay), v(f.original)),
                }
            })
            .collect();
        mystique_cli::output::write_plot(out, |f| {
            metrics::plot::ratios(
                f,
                &format!("{trace_name}: fidelity card"),
                "replay / original",
                &rows,
            )
        })
    }
}

impl Unit {
    fn show(self, x: f64) -> String {
        match self {
            Unit::Ms => format!("{x:.3} ms"),
            Unit::Bytes => mystique_cli::inspect::human_bytes(x.max(0.0) as u64),
            Unit::Count => {
                if x >= 1e6 {
                    format!("{:.2} M", x / 1e6)
                } else {
                    format!("{x:.0}")
                }
            }
            Unit::Percent => format!("{x:.1} %"),
            Unit::Watts => format!("{x:.1} W"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_has_a_ratio_only_where_both_sides_are_known() {
        let f = Figure::new(Some(2.0), Some(3.0), "b");
        assert_eq!(f.ratio, Some(1.5));
        assert_eq!(Figure::new(None, Some(3.0), "b").ratio, None);
        assert_eq!(Figure::new(Some(0.0), Some(3.0), "b").ratio, None);
        assert_eq!(Figure::new(Some(f64::NAN), Some(3.0), "b").original, None);
        let mut c = Card::default();
        c.push("iteration_ms", Unit::Ms, f);
        let j = c.json();
        assert_eq!(j["iteration_ms"]["ratio"], 1.5);
        assert_eq!(j["iteration_ms"]["basis"], "b");
    }
}
