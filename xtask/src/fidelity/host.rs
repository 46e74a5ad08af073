//! The replay host's load: CPU burners (`--busy-host`, and the busy references), a CPU quota
//! (`--throttled-host`), and the cores this process may run on.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The host the replays and the original's timing run on (the references are always timed as
/// their capture found the host).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ReplayHost {
    Quiet,
    /// `--busy-host`: beside a CPU burner on every core ([`Burners`]).
    Busy,
    /// `--throttled-host`: under a CPU quota ([`Throttle`]).
    Throttled,
}

/// One CPU-bound process per core (a Python spin loop), killed when dropped: a busy host.
pub(super) struct Burners(Vec<std::process::Child>);

/// `--throttled-host`'s CFS period: 10 ms, shorter than the kernel's and Kubernetes' 100 ms so
/// that a 50 ms block spans several periods (with 100 ms, a block would run whole or wait
/// half its length by where it fell in the period: a coin toss per block, not a slower host).
pub(super) const THROTTLE_PERIOD_US: u64 = 10_000;
/// Half of one core per period: the harness is pinned to one core, so the processes get half
/// of what the quiet host gives them.
pub(super) const THROTTLE_QUOTA_US: u64 = 5_000;

/// The name of a throttled run's cgroup before its harness's pid: the sweep of those left by
/// killed runs reads the pid back.
pub(super) const CGROUP_PREFIX: &str = "mystique-fidelity-";

/// A CPU cgroup of this run's own with a CFS bandwidth quota, for the processes put in it (and
/// those they start after); when dropped, this process goes back and the cgroup is removed. cgroup v2 (`cpu.max`)
/// where the unified hierarchy has the cpu controller, else v1 (`cpu.cfs_quota_us`).
pub(super) struct Throttle {
    pub(super) dir: PathBuf,
    /// The cgroup this process was in (its `cgroup.procs`), to return to.
    parent_procs: PathBuf,
}

impl Throttle {
    pub(super) fn start(period_us: u64, quota_us: u64) -> Result<Throttle> {
        let name = format!("{CGROUP_PREFIX}{}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup");
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let (parent, is_v2, files): (PathBuf, bool, Vec<(&str, String)>) =
            if std::fs::read_to_string(v2.join("cgroup.subtree_control"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
            {
                (
                    v2.to_path_buf(),
                    true,
                    vec![("cpu.max", format!("{quota_us} {period_us}"))],
                )
            } else if v1.join("cpu.cfs_quota_us").is_file() {
                (
                    v1.to_path_buf(),
                    false,
                    vec![
                        ("cpu.cfs_period_us", period_us.to_string()),
                        ("cpu.cfs_quota_us", quota_us.to_string()),
                    ],
                )
            } else {
                bail!(
                    "--throttled-host needs a CPU cgroup controller (cgroup v2 with `cpu` in \
                 /sys/fs/cgroup/cgroup.subtree_control, or v1 at /sys/fs/cgroup/cpu): none here"
                );
            };
        // A harness killed mid-run (its drop never ran) leaves its cgroup behind, empty once
        // its processes are gone: remove those of harnesses no longer running (the kernel
        // refuses to remove one that still holds a process, which is then left alone).
        for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let file = e.file_name();
            let Some(pid) = file.to_str().and_then(|n| n.strip_prefix(CGROUP_PREFIX)) else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let dir = parent.join(&name);
        std::fs::create_dir_all(&dir).with_context(|| {
            format!(
                "--throttled-host: creating the cgroup {} (needs root or a delegated cgroup)",
                dir.display()
            )
        })?;
        // Back to the cgroup this process is in now (a systemd slice, say), not the root.
        let here = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|c| {
                c.lines().find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (id, controllers, path) = (f.next()?, f.next()?, f.next()?);
                    let ours = if is_v2 {
                        id == "0" && controllers.is_empty()
                    } else {
                        controllers.split(',').any(|c| c == "cpu")
                    };
                    ours.then(|| parent.join(path.trim_start_matches('/')))
                })
            })
            .filter(|d| d.join("cgroup.procs").is_file())
            .unwrap_or_else(|| parent.clone());
        let t = Throttle {
            dir,
            parent_procs: here.join("cgroup.procs"),
        };
        for (file, value) in files {
            std::fs::write(t.dir.join(file), &value)
                .with_context(|| format!("--throttled-host: writing {value:?} to {file}"))?;
        }
        Ok(t)
    }

    /// Moves process `pid` (all its threads) into the cgroup; the processes it starts after
    /// are born there.
    pub(super) fn enter(&self, pid: u32) -> Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("--throttled-host: moving process {pid} into its cgroup"))
    }

    /// How many periods found the cgroup's quota spent (`nr_throttled` of its `cpu.stat`).
    #[cfg(test)]
    pub(super) fn periods_throttled(&self) -> Option<u64> {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        // This process back to where it was (if it entered), so that the cgroup is empty and
        // can go (a child still in it keeps it, harmlessly, until it exits).
        if std::fs::read_to_string(self.dir.join("cgroup.procs")).is_ok_and(|p| {
            p.lines()
                .any(|l| l.trim() == std::process::id().to_string())
        }) {
            let _ = std::fs::write(&self.parent_procs, std::process::id().to_string());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The cores this process may run on, read before it pins itself to one (Linux's
/// `Cpus_allowed_list`; elsewhere, or unreadable, the first `available_parallelism`).
pub(super) fn allowed_cores() -> Vec<usize> {
    let listed = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Cpus_allowed_list:"))?;
            let mut cores = Vec::new();
            for part in line.split(':').nth(1)?.trim().split(',') {
                let (a, b) = part.split_once('-').unwrap_or((part, part));
                cores.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse::<usize>().ok()?);
            }
            Some(cores)
        })
        .filter(|c| !c.is_empty());
    listed.unwrap_or_else(|| {
        (0..std::thread::available_parallelism().map_or(2, |n| n.get())).collect()
    })
}

