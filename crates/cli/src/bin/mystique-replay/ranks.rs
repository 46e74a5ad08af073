//! `mystique replay --ranks DIR_OR_GLOB`: every rank of a distributed trace replayed together on
//! this machine. One process per rank (this executable, as torchrun would start it: RANK,
//! WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), their reports gathered into one.
//!
//! Faults: a rank that fails makes the others fail at their next collective (Gloo sees the
//! closed connection, or the collective times out after `--timeout`); ranks still running
//! `--timeout` after the first failure are killed. Every child dies with this process
//! (PR_SET_PDEATHSIG), so none is left behind.

use crate::rank_files::{self, RankSource, RankTrace};
use anyhow::{bail, Context, Result};
use mystique_cli::args::ReplayArgs;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn run(a: &ReplayArgs, json_out: bool) -> Result<()> {
    let specs = a.ranks.as_deref().unwrap_or_default();
    anyhow::ensure!(a.timeout > 0, "--timeout must be positive");
    anyhow::ensure!(
        a.kineto.is_none() && a.memory_profile.is_none(),
        "--kineto/--emulate-gaps/--memory-profile take one rank's profile: replay that rank \
         alone"
    );
    crate::comm_cmd::check_reshaping(a)?;
    crate::replay_cmd::gpu_options_need_cuda(a, replay::Device::parse(&a.device)?)?;
    // Written after every rank ran (or by each rank): their places are checked before any
    // starts.
    for p in [&a.trace_out, &a.gpu_svg].into_iter().flatten() {
        mystique_cli::output::check(p, &[])?;
    }
    let (traces, from) = match specs {
        [one] => rank_files::discover(one, a.rank_order)?,
        many => rank_files::order(
            rank_files::read(rank_files::list_given(many)?)?,
            a.rank_order,
        )?,
    };
    let captured = traces.len();
    // With --world N, ranks 0..N-1 replay their own traces.
    let n = match a.comm.world {
        Some(n) => {
            if !(1..=captured).contains(&n) {
                return Err(replay::plan::CommSelectError::World { world: n, captured }.into());
            }
            n
        }
        None => captured,
    };
    let traces = &traces[..n];
    // Each rank's profile, for --paced-by-trace: beside its trace.
    let kineto: Vec<Option<std::path::PathBuf>> = traces
        .iter()
        .map(|t| {
            let k = crate::comm_cmd::kineto_beside(&t.path);
            anyhow::ensure!(
                k.is_some() || !a.comm.paced_by_trace,
                "--paced-by-trace: no Kineto trace beside {} (NAME.kineto.json[.gz] for \
                 NAME[.linked].et.json[.gz])",
                t.path.display()
            );
            Ok(k)
        })
        .collect::<Result<_>>()?;
    if !json_out {
        eprintln!(
            "replaying {n} rank{} together over Gloo on loopback (ranks: {}) ...",
            if n == 1 { "" } else { "s" },
            from.phrase()
        );
    }
    let timeout = Duration::from_secs(a.timeout);
    // On the CPU the ranks share this machine's memory (on CUDA each checks its own GPU):
    // each rank says what its plan needs, and none starts until they fit together.
    let gate = MemoryGate::here(a.run.only, a.run.force)?;
    let results = launch(n, timeout, (a.device == "cpu").then_some(&gate), |rank| {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("replay")
            .arg(&traces[rank].path)
            .arg("--json")
            .args(child_args(a, rank, captured));
        if n > 1 {
            one_thread_unless_told(&mut cmd, a.run.threads);
        }
        if let (true, Some(k)) = (a.comm.paced_by_trace, &kineto[rank]) {
            cmd.arg("--kineto").arg(k);
        }
        Ok((cmd, traces[rank].path.display().to_string()))
    })?;
    let reports: Vec<Value> = results
        .iter()
        .map(|out| serde_json::from_slice(out).context("a rank's report is not JSON"))
        .collect::<Result<_>>()?;
    let summary = summarise(traces, from, &reports)?;
    if let Some(p) = &a.trace_out {
        merge_timelines(p, &reports)?;
    }
    let printed = (|| -> Result<()> {
        let mut out = std::io::stdout().lock();
        if json_out {
            serde_json::to_writer(&mut out, &summary)?;
            writeln!(out)?;
        } else {
            print_table(&mut out, &summary, from)?;
        }
        Ok(())
    })();
    mystique_cli::printed_then(
        printed,
        mystique_cli::OpsFailed::check_reports(reports.iter()),
    )
}

