//! GPU counters sampled through NVML on a thread of their own, and their summaries.
//!
//! NVML (`libnvidia-ml.so.1`) is loaded at run time: without a driver, [`NvmlSampler::start`]
//! returns an error saying so, and nothing else changes. The sampler reads, every period
//! (default 20 ms): SM and memory utilisation, power and energy, SM and memory clocks, memory
//! used, PCIe throughput, temperature and throttle reasons; on Hopper or newer, GPM metrics
//! between consecutive samples (SM occupancy, DRAM bandwidth, tensor activity, NVLink
//! throughput). A metric the device does not support is absent from its samples, not zero.
//!
//! Samples carry the caller's [`crate::Clock`] time, so a replay can cut them into its
//! iterations ([`summarise`]) and draw them beside its op slices.

use crate::{Clock, Error};
use serde::Serialize;
use std::collections::BTreeMap;

/// The metrics a [`GpuSample`] may hold, by index: (name, unit).
pub const METRICS: [(&str, &str); 16] = [
    ("sm_util", "%"),
    ("mem_util", "%"),
    ("power", "W"),
    ("energy", "J"),
    ("sm_clock", "MHz"),
    ("mem_clock", "MHz"),
    ("mem_used", "MiB"),
    ("pcie_tx", "MB/s"),
    ("pcie_rx", "MB/s"),
    ("temperature", "C"),
    ("gpm_sm_occupancy", "%"),
    ("gpm_sm_util", "%"),
    ("gpm_dram_bw_util", "%"),
    ("gpm_tensor_util", "%"),
    ("gpm_nvlink_tx", "MiB/s"),
    ("gpm_nvlink_rx", "MiB/s"),
];

/// Index of a metric in [`METRICS`].
pub fn metric_index(name: &str) -> Option<usize> {
    METRICS.iter().position(|(n, _)| *n == name)
}

/// One reading of the GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuSample {
    /// The caller's clock (µs) when the reading was taken.
    pub t_us: f64,
    /// By [`METRICS`] index; `None` where the device does not report it. Energy is joules since
    /// the sampler started.
    pub values: [Option<f64>; METRICS.len()],
    /// NVML's throttle-reason bitmask (`nvmlClocksEventReasons`).
    pub throttle: u64,
}

/// Mean, median, 99th percentile and maximum of a metric over a window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MetricSummary {
    pub unit: &'static str,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// The samples of one window (an iteration, or all measured ones).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuSummary {
    pub samples: usize,
    /// By metric name; metrics without readings in the window are absent.
    pub metrics: BTreeMap<&'static str, MetricSummary>,
    /// Energy used in the window (J), from the first to the last reading in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    /// Every throttle reason seen in the window.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<&'static str>,
}

/// NVML's throttle-reason bits and their names.
const THROTTLE: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
];

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarises the samples taken in `[from_us, to_us]`.
pub fn summarise(samples: &[GpuSample], from_us: f64, to_us: f64) -> GpuSummary {
    let window: Vec<&GpuSample> = samples
        .iter()
        .filter(|s| s.t_us >= from_us && s.t_us <= to_us)
        .collect();
    let mut metrics = BTreeMap::new();
    for (i, (name, unit)) in METRICS.iter().enumerate() {
        let mut v: Vec<f64> = window
            .iter()
            .filter_map(|s| s.values[i])
            .filter(|x| x.is_finite())
            .collect();
        if v.is_empty() {
            continue;
        }
        v.sort_by(f64::total_cmp);
        metrics.insert(
            *name,
            MetricSummary {
                unit,
                mean: v.iter().sum::<f64>() / v.len() as f64,
                p50: percentile(&v, 50.0),
                p99: percentile(&v, 99.0),
                max: v[v.len() - 1],
            },
        );
    }
    let e = metric_index("energy").expect("energy is a metric");
    let energies: Vec<f64> = window.iter().filter_map(|s| s.values[e]).collect();
    let energy_j = (energies.len() >= 2).then(|| energies[energies.len() - 1] - energies[0]);
    let seen = window.iter().fold(0u64, |m, s| m | s.throttle);
    GpuSummary {
        samples: window.len(),
        metrics,
        energy_j,
        throttle_reasons: THROTTLE
            .iter()
            .filter(|(bit, _)| seen & bit != 0)
            .map(|(_, n)| *n)
            .collect(),
    }
}

