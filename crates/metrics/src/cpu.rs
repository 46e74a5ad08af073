//! CPU counters of this process: what the OS accounts (`getrusage`: CPU time, context switches,
//! page faults, peak RSS) and, where the kernel permits it, hardware counters through
//! `perf_event_open` (cycles, instructions, cache references and misses).
//!
//! Hardware counters are often unavailable (VMs without a virtual PMU, `perf_event_paranoid`
//! above 2, containers without the syscall): [`HwCounters::open`] then says why, and reports
//! carry that reason instead of zeros. Counters count every thread of the process, the ones
//! libtorch starts later included (`inherit`).

use crate::Error;
use serde::Serialize;

/// What the OS has accounted to this process so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Usage {
    /// CPU time in user mode (ms), all threads.
    pub user_ms: f64,
    /// CPU time in the kernel (ms), all threads.
    pub sys_ms: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub minor_faults: u64,
    pub major_faults: u64,
    /// Peak resident memory so far (bytes).
    pub peak_rss_bytes: u64,
}

impl Usage {
    /// This process's usage now; `None` where the platform has no `getrusage`.
    pub fn now() -> Option<Usage> {
        #[cfg(unix)]
        {
            // SAFETY: getrusage only writes the struct it is given.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
                return None;
            }
            let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
            Some(Usage {
                user_ms: ms(u.ru_utime),
                sys_ms: ms(u.ru_stime),
                voluntary_switches: u.ru_nvcsw as u64,
                involuntary_switches: u.ru_nivcsw as u64,
                minor_faults: u.ru_minflt as u64,
                major_faults: u.ru_majflt as u64,
                // Linux reports KiB.
                peak_rss_bytes: (u.ru_maxrss as u64).saturating_mul(1024),
            })
        }
        #[cfg(not(unix))]
        None
    }

    /// What was accounted between `earlier` and `self` (the peak is `self`'s).
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            user_ms: (self.user_ms - earlier.user_ms).max(0.0),
            sys_ms: (self.sys_ms - earlier.sys_ms).max(0.0),
            voluntary_switches: self
                .voluntary_switches
                .saturating_sub(earlier.voluntary_switches),
            involuntary_switches: self
                .involuntary_switches
                .saturating_sub(earlier.involuntary_switches),
            minor_faults: self.minor_faults.saturating_sub(earlier.minor_faults),
            major_faults: self.major_faults.saturating_sub(earlier.major_faults),
            peak_rss_bytes: self.peak_rss_bytes,
        }
    }

    /// Adds `other`'s counts to these (the peak is the larger).
    pub fn add(&mut self, other: &Usage) {
        self.user_ms += other.user_ms;
        self.sys_ms += other.sys_ms;
        self.voluntary_switches += other.voluntary_switches;
        self.involuntary_switches += other.involuntary_switches;
        self.minor_faults += other.minor_faults;
        self.major_faults += other.major_faults;
        self.peak_rss_bytes = self.peak_rss_bytes.max(other.peak_rss_bytes);
    }
}

/// Hardware counts over some interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct HwCounts {
    pub cycles: u64,
    pub instructions: u64,
    pub cache_references: u64,
    pub cache_misses: u64,
}

impl HwCounts {
    /// Instructions per cycle (0 when no cycles were counted).
    pub fn ipc(&self) -> f64 {
        if self.cycles == 0 {
            0.0
        } else {
            self.instructions as f64 / self.cycles as f64
        }
    }

    pub fn add(&mut self, o: &HwCounts) {
        self.cycles += o.cycles;
        self.instructions += o.instructions;
        self.cache_references += o.cache_references;
        self.cache_misses += o.cache_misses;
    }
}

/// Open hardware counters of this process (all its threads, present and future).
pub struct HwCounters {
    #[cfg(target_os = "linux")]
    fds: [std::os::fd::OwnedFd; 4],
}

/// The four generic hardware events (`PERF_TYPE_HARDWARE` configs), in [`HwCounts`] order.
#[cfg(target_os = "linux")]
const EVENTS: [(u64, &str); 4] = [
    (0, "cycles"),
    (1, "instructions"),
    (2, "cache-references"),
    (3, "cache-misses"),
];

/// `struct perf_event_attr` up to `PERF_ATTR_SIZE_VER7` (128 bytes): the fields set here and
/// zeros for the rest.
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// disabled (bit 0), inherit (1), exclude_kernel (5), exclude_hv (6), ...
    flags: u64,
    rest: [u64; 10],
}

