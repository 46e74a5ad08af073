//! The dependency invariants of ARCHITECTURE.md, checked on `cargo metadata`: which crates may
//! (transitively) link what. Only normal dependency edges count: dev- and build-dependencies
//! never end up in a dependent's binary.

use serde_json::Value;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Crates that link libtorch or drive a GPU.
const HEAVY: &[&str] = &["tch", "torch-sys", "cudarc", "nvml-wrapper"];

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The resolved package graph, normal edges only.
struct Deps {
    /// Package id -> package name.
    name: HashMap<String, String>,
    /// Package id -> ids of its normal dependencies (sorted, for stable paths).
    normal: HashMap<String, Vec<String>>,
    workspace: BTreeSet<String>,
}

impl Deps {
    fn load() -> Deps {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(&cargo)
            .args(["metadata", "--format-version", "1"])
            .current_dir(workspace_root())
            .output()
            .unwrap_or_else(|e| panic!("could not run {cargo} metadata: {e}"));
        assert!(
            out.status.success(),
            "{cargo} metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata is JSON");
        let name = meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| (s(&p["id"]), s(&p["name"])))
            .collect();
        let workspace = meta["workspace_members"]
            .as_array()
            .expect("workspace_members")
            .iter()
            .map(s)
            .collect();
        let mut normal = HashMap::new();
        for node in meta["resolve"]["nodes"]
            .as_array()
            .expect("resolve.nodes (cargo metadata without --no-deps)")
        {
            let mut deps: Vec<String> = node["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .filter(|d| is_normal(d))
                .map(|d| s(&d["pkg"]))
                .collect();
            deps.sort();
            deps.dedup();
            normal.insert(s(&node["id"]), deps);
        }
        Deps {
            name,
            normal,
            workspace,
        }
    }

    /// The id of the package called `name`: the workspace member of that name if there is one,
    /// else the only package of that name.
    fn id(&self, name: &str) -> &str {
        let ids: Vec<&String> = self
            .name
            .iter()
            .filter(|(_, n)| *n == name)
            .map(|(id, _)| id)
            .collect();
        if let Some(ws) = ids.iter().find(|id| self.workspace.contains(**id)) {
            return ws;
        }
        match ids.as_slice() {
            [one] => one,
            [] => panic!("no package {name} in cargo metadata"),
            _ => panic!("several packages are called {name}: {ids:?}"),
        }
    }

    /// The names of the direct normal dependencies of `pkg`.
    fn direct(&self, pkg: &str) -> BTreeSet<&str> {
        self.normal[self.id(pkg)]
            .iter()
            .map(|d| self.name[d].as_str())
            .collect()
    }

    /// For every package `from` reaches through normal edges whose name is in `targets`, the
    /// shortest path to it: `from -> a -> b -> target`.
    fn paths_to(&self, from: &str, targets: &[&str]) -> Vec<String> {
        let start = self.id(from).to_string();
        let mut prev: HashMap<String, Option<String>> = HashMap::new();
        prev.insert(start.clone(), None);
        let mut queue = VecDeque::from([start]);
        let mut found = vec![];
        while let Some(at) = queue.pop_front() {
            if targets.contains(&self.name[&at].as_str()) {
                found.push(self.path(&prev, &at));
            }
            for d in self.normal.get(&at).into_iter().flatten() {
                if !prev.contains_key(d) {
                    prev.insert(d.clone(), Some(at.clone()));
                    queue.push_back(d.clone());
                }
            }
        }
        found
    }

    fn path(&self, prev: &HashMap<String, Option<String>>, to: &str) -> String {
        let mut chain = vec![self.name[to].as_str()];
        let mut at = to;
        while let Some(Some(p)) = prev.get(at) {
            chain.push(self.name[p].as_str());
            at = p;
        }
        chain.reverse();
        chain.join(" -> ")
    }
}

fn s(v: &Value) -> String {
    v.as_str().expect("a string").to_string()
}

/// A dependency edge is normal when one of its kinds is `null` (not "dev", not "build").
fn is_normal(dep: &Value) -> bool {
    match dep["dep_kinds"].as_array() {
        Some(kinds) => kinds.iter().any(|k| k["kind"].is_null()),
        None => true, // cargo before 1.41 had no dep_kinds and listed every kind
    }
}

fn deps() -> &'static Deps {
    static DEPS: OnceLock<Deps> = OnceLock::new();
    DEPS.get_or_init(Deps::load)
}

