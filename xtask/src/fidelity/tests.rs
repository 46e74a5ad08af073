use std::process::Command;

use super::args::Options;
use super::harness::{balanced_groups, cpu_ns, turn_order};
use super::host::ReplayHost;
use super::host::{Throttle, CGROUP_PREFIX, THROTTLE_PERIOD_US, THROTTLE_QUOTA_US};
use super::references::{
    build_id, drift, halves_disagree, is_stale, Half, HALVES_DISAGREE, OP_SHARE, REFERENCE_ROUNDS,
};
use super::zoo::{prune_zoo, Capture, Model};

/// The drift is the plain replay's ratio now over the reference's, each program's time in
/// running time (less its wait) where the reference has the waits; NaN without a time.
#[test]
fn drift_sets_the_plain_ratio_now_against_the_reference_s_in_running_time() {
    // The reference's T / O in running time: (3 - 1) / (1.5 - 0.5) = 2; now 2.5 (a plain
    // ratio of 0.4): the original slowed against the replay, and the drift is 2 / 2.5.
    let r = serde_json::json!({"original_ms": 3.0, "original_wait_ms": 1.0,
        "replay_ms": 1.5, "replay_wait_ms": 0.5});
    assert!((drift(&r, 0.4) - 0.8).abs() < 1e-12, "{}", drift(&r, 0.4));
    // In wall time where the waits were not recorded.
    let r = serde_json::json!({"original_ms": 2.0, "replay_ms": 1.0});
    assert!((drift(&r, 0.5) - 1.0).abs() < 1e-12);
    assert!(drift(&serde_json::json!({}), 0.5).is_nan());
    let all_wait = serde_json::json!({"original_ms": 1.0, "original_wait_ms": 1.0,
        "replay_ms": 1.0});
    assert!(drift(&all_wait, 0.5).is_nan());
}

/// Groups cover the items in order, at most `most` each, their sizes within one of each other.
#[test]
fn groups_are_balanced() {
    for n in 0..40usize {
        for most in 1..10usize {
            let items: Vec<usize> = (0..n).collect();
            let g = balanced_groups(&items, most);
            assert_eq!(g.len(), n.div_ceil(most), "n {n} most {most}");
            assert_eq!(g.concat(), items, "n {n} most {most}");
            let (lo, hi) = (
                g.iter().map(|x| x.len()).min().unwrap_or(0),
                g.iter().map(|x| x.len()).max().unwrap_or(0),
            );
            assert!(hi <= most && hi - lo <= 1, "n {n} most {most}: {lo}..{hi}");
        }
    }
    let models: Vec<usize> = (0..74).collect();
    let sizes: Vec<usize> = balanced_groups(&models, 4)
        .iter()
        .map(|g| g.len())
        .collect();
    assert_eq!(sizes.iter().filter(|&&k| k == 3).count(), 2, "{sizes:?}");
}

/// A reference's halves disagree where their `T / O` differ by more than the bound, either
/// way round, or where one is not a number; one half alone cannot disagree.
#[test]
fn halves_disagree_on_t_over_o() {
    let half = |o: f64, r: f64| Half {
        original: (o, 0.0),
        replay: (r, 0.0),
        share: 0.9,
        rounds: [Vec::new(), Vec::new()],
    };
    let pair = |a: f64, b: f64| [half(a, 1.0), half(b, 1.0)];
    assert!(!halves_disagree(&pair(1.2, 1.2)));
    assert!(!halves_disagree(&pair(1.0, 1.0 + HALVES_DISAGREE * 0.9)));
    assert!(halves_disagree(&pair(1.0, 1.0 + HALVES_DISAGREE * 1.1)));
    assert!(halves_disagree(&pair(1.0 + HALVES_DISAGREE * 1.1, 1.0)));
    // The same `T / O` from different times is agreement.
    assert!(!halves_disagree(&[half(2.0, 1.0), half(4.0, 2.0)]));
    assert!(halves_disagree(&[half(f64::NAN, 1.0), half(1.0, 1.0)]));
    assert!(!halves_disagree(&[half(1.0, 1.0)]));
    assert!((half(3.0, 2.0).t_over_o() - 1.5).abs() < 1e-12);
}