impl HwCounters {
    /// Opens and starts the counters; `Err` says why they are unavailable here (the first of
    /// the four events the kernel refuses).
    pub fn open() -> Result<HwCounters, Error> {
        #[cfg(target_os = "linux")]
        {
            let [a, b, c, d] = EVENTS.map(|(config, name)| open_event(config, name));
            Ok(HwCounters {
                fds: [a?, b?, c?, d?],
            })
        }
        #[cfg(not(target_os = "linux"))]
        Err(Error::NoPerfEvents)
    }

    /// The counts since the counters were opened (running totals; subtract two reads).
    pub fn read(&self) -> Result<HwCounts, Error> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let mut v = [0u64; 4];
            for (i, fd) in self.fds.iter().enumerate() {
                let mut buf = [0u8; 8];
                // SAFETY: reads 8 bytes into an 8-byte buffer from a descriptor we own.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
                if n != 8 {
                    return Err(Error::CounterRead {
                        counter: EVENTS[i].1,
                        error: std::io::Error::last_os_error(),
                    });
                }
                v[i] = u64::from_ne_bytes(buf);
            }
            Ok(HwCounts {
                cycles: v[0],
                instructions: v[1],
                cache_references: v[2],
                cache_misses: v[3],
            })
        }
        #[cfg(not(target_os = "linux"))]
        Err(Error::NoPerfEvents)
    }
}

/// Opens and starts one hardware event (`PERF_TYPE_HARDWARE` `config`, called `name`) counting
/// the user-space work of every thread of this process.
#[cfg(target_os = "linux")]
fn open_event(config: u64, name: &'static str) -> Result<std::os::fd::OwnedFd, Error> {
    use std::os::fd::FromRawFd;
    let attr = PerfEventAttr {
        type_: 0, // PERF_TYPE_HARDWARE
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config,
        // inherit, exclude_kernel, exclude_hv: user-space work of every thread
        // (perf_event_paranoid 2, the usual default, allows nothing else).
        flags: (1 << 1) | (1 << 5) | (1 << 6),
        ..Default::default()
    };
    // SAFETY: the attr is a valid, fully initialised perf_event_attr of the size it
    // declares; pid 0 / cpu -1 is this process on any CPU.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            0,
            -1,
            -1,
            8u64, // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) => Error::NoPmu { counter: name },
            Some(libc::EACCES) | Some(libc::EPERM) => Error::CounterNotPermitted { counter: name },
            Some(libc::ENOSYS) => Error::NoPerfEventOpen { counter: name },
            _ => Error::CounterOpen {
                counter: name,
                error,
            },
        });
    }
    // SAFETY: a descriptor the kernel just returned, owned from here on.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// How long one thread has waited for a CPU: the kernel's run delay (time runnable but not
/// running: another process had the core), from `/proc/thread-self/schedstat`. On a busy host
/// this is the time a thread loses to the others; unlike wall time minus CPU time, it does not
/// count time the thread chose to sleep (waiting for intra-op workers, a collective, I/O).
///
/// Reads cost about a microsecond (one `pread` of a kept file), so they belong around work, not
/// inside tight loops.
pub struct RunDelay {
    #[cfg(target_os = "linux")]
    file: std::fs::File,
}

impl RunDelay {
    /// The calling thread's counter; `None` where the kernel does not account it (not Linux, or
    /// built without scheduler statistics).
    pub fn of_this_thread() -> Option<RunDelay> {
        #[cfg(target_os = "linux")]
        {
            let file = std::fs::File::open("/proc/thread-self/schedstat").ok()?;
            let r = RunDelay { file };
            r.read_us().map(|_| r)
        }
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// The thread's run delay so far (µs).
    pub fn read_us(&self) -> Option<f64> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::FileExt;
            let mut buf = [0u8; 96];
            let n = self.file.read_at(&mut buf, 0).ok()?;
            // "<ns running> <ns waiting> <time slices>"
            let text = std::str::from_utf8(&buf[..n]).ok()?;
            let ns: u64 = text.split_ascii_whitespace().nth(1)?.parse().ok()?;
            Some(ns as f64 / 1e3)
        }
        #[cfg(not(target_os = "linux"))]
        None
    }
}

