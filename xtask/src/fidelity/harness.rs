//! The paced processes the rounds and the references time side by side, and the order they
//! take turns in.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

use super::zoo::{python_env, zoo_script};

/// A process that runs blocks of iterations on request and answers each with one JSON line
/// (`block_ms`, `minor_faults`): the original (`zoo.py serve`) or a paced replay (`mystique
/// replay --paced`). Several stand side by side and take turns, each waiting on its stdin while
/// another runs, so a round's original and replays run within a few hundred ms of each other, in
/// the same spells of the host's speed, where timings taken a second or more apart each sat in
/// spells of their own (one round's ratio moved by +-20% that way on the development VM).
pub(super) struct Paced {
    what: String,
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

/// One block's answer.
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub(super) ms: f64,
    pub(super) faults: f64,
    /// The CPU time the process ran for over the block (ms; NaN where the kernel does not say):
    /// its threads' time on a CPU, read by the harness while it waited before and after.
    pub(super) cpu_ms: f64,
    /// The time the process waited for a CPU in the block (ms; the kernel's run delay of the
    /// thread that ran it, read by the process itself: 0 where it does not say, as a build
    /// from before it did).
    pub(super) wait_ms: f64,
}

/// The time `pid`'s threads have run on a CPU (ns; `/proc/PID/task/*/schedstat`, the
/// scheduler's own account, not the clock ticks of `stat`). A busy host shares a core between a
/// process and its burner, and how much of the core each of the harness's processes gets is
/// the scheduler's choice (on this VM's EEVDF kernel, 0.3-0.9 of the core by the process's
/// block length and wake-ups, not the same for the original and its replays): the wall-clock
/// ratio there holds the scheduler's shares as well as the programs' speeds. `None` where it
/// cannot be read.
pub(super) fn cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        // A thread may exit between the listing and the read: its time leaves the sum.
        let Ok(text) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        total += text.split_ascii_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

impl Paced {
    fn spawn(what: String, mut c: Command) -> Result<Paced> {
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = c.spawn().with_context(|| format!("starting {what}"))?;
        let stdin = child.stdin.take();
        let stdout = std::io::BufReader::new(child.stdout.take().context("no stdout")?);
        Ok(Paced {
            what,
            child,
            stdin,
            stdout,
        })
    }

    /// Runs one block and waits for its answer (the first one also waits for the process's
    /// start-up: loading, calibrating, warming up).
    pub(super) fn block(&mut self) -> Result<Block> {
        use std::io::{BufRead, Write};
        let pid = self.child.id();
        let cpu0 = cpu_ns(pid);
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin, "go")
            .and_then(|_| stdin.flush())
            .with_context(|| format!("{} exited early", self.what))?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                bail!("{} exited before answering a block", self.what);
            }
            if let Ok(j) = serde_json::from_str::<serde_json::Value>(&line) {
                if let Some(ms) = j["block_ms"].as_f64() {
                    let cpu_ms = match (cpu0, cpu_ns(pid)) {
                        (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
                        _ => f64::NAN,
                    };
                    return Ok(Block {
                        ms,
                        faults: j["minor_faults"].as_f64().unwrap_or(f64::NAN)
                            / j["iters"].as_f64().unwrap_or(f64::NAN),
                        cpu_ms,
                        wait_ms: j["wait_ms"]
                            .as_f64()
                            .filter(|w| w.is_finite() && *w >= 0.0)
                            .map_or(0.0, |w| w.min(ms)),
                    });
                }
            }
        }
    }

    /// Closes its stdin and returns the last JSON line it printed (a replay's report).
    pub(super) fn finish(mut self) -> Result<serde_json::Value> {
        use std::io::Read;
        drop(self.stdin.take());
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest)?;
        let _ = self.child.wait();
        Ok(rest
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_default())
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The original, uninstrumented, in paced blocks of `iters` iterations.
pub(super) fn serve_original(
    root: &Path,
    torch_py: &Path,
    m: &str,
    iters: usize,
    glibc_heap_defaults: bool,
) -> Result<Paced> {
    let mut c = Command::new(crate::python());
    c.arg(zoo_script(root))
        .args(["serve", m])
        .arg(iters.to_string());
    python_env(&mut c, torch_py);
    if glibc_heap_defaults {
        c.env_remove("GLIBC_TUNABLES");
    }
    Paced::spawn(format!("the original {m}"), c)
}

/// `mystique replay ET` as the zoo runs it: one thread, 3 warm-up and `iters` measured
/// iterations, a JSON report (with gaps from `kineto`).
fn replay_command(
    bin: &Path,
    et: &Path,
    kineto: Option<&Path>,
    iters: usize,
    extra: &[String],
) -> Command {
    let mut c = Command::new(bin);
    c.arg("replay")
        .arg(et)
        .args(["--threads", "1", "--warmup", "3", "--json", "--iters"])
        .arg(iters.to_string())
        .args(extra);
    if let Some(k) = kineto {
        c.arg("--kineto").arg(k).arg("--emulate-gaps");
    }
    c
}

/// A replay in paced blocks of `iters` iterations, `blocks` of them (with gaps from `kineto`).
pub(super) fn serve_replay(
    bin: &Path,
    et: &Path,
    kineto: Option<&Path>,
    iters: usize,
    blocks: usize,
    extra: &[String],
) -> Result<Paced> {
    let mut c = replay_command(bin, et, kineto, iters * blocks, extra);
    c.arg("--paced")
        .arg(iters.to_string())
        .stderr(std::process::Stdio::null());
    Paced::spawn(format!("the replay of {}", et.display()), c)
}

/// A plain replay run to its end, with `extra` arguments; its report.
pub(super) fn replay(
    bin: &Path,
    et: &Path,
    iters: usize,
    extra: &[String],
) -> Result<serde_json::Value> {
    let r = replay_command(bin, et, None, iters, extra).output()?;
    // Exit 3 (some ops failed) still has a report.
    serde_json::from_slice(&r.stdout).with_context(|| {
        format!(
            "replay of {}: {}",
            et.display(),
            String::from_utf8_lossy(&r.stderr)
        )
    })
}

/// `items` in groups of at most `most`, as even as can be (sizes differ by one at most): 74
/// models in fours are 17 fours and 2 threes, not 18 fours and a two. A group of one would
/// time its model back to back, as the groups are there to avoid; it happens only for a
/// single item.
pub(super) fn balanced_groups<T>(items: &[T], most: usize) -> Vec<&[T]> {
    let groups = items.len().div_ceil(most.max(1));
    let mut out = Vec::with_capacity(groups);
    let mut rest = items;
    for g in 0..groups {
        // What is left, spread over the groups left.
        let (here, later) = rest.split_at(rest.len().div_ceil(groups - g));
        out.push(here);
        rest = later;
    }
    out
}

/// The order `n` takers (a round's processes, a group's models) go in at `round`: each starts
/// a round in each place in turn, forwards and then backwards, so none always follows the
/// same one (caches, the host's spells).
pub(super) fn turn_order(n: usize, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if n > 0 {
        order.rotate_left(round % n);
        if (round / n) % 2 == 1 {
            order.reverse();
        }
    }
    order
}

/// Iterations per block: about `block_ms` of the original's quiet iterations (its capture's
/// timing), the same count for every process so that a block's times compare as they are.
pub(super) fn block_iters(meta: &serde_json::Value, block_ms: f64) -> usize {
    let ms = meta["iter_ms_median"]
        .as_f64()
        .filter(|ms| ms.is_finite() && *ms > 0.0)
        .unwrap_or(10.0);
    ((block_ms / ms).round() as usize).clamp(1, 1000)
}