/// Starts `n` ranks (`make(rank)` gives each its command and a label), as torchrun would
/// (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), relays their
/// stderr, and returns their stdouts once all have ended; see [`supervise`] for failures.
pub fn launch(
    n: usize,
    timeout: Duration,
    gate: Option<&MemoryGate>,
    make: impl Fn(usize) -> Result<(Command, String)>,
) -> Result<Vec<Vec<u8>>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free loopback port for the rendezvous")?
        .port();
    let mut ranks: Vec<Running> = Vec::with_capacity(n);
    let (tx, rx) = std::sync::mpsc::channel();
    for rank in 0..n {
        let (mut cmd, label) = make(rank)?;
        cmd.env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .stdin(if gate.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if gate.is_some() {
            cmd.env(GATE_ENV, "1");
        }
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting rank {rank}"))?;
        eprintln!("[ranks] rank {rank}: pid {} ({label})", child.id());
        ranks.push(Running::new(rank, child, tx.clone()));
    }
    drop(tx);
    let ended_first = match gate {
        Some(gate) => open_gate(&mut ranks, &rx, gate)?,
        None => None,
    };
    supervise(&mut ranks, timeout, ended_first)
}

/// As torchrun does for several processes on one machine: one intra-op thread for a rank's
/// process unless told otherwise (`--threads`, given as `threads`, or `OMP_NUM_THREADS`), so
/// that the ranks do not oversubscribe the cores they share.
pub fn one_thread_unless_told(cmd: &mut Command, threads: Option<i32>) {
    if threads.is_none() && std::env::var_os("OMP_NUM_THREADS").is_none() {
        cmd.env("OMP_NUM_THREADS", "1");
    }
}

/// The ranks' estimated peaks checked together against `available` bytes (none known: no
/// check), for the replay `only` asks for, unless `force`.
pub struct MemoryGate {
    pub available: Option<u64>,
    pub only: et_graph::Kind,
    pub force: bool,
}

impl MemoryGate {
    /// The gate for this machine: what it has available (or `MYSTIQUE_AVAILABLE_MEMORY`).
    pub fn here(only: et_graph::Kind, force: bool) -> Result<MemoryGate> {
        Ok(MemoryGate {
            available: available_override()?.or_else(metrics::available_memory),
            only,
            force,
        })
    }

    fn check(&self, peaks: &[rank_files::Peak]) -> Result<()> {
        match self.available {
            Some(available) => rank_files::check_memory(peaks, available, self.only, self.force),
            None => Ok(()),
        }
    }
}

/// Set for a rank whose launcher checks the ranks' memory together: before materialising,
/// the rank prints its plan's estimates on stderr ([`GATE_LINE`]) and waits for `go` on stdin.
const GATE_ENV: &str = "MYSTIQUE_MEMORY_GATE";
/// What a rank's gate line starts with: `mystique-gate ASKED COMM_ONLY` (bytes).
const GATE_LINE: &str = "mystique-gate ";
/// Bytes of memory a replay on the CPU (and `--ranks`, for its ranks together) takes as
/// available instead of what this machine and its cgroup have: to see what a larger or smaller
/// machine would refuse, and for tests.
const AVAILABLE_ENV: &str = "MYSTIQUE_AVAILABLE_MEMORY";

/// The bytes [`AVAILABLE_ENV`] gives, if set: an error where it is not a number of bytes.
pub fn available_override() -> Result<Option<u64>> {
    std::env::var(AVAILABLE_ENV)
        .ok()
        .map(|v| {
            v.parse::<u64>()
                .with_context(|| format!("{AVAILABLE_ENV}={v:?} is not a number of bytes"))
        })
        .transpose()
}

