//! Emulated gaps as work. The time the original spent outside operators (Python, autograd)
//! was work on its CPU, so the replay spends it as work too: a fixed loop of dependent integer
//! operations, run a number of times set by the gap's length at the loop's measured speed.
//!
//! Waiting on the clock instead would go wrong twice. A gap would not stretch when the host
//! slows down or the thread is descheduled (a busy host gives each process slices of
//! milliseconds), where the original's work would; and gaps computed while the host ran slow
//! (a VM drifts by 1.5x within minutes) would be spun at that slow length later. The gap model
//! measures its costs and this loop's speed in the same calibration, so a slow calibration
//! inflates the gaps' microseconds and deflates the loop's speed alike, and the units spun are
//! the same.

use std::hint::black_box;
use std::time::Instant;

/// One turn: a shift, an xor and a multiply on a dependency chain (a few cycles, nothing from
/// memory), so its speed follows the CPU's, as the original's Python did. Not affine: the
/// compiler could otherwise fold eight multiply-adds into one.
#[inline(always)]
fn turn(x: u64) -> u64 {
    (x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Runs `units` turns of the work loop.
#[inline(never)]
pub fn spin(units: u64) -> u64 {
    let mut x = black_box(units | 1);
    for _ in 0..units {
        x = turn(x);
    }
    black_box(x)
}

/// The loop's speed now (turns per µs), measured over about `us` µs: the median of chunks, so
/// a preemption in one chunk does not lower it.
pub fn per_us(us: f64) -> f64 {
    const CHUNK: u64 = 4096;
    let mut rates = Vec::new();
    let t0 = Instant::now();
    while rates.len() < 5 || t0.elapsed().as_secs_f64() * 1e6 < us {
        let t = Instant::now();
        spin(CHUNK);
        let dt = t.elapsed().as_secs_f64() * 1e6;
        if dt > 0.0 {
            rates.push(CHUNK as f64 / dt);
        }
        if rates.len() >= 10_000 {
            break;
        }
    }
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}

/// How many turns make `us` µs at `per_us` turns per µs: none for a gap already spent (the
/// bookkeeping since the last op took it), or for a rate that is not a measurement.
pub fn units(us: f64, per_us: f64) -> u64 {
    let n = us * per_us;
    if n.is_finite() && n >= 1.0 && per_us.is_finite() {
        // A gap is capped long before this (et_graph::cap_gaps); it only keeps the cast sane.
        n.min(1e15) as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_convert_to_work_and_nonsense_to_none() {
        assert_eq!(units(10.0, 250.0), 2500);
        // Spent already by the bookkeeping, or no measured speed: nothing to spin.
        assert_eq!(units(-3.0, 250.0), 0);
        assert_eq!(units(0.0, 250.0), 0);
        assert_eq!(units(10.0, 0.0), 0);
        assert_eq!(units(f64::NAN, 250.0), 0);
        assert_eq!(units(10.0, f64::INFINITY), 0);
        assert_eq!(units(f64::INFINITY, 250.0), 0);
        assert_eq!(units(1e30, 1e3), 1e15 as u64);
    }

    #[test]
    fn the_loop_does_as_many_turns_as_asked() {
        // The result depends on every turn: the loop cannot be cut short or optimised away.
        let mut x = 1001u64 | 1;
        for _ in 0..1001 {
            x = (x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        assert_eq!(spin(1001), x);
        assert_ne!(spin(1001), spin(1000));
        assert_eq!(spin(0), 1);
        let r = per_us(200.0);
        assert!(r.is_finite() && r > 0.0, "{r}");
    }
}