/// Which GPU to sample: by NVML index, or by UUID (`GPU-...`, as CUDA reports it; CUDA ordinals
/// and NVML indices differ under `CUDA_VISIBLE_DEVICES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuSelect {
    Index(u32),
    Uuid(String),
}

/// NVML's driver version and device count, or why NVML cannot be used here.
pub fn nvml_status() -> Result<(String, u32), Error> {
    #[cfg(feature = "nvml")]
    {
        let n = imp::init()?;
        Ok((
            n.sys_driver_version().unwrap_or_default(),
            n.device_count().unwrap_or(0),
        ))
    }
    #[cfg(not(feature = "nvml"))]
    Err(Error::NoNvmlSupport)
}

/// A thread reading the GPU every period until stopped.
pub struct NvmlSampler {
    /// The device's name, as NVML gives it.
    pub device_name: String,
    /// Whether GPM metrics are read (Hopper or newer, where the driver supports them).
    pub gpm: bool,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<Vec<GpuSample>>>,
}

impl NvmlSampler {
    /// Starts sampling `gpu` every `period` on the caller's `clock`. `Err` says why NVML cannot
    /// be used here (no driver, no such device, built without the `nvml` feature).
    pub fn start(
        gpu: GpuSelect,
        period: std::time::Duration,
        clock: Clock,
    ) -> Result<NvmlSampler, Error> {
        #[cfg(feature = "nvml")]
        {
            imp::start(gpu, period, clock)
        }
        #[cfg(not(feature = "nvml"))]
        {
            let _ = (gpu, period, clock);
            Err(Error::NoNvmlSupport)
        }
    }

    /// Stops the thread and returns every sample, oldest first.
    pub fn stop(mut self) -> Vec<GpuSample> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for NvmlSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(feature = "nvml")]
mod imp {
    use super::*;
    use nvml_wrapper::enum_wrappers::device::{
        Clock as NvClock, PcieUtilCounter, TemperatureSensor,
    };
    use nvml_wrapper::enums::gpm::GpmMetricId;
    use nvml_wrapper::Nvml;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// The library's versioned name first: the unversioned one exists only with the driver's
    /// development files.
    pub(super) fn init() -> Result<Nvml, Error> {
        let versioned = Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init();
        versioned
            .or_else(|_| Nvml::init())
            .map_err(|e| Error::NvmlUnavailable(Box::new(e)))
    }

    /// GPM metrics read (in [`METRICS`] order from `gpm_sm_occupancy`).
    const GPM: [GpmMetricId; 6] = [
        GpmMetricId::SmOccupancy,
        GpmMetricId::SmUtil,
        GpmMetricId::DramBwUtil,
        GpmMetricId::AnyTensorUtil,
        GpmMetricId::NvlinkTotalTxPerSec,
        GpmMetricId::NvlinkTotalRxPerSec,
    ];