/// In a rank started with [`GATE_ENV`]: the gate that tells its launcher what its plan needs
/// and waits for its go.
pub fn gate_from_env() -> Option<replay::MemoryGate> {
    std::env::var_os(GATE_ENV)?;
    Some(replay::MemoryGate(std::sync::Arc::new(
        |asked, comm_only| {
            eprintln!("{GATE_LINE}{asked} {comm_only}");
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            match line.trim() {
                "go" => Ok(()),
                "stop peer" => Err("stopped before starting: another rank ended first (the \
                                    launcher names it)"
                    .into()),
                _ => Err(
                    "stopped before starting: the ranks do not fit this machine's memory together \
                 (the launcher says why)"
                        .into(),
                ),
            }
        },
    )))
}

/// Waits for every rank's estimate, checks them together, then lets every rank go, or stops
/// them all (their stdin closed) and says why. A rank that ends before it gets there leaves
/// the others to [`supervise`], which reports it.
fn open_gate(
    ranks: &mut [Running],
    rx: &std::sync::mpsc::Receiver<(usize, rank_files::Peak)>,
    gate: &MemoryGate,
) -> Result<Option<usize>> {
    let mut peaks: Vec<Option<rank_files::Peak>> = vec![None; ranks.len()];
    // The rank that ended before it said what it needs: the cause of the others' stopping.
    let mut ended = None;
    while peaks.iter().any(Option::is_none) {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((rank, p)) => peaks[rank] = Some(p),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        ended = ranks
            .iter_mut()
            .filter(|r| peaks[r.rank].is_none())
            .find_map(|r| (!matches!(r.child.try_wait(), Ok(None))).then_some(r.rank));
        if ended.is_some() {
            break;
        }
    }
    let all: Option<Vec<rank_files::Peak>> = peaks.into_iter().collect();
    let verdict = match &all {
        Some(p) => gate.check(p),
        // A rank ended first: supervise names it; the others must not wait for a go.
        None => Ok(()),
    };
    // What each waiting rank is told: go, or why it stops (it says so in its own error).
    let word: &[u8] = match (&all, &verdict) {
        (Some(_), Ok(())) => b"go\n",
        (None, _) => b"stop peer\n",
        (Some(_), Err(_)) => b"stop memory\n",
    };
    for r in ranks.iter_mut() {
        if let Some(mut stdin) = r.child.stdin.take() {
            let _ = stdin.write_all(word);
        }
    }
    if verdict.is_err() {
        for r in ranks.iter_mut() {
            let _ = r.child.wait();
        }
    }
    verdict.map(|()| ended)
}

/// The replay arguments each rank gets (its own trace, `--json` and the rendezvous aside).
fn child_args(a: &ReplayArgs, rank: usize, captured: usize) -> Vec<String> {
    let mut v = vec![
        "--device".into(),
        a.device.clone(),
        "--warmup".into(),
        a.run.warmup.to_string(),
        "--iters".into(),
        a.run.iters.to_string(),
        "--only".into(),
        format!("{:?}", a.run.only).to_lowercase(),
        "--timeout".into(),
        a.timeout.to_string(),
        "--seed".into(),
        a.run.seed.to_string(),
    ];
    if let Some(t) = a.run.threads {
        v.extend(["--threads".into(), t.to_string()]);
    }
    if let Some(it) = &a.iteration {
        let s: Vec<String> = it.iter().map(|i| i.to_string()).collect();
        v.extend(["--iteration".into(), s.join(",")]);
    }
    for (flag, on) in [
        ("--force", a.run.force),
        ("--strict", a.strict),
        ("--no-autograd", a.run.no_autograd),
        ("--check-values", a.run.check_values),
        ("--blocking", a.comm.blocking),
        ("--paced-by-trace", a.comm.paced_by_trace),
        ("--check-collectives", a.comm.check_collectives),
    ] {
        if on {
            v.push(flag.into());
        }
    }
    if let Some(n) = a.comm.world {
        v.extend([
            "--world".into(),
            n.to_string(),
            "--captured-world".into(),
            captured.to_string(),
        ]);
    }
    if let Some(k) = &a.comm.allow_collectives {
        v.extend(["--allow-collectives".into(), k.join(",")]);
    }
    if a.comm.rebalance.is_some() {
        v.extend(["--rebalance".into(), "equal".into()]);
    }
    if let Some(m) = a.comm.max_collectives {
        v.extend(["--max-collectives".into(), m.to_string()]);
    }
    for l in &a.load_library {
        v.extend(["--load-library".into(), l.display().to_string()]);
    }
    if let Some(p) = &a.trace_out {
        // One Chrome trace per rank (out.json -> out.rank3.json), merged into out.json.
        v.extend([
            "--trace-out".into(),
            rank_timeline(p, rank).display().to_string(),
        ]);
    }
    if let Some(ms) = a.nvml_period {
        v.extend(["--nvml-period".into(), ms.to_string()]);
    }
    if let Some(p) = &a.gpu_svg {
        // Each rank's GPU on its own: out.svg -> out.rank3.svg.
        v.extend([
            "--gpu-svg".into(),
            rank_timeline(p, rank).display().to_string(),
        ]);
    }
    v
}

