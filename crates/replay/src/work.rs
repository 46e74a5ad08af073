//! Emulated host work: what an emulated gap spins.
//!
//! A gap stands for the original's Python and autograd bookkeeping between ops: CPU work, which
//! takes longer when the host runs slower. A VM's speed moves by up to 2x in spells of 100-200 ms
//! (seen on this project's VMs: one replay's iterations at 1.3, 1.8, 3.5 and 2.3 ms in turn, with
//! libtorch ops and a Python loop slowing together in one side-by-side measurement), so a gap
//! spun for a fixed time is right only at the speed it was computed at: in a slow spell the
//! original's Python slows with its ops but a timed gap does not. The gap model computes each gap on this host's speed during the
//! calibration; the calibration also measures how many units of this work the host does per µs
//! ([`probe`]), and the replay spins `gap × rate` units, which slow or speed up with the host as
//! the original's work would. Work also stands still while the thread is descheduled (a busy
//! host), as the original's Python would have: no clock needs watching for it.

/// The work's table: 1 MiB, as much as the core's own cache holds on current server CPUs (this
/// project's VMs: 1.25 MiB of L2 per core). Sized so the work slows as libtorch's ops slow: on
/// these VMs the host's slow spells slowed small-model ops about 1.6x, a random walk over 1 MiB
/// 1.6x, over 128 KiB 1.4x, and an L1-resident multiply chain 1.15x, measured side by side over
/// 2000 rounds. A fixed property of the loop, not fitted to any model.
const TABLE_WORDS: usize = 1 << 17;

/// The table and where the walk is: each call goes on from where the last one stopped, so
/// short gaps touch new places rather than the same warm first few.
struct Walk {
    table: Vec<u64>,
    x: u64,
    acc: u64,
}

thread_local! {
    static WALK: std::cell::RefCell<Walk> = std::cell::RefCell::new(Walk {
        table: (0..TABLE_WORDS as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect(),
        x: 0x9E37_79B9_7F4A_7C15,
        acc: 0,
    });
}

/// Runs `units` units of work: each a multiply-add and a read and a write at a pseudo-random
/// place of a 1 MiB table, in one dependent chain (the next place depends on what was read), so
/// the compiler can neither vectorise nor drop it and the CPU cannot overlap units: the time of
/// a cache access and then some (about 100 ns each on this project's VMs: 10-11 units per µs).
/// Returns a value that depends on every unit.
#[inline(never)]
pub fn spin(units: u64) -> u64 {
    WALK.with(|w| {
        let w = &mut *w.borrow_mut();
        let (t, mut x, mut acc) = (&mut w.table, w.x, w.acc);
        let mask = (TABLE_WORDS - 1) as u64;
        for _ in 0..units {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let j = ((x >> 20) ^ acc) & mask;
            acc = acc.wrapping_add(t[j as usize]);
            t[((j + 1) & mask) as usize] = acc;
        }
        (w.x, w.acc) = (x, acc);
        std::hint::black_box(acc)
    })
}

/// The units one probe runs: about 0.5 ms on this project's VMs, short beside a speed spell,
/// long beside the clock's resolution.
pub const PROBE_UNITS: u64 = 5_000;

/// Units of work per µs over probes, as a ratio of sums (a probe that lost the CPU counts for
/// its running time only: the caller takes the wait out).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rate {
    units: f64,
    us: f64,
}

impl Rate {
    pub fn add(&mut self, units: u64, us: f64) {
        if us.is_finite() && us > 0.0 {
            self.units += units as f64;
            self.us += us;
        }
    }

    /// Units per µs; `None` before any probe.
    pub fn per_us(&self) -> Option<f64> {
        (self.us > 0.0).then(|| self.units / self.us)
    }
}

/// Runs one probe: `(units, µs)` on `clock_us` (a monotonic µs clock).
pub fn probe(clock_us: impl Fn() -> f64) -> (u64, f64) {
    let t0 = clock_us();
    spin(PROBE_UNITS);
    (PROBE_UNITS, clock_us() - t0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_depends_on_every_unit() {
        // Each count gives its own value: no unit is skipped or merged (the table carries the
        // writes of earlier calls, so the values are not compared across calls).
        let v: Vec<u64> = (1..64).map(spin).collect();
        let distinct: std::collections::HashSet<_> = v.iter().collect();
        assert_eq!(distinct.len(), v.len());
        // No work leaves the walk where it was.
        let last = spin(1);
        assert_eq!(spin(0), last);
    }

    #[test]
    fn rate_is_a_ratio_of_sums_and_skips_empty_probes() {
        let mut r = Rate::default();
        assert_eq!(r.per_us(), None);
        r.add(100, 10.0);
        r.add(300, 10.0);
        r.add(50, 0.0);
        r.add(50, f64::NAN);
        assert_eq!(r.per_us(), Some(20.0));
    }
}