/// Pins the calling thread, and the processes and threads it starts from now on, to one core:
/// the last it may run on. Returns that core; `None` where affinity cannot be set (not Linux,
/// or refused).
///
/// Why a harness wants this: single-threaded processes that take turns (an original and its
/// replays timed side by side) otherwise land on whichever core the scheduler picks, and a
/// VM's cores do not run at one speed (a neighbour on one core's hardware sibling); on the
/// development VM the same build's two replays of one model then read 0.1 apart in the same
/// run, and one round's blocks followed each other's speed with a slope of 0.0-0.4 (0.5-0.8
/// pinned).
pub fn pin_to_one_core() -> Option<usize> {
    #[cfg(target_os = "linux")]
    // SAFETY: cpu_set_t is plain data; the calls read and write only the set passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let core = (0..libc::CPU_SETSIZE as usize)
            .rev()
            .find(|&c| libc::CPU_ISSET(c, &set))?;
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut one);
        (libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) == 0)
            .then_some(core)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// CPU figures of a replay, per measured iteration.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CpuReport {
    /// OS accounting per measured iteration (peak RSS: the process's peak).
    pub per_iter: Usage,
    /// Hardware counts per measured iteration, where counters could be opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hw_per_iter: Option<HwCounts>,
    /// Why hardware counters are missing, when they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hw_unavailable: Option<String>,
    /// Time the replaying thread waited for a CPU, per measured iteration (ms): what a busy
    /// host took from it ([`RunDelay`]); absent where the kernel does not account it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_for_cpu_ms: Option<f64>,
}

/// Accumulates [`Usage`] and [`HwCounts`] over intervals (the measured iterations) and reports
/// their mean.
pub struct CpuSampler {
    hw: Result<HwCounters, Error>,
    usage: Usage,
    hw_sum: HwCounts,
    intervals: usize,
    /// The thread that created the sampler (the replaying one), and its run delay summed over
    /// the intervals (µs).
    delay: Option<RunDelay>,
    waited_us: f64,
    open: Option<(Option<Usage>, Option<HwCounts>, Option<f64>)>,
}

impl Default for CpuSampler {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuSampler {
    pub fn new() -> CpuSampler {
        CpuSampler {
            hw: HwCounters::open(),
            usage: Usage::default(),
            hw_sum: HwCounts::default(),
            intervals: 0,
            delay: RunDelay::of_this_thread(),
            waited_us: 0.0,
            open: None,
        }
    }

    /// Starts an interval.
    pub fn begin(&mut self) {
        let hw = self.hw.as_ref().ok().and_then(|h| h.read().ok());
        let waited = self.delay.as_ref().and_then(RunDelay::read_us);
        self.open = Some((Usage::now(), hw, waited));
    }

    /// Ends the interval [`CpuSampler::begin`] started (nothing when none is open).
    pub fn end(&mut self) {
        self.end_spanning(1);
    }

    /// Ends the interval [`CpuSampler::begin`] started, which spanned `iterations` iterations:
    /// the report's means are per iteration. One interval over many iterations keeps the
    /// sampler's system calls out of them (a system call is where the scheduler gets to act on
    /// an expired slice: between the iterations it would take the preemptions they should have).
    pub fn end_spanning(&mut self, iterations: usize) {
        let Some((u0, h0, w0)) = self.open.take() else {
            return;
        };
        if let (Some(w0), Some(w1)) = (w0, self.delay.as_ref().and_then(RunDelay::read_us)) {
            self.waited_us += (w1 - w0).max(0.0);
        }
        if let (Some(u0), Some(u1)) = (u0, Usage::now()) {
            self.usage.add(&u1.since(&u0));
        }
        if let (Some(h0), Ok(Ok(h1))) = (h0, self.hw.as_ref().map(|h| h.read())) {
            self.hw_sum.add(&HwCounts {
                cycles: h1.cycles.saturating_sub(h0.cycles),
                instructions: h1.instructions.saturating_sub(h0.instructions),
                cache_references: h1.cache_references.saturating_sub(h0.cache_references),
                cache_misses: h1.cache_misses.saturating_sub(h0.cache_misses),
            });
        }
        self.intervals += iterations;
    }