/// Where rank `rank` writes its timeline for `--trace-out P`: `out.json` -> `out.rank3.json`.
fn rank_timeline(p: &std::path::Path, rank: usize) -> std::path::PathBuf {
    let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("replay");
    let ext = p.extension().and_then(|s| s.to_str()).unwrap_or("json");
    p.with_file_name(format!("{stem}.rank{rank}.{ext}"))
}

/// `--trace-out P` with `--ranks`: every rank's timeline in `P`, one process row per rank, on
/// one axis (each rank's clock put on the wall clock of its start), so that each collective
/// shows on every rank at once.
fn merge_timelines(p: &std::path::Path, reports: &[Value]) -> Result<()> {
    let origins: Vec<f64> = reports
        .iter()
        .map(|r| r["timeline_origin_unix_us"].as_f64().unwrap_or(0.0))
        .collect();
    let base = origins.iter().copied().fold(f64::INFINITY, f64::min);
    let mut events: Vec<Value> = Vec::new();
    for (rank, origin) in origins.iter().enumerate() {
        let path = rank_timeline(p, rank);
        let text = std::fs::read(&path)
            .with_context(|| format!("reading rank {rank}'s timeline {}", path.display()))?;
        let j: Value = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not a Chrome trace", path.display()))?;
        for mut e in j["traceEvents"].as_array().cloned().unwrap_or_default() {
            e["pid"] = json!(rank + 1);
            if let Some(ts) = e["ts"].as_f64() {
                e["ts"] = json!(ts + origin - base);
            }
            if e["name"] == "process_name" {
                e["args"]["name"] = json!(format!("rank {rank}"));
            }
            events.push(e);
        }
    }
    mystique_cli::output::write_atomic_gz(p, |w| {
        serde_json::to_writer(
            &mut *w,
            &json!({"traceEvents": events, "displayTimeUnit": "ms"}),
        )?;
        Ok(())
    })
}

/// Makes a child die with this process, so that no rank outlives its launcher.
fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // The launcher waits for SIGINT/SIGTERM/SIGHUP on a thread of its own, with
                // them blocked; a rank takes them as signals do.
                mystique_cli::signals::unblock();
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// A rank's process, its stdout collected and its stderr relayed as it comes.
struct Running {
    rank: usize,
    child: Child,
    stdout: std::thread::JoinHandle<Vec<u8>>,
    last_error: std::sync::Arc<std::sync::Mutex<String>>,
    stderr: std::thread::JoinHandle<()>,
}

