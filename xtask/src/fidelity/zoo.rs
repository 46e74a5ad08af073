//! The model zoo (`xtask/scripts/zoo.py`): its models and sets, the cache of their captures,
//! and which capture a replay takes.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The zoo's held-out sets (`zoo.py`): each one's table title and its label on the plot. A new
/// set is added here alone. Every set checks the replay on models no choice was made on; a
/// later set checks the choices made with the earlier ones' results in view (the module's doc).
pub(super) struct HeldOut {
    pub(super) set: &'static str,
    pub(super) title: &'static str,
    pub(super) label: &'static str,
}

pub(super) static HELD_OUT: [HeldOut; 18] = [
    HeldOut {
        set: "heldout",
        title: "HELD-OUT",
        label: "held-out",
    },
    HeldOut {
        set: "fresh",
        title: "HELD-OUT fresh",
        label: "held-out fresh",
    },
    HeldOut {
        set: "fresh2",
        title: "HELD-OUT fresh2",
        label: "held-out fresh2",
    },
    HeldOut {
        set: "fresh3",
        title: "HELD-OUT fresh3",
        label: "held-out fresh3",
    },
    HeldOut {
        set: "fresh4",
        title: "HELD-OUT fresh4",
        label: "held-out fresh4",
    },
    HeldOut {
        set: "fresh5",
        title: "HELD-OUT fresh5",
        label: "held-out fresh5",
    },
    HeldOut {
        set: "fresh6",
        title: "HELD-OUT fresh6",
        label: "held-out fresh6",
    },
    HeldOut {
        set: "fresh7",
        title: "HELD-OUT fresh7",
        label: "held-out fresh7",
    },
    HeldOut {
        set: "fresh8",
        title: "HELD-OUT fresh8",
        label: "held-out fresh8",
    },
    HeldOut {
        set: "fresh9",
        title: "HELD-OUT fresh9",
        label: "held-out fresh9",
    },
    HeldOut {
        set: "fresh10",
        title: "HELD-OUT fresh10",
        label: "held-out fresh10",
    },
    HeldOut {
        set: "fresh11",
        title: "HELD-OUT fresh11",
        label: "held-out fresh11",
    },
    HeldOut {
        set: "fresh12",
        title: "HELD-OUT fresh12",
        label: "held-out fresh12",
    },
    HeldOut {
        set: "fresh13",
        title: "HELD-OUT fresh13",
        label: "held-out fresh13",
    },
    HeldOut {
        set: "fresh14",
        title: "HELD-OUT fresh14",
        label: "held-out fresh14",
    },
    HeldOut {
        set: "fresh15",
        title: "HELD-OUT fresh15",
        label: "held-out fresh15",
    },
    HeldOut {
        set: "fresh16",
        title: "HELD-OUT fresh16",
        label: "held-out fresh16",
    },
    HeldOut {
        set: "fresh17",
        title: "HELD-OUT fresh17",
        label: "held-out fresh17",
    },
];

pub(super) struct Model {
    pub(super) name: String,
    pub(super) set: String,
    pub(super) covers: String,
    /// What its captures depend on besides the machinery: its code (`zoo.py`'s `model_key`).
    pub(super) key: String,
    /// What every capture depends on: the code that runs and records a model (`machinery_key`).
    pub(super) machinery: String,
}

pub(super) fn zoo_script(root: &Path) -> PathBuf {
    root.join("xtask/scripts/zoo.py")
}

/// glibc's heap settings for the zoo's Python, the same as the replay's
/// (`replay::device::keep_freed_memory`): blocks up to 32 MiB from the heap, the heap never
/// trimmed. Under glibc's defaults a short-lived Python process may trim its heap and fault it
/// back in every iteration, or not, by its history (conv1d_adamw's original took 18 to 1029
/// faults per iteration in processes of one run, at ~1.5 µs each; unet_infer, big_matmul,
/// conv1d_adamw and resnet_sgd ran 10-20% slower with the defaults than with these, side by side).
/// That is the allocator's state, not the model's work, and no trace records it, so the
/// original and the replay are compared in the same allocator state; the table shows both
/// processes' faults. `--glibc-heap-defaults` times the original under glibc's defaults instead.
const WARM_HEAP: &str =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647";

pub(super) fn python_env(c: &mut Command, torch_py: &Path) {
    c.env("PYTHONPATH", torch_py)
        .env("PYTHONWARNINGS", "ignore")
        .env("GLIBC_TUNABLES", WARM_HEAP)
        .stderr(std::process::Stdio::null());
}

fn models(root: &Path, torch_py: &Path) -> Result<Vec<Model>> {
    let mut c = Command::new(crate::python());
    c.arg(zoo_script(root)).arg("list");
    python_env(&mut c, torch_py);
    let out = c.output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("zoo.py list: {}", String::from_utf8_lossy(&out.stdout)))?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .map(|m| Model {
            name: m["name"].as_str().unwrap_or_default().into(),
            set: m["set"].as_str().unwrap_or_default().into(),
            covers: m["covers"].as_str().unwrap_or_default().into(),
            key: m["key"].as_str().unwrap_or_default().into(),
            machinery: m["machinery"].as_str().unwrap_or_default().into(),
        })
        .collect())
}

