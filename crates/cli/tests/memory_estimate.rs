//! The memory estimate a replay is refused or started on, against the resident peak it then
//! reaches, on every shared trace: single-rank replays, and communication-only replays of the
//! multi-rank sets. One test, run alone in its binary: replays of several GB one at a time.

mod common;
use common::{bin, shared};
use serde_json::Value;

/// What libtorch's kernels keep beyond the plan's tensors that no estimate from the plan can
/// see: the code pages of the kernels a trace runs, their thread pools and workspaces, Gloo's
/// connections (20-30 MiB on the small CPU traces).
const KERNELS_OWN: u64 = 32 << 20;

/// The estimate of each replay is within 25% of its resident peak beyond libtorch's own (a
/// replay that holds nothing: a trace without collectives, comm only), give or take what
/// kernels keep for themselves ([`KERNELS_OWN`]). A replay the machine cannot hold is refused
/// by its own memory check (exit 2) and reported as not measured.
#[test]
fn the_memory_estimate_is_within_a_quarter_of_the_resident_peak() {
    let own = common::libtorch_own();
    let singles = [
        "cpu/cnn.et.json.gz",
        "cpu/dlrm.et.json",
        "cpu/mlp.et.json",
        "cpu/transformer.et.json.gz",
        "public/chakra_allgather_1.0.2.et.json",
        "public/hta_simple_add_1.0.1.et.json.gz",
        "public/param_linear_1.0.1.et.json.gz",
        "public/param_pt2_triton_1.1.1.et.json",
        "public/param_resnet_1.1.0.et.json.gz",
        "public/param_resnet_1gpu_1.0.3.et.json.gz",
        "public/param_hf_gpt2_1.1.0.et.json.gz",
    ];
    let fixture = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tp_w8");
    let sets = [
        shared("cpu/dist_mlp_w2.rank*.et.json"),
        shared("public/param_dlrm_8rank_1.0.1"),
        fixture,
    ];
    let mut rows: Vec<(String, u64, u64)> = Vec::new();
    let mut refused = Vec::new();
    let run = |args: &[&str]| {
        bin()
            .args(["replay", "--json", "--iters", "1", "--warmup", "0"])
            .args(args)
            .output()
            .unwrap()
    };
    for rel in singles {
        let path = shared(rel);
        let out = run(&[path.to_str().unwrap()]);
        if out.status.code() == Some(2) {
            refused.push(format!(
                "{rel}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            continue;
        }
        let r: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{rel}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        rows.push(measured(rel.to_string(), &r));
    }
    for set in &sets {
        let out = run(&["--ranks", set.to_str().unwrap(), "--only", "comm"]);
        assert!(
            out.status.success(),
            "{}: {}",
            set.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
            let name = set.file_name().unwrap().to_string_lossy();
            rows.push(measured(format!("{name} rank {k} (comm only)"), r));
        }
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut table = format!(
        "libtorch's own: {:.1} MiB resident\n{:>12} {:>12}  replay\n",
        mib(own),
        "estimate MiB",
        "beyond MiB"
    );
    let mut off = Vec::new();
    for (name, estimate, peak) in &rows {
        let beyond = peak.saturating_sub(own);
        table += &format!("{:>12.1} {:>12.1}  {name}\n", mib(*estimate), mib(beyond));
        if estimate.abs_diff(beyond) > beyond / 4 + KERNELS_OWN {
            off.push(name.clone());
        }
    }
    for r in &refused {
        table += &format!("not measured: {r}\n");
    }
    eprintln!("{table}");
    assert!(
        rows.len() >= singles.len() - refused.len() + 2 + 8,
        "{table}"
    );
    assert!(off.is_empty(), "estimate off for {off:?}\n{table}");
}

/// A replay's name, estimate and resident peak.
fn measured(name: String, r: &Value) -> (String, u64, u64) {
    let field = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("{name}: {r}"));
    let estimate = field(&r["estimated_peak_bytes"]);
    let peak = field(&r["device_memory"]["peak_bytes"]);
    (name, estimate, peak)
}