impl Running {
    fn new(
        rank: usize,
        mut child: Child,
        gate: std::sync::mpsc::Sender<(usize, rank_files::Peak)>,
    ) -> Running {
        let mut out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        let last_error = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let last = last_error.clone();
        Running {
            rank,
            stdout: std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = out.read_to_end(&mut v);
                v
            }),
            stderr: std::thread::spawn(move || {
                for line in std::io::BufReader::new(err).lines().map_while(|l| l.ok()) {
                    if let Some(figures) = line.strip_prefix(GATE_LINE) {
                        let mut v = figures.split(' ').map(|x| x.parse::<u64>().ok());
                        if let (Some(Some(asked)), Some(Some(comm_only))) = (v.next(), v.next()) {
                            let _ = gate.send((rank, rank_files::Peak { asked, comm_only }));
                            continue;
                        }
                    }
                    eprintln!("[rank {rank}] {line}");
                    if line.starts_with("error:") || line.trim_start().starts_with("caused by:") {
                        let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
                        if line.starts_with("error:") {
                            l.clear();
                        }
                        if !l.is_empty() {
                            l.push_str("; ");
                        }
                        l.push_str(line.trim());
                    }
                }
            }),
            last_error,
            child,
        }
    }
}

/// Waits for every rank; returns their reports, or the first failure once every rank has
/// stopped (those still running `timeout` after it are killed).
fn supervise(
    ranks: &mut [Running],
    timeout: Duration,
    ended_first: Option<usize>,
) -> Result<Vec<Vec<u8>>> {
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; ranks.len()];
    let mut first_failure: Option<(usize, Instant)> = None;
    // A rank known to have ended first (before the memory gate) is the first failure, whichever
    // of the others is seen to end first below.
    if let Some(k) = ended_first {
        if let Some(r) = ranks.get_mut(k) {
            let s = r.child.wait()?;
            status[k] = Some(s);
            if !ran(s) {
                first_failure = Some((k, Instant::now()));
            }
        }
    }
    let mut killed = Vec::new();
    // Since when each rank has been stopped (SIGSTOP, a debugger): it answers no collective,
    // and the ranks waiting for it would time out and be blamed in its place.
    let mut stopped_since: Vec<Option<Instant>> = vec![None; ranks.len()];
    let mut stopped_rank: Option<usize> = None;
    loop {
        for (k, r) in ranks.iter_mut().enumerate() {
            if status[k].is_none() {
                if let Some(s) = r.child.try_wait()? {
                    status[k] = Some(s);
                    if !ran(s) && first_failure.is_none() {
                        first_failure = Some((k, Instant::now()));
                    }
                } else if is_stopped(r.child.id()) {
                    let since = *stopped_since[k].get_or_insert_with(Instant::now);
                    if stopped_rank.is_none()
                        && (first_failure.is_some() || since.elapsed() > timeout)
                    {
                        stopped_rank = Some(k);
                    }
                } else {
                    stopped_since[k] = None;
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        if let Some(k) = stopped_rank {
            // The stopped rank is the cause: end the run now, naming it.
            first_failure = Some((k, Instant::now()));
            for (j, r) in ranks.iter_mut().enumerate() {
                if status[j].is_none() {
                    let _ = r.child.kill();
                    status[j] = r.child.wait().ok();
                    if j != k {
                        killed.push(j);
                    }
                }
            }
            break;
        }
        if let Some((_, at)) = first_failure {
            if at.elapsed() > timeout {
                for (k, r) in ranks.iter_mut().enumerate() {
                    if status[k].is_none() {
                        let _ = r.child.kill();
                        status[k] = r.child.wait().ok();
                        killed.push(k);
                    }
                }
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut outputs = Vec::new();
    for r in ranks.iter_mut() {
        let out = std::mem::replace(&mut r.stdout, std::thread::spawn(Vec::new));
        outputs.push(out.join().unwrap_or_default());
        let err = std::mem::replace(&mut r.stderr, std::thread::spawn(|| ()));
        let _ = err.join();
    }
    if let Some(k) = stopped_rank {
        let secs = stopped_since[k].map_or(0.0, |t| t.elapsed().as_secs_f64());
        bail!(
            "rank {} stopped responding: its process was stopped (SIGSTOP or a debugger) for \
             {secs:.1} s, so the others waited for it in their collectives; it and the ranks \
             still running ({killed:?}) were killed",
            ranks[k].rank
        );
    }
    if let Some((k, _)) = first_failure {
        let why = ranks[k]
            .last_error
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let others: Vec<String> = status
            .iter()
            .enumerate()
            .filter(|(j, s)| *j != k && s.is_some_and(|s| !ran(s)))
            .map(|(j, _)| j.to_string())
            .collect();
        bail!(
            "rank {} failed first ({}){}{}{}",
            ranks[k].rank,
            status[k].map_or("killed".into(), describe),
            if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            },
            if others.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} {} failed after it",
                    if others.len() == 1 { "rank" } else { "ranks" },
                    others.join(", ")
                )
            },
            if killed.is_empty() {
                String::new()
            } else {
                format!(
                    "; ranks {killed:?} were still running {} s later and were killed",
                    timeout.as_secs()
                )
            }
        );
    }
    Ok(outputs)
}

/// Whether process `pid` is stopped (state `T` or `t` in `/proc/PID/stat`: a stop signal or a
/// tracer holds it).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // The state follows the command name, which is in parentheses and may hold any byte.
            let after = &s[s.rfind(')')? + 1..];
            after
                .split_whitespace()
                .next()
                .map(|st| st == "T" || st == "t")
        })
        .unwrap_or(false)
}

