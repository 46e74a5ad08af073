use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::stamp::{iso_utc, line, machine_from};
use super::{load, parse_args, render, splice, typical_ns, BEGIN, END};

fn fixture(name: &str) -> Value {
    let text = match name {
        "fidelity" => include_str!("fixtures/fidelity.json"),
        "parse" => include_str!("fixtures/parse.json"),
        "dispatch" => include_str!("fixtures/dispatch.json"),
        other => panic!("no fixture {other}"),
    };
    serde_json::from_str(text).unwrap()
}

fn saved(names: &[&str]) -> BTreeMap<String, Value> {
    names.iter().map(|n| (n.to_string(), fixture(n))).collect()
}

/// A folder of its own under the system's temporary one, empty.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xtask-results-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The stamp names the command, the date to the minute in UTC, the build and the machine.
#[test]
fn a_stamp_reads_as_command_date_build_and_machine() {
    assert_eq!(
        line(&fixture("fidelity")["stamp"]),
        "`cargo xtask fidelity 12`, 2026-12-05 14:03 UTC, build 76ccb85; AMD EPYC 7B13, 2 cores, \
         virtual machine, x86_64, 7.8 GiB, Linux 6.18.0, cgroup v1."
    );
    // What was not recorded is left out, not invented.
    assert_eq!(
        line(&fixture("dispatch")["stamp"]),
        "`cargo xtask results --run dispatch`, 2026-12-01 10:00 UTC, build abc1234; CPU unknown, \
         2 cores, x86_64, cgroup v2."
    );
}

