use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A clock that moves 1 µs a read, and jumps where the thread was descheduled: those jumps
/// of a slice or more move the deadline by as long, shorter ones (an interrupt) do not.
#[test]
fn a_gap_spun_moves_its_deadline_by_the_slices_the_thread_lost() {
    let mut t = 0.0;
    let mut reads = 0;
    let jumps = [(50, 3000.0), (120, 200.0), (400, 800.0)];
    let spin = spin_on(
        || {
            reads += 1;
            t += 1.0
                + jumps
                    .iter()
                    .find(|(at, _)| *at == reads)
                    .map_or(0.0, |(_, by)| *by);
            t
        },
        1000.0,
    );
    // The polls that took 3001 and 801 µs lost slices; the one of 201 µs was interrupted.
    assert_eq!(spin.moved, 3001.0 + 801.0);
    assert_eq!(spin.began, 1.0);
    // Running time spun: the wall time less what the deadline moved by is the gap asked for.
    assert!(spin.ended >= 1000.0 + spin.moved, "{spin:?}");
    assert!(spin.ended < 1000.0 + spin.moved + 2.0, "{spin:?}");
}

/// On a host with more spinning threads than cores: the spin is never shorter than the gap;
/// and where the kernel says the thread waited for a CPU many slices' worth, the spin saw
/// some of it and moved its deadline (a wait is another thread's slice, 0.75 ms or more, over
/// the spin's threshold). How much it sees depends on the scheduler's slices: the scripted
/// test above pins down what it does with what it sees.
#[test]
fn an_emulated_gap_is_spun_in_running_time() {
    let Some(delay) = metrics::cpu::RunDelay::of_this_thread() else {
        return;
    };
    // More spinning threads than cores: this one waits for a CPU now and then.
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rivals: Vec<_> = (0..cores + 1)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let timer = Device::Cpu.timer();
    let target_us = 100_000.0;
    let (w0, t0) = (delay.read_us().unwrap(), timer.host_us());
    let moved = spin_running(&timer, t0 + target_us).moved;
    let (w1, t1) = (delay.read_us().unwrap(), timer.host_us());
    stop.store(true, Ordering::Relaxed);
    for r in rivals {
        r.join().unwrap();
    }
    let (wall, waited) = (t1 - t0, w1 - w0);
    assert!(
        wall >= target_us + moved,
        "spun {wall} us for a {target_us} us gap, moved {moved} us (waited {waited} us)"
    );
    if waited >= 20.0 * et_graph::SLICE_MIN_US {
        assert!(
            moved > 0.0,
            "waited {waited} us for a CPU in {wall} us, and the spin saw none of it"
        );
    }
}

#[test]
fn bookkeeping_longer_than_a_gap_is_owed_back_by_the_gaps_after() {
    let mut o = Owed::default();
    // A 10 µs gap after a free that took 30: the gap was over before the spin began.
    assert_eq!(o.deadline(100.0, 10.0), 110.0);
    o.settle(10.0, 30.0, 30.0);
    assert_eq!(o.0, 20.0);
    // The next 50 µs gap ends 20 µs early, and it spends 30 of running time.
    assert_eq!(o.deadline(200.0, 50.0), 230.0);
    o.settle(50.0, 30.0, 1.0);
    assert_eq!(o.0, 0.0);
    // Owed more than a gap: that gap is not spun at all, the rest stays owed.
    o.settle(5.0, 45.0, 45.0);
    assert_eq!(o.deadline(300.0, 15.0), 300.0);
    o.settle(15.0, 2.0, 2.0);
    assert_eq!(o.0, 27.0);
    // A slice's wait before the spin is not the replay's work: nothing more is owed.
    o.settle(15.0, 2_000.0, et_graph::SLICE_MIN_US);
    assert_eq!(o.0, 27.0);
    // A gap with room for it pays back all that is owed, and nothing goes below zero.
    o.settle(100.0, 10.0, 1.0);
    assert_eq!(o.0, 0.0);
}

#[test]
fn gap_pace_follows_the_ops_by_medians_over_a_window() {
    let mut p = GapPace::new(&[100.0, 10.0]);
    assert_eq!(p.factor, 1.0);
    // An iteration's ratio is its ops' weighted median: the 100 µs op's, not the other's.
    let mut v = vec![(1.5, 100.0), (9.0, 10.0)];
    assert_eq!(et_graph::weighted_median(&mut v), Some(1.5));
    assert_eq!(et_graph::weighted_median(&mut []), None);
    // Iterations slower by 1.5: the gaps stretch as much.
    for _ in 0..10 {
        p.push(1.5, 110.0);
    }
    assert_eq!(p.factor, 1.5);
    // One iteration that lost a time slice does not move the median.
    p.push(8.0, 110.0);
    assert_eq!(p.factor, 1.5);
    // At most MAX_ITERATIONS are kept: a faster host takes over once they are.
    for _ in 0..GapPace::MAX_ITERATIONS {
        p.push(0.8, 110.0);
    }
    assert_eq!(p.factor, 0.8);
    assert_eq!(p.recent.len(), GapPace::MAX_ITERATIONS);
    // Long iterations: the window holds as few as cover WINDOW_US of calibrated time.
    let mut q = GapPace::new(&[]);
    for _ in 0..5 {
        q.push(1.2, GapPace::WINDOW_US);
    }
    assert_eq!(q.recent.len(), 1);
    // A ratio no host's speed explains is bounded.
    q.push(50.0, GapPace::WINDOW_US);
    assert_eq!(q.factor, GapPace::BOUNDS.1);
}
