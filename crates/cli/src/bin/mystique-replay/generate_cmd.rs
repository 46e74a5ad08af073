//! `mystique generate`: a benchmark package (formats and checks in `mystique_cli::package`).
//! Generating compiles replay plans, so it runs here, beside libtorch.

use anyhow::{bail, Context, Result};
use et_graph::Graph;
use mystique_cli::anonymize::Anonymized;
use mystique_cli::args::GenerateArgs;
use mystique_cli::package::{
    self, Manifest, Original, RankEntry, SelectionRecord, MANIFEST, PACKAGE_FORMAT,
    PACKAGE_FORMAT_THREADS,
};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Namespaces of operators libtorch itself registers.
const LIBTORCH_NAMESPACES: &[&str] = &[
    "aten",
    "prims",
    "c10d",
    "_c10d_functional",
    "profiler",
    "cuda",
    "quantized",
    "sparse",
    "mkldnn",
    "inductor",
    "record_param_comms",
];

/// The packaged profile of `generate --emulate-gaps`.
const PROFILE: &str = "rank0.timing.json.gz";

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes)?;
    Ok(e.finish()?)
}

fn random_key() -> Vec<u8> {
    let mut k = vec![0u8; 32];
    mystique_cli::signals::random_bytes(&mut k);
    k
}

/// Writes a benchmark package of the given traces: checks every input and option first, then
/// builds the package in a temporary directory beside the output and renames it into place.
pub fn generate(a: &GenerateArgs, json: bool) -> Result<()> {
    let expanded = from_capture(a)?;
    let a = &expanded;
    let out = &a.output;
    check_output(a)?;
    let reference = a
        .reference
        .as_deref()
        .map(replay::calibrate::read_reference)
        .transpose()?;
    let sel = a.filters.selection()?;
    // What-if edits, checked before any work.
    let edits = WhatIf::of(a)?;
    let loaded = load_in_rank_order(&a.traces)?;
    let name = out
        .file_name()
        .with_context(|| format!("{} has no directory name", out.display()))?
        .to_string_lossy()
        .into_owned();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp_dir = mystique_cli::output::create_exclusive_dir(&parent, &name)?;
    let tmp = tmp_dir.path().to_path_buf();
    let built = (|| -> Result<(Manifest, Anonymized)> {
        let mut b = PackageBuilder::new(a, &tmp, &edits, reference);
        let mut profiles = profiles_by_rank(a, &loaded)?;
        for (rank, (path, sha, t)) in loaded.iter().enumerate() {
            b.add_rank(rank, path, sha, t, &sel, profiles[rank].take())?;
        }
        b.finish()
    })();
    // On an error the temporary directory goes with `tmp_dir`.
    let (manifest, anon) = built?;
    if out.exists() {
        std::fs::remove_dir(out)?;
    }
    std::fs::rename(&tmp, out).with_context(|| format!("creating {}", out.display()))?;
    tmp_dir.keep();
    if let Some(m) = &a.map {
        let text = serde_json::to_vec_pretty(&anon.map)?;
        mystique_cli::output::write_atomic(m, |w| Ok(w.write_all(&text)?))?;
    }
    print_summary(out, &manifest, json)?;
    Ok(())
}