    /// The mean per interval.
    pub fn report(&self) -> CpuReport {
        let n = self.intervals.max(1) as u64;
        let nf = n as f64;
        let u = &self.usage;
        CpuReport {
            per_iter: Usage {
                user_ms: u.user_ms / nf,
                sys_ms: u.sys_ms / nf,
                voluntary_switches: u.voluntary_switches / n,
                involuntary_switches: u.involuntary_switches / n,
                minor_faults: u.minor_faults / n,
                major_faults: u.major_faults / n,
                peak_rss_bytes: Usage::now().map_or(u.peak_rss_bytes, |now| now.peak_rss_bytes),
            },
            hw_per_iter: self.hw.as_ref().ok().map(|_| HwCounts {
                cycles: self.hw_sum.cycles / n,
                instructions: self.hw_sum.instructions / n,
                cache_references: self.hw_sum.cache_references / n,
                cache_misses: self.hw_sum.cache_misses / n,
            }),
            hw_unavailable: self.hw.as_ref().err().map(Error::to_string),
            waited_for_cpu_ms: self.delay.as_ref().map(|_| self.waited_us / 1e3 / nf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns about `ms` of CPU time in user mode.
    fn spin(ms: u64) -> u64 {
        let t = std::time::Instant::now();
        let mut x = 1u64;
        while t.elapsed().as_millis() < ms as u128 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        x
    }

    #[test]
    fn usage_counts_cpu_time_spent_between_two_reads() {
        let Some(a) = Usage::now() else { return };
        std::hint::black_box(spin(60));
        let b = Usage::now().unwrap();
        let d = b.since(&a);
        // 60 ms of wall time spinning is at least some CPU time (the VM may steal part).
        assert!(d.user_ms + d.sys_ms > 5.0, "{d:?}");
        assert!(d.peak_rss_bytes > 0);
    }

    #[test]
    fn hardware_counters_count_or_say_why_not() {
        match HwCounters::open() {
            Ok(c) => {
                let a = c.read().unwrap();
                std::hint::black_box(spin(20));
                let b = c.read().unwrap();
                assert!(b.instructions > a.instructions, "{a:?} {b:?}");
                assert!(b.cycles > a.cycles, "{a:?} {b:?}");
            }
            Err(why) => assert!(why.to_string().starts_with("hardware counter"), "{why}"),
        }
    }

    #[test]
    fn a_pinned_thread_and_its_children_run_on_one_core() {
        // On a thread of its own, so that the test harness's thread keeps its affinity.
        std::thread::spawn(|| {
            let Some(core) = pin_to_one_core() else {
                return;
            };
            fn of_this() -> Vec<usize> {
                // SAFETY: plain data, read and written only through the set passed.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
                    (0..libc::CPU_SETSIZE as usize)
                        .filter(|&c| libc::CPU_ISSET(c, &set))
                        .collect()
                }
            }
            assert_eq!(of_this(), vec![core]);
            // A thread started from it inherits the one core.
            let child = std::thread::spawn(of_this).join().unwrap();
            assert_eq!(child, vec![core]);
            assert_eq!(unsafe { libc::sched_getcpu() }, core as i32);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn run_delay_counts_the_time_another_thread_had_the_core() {
        let Some(mine) = RunDelay::of_this_thread() else {
            return;
        };
        // Pin this thread and a rival to one core: while both spin, each waits for the other.
        let cpu = unsafe { libc::sched_getcpu() };
        if cpu < 0 {
            return;
        }
        let pin = |cpu: i32| unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        let before = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            set
        };
        if !pin(cpu) {
            return;
        }
        let rival = std::thread::spawn(move || {
            pin(cpu);
            spin(300)
        });
        let a = mine.read_us().unwrap();
        std::hint::black_box(spin(300));
        let b = mine.read_us().unwrap();
        rival.join().unwrap();
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &before);
        }
        // Sharing one core for 300 ms of wall time, this thread waited for a good part of it.
        assert!(b - a > 30_000.0, "waited {} us", b - a);
        // Alone, it waits (almost) not at all.
        let c = mine.read_us().unwrap();
        std::hint::black_box(spin(100));
        let d = mine.read_us().unwrap();
        assert!(d - c < b - a, "{} us alone, {} us shared", d - c, b - a);
    }

    #[test]
    fn sampler_reports_the_mean_per_interval() {
        let mut s = CpuSampler::new();
        for _ in 0..2 {
            s.begin();
            std::hint::black_box(spin(30));
            s.end();
        }
        let r = s.report();
        assert!(r.per_iter.user_ms + r.per_iter.sys_ms > 2.0, "{r:?}");
        // Either counts or a reason, never both and never neither.
        assert_ne!(r.hw_per_iter.is_some(), r.hw_unavailable.is_some(), "{r:?}");
        // An end without a begin changes nothing.
        let before = s.report();
        s.end();
        assert_eq!(before.per_iter.user_ms, s.report().per_iter.user_ms);
    }
}