/// The zoo's models that `only` names (all of them without it), each captured where its
/// captures are missing or were made by other code, and the cache directory that holds them.
pub(super) fn prepare(
    root: &Path,
    cache: &Path,
    torch_py: &Path,
    only: Option<&[String]>,
) -> Result<(Vec<Model>, PathBuf)> {
    let all = models(root, torch_py)?;
    let names: Vec<String> = all.iter().map(|m| m.name.clone()).collect();
    let models: Vec<Model> = all
        .into_iter()
        .filter(|m| only.is_none_or(|o| o.contains(&m.name)))
        .collect();
    if models.is_empty() {
        bail!("no zoo model selected");
    }
    let dir = zoo_dir(cache, &models)?;
    // Against the whole zoo, never the --models subset.
    prune_zoo(&dir, &names)?;
    ensure_zoo(root, &dir, torch_py, &models)?;
    Ok((models, dir))
}

/// The zoo's cache directory for the capture machinery (its code and settings, `zoo.py`'s
/// `machinery_key`, and the captures' environment): a change there captures every model afresh.
/// A model's own code is checked per model ([`ensure_zoo`]), so adding or changing a model
/// captures that one alone.
fn zoo_dir(cache: &Path, models: &[Model]) -> Result<PathBuf> {
    let Some(machinery) = models.first().map(|m| m.machinery.as_str()) else {
        bail!("zoo.py list: no models");
    };
    anyhow::ensure!(
        !machinery.is_empty()
            && models
                .iter()
                .all(|m| m.machinery == machinery && !m.key.is_empty()),
        "zoo.py list: every model needs a key and the same machinery key"
    );
    let mut src = machinery.as_bytes().to_vec();
    // The captures' environment is part of what they are.
    src.extend_from_slice(WARM_HEAP.as_bytes());
    // FNV-1a: a stable content key, no dependency.
    let h = src.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    });
    Ok(cache.join(format!("zoo/torch-2.11.0-m{h:016x}")))
}

/// The files a capture writes for model `M`: `M.<suffix>`.
const CAPTURE_SUFFIXES: &[&str] = &[
    "et.json",
    "timing.json",
    "linked.et.json",
    "kineto.json",
    "meta.json",
    "reference.json",
];