/// Every round is a permutation of the takers, and over `2 n` rounds each goes first twice
/// and last twice (no process, no model always follows the same one).
#[test]
fn turns_rotate_and_reverse() {
    for n in [1usize, 2, 4, 6, 8] {
        let mut first = vec![0; n];
        let mut last = vec![0; n];
        for round in 0..2 * n {
            let o = turn_order(n, round);
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n {n} round {round}");
            first[o[0]] += 1;
            last[o[n - 1]] += 1;
        }
        assert!(first.iter().all(|&c| c == 2), "n {n}: firsts {first:?}");
        assert!(last.iter().all(|&c| c == 2), "n {n}: lasts {last:?}");
    }
    assert!(turn_order(0, 3).is_empty());
}

/// A process's CPU time, read from its threads' schedstat, grows by about what it spun (it
/// may have been descheduled meanwhile: only at least half is asked), and a process that is
/// not there reads as unknown.
#[cfg(target_os = "linux")]
#[test]
fn a_processs_cpu_time_is_read_from_its_threads() {
    let me = std::process::id();
    let before = cpu_ns(me).expect("this process's schedstat");
    let t = std::time::Instant::now();
    let mut x = 0u64;
    while t.elapsed() < std::time::Duration::from_millis(50) {
        x = std::hint::black_box(x.wrapping_add(1));
    }
    let spun = cpu_ns(me).expect("this process's schedstat") - before;
    assert!(spun >= 25_000_000, "{spun} ns");
    assert_eq!(cpu_ns(u32::MAX), None);
}

/// A process spinning in the throttle's cgroup is held to its quota: the cgroup reports
/// periods that found the quota spent. Where no CPU cgroup can be made (not root, no
/// controller), there is nothing to check, and the test says so.
#[cfg(target_os = "linux")]
#[test]
fn a_throttled_process_is_held_to_its_quota() {
    let t = match Throttle::start(THROTTLE_PERIOD_US, THROTTLE_QUOTA_US) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("skipped: {e:#}");
            return;
        }
    };
    let mut spinner = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("sh");
    let entered = t.enter(spinner.id());
    // Ten periods' worth of spinning: each finds the half-period quota spent.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let throttled = t.periods_throttled();
    let _ = spinner.kill();
    let _ = spinner.wait();
    entered.expect("moving the spinner into the cgroup");
    assert!(throttled.is_some_and(|n| n > 0), "{throttled:?}");
    // The cgroup a killed harness left (a pid above the kernel's largest): the next
    // throttled run removes it.
    let stale = t.dir.with_file_name(format!("{CGROUP_PREFIX}4194305"));
    std::fs::create_dir_all(&stale).expect("a stale cgroup");
    drop(t);
    let again = Throttle::start(THROTTLE_PERIOD_US, THROTTLE_QUOTA_US).expect("a second cgroup");
    assert!(!stale.exists(), "{} left behind", stale.display());
    drop(again);
}