/// The held-out table counts each ratio within the report's bounds (inclusive), with the
/// median and range; the tuning set, the value checks, the models outside and the error over
/// the drift follow.
#[test]
fn the_fidelity_section_counts_the_held_out_models_ratios() {
    let out = render::generated(&saved(&["fidelity"]));
    let expected_table = "\
| 3 held-out models | within [0.90, 1.10] | within [0.80, 1.25] | median (range) |
|---|---|---|---|
| anchored on the quiet capture's reference | 2 | 3 | 1.000 (0.900-1.150) |
| anchored on the busy capture's reference | 2 | 2 | 1.050 (0.950-1.300) |
| gaps from the profile alone, quiet capture | 2 | 3 | 0.950 (0.850-1.100) |
| gaps from the profile alone, busy capture | 1 | 2 | 1.200 (0.900-1.260) |
| plain replay (no gaps) | 2 | 2 | 0.900 (0.700-1.100) |
";
    assert!(out.contains(expected_table), "{out}");
    for line in [
        "## Replay vs original on the fidelity zoo\n\n`cargo xtask fidelity 12`, 2026-12-05 14:03 UTC",
        "4 models (3 held-out, 1 tuning)",
        "replayed on a quiet host",
        "median over 12 rounds",
        "- Tuning set (1 model), anchored within [0.90, 1.10]: 1/1 on the quiet capture's reference, 0/1 on the busy capture's.",
        "- Under `--check-values`: failed ops in b (2); NaN/Inf inputs in c (aten::log (3)).",
        "- Outside [0.90, 1.10] anchored (quiet / busy capture): b 1.150 / 0.950, c 0.900 / 1.300.",
        "(the gap model's own error), within [0.90, 1.10]: 2/3 quiet, 2/3 busy.",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
}

/// A parse row gives time and throughput end to end, the speed-up over `json.load` and the
/// peak RSS against the file; a trace without the CLI's figures says so.
#[test]
fn the_parse_section_has_a_row_per_trace() {
    let out = render::generated(&saved(&["parse"]));
    for line in [
        "## Parse speed\n\n`cargo xtask bench parse 3`, 2026-12-01 09:30 UTC, build abc1234-dirty;",
        "medians of 3 rounds",
        "| scaled-210mb-transformer.et.json | 213 MB | 0.362 s = 588 MB/s | 26.2x faster | 0.89x the file | 0.296 s = 720 MB/s, peak RSS 0.90x the file |",
        "| scaled-210mb-dlrm.et.json | 213 MB | not measured (no `target/release/mystique`) | - | - | 0.299 s = 712 MB/s, peak RSS 0.88x the file |",
        "- Python's `json.load`: scaled-210mb-transformer.et.json 9.49 s, peak RSS 7.7x the file; scaled-210mb-dlrm.et.json 11.44 s, peak RSS 7.5x the file.",
        "scaled-210mb-transformer.et.json: record reader 0.466 s, serde_json visitors 0.866 s.",
        "scaled-210mb-dlrm.et.json: not measured.",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
}

/// The dispatch cost is the difference per op between the replay's and tch's times.
#[test]
fn the_dispatch_section_gives_the_cost_per_op() {
    let out = render::generated(&saved(&["dispatch"]));
    assert!(
        out.contains(
            "1000 tiny `aten::add` calls replayed through the plan and the boxed dispatcher took 902.7 µs, \
             the same calls made directly through tch 669.3 µs: the replay adds **0.23 µs per op**"
        ),
        "{out}"
    );
}

/// Each measurement without a saved output is listed with the command that makes it; those
/// with one are not.
#[test]
fn measurements_without_output_are_listed_with_their_command() {
    let none = render::generated(&BTreeMap::new());
    for cmd in [
        "`cargo xtask fidelity`",
        "`cargo xtask fidelity --throttled-host`",
        "`cargo xtask fidelity --busy-host`",
        "`cargo xtask bench parse`",
        "`cargo xtask results --run dispatch`",
    ] {
        assert!(none.contains(cmd), "missing {cmd} in\n{none}");
    }
    let some = render::generated(&saved(&["fidelity", "parse", "dispatch"]));
    assert!(some.contains("- Replay vs original under a CPU quota"));
    assert!(!some.contains("- Parse speed"), "{some}");
    assert!(!some.contains("(`dispatch`)"), "{some}");
    // The sections come in the document's order.
    let at = |s: &str| some.find(s).unwrap();
    assert!(at("## Replay vs original on") < at("## Parse speed"));
    assert!(at("## Parse speed") < at("## Dispatch cost"));
    assert!(at("## Dispatch cost") < at("## Not measured"));
    // Each heading stands after a blank line.
    for (i, _) in some.match_indices("\n## ") {
        assert!(
            some[..i].ends_with('\n'),
            "no blank line before {}",
            &some[i..i + 20]
        );
    }
}

/// The text above the begin marker and below the end marker is kept; the generated part is
/// replaced; an earlier block goes once its measurement has a saved output; splicing again
/// changes nothing.
#[test]
fn splicing_keeps_the_hand_written_text_and_drops_replaced_earlier_blocks() {
    let doc = format!(
        "# Results\n\nWhat the numbers mean.\n\n{BEGIN}\n\nold generated text\n\n{END}\n\n\
         ## Earlier measurements\n\nOn a VM.\n\n<!-- earlier: parse -->\n### Parse speed\n\nold parse\n\n\
         <!-- earlier: comms -->\n### Collectives\n\nold comms\n"
    );
    let s = saved(&["parse"]);
    let new = splice(&doc, &render::generated(&s), &s).unwrap();
    assert!(new.starts_with(&format!(
        "# Results\n\nWhat the numbers mean.\n\n{BEGIN}\n\n## Parse speed\n"
    )));
    assert!(!new.contains("old generated text"));
    assert!(!new.contains("old parse"));
    assert!(new.contains("## Earlier measurements\n\nOn a VM.\n\n<!-- earlier: comms -->\n### Collectives\n\nold comms\n"));
    assert!(new.contains(&format!("\n\n{END}\n")));
    assert_eq!(splice(&new, &render::generated(&s), &s).unwrap(), new);
    // Without the markers nothing is written.
    assert!(splice("# Results\n", "x", &s).is_err());
    assert!(splice(&format!("{BEGIN}\n"), "x", &s).is_err());
}

/// The latest saved output of a measurement wins, but a run of part of the zoo never stands
/// for the zoo's figures, even when later; files of other kinds are skipped; a missing folder
/// holds none.
#[test]
fn loading_takes_the_latest_output_of_each_measurement() {
    let d = scratch("load");
    let mut subset = fixture("fidelity");
    subset["stamp"]["date"] = json!("2026-12-06T08:00:00Z");
    subset["run"]["subset"] = json!(true);
    std::fs::write(d.join("fidelity.json"), fixture("fidelity").to_string()).unwrap();
    std::fs::write(d.join("fidelity-subset.json"), subset.to_string()).unwrap();
    std::fs::write(d.join("parse.json"), fixture("parse").to_string()).unwrap();
    std::fs::write(d.join("other.json"), "{}").unwrap();
    std::fs::write(d.join("notes.txt"), "not JSON").unwrap();
    let got = load(&d).unwrap();
    assert_eq!(got.keys().collect::<Vec<_>>(), ["fidelity", "parse"]);
    assert_eq!(got["fidelity"]["run"]["subset"], json!(false));
    let mut later = fixture("fidelity");
    later["stamp"]["date"] = json!("2026-12-07T08:00:00Z");
    std::fs::write(d.join("fidelity-throttled.json"), later.to_string()).unwrap();
    let got = load(&d).unwrap();
    assert_eq!(
        got["fidelity"]["stamp"]["date"],
        json!("2026-12-07T08:00:00Z")
    );
    assert!(load(&d.join("absent")).unwrap().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Criterion's typical estimate: the slope where it has one, else the mean.
#[test]
fn criterion_estimates_give_the_slope_or_the_mean() {
    let d = scratch("criterion");
    let est = |slope: Value| {
        json!({"mean": {"point_estimate": 910.0}, "median": {"point_estimate": 900.0},
            "slope": slope})
    };
    std::fs::write(
        d.join("a.json"),
        est(json!({"point_estimate": 902.7})).to_string(),
    )
    .unwrap();
    std::fs::write(d.join("b.json"), est(Value::Null).to_string()).unwrap();
    assert_eq!(typical_ns(&d.join("a.json")).unwrap(), 902.7);
    assert_eq!(typical_ns(&d.join("b.json")).unwrap(), 910.0);
    assert!(typical_ns(&d.join("absent.json")).is_err());
    std::fs::remove_dir_all(&d).unwrap();
}

/// The machine from /proc: the CPU model, the processors, a hypervisor, memory, kernel.
#[test]
fn the_machine_comes_from_proc() {
    let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 hypervisor\n\n\
                   processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 hypervisor\n";
    let m = machine_from(cpuinfo, "MemTotal:        8152352 kB\n", "6.18.0", false);
    assert_eq!(m["cpu"], json!("AMD EPYC 7B13"));
    assert_eq!(m["cores"], json!(2));
    assert_eq!(m["virtual"], json!(true));
    assert_eq!(m["memory_gib"], json!(7.8));
    assert_eq!(m["kernel"], json!("6.18.0"));
    assert_eq!(m["cgroup"], json!("v1"));
    let bare = machine_from("", "", "", true);
    assert!(bare.get("cpu").is_none() && bare.get("kernel").is_none());
    assert_eq!(bare["virtual"], json!(false));
    assert_eq!(bare["cgroup"], json!("v2"));
}

/// Unix seconds as a UTC date and time.
#[test]
fn dates_are_utc() {
    assert_eq!(iso_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(iso_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(iso_utc(951_782_400), "2000-02-29T00:00:00Z");
}

/// `--run` takes known names only; `--rounds` goes with it.
#[test]
fn arguments_name_known_measurements() {
    let (runs, rounds) = parse_args(&["--run", "parse,dispatch", "--rounds", "2"]).unwrap();
    assert_eq!(runs, ["parse", "dispatch"]);
    assert_eq!(rounds.as_deref(), Some("2"));
    assert_eq!(parse_args(&[]).unwrap(), (vec![], None));
    assert!(parse_args(&["--run", "comms"]).is_err());
    assert!(parse_args(&["--rounds", "2"]).is_err());
    assert!(parse_args(&["--run", "parse", "--rounds", "x"]).is_err());
    assert!(parse_args(&["extra"]).is_err());
}