/// Removes the captures of models no longer in the zoo (`names`: all of it), so that nothing
/// that reads the cache's directories (the zoo tests) replays a model the zoo has dropped.
pub(super) fn prune_zoo(dir: &Path, names: &[String]) -> Result<()> {
    let mut gone = std::collections::BTreeSet::new();
    for variant in ["quiet", "busy", "linked-memory/quiet", "linked-memory/busy"] {
        let Ok(entries) = std::fs::read_dir(dir.join(variant)) else {
            continue;
        };
        for e in entries.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let Some((stem, suffix)) = file.split_once('.') else {
                continue;
            };
            if CAPTURE_SUFFIXES.contains(&suffix) && !names.iter().any(|n| n == stem) {
                std::fs::remove_file(e.path())
                    .with_context(|| format!("removing {}", e.path().display()))?;
                gone.insert(stem.to_string());
            }
        }
    }
    if !gone.is_empty() {
        eprintln!(
            "[fidelity] removed the captures of {} model(s) no longer in the zoo: {}",
            gone.len(),
            gone.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

/// Takes the linked pairs with `profile_memory` ([`Capture::LinkedMemory`]) of `models` that are
/// missing or older than the model's capture on the same host (quiet and busy).
pub(super) fn ensure_linked_memory(
    root: &Path,
    dir: &Path,
    torch_py: &Path,
    models: &[Model],
) -> Result<()> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    for variant in ["quiet", "busy"] {
        let out = Capture::LinkedMemory.dir(dir, variant);
        let stale: Vec<&str> = models
            .iter()
            .filter(|m| {
                let (et, kineto) = Capture::LinkedMemory.files(&out, &m.name);
                let capture = modified(&dir.join(variant).join(format!("{}.meta.json", m.name)));
                let (et, kineto) = (modified(&et), modified(&kineto));
                et.is_none() || kineto.is_none() || et < capture || kineto < capture
            })
            .map(|m| m.name.as_str())
            .collect();
        if stale.is_empty() {
            continue;
        }
        eprintln!(
            "[fidelity] capturing {} linked pair(s) under profile_memory ({variant}) ...",
            stale.len()
        );
        let mut c = Command::new(crate::python());
        c.arg(zoo_script(root))
            .arg("linked-memory")
            .arg(&out)
            .args(&stale);
        if variant == "busy" {
            c.arg("--busy");
        }
        python_env(&mut c, torch_py);
        let o = c.output()?;
        if !o.status.success() {
            bail!(
                "capturing linked pairs under profile_memory ({variant}) failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
    }
    Ok(())
}

/// Captures whatever of the zoo is missing (quiet and busy).
fn ensure_zoo(root: &Path, dir: &Path, torch_py: &Path, models: &[Model]) -> Result<()> {
    for variant in ["quiet", "busy"] {
        for m in models {
            let out = dir.join(variant);
            // Captured, and by the model's code as it is now.
            let meta: Option<serde_json::Value> =
                std::fs::read(out.join(format!("{}.meta.json", m.name)))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
            if meta.is_some_and(|v| v["model_key"].as_str() == Some(m.key.as_str())) {
                continue;
            }
            eprintln!("[fidelity] capturing {} ({variant}) ...", m.name);
            let mut c = Command::new(crate::python());
            c.arg(zoo_script(root))
                .arg("capture")
                .arg(&out)
                .arg(&m.name);
            if variant == "busy" {
                c.arg("--busy");
            }
            python_env(&mut c, torch_py);
            let o = c.output()?;
            if !o.status.success() {
                bail!("capturing {} ({variant}) failed", m.name);
            }
        }
    }
    Ok(())
}

/// Model `name`'s quiet capture's record in the zoo directory `dir` (`quiet/NAME.meta.json`:
/// its timing, the iteration a linked capture names, its peak memory); null where missing or
/// unreadable, as the captures are checked when the zoo is made.
pub(super) fn quiet_meta(dir: &Path, name: &str) -> serde_json::Value {
    read_json(&dir.join("quiet").join(format!("{name}.meta.json")))
}

/// The JSON file at `path`; null where missing or unreadable (the caller's checks of its fields
/// then fail as they would on a file without them).
pub(super) fn read_json(path: &Path) -> serde_json::Value {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Which of a model's captures a replay takes its ops and gaps from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Capture {
    /// The clean ET and the profile taken without the observer (`M.et.json`, `M.timing.json`).
    Timing,
    /// The linked pair (`M.linked.et.json`, `M.kineto.json`), the iteration the capture names.
    Linked,
    /// A linked pair taken with `profile_memory` too, as people who want the memory view take
    /// theirs (`zoo.py linked-memory`, in `linked-memory/quiet` and `linked-memory/busy`).
    LinkedMemory,
}

impl Capture {
    pub(super) fn parse(a: Option<&str>) -> Result<Capture> {
        match a {
            Some("timing") => Ok(Capture::Timing),
            Some("linked") => Ok(Capture::Linked),
            Some("linked-memory") => Ok(Capture::LinkedMemory),
            other => bail!(
                "--capture / --against-capture: timing, linked or linked-memory, not {other:?}"
            ),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Capture::Timing => "the clean ET + the profile taken without the observer",
            Capture::Linked => "the linked pair (ET + Kineto of the same iterations)",
            Capture::LinkedMemory => {
                "the linked pair taken with profile_memory (ET + Kineto with memory events)"
            }
        }
    }

    /// Its argument's value (`--capture NAME`).
    pub(super) fn arg(self) -> &'static str {
        match self {
            Capture::Timing => "timing",
            Capture::Linked => "linked",
            Capture::LinkedMemory => "linked-memory",
        }
    }

    /// The directory of the zoo `zoo` holding this capture of the `kind` host (`quiet`, `busy`).
    pub(super) fn dir(self, zoo: &Path, kind: &str) -> PathBuf {
        match self {
            Capture::Timing | Capture::Linked => zoo.join(kind),
            Capture::LinkedMemory => zoo.join("linked-memory").join(kind),
        }
    }

    /// The ET and the profile a replay of model `name` takes from the capture directory `d`:
    /// the clean ET and the profile taken without the observer (linked by order, gaps typical
    /// of its five iterations), or the linked pair (ET + Kineto of the same iterations).
    pub(super) fn files(self, d: &Path, name: &str) -> (PathBuf, PathBuf) {
        match self {
            Capture::Timing => (
                d.join(format!("{name}.et.json")),
                d.join(format!("{name}.timing.json")),
            ),
            Capture::Linked | Capture::LinkedMemory => (
                d.join(format!("{name}.linked.et.json")),
                d.join(format!("{name}.kineto.json")),
            ),
        }
    }

    /// The arguments that replay the iteration the capture names (its `meta`): a linked
    /// capture holds several profiled iterations, and the replay takes the one named (its gaps
    /// typical of all of them).
    pub(super) fn iteration_args(self, meta: &serde_json::Value) -> Vec<String> {
        match (self, meta["replay_iteration"].as_u64()) {
            (Capture::Linked | Capture::LinkedMemory, Some(n)) => {
                vec!["--iteration".into(), n.to_string()]
            }
            _ => Vec::new(),
        }
    }
}