/// Warns where a package of one trace holds collectives that need peers: `run` replays one
/// rank, and its collectives on groups of more than one rank fail there. (A group of one rank
/// runs as the identity; `wait` records move no data.)
fn warn_of_peers(path: &Path, plan: &replay::plan::Plan) {
    let mut kinds = BTreeSet::new();
    let mut n = 0;
    for step in &plan.steps {
        let replay::plan::StepKind::Collective(c) = &step.kind else {
            continue;
        };
        let size = plan.groups.get(c.group as usize).map(|g| g.size);
        if c.kind() == "wait" || size == Some(1) {
            continue;
        }
        n += 1;
        kinds.insert(c.kind());
    }
    if n > 0 {
        eprintln!(
            "warning: {} is one rank of a job: its {n} collective{} ({}) need the other ranks, \
             which a package of it alone does not hold, and fail at `run`. Package every \
             rank's trace together (generate RANK0 RANK1 ...), or this rank's compute alone \
             (--only compute)",
            path.display(),
            if n == 1 { "" } else { "s" },
            kinds.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
}

/// What a capture's files stand for, by their names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CaptureFile {
    Trace,
    Kineto,
    /// `NAME.timing.json`: a profile taken without the observer, as capturing.md's script
    /// writes it; the capture's profile where it has no `NAME.kineto.json`.
    Timing,
    Reference,
    Meta,
    /// `NAME.memory.json`: the profile_memory profile `replay --memory-profile` follows; a
    /// package does not carry it.
    Memory,
}

impl CaptureFile {
    fn of(p: &Path) -> Option<CaptureFile> {
        let name = p.file_name()?.to_str()?;
        let name = name.strip_suffix(".gz").unwrap_or(name);
        let stem = name.strip_suffix(".json")?;
        Some(match stem.rsplit('.').next()? {
            "et" => CaptureFile::Trace,
            "kineto" => CaptureFile::Kineto,
            "timing" => CaptureFile::Timing,
            "reference" => CaptureFile::Reference,
            "meta" => CaptureFile::Meta,
            "memory" => CaptureFile::Memory,
            _ => return None,
        })
    }
}

/// The model a capture file is of: its name before the kind (`model.rank1.et.json` ->
/// `model`), its rank number left out.
fn capture_name(p: &Path) -> Option<String> {
    let name = p.file_name()?.to_str()?;
    let name = name.strip_suffix(".gz").unwrap_or(name);
    let stem = name.strip_suffix(".json")?;
    let (model, _kind) = stem.rsplit_once('.')?;
    let model = model.strip_suffix(".linked").unwrap_or(model);
    let rank = |r: &str| !r.is_empty() && r.chars().all(|c| c.is_ascii_digit());
    // `NAME.rankR.*`, or a job's ranks named `rankR.*` alone (PARAM's and HTA's sets).
    let base = match model.rsplit_once(".rank") {
        Some((b, r)) if rank(r) => b,
        _ if model.strip_prefix("rank").is_some_and(rank) => "",
        _ => model,
    };
    Some(base.to_string())
}

/// The arguments with a capture's files put in their places: a directory stands for the
/// files in it; `NAME.kineto.json` is `--kineto` (and `--emulate-gaps`, unless anonymised or
/// several ranks), `NAME.reference.json` `--reference`, `NAME.meta.json`'s uninstrumented
/// iteration `--original-ms` (one rank), the traces the rest. Options given on the command
/// line win. Plain traces pass as they are.
fn from_capture(a: &GenerateArgs) -> Result<GenerateArgs> {
    let inputs: Vec<PathBuf> = a
        .traces
        .iter()
        .chain(&a.kineto)
        .chain(&a.reference)
        .cloned()
        .collect();
    mystique_cli::stdin_once(&inputs)?;
    let mut files = Vec::new();
    for p in &a.traces {
        if p.is_dir() {
            let mut in_dir: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.is_file()
                        && !f
                            .file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with('.'))
                })
                .collect();
            in_dir.sort();
            let kept: Vec<PathBuf> = in_dir
                .into_iter()
                .filter(|f| CaptureFile::of(f).is_some())
                .collect();
            anyhow::ensure!(
                !kept.is_empty(),
                "{} holds no capture (NAME.et.json, NAME.kineto.json, ...)",
                p.display()
            );
            // One capture: one NAME (its ranks `NAME.rankR`), not several models side by side.
            let names: std::collections::BTreeSet<String> =
                kept.iter().filter_map(|f| capture_name(f)).collect();
            anyhow::ensure!(
                names.len() <= 1,
                "{} holds captures of several models ({}): give one's files (DIR/NAME.*)",
                p.display(),
                names
                    .into_iter()
                    .map(|n| if n.is_empty() { "rankR.*".into() } else { n })
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            files.extend(kept);
        } else {
            files.push(p.clone());
        }
    }
    let mut out = a.clone();
    out.traces.clear();
    let (mut kineto, mut timing) = (Vec::new(), Vec::new());
    let (mut reference, mut metas) = (None, Vec::new());
    for f in files {
        match CaptureFile::of(&f) {
            Some(CaptureFile::Kineto) => kineto.push(f),
            Some(CaptureFile::Timing) => timing.push(f),
            Some(CaptureFile::Reference) => {
                if let Some(r) = reference.replace(f.clone()) {
                    bail!("two references: {} and {}", r.display(), f.display());
                }
            }
            Some(CaptureFile::Meta) => metas.push(f),
            Some(CaptureFile::Memory) => {}
            // A trace, by its name or (any other file given) as the user says.
            _ => out.traces.push(f),
        }
    }
    anyhow::ensure!(
        !out.traces.is_empty(),
        "no execution trace among the inputs"
    );
    // A capture's clean ET and its linked one (`NAME.et.json`, `NAME.linked.et.json`) are one
    // run's: the package takes the one its profile pairs with, the linked ET with the linked
    // profile (`NAME.kineto.json`), else the clean one.
    let linked_profile = !kineto.is_empty()
        || a.kineto
            .iter()
            .any(|k| !matches!(CaptureFile::of(k), Some(CaptureFile::Timing)));
    // A twin is in the same directory, under the same name.
    let stem_of = |p: &Path| -> Option<(PathBuf, bool)> {
        let (stem, linked) = crate::replay_cmd::capture_stem(p)?;
        Some((p.with_file_name(stem), linked))
    };
    let stems: Vec<Option<(PathBuf, bool)>> = out.traces.iter().map(|p| stem_of(p)).collect();
    let mut keep = vec![true; out.traces.len()];
    for (i, s) in stems.iter().enumerate() {
        let Some((stem, linked)) = s else { continue };
        let twin = stems
            .iter()
            .position(|t| t.as_ref().is_some_and(|(t, l)| t == stem && l != linked));
        if let (Some(j), true) = (twin, *linked != linked_profile) {
            keep[i] = false;
            eprintln!(
                "note: {} left out: the package takes {}, the same capture's {}",
                out.traces[i].display(),
                out.traces[j].display(),
                if linked_profile {
                    "linked trace, which its linked profile pairs with"
                } else {
                    "clean trace (no linked profile is given)"
                }
            );
        }
    }
    let mut k = keep.iter();
    out.traces.retain(|_| *k.next().unwrap_or(&true));
    let single = out.traces.len() == 1;
    if kineto.is_empty() && a.kineto.is_empty() {
        kineto = timing;
    }
    anyhow::ensure!(
        a.kineto.is_empty() || kineto.is_empty(),
        "a Kineto trace among the inputs and --kineto: give it once"
    );
    anyhow::ensure!(
        a.reference.is_none() || reference.is_none(),
        "a reference among the inputs and --reference: give it once"
    );
    if a.kineto.is_empty() && !kineto.is_empty() {
        out.emulate_gaps = a.emulate_gaps || (single && !a.anonymize);
        if single && a.anonymize && !a.emulate_gaps {
            eprintln!(
                "note: {} is left out of the package's gaps: an anonymised package carries no \
                 profile (its event names are the model's own), so `run` replays the ops back \
                 to back; the profile still gives the original's time",
                kineto
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        out.kineto = kineto;
    }
    if a.reference.is_none() && out.emulate_gaps {
        out.reference = reference;
    }
    // The traces' meta files beside them, where none was given: as `replay` and `compare`
    // take them. For several ranks only where every rank has one: the job's step is its
    // slowest rank's, which a mix of uninstrumented and profiled originals would not give.
    if metas.is_empty() {
        let beside: Vec<Option<PathBuf>> = out
            .traces
            .iter()
            .map(|t| crate::replay_cmd::meta_of(t).map(|(_, m)| m))
            .collect();
        let found = beside.iter().flatten().count();
        if found == beside.len() {
            metas = beside.into_iter().flatten().collect();
            let took = if !single {
                "uninstrumented iterations"
            } else if a.original_ms.is_none() && out.reference.is_none() {
                "uninstrumented iteration and threads"
            } else {
                "threads"
            };
            eprintln!(
                "note: the original's {took} from {}, the capture's meta file{} beside the \
                 trace{}",
                metas
                    .iter()
                    .map(|m| m.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if single { "" } else { "s" },
                if single { "" } else { "s" }
            );
        } else if found > 0 {
            eprintln!(
                "note: {found} of the {} traces have their capture's meta file beside them, \
                 not all: each rank's original is its profile's",
                beside.len()
            );
        }
    }
    if !single {
        out.rank_metas = metas.clone();
    }
    // A single rank's meta, read once: the original's iteration where nothing else gives it
    // (a meta that cannot be read is an error there), and the threads it ran with, `run`'s
    // default for the package.
    if let ([m], true) = (metas.as_slice(), single) {
        let needed = a.original_ms.is_none() && out.reference.is_none();
        let v = crate::replay_cmd::read_meta(m);
        let v = match v {
            Ok(v) => v,
            Err(e) if needed => return Err(e),
            Err(_) => return Ok(out),
        };
        if needed {
            out.original_ms = v["iter_ms_median"]
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0);
            out.original_from = out.original_ms.and_then(|_| meta_source(m, a.anonymize));
        }
        out.original_threads = v["threads"].as_i64().filter(|&n| n > 0);
    }
    Ok(out)
}

/// How an original's `from` ends where a capture's meta file gave its time.
const FROM_META: &str = "(iter_ms_median)";

/// Where an original's time came from when a capture's meta file `m` gave it: the file's
/// name, which is the model's, or under `anonymize` no name.
fn meta_source(m: &Path, anonymize: bool) -> Option<String> {
    if anonymize {
        return Some(format!("the capture's meta file {FROM_META}"));
    }
    let name = m.file_name()?;
    Some(format!("{} {FROM_META}", name.to_string_lossy()))
}

/// The output is a new or empty directory, the anonymisation map no input, and `--kineto`
/// given for a single rank only.
fn check_output(a: &GenerateArgs) -> Result<()> {
    let out = &a.output;
    let inputs: Vec<&Path> = a.traces.iter().map(PathBuf::as_path).collect();
    mystique_cli::output::check_new_dir(out)?;
    if let Some(m) = &a.map {
        // The map undoes the anonymisation: it must never travel with the package.
        if mystique_cli::output::inside(m, out) {
            bail!(
                "--map {} is inside the package {}: the mapping would ship with it; write it \
                 elsewhere",
                m.display(),
                out.display()
            );
        }
        mystique_cli::output::check(m, &inputs)?;
    }
    anyhow::ensure!(
        a.kineto.len() <= 1 || a.kineto.len() == a.traces.len(),
        "--kineto: {} profiles for {} traces (one per rank, or none)",
        a.kineto.len(),
        a.traces.len()
    );
    anyhow::ensure!(
        !a.emulate_gaps || a.traces.len() == 1,
        "--emulate-gaps packages the gaps of a single-rank trace"
    );
    anyhow::ensure!(
        a.kineto.len() != 1 || a.traces.len() == 1,
        "--kineto: one profile per rank ({} traces)",
        a.traces.len()
    );
    Ok(())
}

/// The what-if edits of `--scale` and `--dtype`, and how the manifest describes them.
struct WhatIf {
    scale: Option<(i64, i64)>,
    dtype: Option<(et_schema::DType, et_schema::DType)>,
    described: Vec<String>,
}

impl WhatIf {
    fn of(a: &GenerateArgs) -> Result<WhatIf> {
        let scale = a
            .scale
            .as_deref()
            .map(|s| -> Result<(i64, i64)> {
                let (d, f) = s
                    .split_once(':')
                    .context("--scale wants DIM:FACTOR, e.g. 64:2")?;
                let (d, f): (i64, i64) = (d.parse()?, f.parse()?);
                anyhow::ensure!(d > 0 && f > 0, "--scale: DIM and FACTOR must be positive");
                anyhow::ensure!(f != 1, "--scale {d}:1 changes nothing");
                Ok((d, f))
            })
            .transpose()?;
        let dtype = a
            .dtype
            .as_deref()
            .map(|s| -> Result<(et_schema::DType, et_schema::DType)> {
                let (x, y) = s
                    .split_once(':')
                    .context("--dtype wants FROM:TO, e.g. float32:bfloat16")?;
                let p = |n: &str| {
                    et_schema::DType::from_et_name(n)
                        .with_context(|| format!("unknown dtype {n:?}"))
                };
                let (x, y) = (p(x)?, p(y)?);
                anyhow::ensure!(x != y, "--dtype {x}:{y} changes nothing");
                Ok((x, y))
            })
            .transpose()?;
        let mut described = Vec::new();
        if let Some((d, f)) = scale {
            described.push(format!("scale dimension {d} x{f}"));
        }
        if let Some((x, y)) = dtype {
            described.push(format!("dtype {x} -> {y}"));
        }
        Ok(WhatIf {
            scale,
            dtype,
            described,
        })
    }

    /// The selected ops of `g` as a new trace, with the edits made, and which edits changed it
    /// (scale, dtype): a rank an edit finds nothing in is left as it is, and only an edit that
    /// changed no rank is refused ([`PackageBuilder::finish`]).
    fn apply(&self, g: &Graph, set: &et_graph::ReplaySet) -> Result<(et_schema::Trace, [bool; 2])> {
        let mut new = et_graph::compose::extract(g, set);
        let mut changed = [false; 2];
        if let Some((d, f)) = self.scale {
            let scaled = et_graph::compose::scale_dim(&new, d, f)?;
            changed[0] = !mystique_cli::compose_cmd::same(&new, &scaled);
            mystique_cli::compose_cmd::warn_mismatched_reshapes(&new, &scaled, d);
            new = scaled;
        }
        if let Some((x, y)) = self.dtype {
            let typed = et_graph::compose::change_dtype(&Graph::new(&new), x, y);
            changed[1] = !mystique_cli::compose_cmd::same(&new, &typed);
            new = typed;
        }
        Ok((new, changed))
    }
}

/// The `--kineto` profiles read, by rank of `loaded` (the traces in rank order): matched by
/// the rank each profile recorded, else the number in its file name, else as given (the
/// traces' order as given). `None` for every rank without them.
fn profiles_by_rank(
    a: &GenerateArgs,
    loaded: &[(PathBuf, String, et_schema::Trace)],
) -> Result<Vec<Option<(PathBuf, et_schema::kineto::KinetoTrace)>>> {
    let n = loaded.len();
    if a.kineto.is_empty() {
        return Ok((0..n).map(|_| None).collect());
    }
    let read: Vec<(PathBuf, et_schema::kineto::KinetoTrace)> = a
        .kineto
        .iter()
        .map(|k| Ok((k.clone(), mystique_cli::read_kineto(k)?)))
        .collect::<Result<_>>()?;
    if n == 1 {
        return Ok(read.into_iter().map(Some).collect());
    }
    // One rank each, every one of 0..n.
    let distinct = |ranks: Vec<Option<u64>>| {
        crate::rank_files::distinct(&ranks).filter(|all| all.iter().all(|&r| (r as usize) < n))
    };
    let recorded: Vec<Option<u64>> = read
        .iter()
        .map(|(_, kt)| kt.rank.and_then(|r| u64::try_from(r).ok()))
        .collect();
    let named: Vec<Option<u64>> = read
        .iter()
        .map(|(k, _)| crate::rank_files::rank_in_name(k))
        .collect();
    // Two profiles that record one rank, and whose names do not tell them apart either, are
    // one rank's twice (one file given twice, most often): matched by order instead, one of
    // them would be linked to another rank's trace and refused as "not the same process",
    // which names neither the cause nor the fix.
    if distinct(named.clone()).is_none() {
        for (k, &r) in recorded.iter().enumerate() {
            if let Some(j) = recorded[..k].iter().position(|&o| r.is_some() && o == r) {
                bail!(
                    "--kineto: {} and {} both record rank {}: give one profile per rank",
                    read[j].0.display(),
                    read[k].0.display(),
                    r.unwrap_or_default()
                );
            }
        }
    }
    // As given: the k-th profile is the k-th trace's, wherever that trace's rank put it.
    let given = read
        .iter()
        .enumerate()
        .map(|(k, _)| {
            loaded
                .iter()
                .position(|(p, _, _)| *p == a.traces[k])
                .map(|r| r as u64)
        })
        .collect();
    let ranks = distinct(recorded)
        .or_else(|| distinct(named))
        .or_else(|| distinct(given))
        .context("--kineto: cannot tell which profile is which rank's")?;
    let mut out: Vec<Option<_>> = (0..n).map(|_| None).collect();
    for (r, p) in ranks.into_iter().zip(read) {
        out[r as usize] = Some(p);
    }
    Ok(out)
}

/// Every trace read, with its file's SHA-256, ordered by the rank each recorded (in the given
/// order otherwise).
fn load_in_rank_order(traces: &[PathBuf]) -> Result<Vec<(PathBuf, String, et_schema::Trace)>> {
    let mut loaded = Vec::new();
    for p in traces {
        let (sha, t) = if p.as_os_str() == "-" {
            // Read once: the bytes hashed are the bytes parsed.
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut raw)
                .context("reading the trace from stdin")?;
            let sha = package::sha256_hex(&raw);
            let bytes = et_schema::decompress(raw, "-")?;
            let t = et_schema::parse_trace(&bytes, "-", &Default::default())?;
            for w in &t.warnings {
                eprintln!("warning: -: {w}");
            }
            (sha, t)
        } else {
            let raw = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            (package::sha256_hex(&raw), mystique_cli::read_trace(p)?)
        };
        loaded.push((p.clone(), sha, t));
    }
    if loaded.len() <= 1 {
        return Ok(loaded);
    }
    let (order, _) = crate::rank_files::order(
        loaded
            .iter()
            .map(|(p, _, t)| crate::rank_files::RankTrace::of(p.clone(), t))
            .collect(),
        false,
    )?;
    let pos: Vec<usize> = order
        .iter()
        .map(|r| {
            loaded
                .iter()
                .position(|(p, _, _)| *p == r.path)
                .unwrap_or(0)
        })
        .collect();
    let mut taken: Vec<Option<_>> = loaded.into_iter().map(Some).collect();
    Ok(pos.into_iter().filter_map(|k| taken[k].take()).collect())
}

