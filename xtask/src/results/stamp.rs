//! A measurement's stamp: the command that produced it, when (UTC), the build, and the machine
//! (CPU model, cores, memory, kernel, cgroup version), all recorded when the figures are saved.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// The stamp of a measurement saved now by `command`, of the checkout at `root`.
pub(super) fn now(command: &str, root: &Path) -> Value {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "command": command,
        "date": iso_utc(secs),
        "build": build(root),
        "machine": this_machine(),
    })
}

/// The checkout's commit (`git describe --always --dirty`: `-dirty` where tracked files differ
/// from it), or "unknown" outside git.
fn build(root: &Path) -> String {
    Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// This machine, from `/proc` and `/sys` (fields it cannot read are left out).
fn this_machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    machine_from(
        &read("/proc/cpuinfo"),
        &read("/proc/meminfo"),
        read("/proc/sys/kernel/osrelease").trim(),
        Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
    )
}

/// The machine as `/proc/cpuinfo`, `/proc/meminfo` and the kernel release describe it;
/// `cgroup_v2`: whether the unified hierarchy is mounted (cgroup v1 otherwise), which decides
/// how `--throttled-host` sets its CPU quota.
pub(super) fn machine_from(cpuinfo: &str, meminfo: &str, kernel: &str, cgroup_v2: bool) -> Value {
    let field = |text: &str, name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let processors = cpuinfo
        .lines()
        .filter(|l| l.split(':').next().map(str::trim) == Some("processor"))
        .count();
    let cores = if processors > 0 {
        processors
    } else {
        std::thread::available_parallelism().map_or(0, |n| n.get())
    };
    let virtual_machine =
        field(cpuinfo, "flags").is_some_and(|f| f.split_whitespace().any(|x| x == "hypervisor"));
    let memory_gib = field(meminfo, "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| kib / (1024.0 * 1024.0));
    let mut m = json!({
        "cores": cores,
        "virtual": virtual_machine,
        "arch": std::env::consts::ARCH,
        "cgroup": if cgroup_v2 { "v2" } else { "v1" },
    });
    let extra = [
        ("cpu", field(cpuinfo, "model name").map(Value::from)),
        (
            "memory_gib",
            memory_gib.map(|g| json!((g * 10.0).round() / 10.0)),
        ),
        ("kernel", (!kernel.is_empty()).then(|| Value::from(kernel))),
    ];
    for (k, v) in extra {
        if let Some(v) = v {
            m[k] = v;
        }
    }
    m
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub(super) fn iso_utc(secs: u64) -> String {
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The stamp as one line of the document: "`command`, date, build; machine."
pub(super) fn line(stamp: &Value) -> String {
    let date = stamp["date"]
        .as_str()
        .map(|d| d.replacen('T', " ", 1).trim_end_matches('Z').to_string())
        .map(|d| {
            format!(
                "{} UTC",
                d.rsplit_once(':').map_or(d.as_str(), |(hm, _)| hm)
            )
        })
        .unwrap_or_else(|| "date unknown".into());
    format!(
        "`{}`, {date}, build {}; {}.",
        stamp["command"].as_str().unwrap_or("?"),
        stamp["build"].as_str().unwrap_or("unknown"),
        machine_words(&stamp["machine"])
    )
}

/// The machine in words: "AMD EPYC 7B13, 2 cores, virtual machine, x86_64, 7.8 GiB, Linux
/// 6.18.0, cgroup v1".
fn machine_words(m: &Value) -> String {
    let mut parts = vec![m["cpu"].as_str().unwrap_or("CPU unknown").to_string()];
    if let Some(n) = m["cores"].as_u64() {
        parts.push(format!("{n} {}", if n == 1 { "core" } else { "cores" }));
    }
    if m["virtual"].as_bool() == Some(true) {
        parts.push("virtual machine".into());
    }
    if let Some(a) = m["arch"].as_str() {
        parts.push(a.into());
    }
    if let Some(g) = m["memory_gib"].as_f64() {
        parts.push(format!("{g:.1} GiB"));
    }
    if let Some(k) = m["kernel"].as_str() {
        parts.push(format!("Linux {k}"));
    }
    if let Some(c) = m["cgroup"].as_str() {
        parts.push(format!("cgroup {c}"));
    }
    parts.join(", ")
}