/// Whether a rank ran to its end: every op, or with failed ops (its report printed, exit 3).
fn ran(s: std::process::ExitStatus) -> bool {
    s.success() || s.code() == Some(mystique_cli::EXIT_OPS_FAILED as i32)
}

fn describe(s: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = s.signal() {
            return format!("killed by signal {sig}");
        }
    }
    format!("exit code {}", s.code().unwrap_or(-1))
}

/// One object: the per-rank reports and cross-rank figures: the slowest rank, and per
/// collective kind the statistics over every rank's calls (per rank and iteration), with the
/// waiting each kind caused (each rank's time in it beyond the fastest rank's, summed).
fn summarise(traces: &[RankTrace], from: RankSource, reports: &[Value]) -> Result<Value> {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let slowest = reports
        .iter()
        .enumerate()
        .max_by(|a, b| f(&a.1["iter_ms"]["median"]).total_cmp(&f(&b.1["iter_ms"]["median"])))
        .map(|(k, _)| k);
    // Per kind: every rank's calls, and how many ranks ran it.
    let mut by_kind: BTreeMap<String, (Vec<replay::CollectiveCall>, usize)> = BTreeMap::new();
    // Per kind, each rank's time in it per iteration.
    let mut per_rank_ms: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in reports {
        let mine: Vec<replay::CollectiveCall> = match r.get("collective_calls") {
            Some(v) => serde_json::from_value(v.clone())
                .context("a rank's report lists its collectives in another format")?,
            None => Vec::new(),
        };
        for (kind, c) in r["collectives"].as_object().into_iter().flatten() {
            per_rank_ms
                .entry(kind.clone())
                .or_default()
                .push(f(&c["total_ms"]));
            by_kind.entry(kind.clone()).or_default().1 += 1;
        }
        for c in mine {
            by_kind.entry(c.kind.clone()).or_default().0.push(c);
        }
    }
    let iters = reports
        .first()
        .and_then(|r| r["iters"].as_u64())
        .unwrap_or(1) as usize;
    let world = reports.len();
    // Per rank (of those that ran the kind) and iteration.
    let kinds: BTreeMap<String, replay::CollectiveTiming> = by_kind
        .into_iter()
        .map(|(kind, (calls, ranks))| {
            let list: Vec<&replay::CollectiveCall> = calls.iter().collect();
            let t = replay::CollectiveTiming::of(&list, iters * ranks.max(1), world);
            (kind, t)
        })
        .collect();
    let collectives: BTreeMap<String, Value> = kinds
        .into_iter()
        .map(|(kind, c)| {
            let times = per_rank_ms.get(&kind).cloned().unwrap_or_default();
            let min = times.iter().copied().fold(f64::INFINITY, f64::min);
            let wait: f64 = times.iter().map(|t| t - min).sum();
            let mut v = serde_json::to_value(&c).unwrap_or_default();
            v["time_ms"] = json!(c.total_ms);
            v["wait_ms"] = json!(wait);
            v["ranks"] = json!(times.len());
            (kind, v)
        })
        .collect();
    Ok(json!({
        "world_size": reports.len(),
        "traces": traces.iter().map(|t| t.path.display().to_string()).collect::<Vec<_>>(),
        "ranks_from": from.name(),
        "slowest_rank": slowest,
        "collectives": collectives,
        "ranks": reports,
    }))
}