/// A package being written into its temporary directory, rank by rank.
struct PackageBuilder<'a> {
    a: &'a GenerateArgs,
    tmp: &'a Path,
    edits: &'a WhatIf,
    reference: Option<package::Reference>,
    key: Vec<u8>,
    anon: Anonymized,
    files: BTreeMap<String, String>,
    ranks: Vec<RankEntry>,
    ops_from: BTreeSet<String>,
    devices: BTreeSet<String>,
    original: Option<Original>,
    gaps: Option<package::Gaps>,
    schema: String,
    /// Whether the scale and the dtype edit changed any rank so far.
    edited: [bool; 2],
}

impl<'a> PackageBuilder<'a> {
    fn new(
        a: &'a GenerateArgs,
        tmp: &'a Path,
        edits: &'a WhatIf,
        reference: Option<package::Reference>,
    ) -> Self {
        PackageBuilder {
            a,
            tmp,
            edits,
            reference,
            key: random_key(),
            anon: Anonymized::default(),
            files: BTreeMap::new(),
            ranks: Vec::new(),
            ops_from: BTreeSet::new(),
            devices: BTreeSet::new(),
            original: None,
            gaps: None,
            schema: String::new(),
            edited: [false; 2],
        }
    }

    /// Adds rank `rank`: its selection, edited and anonymised, as the packaged trace; the plan
    /// compiled from that trace as `run` will read it; its profile's timing where given (and
    /// for a single rank, the profile itself with `--emulate-gaps`).
    fn add_rank(
        &mut self,
        rank: usize,
        path: &Path,
        sha: &str,
        t: &et_schema::Trace,
        sel: &et_graph::Selection,
        kineto: Option<(PathBuf, et_schema::kineto::KinetoTrace)>,
    ) -> Result<()> {
        let a = self.a;
        let g = Graph::new(t);
        let set = g.select(sel)?;
        let mut original = None;
        if let Some((k, kt)) = &kineto {
            let linking = |set: &et_graph::ReplaySet| {
                let link = et_graph::link(&g, set, kt)
                    .with_context(|| format!("linking {} to {}", k.display(), path.display()))?;
                anyhow::Ok(et_graph::typical_timing(&g, set, kt, &link))
            };
            let o = linking(&set)?;
            // The iteration is the whole of the chosen iterations, whatever else the selection
            // leaves out: a profile linked by order bounds it by the ops linked, and the
            // collectives alone of a job (`--only comm`) span less than its iteration.
            let whole = g.select(&et_graph::Selection {
                iterations: sel.iterations.clone(),
                ..Default::default()
            })?;
            let iter_us = if whole.ops.len() > set.ops.len() {
                let w = linking(&whole)?;
                if a.emulate_gaps {
                    let ms = |t: &et_graph::OriginalTiming| {
                        t.op_us.iter().flatten().sum::<f64>() / 1000.0
                    };
                    eprintln!(
                        "warning: --emulate-gaps with a part of the iteration ({} of its {} ops): \
                         the gap before each packaged op is the original's time since the \
                         previous one, which holds the ops left out (about {:.3} ms per iteration \
                         in the profile), and `run` spins it as time between ops. Package \
                         whole iterations for the time between ops alone",
                        set.ops.len(),
                        whole.ops.len(),
                        (ms(&w) - ms(&o)).max(0.0)
                    );
                }
                w.span_us
            } else {
                o.span_us
            };
            original = Some(Original {
                iter_ms: iter_us / 1000.0,
                ops_ms: Some(o.op_us.iter().flatten().sum::<f64>() / 1000.0),
                from: "kineto".into(),
            });
        }
        let single = a.traces.len() == 1;
        // A rank of a capture: its iteration timed uninstrumented, from its meta file (the
        // profile's is instrumented), as a single rank's capture is.
        let meta = crate::replay_cmd::meta_of(path).filter(|(_, m)| a.rank_metas.contains(m));
        if let (Some((v, m)), false) = (meta, single) {
            if let Some(ms) = v["iter_ms_median"]
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
            {
                original = Some(Original {
                    iter_ms: ms,
                    ops_ms: original.and_then(|o: Original| o.ops_ms),
                    from: meta_source(&m, a.anonymize).unwrap_or_default(),
                });
            }
        }
        for tr in &t.tensors {
            if let Some(d) = tr.device.map(|d| t.str(d)).filter(|d| !d.is_empty()) {
                self.devices.insert(d.to_string());
            }
        }
        let (mut new, edited) = self.edits.apply(&g, &set)?;
        self.edited[0] |= edited[0];
        self.edited[1] |= edited[1];
        if a.anonymize {
            let an = mystique_cli::anonymize::anonymize(&mut new, &self.key);
            for (k, n) in an.replaced {
                *self.anon.replaced.entry(k).or_default() += n;
            }
            self.anon.map.extend(an.map);
        }
        self.schema = new.meta.schema.clone();
        let trace_name = format!("rank{rank}.et.json.gz");
        new.source = trace_name.clone();
        let text = et_schema::write_trace_to_vec(&new);
        // The plan is compiled from the packaged trace itself, as `run` will read it.
        let packaged = et_schema::parse_trace(&text, &trace_name, &Default::default())?;
        let pg = Graph::new(&packaged);
        let plan = replay::plan::compile(&pg, &pg.replay_set(None));
        for op in &plan.ops {
            let ns = op.name.split("::").next().unwrap_or("");
            if op.name.contains("::") && !LIBTORCH_NAMESPACES.contains(&ns) {
                self.ops_from.insert(ns.to_string());
            }
        }
        if let (true, Some((k, kt))) = (a.emulate_gaps, kineto) {
            self.add_profile(&pg, &k, kt)?;
        }
        let plan_name = format!("rank{rank}.plan.json.gz");
        for (file, bytes) in [
            (&trace_name, gzip(&text)?),
            (&plan_name, gzip(&serde_json::to_vec(&plan)?)?),
        ] {
            self.write(file, &bytes)?;
        }
        eprintln!(
            "[generate] rank {rank}: {} ops from {}",
            plan.steps.len(),
            path.display()
        );
        if single {
            self.original = original.clone();
            warn_of_peers(path, &plan);
        }
        self.ranks.push(RankEntry {
            rank,
            trace: trace_name,
            plan: plan_name,
            source_sha256: sha.to_string(),
            ops: plan.steps.len(),
            original: original.filter(|_| !single),
        });
        Ok(())
    }