/// Fails with every offending path.
fn assert_reaches_none(d: &Deps, from: &str, forbidden: &[&str], why: &str) {
    let bad = d.paths_to(from, forbidden);
    assert!(
        bad.is_empty(),
        "{from} must not depend on {forbidden:?} ({why}), but:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn schema_and_graph_never_link_libtorch_or_cuda() {
    let d = deps();
    // The walker does find libtorch where it is: else this test could not fail.
    let found = d.paths_to("replay", &["tch", "torch-sys"]);
    assert!(
        found.iter().any(|p| p.ends_with("-> tch"))
            && found.iter().any(|p| p.ends_with("-> torch-sys")),
        "sanity: replay reaches tch and torch-sys, found {found:?}"
    );
    for pkg in ["et-schema", "et-graph"] {
        assert_reaches_none(d, pkg, HEAVY, "ARCHITECTURE.md: never links libtorch");
    }
}

#[test]
fn metrics_knows_nothing_about_traces() {
    let d = deps();
    let traces = ["et-schema", "et-graph", "replay"];
    // Sanity: the walker finds these crates from a crate that does use them.
    let found = d.paths_to("replay", &traces);
    assert!(
        found.iter().any(|p| p.ends_with("-> et-schema")),
        "sanity: replay reaches et-schema, found {found:?}"
    );
    assert_reaches_none(
        d,
        "metrics",
        &traces,
        "ARCHITECTURE.md: metrics knows nothing about traces",
    );
}

/// The sentence "depends only on a, b and c" of et-schema's section of ARCHITECTURE.md.
fn allowed_schema_deps() -> Vec<String> {
    let doc = std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md at the workspace root");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("crates/et-schema"))
        .expect("ARCHITECTURE.md has a section `## crates/et-schema`");
    let flat = section.split_whitespace().collect::<Vec<_>>().join(" ");
    let key = "depends only on ";
    let at = flat
        .find(key)
        .expect("the et-schema section of ARCHITECTURE.md says what et-schema `depends only on`");
    let list = &flat[at + key.len()..];
    let list = &list[..list.find('.').expect("the sentence ends with a full stop")];
    list.split(", ")
        .flat_map(|x| x.split(" and "))
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

#[test]
fn schema_depends_only_on_the_documented_crates() {
    let allowed = allowed_schema_deps();
    assert_eq!(
        allowed,
        [
            "serde",
            "serde_json",
            "flate2",
            "thiserror",
            "rustc-hash",
            "memchr",
            "libc",
            "simd-json"
        ],
        "ARCHITECTURE.md's list changed: update this test with it"
    );
    let d = deps();
    let outside = |pkg: &str| -> Vec<String> {
        d.direct(pkg)
            .into_iter()
            .filter(|n| !allowed.iter().any(|a| a == n))
            .map(|n| format!("{pkg} -> {n}"))
            .collect()
    };
    // Sanity: et-graph's own dependencies (indexmap, regex, ...) would be refused.
    assert!(
        outside("et-graph")
            .iter()
            .any(|p| p.ends_with("-> indexmap")),
        "sanity: {:?}",
        outside("et-graph")
    );
    let bad = outside("et-schema");
    assert!(
        bad.is_empty(),
        "et-schema may depend only on {allowed:?} (ARCHITECTURE.md), but:\n  {}",
        bad.join("\n  ")
    );
}

/// libtorch stays in the replay crate and the executables that run it: no other workspace
/// crate depends on tch or torch-sys directly; the CUDA driver (cudarc) only in replay (stream,
/// arena) and metrics (CUDA events). (That the `mystique` binary itself never loads libtorch is
/// checked on the binary, in the CLI's tests.)
#[test]
fn only_replay_and_its_executables_use_libtorch_directly() {
    let d = deps();
    let allowed = ["replay", "mystique-cli", "mystique-benches"];
    let cuda_allowed = ["replay", "metrics"];
    let mut bad = Vec::new();
    for pkg in [
        "et-schema",
        "et-graph",
        "metrics",
        "replay",
        "mystique-cli",
        "mystique-benches",
        "xtask",
    ] {
        let direct = d.direct(pkg);
        for t in ["tch", "torch-sys"] {
            if direct.contains(t) && !allowed.contains(&pkg) {
                bad.push(format!("{pkg} -> {t}"));
            }
        }
        if direct.contains("cudarc") && !cuda_allowed.contains(&pkg) {
            bad.push(format!("{pkg} -> cudarc"));
        }
        if pkg == "metrics" && (direct.contains("tch") || direct.contains("torch-sys")) {
            bad.push("metrics -> libtorch".into());
        }
    }
    assert!(
        d.direct("replay").contains("tch"),
        "sanity: replay uses tch directly"
    );
    assert!(
        d.direct("replay").contains("cudarc") && d.direct("metrics").contains("nvml-wrapper"),
        "the CUDA backend and NVML are built by default"
    );
    assert!(bad.is_empty(), "libtorch outside replay: {bad:?}");
}

/// The files of module `module` (a path under the workspace without `.rs`): `module.rs`, or
/// every `.rs` file of the folder `module/` where it is a module folder; (path, text) each.
fn module_sources(module: &str) -> Vec<(String, String)> {
    let root = workspace_root();
    let file = root.join(format!("{module}.rs"));
    if file.is_file() {
        let text = std::fs::read_to_string(&file).unwrap();
        return vec![(format!("{module}.rs"), text)];
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(module))
        .unwrap_or_else(|e| panic!("neither {module}.rs nor {module}/: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(&root).unwrap_or(&p).display().to_string();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The replay plan is pure data built without libtorch: its module uses neither tch nor the
/// shim, so it could move to a crate of its own unchanged.
#[test]
fn the_replay_plan_module_touches_no_libtorch() {
    let sources = module_sources("crates/replay/src/plan");
    for (path, src) in &sources {
        for forbidden in [
            "tch::",
            "torch_sys",
            "crate::ffi",
            "crate::executor",
            "crate::device",
        ] {
            assert!(!src.contains(forbidden), "{path} uses {forbidden}");
        }
    }
    assert!(
        sources
            .iter()
            .any(|(_, src)| src.contains("pub fn compile(")),
        "sanity: this is the plan module"
    );
}

/// The example of downstream use builds on et-graph alone: no libtorch, no replay.
#[test]
fn the_downstream_example_needs_et_graph_only() {
    let d = deps();
    assert_reaches_none(
        d,
        "et-graph-opmix",
        &["tch", "torch-sys", "replay", "cudarc", "metrics"],
        "examples/opmix shows et-graph used alone",
    );
    assert!(d.direct("et-graph-opmix").contains("et-graph"));
}