fn print_table(out: &mut impl Write, s: &Value, from: RankSource) -> Result<()> {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    writeln!(
        out,
        "ranks      {} over loopback ({}); which trace is which rank: {}",
        s["world_size"].as_u64().unwrap_or(0),
        s["ranks"][0]["comm"].as_str().unwrap_or("gloo"),
        from.phrase()
    )?;
    writeln!(out, "  rank  replayed  failed  iteration ms  trace")?;
    for (k, r) in s["ranks"].as_array().into_iter().flatten().enumerate() {
        writeln!(
            out,
            "  {k:>4}  {:>8}  {:>6}  {:>12.3}  {}",
            format!(
                "{}/{}",
                r["ops_replayed"].as_u64().unwrap_or(0),
                r["ops_selected"].as_u64().unwrap_or(0)
            ),
            r["ops_failed"].as_u64().unwrap_or(0),
            f(&r["iter_ms"]["median"]),
            s["traces"][k].as_str().unwrap_or("")
        )?;
    }
    if let Some(k) = s["slowest_rank"].as_u64() {
        writeln!(out, "slowest    rank {k}")?;
    }
    let kinds: BTreeMap<String, replay::CollectiveTiming> = s["collectives"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), serde_json::from_value(v.clone()).ok()?)))
        .collect();
    let waits: BTreeMap<String, f64> = s["collectives"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), f(&v["wait_ms"])))
        .collect();
    if !kinds.is_empty() {
        crate::print::print_collectives(out, &kinds, Some(&waits))?;
        let buckets = kinds.values().any(|k| k.sizes.len() > 1);
        writeln!(
            out,
            "  ({}time: mean over ranks; wait: each rank's time beyond the fastest rank's, summed)",
            if buckets {
                "calls of a size: per iteration and rank, averaged over the ranks, whose sizes \
                 may differ; "
            } else {
                ""
            }
        )?;
    }
    for (k, r) in s["ranks"].as_array().into_iter().flatten().enumerate() {
        if let Some(p) = r.get("paced").filter(|p| !p.is_null()) {
            writeln!(
                out,
                "paced      rank {k}: iteration {:.3} ms, the trace's {:.3} ms ({} collectives at \
                 their recorded times)",
                f(&r["iter_ms"]["median"]),
                f(&p["trace_ms"]),
                p["collectives"]
            )?;
        }
        for f in r["failures"].as_array().into_iter().flatten() {
            writeln!(
                out,
                "failed     rank {k}: {}x {}: [{}] {}",
                f["count"],
                f["op"].as_str().unwrap_or("?"),
                f["kind"].as_str().unwrap_or("?"),
                f["reason"].as_str().unwrap_or("")
            )?;
        }
        for f in r["fallbacks"].as_array().into_iter().flatten() {
            writeln!(
                out,
                "fallback   rank {k}: {}x {}: {}",
                f["count"],
                f["op"].as_str().unwrap_or("?"),
                f["ran_as"].as_str().unwrap_or("")
            )?;
        }
        if let Some(c) = r.get("check").filter(|c| !c.is_null()) {
            writeln!(
                out,
                "checked    rank {k}: {} collective calls per iteration verified{}",
                c["checked"],
                match c["unchecked"].as_object().filter(|m| !m.is_empty()) {
                    Some(m) => format!(
                        " (not modelled: {})",
                        m.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                    None => String::new(),
                }
            )?;
        }
    }
    Ok(())
}