/// A build's id changes with the replay executable as with the front: references timed
/// by an older replay are timed again.
#[test]
fn a_build_is_the_front_and_the_replay_executable() {
    let dir = std::env::temp_dir().join(format!("xtask-build-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (front, replay) = (dir.join("mystique"), dir.join("mystique-replay"));
    std::fs::write(&front, b"front").unwrap();
    assert!(build_id(&front).is_err(), "no replay beside it: no id");
    std::fs::write(&replay, b"replay 1").unwrap();
    let one = build_id(&front).unwrap();
    assert_eq!(one, build_id(&front).unwrap());
    std::fs::write(&replay, b"replay 2").unwrap();
    let two = build_id(&front).unwrap();
    std::fs::write(&front, b"front 2").unwrap();
    let three = build_id(&front).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(one != two && two != three, "{one} {two} {three}");
}

/// Only capture files of models outside the zoo go, matched on the whole name (a model
/// whose name another's begins with keeps its own).
#[test]
fn pruning_removes_only_dropped_models_captures() {
    let dir = std::env::temp_dir().join(format!("xtask-prune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for v in ["quiet", "busy"] {
        std::fs::create_dir_all(dir.join(v)).unwrap();
        for f in [
            "mlp.et.json",
            "mlp.reference.json",
            "mlp_old.et.json",
            "mlp_old.meta.json",
            "notes.txt",
        ] {
            std::fs::write(dir.join(v).join(f), b"{}").unwrap();
        }
    }
    prune_zoo(&dir, &["mlp".to_string()]).unwrap();
    for v in ["quiet", "busy"] {
        let mut left: Vec<String> = std::fs::read_dir(dir.join(v))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["mlp.et.json", "mlp.reference.json", "notes.txt"]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The options' defaults, a few flags, and the flags for the `--against` build refused
/// without it.
#[test]
fn options_parse_with_their_defaults_and_refuse_against_flags_alone() {
    let o = Options::parse(&[]).unwrap();
    assert_eq!((o.rounds, o.block_ms, o.round_parts), (100, 50.0, 1));
    assert!(o.host == ReplayHost::Quiet);
    assert_eq!(
        (o.capture, o.against_capture),
        (Capture::Timing, Capture::Timing)
    );
    assert!(o.only.is_none() && o.against.is_none() && !o.glibc_heap_defaults);
    let o = Options::parse(&[
        "7",
        "--models",
        "a,b",
        "--block-ms",
        "20",
        "--capture",
        "linked",
        "--throttled-host",
    ])
    .unwrap();
    assert_eq!(o.rounds, 7);
    assert_eq!(o.only, Some(vec!["a".to_string(), "b".to_string()]));
    assert_eq!((o.block_ms, o.capture), (20.0, Capture::Linked));
    assert!(o.host == ReplayHost::Throttled);
    let o = Options::parse(&["--capture", "linked-memory"]).unwrap();
    assert_eq!(o.capture, Capture::LinkedMemory);
    // Its pairs sit apart from the zoo's own captures, under the same names.
    let zoo = std::path::Path::new("/zoo");
    assert_eq!(o.capture.dir(zoo, "busy"), zoo.join("linked-memory/busy"));
    assert_eq!(Capture::Linked.dir(zoo, "busy"), zoo.join("busy"));
    assert_eq!(
        o.capture.files(&o.capture.dir(zoo, "quiet"), "m"),
        Capture::Linked.files(&zoo.join("linked-memory/quiet"), "m")
    );
    for bad in [
        &["--against-args", "--iters 3"][..],
        &["--against-capture", "timing"],
        &["--busy-host", "--throttled-host"],
        &["--block-ms", "0"],
        &["--round-parts", "0"],
        &["--capture", "other"],
        &["many"],
    ] {
        assert!(Options::parse(bad).is_err(), "{bad:?}");
    }
}

/// A reference is timed again when missing, of other code of the model or in another form;
/// one another build timed only where the build is asked about (an A/B run keeps its busy
/// references of another build).
#[test]
fn a_reference_of_another_build_is_stale_only_where_the_build_counts() {
    let dir = std::env::temp_dir().join(format!("xtask-stale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let m = Model {
        name: "mlp".into(),
        set: "tune".into(),
        covers: String::new(),
        key: "k1".into(),
        machinery: String::new(),
    };
    assert!(is_stale(&dir, &m, None), "missing");
    let write = |key: &str| {
        let j = serde_json::json!({"replay_build": "old", "model_key": key,
            "rounds": REFERENCE_ROUNDS, "halves": [], "op_share": OP_SHARE});
        std::fs::write(dir.join("mlp.reference.json"), j.to_string()).unwrap();
    };
    write("k1");
    assert!(is_stale(&dir, &m, Some("new")));
    assert!(!is_stale(&dir, &m, Some("old")));
    assert!(!is_stale(&dir, &m, None));
    write("k2");
    assert!(is_stale(&dir, &m, None), "the model's code changed");
    let _ = std::fs::remove_dir_all(&dir);
}