    pub(super) fn start(
        gpu: GpuSelect,
        period: std::time::Duration,
        clock: Clock,
    ) -> Result<NvmlSampler, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<Result<(String, bool), Error>>();
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("nvml-sampler".into())
            .spawn(move || {
                let nvml = match init() {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return Vec::new();
                    }
                };
                let device = match &gpu {
                    GpuSelect::Index(i) => nvml.device_by_index(*i),
                    // A machine with one GPU has no doubt about which, whatever the UUID says.
                    GpuSelect::Uuid(u) => {
                        nvml.device_by_uuid(u.as_str())
                            .or_else(|e| match nvml.device_count() {
                                Ok(1) => nvml.device_by_index(0),
                                _ => Err(e),
                            })
                    }
                };
                let device = match device {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = tx.send(Err(Error::NoSuchGpu {
                            gpu,
                            error: Box::new(e),
                        }));
                        return Vec::new();
                    }
                };
                let gpm = device.gpm_support().unwrap_or(false);
                let name = device.name().unwrap_or_else(|_| "unknown GPU".into());
                let _ = tx.send(Ok((name, gpm)));
                let energy0 = device.total_energy_consumption().ok();
                // NVML's GPM counters refresh internally: two samples must be over 100 ms apart.
                let gpm_every = std::time::Duration::from_millis(100);
                let mut prev_gpm = if gpm {
                    device
                        .gpm_sample()
                        .ok()
                        .map(|s| (s, std::time::Instant::now()))
                } else {
                    None
                };
                let mut samples = Vec::new();
                let mut next = std::time::Instant::now();
                while !stop2.load(Ordering::Relaxed) {
                    let mut v = [None; METRICS.len()];
                    if let Ok(u) = device.utilization_rates() {
                        v[0] = Some(u.gpu as f64);
                        v[1] = Some(u.memory as f64);
                    }
                    v[2] = device.power_usage().ok().map(|mw| mw as f64 / 1e3);
                    v[3] = match (energy0, device.total_energy_consumption().ok()) {
                        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e3),
                        _ => None,
                    };
                    v[4] = device.clock_info(NvClock::SM).ok().map(f64::from);
                    v[5] = device.clock_info(NvClock::Memory).ok().map(f64::from);
                    v[6] = device
                        .memory_info()
                        .ok()
                        .map(|m| m.used as f64 / (1 << 20) as f64);
                    // KB/s
                    v[7] = device
                        .pcie_throughput(PcieUtilCounter::Send)
                        .ok()
                        .map(|k| k as f64 / 1e3);
                    v[8] = device
                        .pcie_throughput(PcieUtilCounter::Receive)
                        .ok()
                        .map(|k| k as f64 / 1e3);
                    v[9] = device
                        .temperature(TemperatureSensor::Gpu)
                        .ok()
                        .map(f64::from);
                    let due = prev_gpm
                        .as_ref()
                        .is_some_and(|(_, t)| t.elapsed() >= gpm_every);
                    if let (true, Some((p, _))) = (due, &prev_gpm) {
                        if let Ok(cur) = device.gpm_sample() {
                            if let Ok(rs) = nvml_wrapper::gpm::gpm_metrics_get(&nvml, p, &cur, &GPM)
                            {
                                // Percentages, and NVLink in MiB/s (NVML's header).
                                for (k, r) in rs.into_iter().enumerate() {
                                    v[10 + k] = r.ok().map(|r| r.value);
                                }
                            }
                            prev_gpm = Some((cur, std::time::Instant::now()));
                        }
                    }
                    let throttle = device
                        .current_throttle_reasons()
                        .map(|r| r.bits())
                        .unwrap_or(0);
                    samples.push(GpuSample {
                        t_us: clock.now_us(),
                        values: v,
                        throttle,
                    });
                    next += period;
                    let now = std::time::Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        // Fell behind (a slow NVML call): no burst of catch-up samples.
                        next = now;
                    }
                }
                samples
            })
            .map_err(Error::SamplerThread)?;
        match rx.recv() {
            Ok(Ok((device_name, gpm))) => Ok(NvmlSampler {
                device_name,
                gpm,
                stop,
                handle: Some(handle),
            }),
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(e)
            }
            Err(_) => Err(Error::SamplerEnded),
        }
    }
}

/// One line of [`svg_timelines`]: name, unit and (time in ms, value) points.
pub type Series<'a> = (String, &'a str, Vec<(f64, f64)>);