impl Burners {
    /// One burner pinned to each of `cores` (the harness may already be pinned to one: the
    /// cores are named, not read from the burner's own affinity).
    pub(super) fn start(cores: &[usize]) -> Result<Burners> {
        let mut b = Burners(Vec::new());
        // Pinned, one to each core this process may run on: left to the scheduler, two could share a core and leave
        // another free, and whichever process landed there would run unslowed (a lottery
        // between the original and the replay, not a busy host).
        for core in cores {
            b.0.push(
                Command::new(crate::python())
                    .args([
                        "-c",
                        // It ends when this process does (it is then another's child): a
                        // harness killed mid-run left two burners spinning, and the test
                        // suite run after it failed a timing of its own under them.
                        &format!(
                            "import os\nif hasattr(os, 'sched_setaffinity'): os.sched_setaffinity(0, {{{core}}})\n\
                             parent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(1000000): pass"
                        ),
                    ])
                    .spawn()
                    .context("starting a CPU burner")?,
            );
        }
        // Let them reach the scheduler's steady state before anything is timed.
        std::thread::sleep(std::time::Duration::from_millis(500));
        Ok(b)
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Pins this process, and so every process it starts after, to one core, and says which.
pub(super) fn pin_to_one_core() {
    // One core for the original and every replay (they take turns, each on one thread): on the
    // VM's two cores the same build's two replays of a model read up to 0.1 apart in one run
    // (tiny and DLRM-like models most), and a round's blocks followed each other's speed
    // with a slope of 0.0-0.4; pinned, 0.5-0.8, and the rounds' spread fell by a third.
    // After the captures (a busy capture's burner must not share the model's core alone); the
    // burners name their cores (read before this).
    match metrics::cpu::pin_to_one_core() {
        Some(core) => println!("pinned: the original and the replays run on core {core}"),
        None => println!("not pinned (affinity cannot be set here): processes land on any core"),
    }
}

/// The replay host's load through the rounds ([`ReplayHost`]): the burners of a busy host or
/// the cgroup of a throttled one, held until dropped. Started after the references, which are
/// timed as their captures found the host.
pub(super) struct Load {
    _throttle: Option<Throttle>,
    _burners: Option<Burners>,
}

impl Load {
    /// Starts `host`'s load (none for a quiet host) and says what it is; the burners go on
    /// `cores`.
    pub(super) fn start(host: ReplayHost, cores: &[usize]) -> Result<Load> {
        // The reverse of a busy capture: the replay host is the busy one. The original is timed
        // beside the replays under the same load, so the ratio compares like with like.
        let burners = if host == ReplayHost::Busy {
            let b = Burners::start(cores)?;
            println!(
                "busy host: {} CPU burners, one pinned to each core, run beside every replay and every timing of\n\
                 the original (the captures were made without them: replayed on a slower host than they were\n\
                 captured on); each process gets a share of a core.",
                b.0.len()
            );
            Some(b)
        } else {
            None
        };
        // The other reverse: a replay host whose CPU time is rationed (a container's CPU limit),
        // not shared with a burner. Taken after the references, like the burners.
        let throttle = if host == ReplayHost::Throttled {
            let t = Throttle::start(THROTTLE_PERIOD_US, THROTTLE_QUOTA_US)?;
            t.enter(std::process::id())?;
            println!(
                "throttled host: this harness, the original and every replay run in the cgroup {} under a CPU\n\
                 quota of {} ms per {} ms period (CFS bandwidth control, as a container's CPU limit): each runs at\n\
                 full speed until the period's quota is spent, then waits for the next period.",
                t.dir.display(),
                THROTTLE_QUOTA_US / 1000,
                THROTTLE_PERIOD_US / 1000
            );
            Some(t)
        } else {
            None
        };
        Ok(Load {
            _throttle: throttle,
            _burners: burners,
        })
    }
}