    /// `--emulate-gaps`: the profile packaged (gzipped) for `run` to calibrate the gaps from.
    /// `run` links it to the packaged trace, as here: a profile that would not link there is
    /// refused now.
    fn add_profile(
        &mut self,
        packaged: &Graph,
        k: &Path,
        kt: et_schema::kineto::KinetoTrace,
    ) -> Result<()> {
        replay::calibrate::Linked::of(packaged, &packaged.replay_set(None), kt, true)
            .with_context(|| {
                format!(
                    "--emulate-gaps: the profile {} does not link to the packaged ops (package \
                     whole iterations of the ET it was taken with)",
                    k.display()
                )
            })?;
        let raw = std::fs::read(k).with_context(|| format!("reading {}", k.display()))?;
        let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
            raw
        } else {
            gzip(&raw)?
        };
        self.write(PROFILE, &bytes)?;
        self.gaps = Some(package::Gaps {
            profile: PROFILE.into(),
            reference: self.reference,
        });
        Ok(())
    }

    /// A file of the package, recorded with its hash.
    fn write(&mut self, file: &str, bytes: &[u8]) -> Result<()> {
        self.files
            .insert(file.to_string(), package::sha256_hex(bytes));
        std::fs::write(self.tmp.join(file), bytes)?;
        Ok(())
    }

    /// The manifest, written last: the original's time (a reference's or `--original-ms`
    /// over the profile's), the selection, the edits and every file's hash.
    fn finish(self) -> Result<(Manifest, Anonymized)> {
        let a = self.a;
        if let (Some((d, f)), false) = (self.edits.scale, self.edited[0]) {
            bail!("--scale {d}:{f}: no tensor dimension or integer list of any rank holds {d}");
        }
        if let (Some((x, _)), false) = (self.edits.dtype, self.edited[1]) {
            bail!("--dtype: no tensor or dtype argument of any rank is {x}");
        }
        let mut original = self.original;
        // A multi-rank job's step ends when its slowest rank's does.
        let per_rank: Vec<&Original> = self
            .ranks
            .iter()
            .filter_map(|r| r.original.as_ref())
            .collect();
        if per_rank.len() == self.ranks.len() && per_rank.len() > 1 {
            let metas = per_rank.iter().all(|o| o.from.ends_with(FROM_META));
            original = Some(Original {
                iter_ms: per_rank.iter().map(|o| o.iter_ms).fold(0.0, f64::max),
                ops_ms: None,
                from: format!(
                    "{} (slowest of {} ranks)",
                    if metas { "meta files" } else { "kineto" },
                    per_rank.len()
                ),
            });
        }
        if let Some(r) = self.reference {
            // The original's iteration uninstrumented, where the profile's was not.
            original = Some(Original {
                iter_ms: r.original_ms,
                ops_ms: original.and_then(|o: Original| o.ops_ms),
                from: "reference".into(),
            });
        }
        if let Some(ms) = a.original_ms {
            anyhow::ensure!(ms > 0.0 && ms.is_finite(), "--original-ms must be positive");
            // The ops' time stays the profile's, where there is one, as with a reference.
            original = Some(Original {
                iter_ms: ms,
                ops_ms: original.and_then(|o: Original| o.ops_ms),
                from: a
                    .original_from
                    .clone()
                    .unwrap_or_else(|| "--original-ms".into()),
            });
        }
        let f = &a.filters;
        let manifest = Manifest {
            format: if a.original_threads.is_some() {
                PACKAGE_FORMAT_THREADS
            } else {
                PACKAGE_FORMAT
            }
            .into(),
            created_by: format!("mystique {}", env!("CARGO_PKG_VERSION")),
            libtorch: "2.11.0".into(),
            schema: self.schema,
            ranks: self.ranks,
            selection: SelectionRecord {
                iterations: f.iteration.clone(),
                name: f.name.clone(),
                scope: f.scope.clone(),
                ids: f.ids.clone(),
                only: format!("{:?}", f.only).to_lowercase(),
            },
            what_if: self.edits.described.clone(),
            devices_recorded: self.devices.into_iter().collect(),
            seed: a.seed,
            warmup: a.warmup,
            iters: a.iters,
            ops_from: self.ops_from.into_iter().collect(),
            original,
            gaps: self.gaps,
            threads: a.original_threads,
            anonymized: a.anonymize.then(|| self.anon.replaced.clone()),
            files: self.files,
        };
        std::fs::write(
            self.tmp.join(MANIFEST),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
        Ok((manifest, self.anon))
    }
}

/// What was generated: a JSON line on stdout with `--json`, else a line on stderr (and the
/// libraries its ops need).
fn print_summary(out: &Path, manifest: &Manifest, json: bool) -> Result<()> {
    let summary = serde_json::json!({
        "package": out.display().to_string(),
        "ranks": manifest.ranks.len(),
        "ops": manifest.ranks.iter().map(|r| r.ops).sum::<usize>(),
        "ops_from": manifest.ops_from,
        "anonymized": manifest.anonymized,
        "original": manifest.original,
    });
    if json {
        writeln!(std::io::stdout(), "{summary}")?;
        return Ok(());
    }
    eprintln!(
        "generated {} ({} rank(s), {} ops){}",
        out.display(),
        manifest.ranks.len(),
        summary["ops"],
        match &manifest.anonymized {
            Some(r) => format!("; anonymised: {r:?}"),
            None => String::new(),
        }
    );
    if !manifest.ops_from.is_empty() {
        eprintln!(
            "note: its ops need libraries from {:?}: `mystique run` takes them with --load-library",
            manifest.ops_from
        );
    }
    Ok(())
}