/// Stacked line charts, one per series, over a shared time axis (ms): NVML timelines.
pub fn svg_timelines(title: &str, series: &[Series]) -> String {
    use std::fmt::Write as _;
    let (w, h, left, top) = (900.0, 90.0, 170.0, 40.0);
    let t_max = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let esc = crate::xml_escape;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="monospace" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="22" font-size="14">{}</text>"##,
        left + w + 20.0,
        top + (h + 20.0) * series.len() as f64 + 30.0,
        esc(title)
    );
    for (i, (name, unit, pts)) in series.iter().enumerate() {
        let y0 = top + (h + 20.0) * i as f64;
        let v_max = pts
            .iter()
            .map(|p| p.1)
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max);
        let scale = if v_max > 0.0 { v_max } else { 1.0 };
        let _ = writeln!(
            s,
            r##"<text x="10" y="{}">{}</text><text x="10" y="{}" fill="#666">max {:.1} {}</text>
<rect x="{left}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>"##,
            y0 + 30.0,
            esc(name),
            y0 + 46.0,
            v_max,
            esc(unit)
        );
        let points: Vec<String> = pts
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|(t, v)| {
                format!(
                    "{:.1},{:.1}",
                    left + w * t / t_max,
                    y0 + h - h * (v / scale).clamp(0.0, 1.0)
                )
            })
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline fill="none" stroke="#4c72b0" stroke-width="1.2" points="{}"/>"##,
            points.join(" ")
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="{}">0 ms</text><text x="{}" y="{}" text-anchor="end">{:.1} ms</text>"##,
        top + (h + 20.0) * series.len() as f64 + 10.0,
        left + w,
        top + (h + 20.0) * series.len() as f64 + 10.0,
        t_max
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_us: f64, sm: Option<f64>, energy: f64, throttle: u64) -> GpuSample {
        let mut values = [None; METRICS.len()];
        values[0] = sm;
        values[metric_index("energy").unwrap()] = Some(energy);
        GpuSample {
            t_us,
            values,
            throttle,
        }
    }

    #[test]
    fn summaries_cover_only_their_window_and_only_reported_metrics() {
        let s: Vec<GpuSample> = (0..10)
            .map(|i| sample(i as f64 * 10.0, Some(i as f64 * 10.0), i as f64, 0))
            .chain([sample(200.0, Some(1000.0), 50.0, 0x4)])
            .collect();
        let w = summarise(&s, 0.0, 95.0);
        assert_eq!(w.samples, 10);
        let sm = w.metrics["sm_util"];
        assert_eq!((sm.mean, sm.p50, sm.p99, sm.max), (45.0, 40.0, 90.0, 90.0));
        assert_eq!(w.energy_j, Some(9.0));
        assert!(w.throttle_reasons.is_empty());
        assert!(!w.metrics.contains_key("power"), "never reported");
        let all = summarise(&s, 0.0, 1e9);
        assert_eq!(all.metrics["sm_util"].max, 1000.0);
        assert_eq!(all.throttle_reasons, vec!["sw_power_cap"]);
        let empty = summarise(&s, 500.0, 600.0);
        assert_eq!(
            (empty.samples, empty.metrics.len(), empty.energy_j),
            (0, 0, None)
        );
    }

    #[test]
    fn nvml_status_names_the_driver_or_why_not() {
        match nvml_status() {
            Ok((version, _)) => assert!(!version.is_empty()),
            Err(e) => assert!(e.to_string().contains("NVML"), "{e}"),
        }
    }

    #[test]
    fn sampler_without_a_driver_says_so() {
        let r = NvmlSampler::start(
            GpuSelect::Index(0),
            std::time::Duration::from_millis(5),
            Clock::default(),
        );
        match r {
            // A machine with a driver: samples arrive with increasing times.
            Ok(s) => {
                std::thread::sleep(std::time::Duration::from_millis(60));
                let v = s.stop();
                assert!(v.len() >= 2, "{} samples", v.len());
                assert!(v.windows(2).all(|w| w[0].t_us < w[1].t_us));
            }
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("NVML") || e.contains("nvml"), "{e}")
            }
        }
    }

    #[test]
    fn timelines_draw_one_line_per_series() {
        let svg = svg_timelines(
            "gpu <0>",
            &[
                ("sm_util".into(), "%", vec![(0.0, 10.0), (5.0, 90.0)]),
                ("power".into(), "W", vec![(0.0, 100.0), (5.0, f64::NAN)]),
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("gpu &lt;0&gt;"));
        assert!(!svg.contains("NaN"));
    }
}
