//! Which file is which rank, for `replay --ranks` and multi-rank packages.
//!
//! A directory is read by content: every execution trace in it, whatever its name (a cheap
//! probe of its first bytes), Kineto traces and other files left out (named with `-v`). A
//! rank comes from, in order: the rank each trace recorded (its `record_param_comms` records),
//! then a number in its file name (`_0`, `-rank3`, `rank_7`, `.7.`), then, with `--rank-order`,
//! the files as listed. Records that several traces share are no evidence (a job whose every
//! trace recorded rank 0): the next source decides, with a warning. Sets that cannot be one run
//! (two traces for one rank, a rank missing from 0..N-1, a world size that differs) are refused
//! before anything starts, naming the files.

use anyhow::{bail, Context, Result};
use mystique_cli::inspect::human_bytes as human;
use std::io::Read;
use std::path::{Path, PathBuf};

/// One rank's trace: the rank it recorded and the world size its groups record, if any.
pub struct RankTrace {
    pub path: PathBuf,
    /// The rank the trace's own records give.
    pub recorded: Option<u64>,
    /// The world size its process groups record.
    pub world: Option<i64>,
    /// The most ranks one of its collectives splits its data over (an all-to-all's split
    /// sizes, one per rank of its group): the job had at least this many ranks, where its
    /// process groups are not recorded.
    pub largest_group: Option<usize>,
    /// It records a collective or a process group: it is a rank of a distributed job.
    pub distributed: bool,
}

/// A rank's estimated peak memory (bytes): of the replay asked for, and of a comm-only one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peak {
    pub asked: u64,
    pub comm_only: u64,
}

/// Where the ranks of a set came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankSource {
    /// The traces' own records.
    Recorded,
    /// A number in each file name.
    FileName,
    /// The files as listed (`--rank-order`).
    Listed,
}

impl RankSource {
    /// How JSON reports name it.
    pub fn name(self) -> &'static str {
        match self {
            RankSource::Recorded => "recorded",
            RankSource::FileName => "file name",
            RankSource::Listed => "listed order",
        }
    }

    /// Where the ranks came from, in a sentence.
    pub fn phrase(self) -> &'static str {
        match self {
            RankSource::Recorded => "the ranks the traces recorded",
            RankSource::FileName => "the numbers in the file names",
            RankSource::Listed => "the listed order (--rank-order)",
        }
    }
}

/// What a file's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    ExecutionTrace,
    Kineto,
    Other,
}

/// Bytes of a file's (decompressed) start a probe reads: an ET's top-level `schema` and the
/// start of its `nodes` come first, a Kineto trace's `schemaVersion`/`traceEvents` too.
const PROBE_BYTES: u64 = 64 << 10;

/// Classifies `path` by its first bytes (gzip inflated), without parsing it.
fn probe(path: &Path) -> Kind {
    let Ok(f) = std::fs::File::open(path) else {
        return Kind::Other;
    };
    let mut raw = Vec::new();
    if f.take(PROBE_BYTES).read_to_end(&mut raw).is_err() {
        return Kind::Other;
    }
    let head = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        // A truncated gzip stream yields what it could inflate before the error.
        let _ = flate2::read::GzDecoder::new(&raw[..])
            .take(PROBE_BYTES)
            .read_to_end(&mut out);
        out
    } else {
        raw
    };
    classify(&String::from_utf8_lossy(&head))
}

/// An ET has `nodes` and a top-level `schema`, or, where its writer put `nodes` first, node
/// records with `ctrl_deps` (nested layouts) or `parent` (flat ones); a Kineto trace has
/// `traceEvents`.
fn classify(head: &str) -> Kind {
    let starts_as_object = head.trim_start().starts_with('{');
    if !starts_as_object {
        Kind::Other
    } else if head.contains("\"traceEvents\"") {
        Kind::Kineto
    } else if head.contains("\"nodes\"")
        && ["\"schema\"", "\"ctrl_deps\"", "\"parent\""]
            .iter()
            .any(|k| head.contains(k))
    {
        Kind::ExecutionTrace
    } else {
        Kind::Other
    }
}

/// The rank a file name gives ([`et_graph::summary::rank_in_name`]).
pub fn rank_in_name(path: &Path) -> Option<u64> {
    et_graph::summary::rank_in_name(path).map(|(rank, _)| rank)
}

/// Rank trace files of `spec`: every execution trace of a directory (linked twins left out:
/// they are the same ranks), or the files a glob's last component matches; in natural order.
pub fn list(spec: &str) -> Result<Vec<PathBuf>> {
    let p = Path::new(spec);
    let (dir, pattern) = if p.is_dir() {
        (p.to_path_buf(), None)
    } else {
        let dir = p
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = p
            .file_name()
            .and_then(|f| f.to_str())
            .with_context(|| format!("{spec:?}: not a directory or a glob"))?;
        (dir.to_path_buf(), Some(name.to_string()))
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|f| f.is_file())
        .filter(|f| {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            match &pattern {
                Some(pat) => glob_match(pat, name),
                None => is_rank_trace(f, name),
            }
        })
        .collect();
    files.sort_by_key(|f| natural_key(f));
    // A pattern names its files: one that takes in a profile is refused rather than thinned
    // (each rank's process would fail on it, and its peers with it).
    if pattern.is_some() {
        if let Some(k) = files.iter().find(|f| matches!(probe(f), Kind::Kineto)) {
            bail!(
                "{spec:?} matches {}, a Kineto (profiler) trace: give a pattern that \
                 matches the execution traces only (for example DIR/*.et.json.gz), or the \
                 directory, whose profiles are left out",
                k.display()
            );
        }
    }
    // A linked trace and its clean twin are one rank: the linked one is left out (said where a
    // pattern named it, as where the shell expands the pattern).
    let twins = drop_linked_twins(&mut files);
    if twins > 0 {
        if pattern.is_none() {
            log::info!("--ranks: {twins} linked ETs left out (the same ranks as their clean ones)");
        } else {
            eprintln!(
                "note: --ranks: {spec:?} matches {twins} linked trace{} beside {} clean \
                 one{}, left out (the same rank{})",
                if twins == 1 { "" } else { "s" },
                if twins == 1 { "its" } else { "their" },
                if twins == 1 { "" } else { "s" },
                if twins == 1 { "" } else { "s" },
            );
        }
    }
    let glob = pattern.as_deref().is_some_and(is_glob);
    anyhow::ensure!(
        !files.is_empty() || glob || p.exists(),
        "{spec:?}: no such file or directory"
    );
    anyhow::ensure!(
        files.len() >= 2,
        "{spec:?} matches {} trace{}; a job's ranks are two traces or more",
        files.len(),
        if files.len() == 1 { "" } else { "s" }
    );
    Ok(files)
}

/// Rank trace files among `given`, files named one by one (as the shell expands an unquoted
/// glob): the execution traces by their content, a linked one left out where its clean twin
/// is given too; in natural order. The others are left out with a note (`ddp.rank*` also
/// names each rank's profile and meta file). A directory or a glob among them is refused: it
/// goes alone.
pub fn list_given(given: &[String]) -> Result<Vec<PathBuf>> {
    let paths: Vec<PathBuf> = given.iter().map(PathBuf::from).collect();
    for (spec, p) in given.iter().zip(&paths) {
        anyhow::ensure!(
            !p.is_dir() && !is_glob(spec),
            "--ranks {spec:?}: a directory or a glob goes alone after --ranks; several values \
             are the trace files themselves"
        );
        anyhow::ensure!(p.exists(), "{spec:?}: no such file");
    }
    let (mut files, mut left_out) = (Vec::new(), 0usize);
    for p in paths {
        if matches!(probe(&p), Kind::ExecutionTrace) {
            files.push(p);
        } else {
            left_out += 1;
        }
    }
    left_out += drop_linked_twins(&mut files);
    if left_out > 0 {
        eprintln!(
            "note: --ranks: {left_out} of the files given left out: not execution traces (profiles, \
             meta files), or linked traces beside their clean ones"
        );
    }
    // A file given twice (by any spelling) is kept twice: `order` refuses it, naming it.
    files.sort_by_key(|f| natural_key(f));
    anyhow::ensure!(
        files.len() >= 2,
        "--ranks: the files given hold {} execution trace{}; a job's ranks are two traces or more",
        files.len(),
        if files.len() == 1 { "" } else { "s" }
    );
    Ok(files)
}

/// Leaves out of `files` each linked trace whose clean twin (`NAME.linked.et.json` beside
/// `NAME.et.json`, in the same directory) is among them: the same rank. Returns how many.
fn drop_linked_twins(files: &mut Vec<PathBuf>) -> usize {
    let stem = |p: &Path| {
        crate::replay_cmd::capture_stem(p).map(|(s, linked)| (p.with_file_name(s), linked))
    };
    let clean: std::collections::HashSet<PathBuf> = (files.iter())
        .filter_map(|p| stem(p).filter(|(_, linked)| !linked).map(|(s, _)| s))
        .collect();
    let before = files.len();
    files.retain(|p| !stem(p).is_some_and(|(s, linked)| linked && clean.contains(&s)));
    before - files.len()
}

/// Whether `spec` reads as a glob rather than a file name: it holds `*`, `?` or `[`.
fn is_glob(spec: &str) -> bool {
    spec.contains(['*', '?', '['])
}

/// In a directory: an execution trace by its content (its linked twins are left out after).
fn is_rank_trace(f: &Path, name: &str) -> bool {
    match probe(f) {
        Kind::ExecutionTrace => true,
        Kind::Kineto => {
            log::info!("--ranks: {name} left out: a Kineto trace");
            false
        }
        Kind::Other => {
            log::info!("--ranks: {name} left out: not an execution trace");
            false
        }
    }
}

impl RankTrace {
    /// `t`'s rank as it recorded it and the world size of its groups.
    pub fn of(path: PathBuf, t: &et_schema::Trace) -> RankTrace {
        RankTrace {
            recorded: et_graph::summary::recorded_rank(t),
            world: replay::plan::process_groups(t)
                .first()
                .map(|g| g.size)
                .filter(|&s| s > 0),
            largest_group: largest_split(t),
            distributed: t.nodes.iter().any(|n| {
                let name = t.name(n);
                name == "record_param_comms"
                    || name == et_graph::summary::PROCESS_GROUP_INIT
                    || name.starts_with("c10d::")
            }),
            path,
        }
    }

    /// The rank and world size `path` recorded, read without parsing the trace: its bytes are
    /// searched for the records that hold them (`record_param_comms`, `## process_group:init
    /// ##`), and only those nodes are parsed.
    pub fn probe(path: PathBuf) -> Result<RankTrace> {
        let bytes =
            et_schema::read_input(&path).with_context(|| format!("reading {}", path.display()))?;
        let t = records_of(&bytes, &path)?;
        let mut r = RankTrace::of(path, &t);
        // A collective op without a record (schemas before records were written) still makes
        // the trace a rank of a job.
        r.distributed |= memchr::memmem::find(&bytes, b"\"c10d::").is_some();
        Ok(r)
    }
}

/// The longest split-size list among `t`'s all-to-all records (`record_param_comms`, in its
/// inputs as schema 1.0.x wrote them or its attributes as later ones do): one size per rank of
/// the collective's group.
fn largest_split(t: &et_schema::Trace) -> Option<usize> {
    t.nodes
        .iter()
        .filter(|n| t.name(n) == "record_param_comms")
        .filter(|n| {
            et_graph::summary::collective_name(t, n)
                .is_some_and(|c| c.contains("all_to_all") || c.contains("alltoall"))
        })
        .flat_map(|n| {
            let inputs = t.inputs(n).iter().map(|a| a.value);
            inputs.chain(t.extras(n).iter().map(|e| e.value))
        })
        .filter_map(|v| t.int_list(v))
        .map(|l| l.len())
        .max()
        .filter(|&l| l > 1)
}

/// Nodes of these names are all a rank's identity needs; at most this many of each are parsed.
const IDENTITY_RECORDS: [(&str, usize); 2] = [
    ("\"record_param_comms\"", 64),
    ("\"## process_group:init ##\"", 1),
];

/// A trace of `bytes`' identity records alone (see [`RankTrace::probe`]), under the file's
/// own schema version. A record whose object cannot be cut out or parsed is passed over.
fn records_of(bytes: &[u8], path: &Path) -> Result<et_schema::Trace> {
    let head = &bytes[..bytes.len().min(PROBE_BYTES as usize)];
    let schema = schema_of(head).unwrap_or("1.1.1-chakra.0.0.4");
    let mut nodes: Vec<&[u8]> = Vec::new();
    for (name, most) in IDENTITY_RECORDS {
        let finder = memchr::memmem::Finder::new(name.as_bytes());
        let (mut found, mut last_end) = (0, 0);
        for at in finder.find_iter(bytes) {
            if found == most {
                break;
            }
            if at < last_end {
                continue;
            }
            if let Some((start, end)) = enclosing_object(bytes, at) {
                last_end = end;
                found += 1;
                nodes.push(&bytes[start..end]);
            }
        }
    }
    // The records' parents are not among them: no tree to check.
    let opts = et_schema::ParseOptions {
        threads: 1,
        validate: false,
        ..Default::default()
    };
    let parse = |text: &[u8]| et_schema::parse_trace(text, &path.display().to_string(), &opts);
    let wrap = |nodes: &[&[u8]]| {
        let mut text = format!("{{\"schema\": {schema:?}, \"nodes\": [").into_bytes();
        for (k, n) in nodes.iter().enumerate() {
            if k > 0 {
                text.push(b',');
            }
            text.extend_from_slice(n);
        }
        text.extend_from_slice(b"]}");
        text
    };
    // Together, else each alone (one that does not parse left out).
    if let Ok(t) = parse(&wrap(&nodes)) {
        return Ok(t);
    }
    let good: Vec<&[u8]> = nodes
        .iter()
        .copied()
        .filter(|n| parse(&wrap(&[n])).is_ok())
        .collect();
    parse(&wrap(&good)).with_context(|| format!("reading the rank records of {}", path.display()))
}

/// The top-level `schema` string in the first bytes of an ET.
fn schema_of(head: &[u8]) -> Option<&str> {
    let at = memchr::memmem::find(head, b"\"schema\"")?;
    let rest = std::str::from_utf8(&head[at + 8..]).ok().or_else(|| {
        // Cut inside a multi-byte character: what is valid of it.
        let r = &head[at + 8..];
        std::str::from_utf8(&r[..std::str::from_utf8(r).err()?.valid_up_to()]).ok()
    })?;
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    rest.split('"').next()
}

/// The innermost JSON object around byte `at` (a node record, around its name): the nearest
/// `{` before it whose matching `}` comes after it. Objects that end before it are the node's
/// own values where its writer put them before the name (sorted keys put `attrs` and `inputs`
/// first). `None` past 64 candidates.
fn enclosing_object(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
    let mut before = at;
    for _ in 0..64 {
        let start = memchr::memrchr(b'{', &bytes[..before])?;
        if let Some(end) = object_end(bytes, start).filter(|&e| e > at) {
            return Some((start, end));
        }
        before = start;
    }
    None
}

/// The end (one past its `}`) of the object opening at `start`, strings and escapes followed.
fn object_end(bytes: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (k, &b) in bytes[start..].iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return (b == b'}').then_some(start + k + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Each file probed for the rank it recorded and the world size of its groups
/// ([`RankTrace::probe`]).
pub fn read(files: Vec<PathBuf>) -> Result<Vec<RankTrace>> {
    files.into_iter().map(RankTrace::probe).collect()
}

/// The rank traces `spec` names ([`list`]), probed ([`read`]) and in rank order ([`order`]).
pub fn discover(spec: &str, listed: bool) -> Result<(Vec<RankTrace>, RankSource)> {
    order(read(list(spec)?)?, listed)
}

/// Refuses ranks whose estimated peaks add up to more than `available` bytes (what this machine
/// and its memory cgroup have), with each rank's figure, the total and what would fit, unless
/// `force`: every rank checks only itself, before the others have allocated, and a set that
/// does not fit together ends by the kernel's OOM killer.
pub fn check_memory(
    peaks: &[Peak],
    available: u64,
    only: et_graph::Kind,
    force: bool,
) -> Result<()> {
    let total: u64 = peaks.iter().map(|p| p.asked).sum();
    if force || total <= available {
        return Ok(());
    }
    let per_rank = peaks
        .iter()
        .enumerate()
        .map(|(r, p)| format!("rank {r}: {}", human(p.asked)))
        .collect::<Vec<_>>()
        .join(", ");
    let comm: u64 = peaks.iter().map(|p| p.comm_only).sum();
    let options = if only != et_graph::Kind::Comm && comm <= available {
        format!("--only comm would need about {}; ", human(comm))
    } else {
        String::new()
    };
    bail!(
        "the {} ranks need about {} of memory together ({per_rank}) and {} is available: \
         {options}--force runs them anyway",
        peaks.len(),
        human(total),
        human(available)
    )
}

/// Orders the traces as ranks 0..N-1 by the first source that tells them apart (see the module
/// doc); `listed`: the files as given may decide (`--rank-order`). Refuses sets that cannot be
/// one run.
pub fn order(traces: Vec<RankTrace>, listed: bool) -> Result<(Vec<RankTrace>, RankSource)> {
    let n = traces.len();
    // A trace with no collective and no process group beside ranks that have them is no rank
    // of their job: it would end without joining, and its peers wait for it to time out.
    if let (Some(alone), Some(rank)) = (
        traces.iter().find(|t| !t.distributed),
        traces.iter().find(|t| t.distributed),
    ) {
        bail!(
            "{} records no collective and no process group, where {} does: it is not a rank of \
             the same job",
            alone.path.display(),
            rank.path.display()
        );
    }
    let ordered = order_by_rank(traces, listed)?;
    // Without process-group records, an all-to-all says how many ranks its group had; a group
    // larger than the set given can never run (Gloo would refuse its splits at the first call).
    if let Some((t, l)) = ordered
        .0
        .iter()
        .filter(|t| t.world.is_none())
        .find_map(|t| t.largest_group.filter(|&l| l > n).map(|l| (t, l)))
    {
        bail!(
            "{} splits an all-to-all over {l} ranks, but {n} rank traces were given: give every \
             rank of the job",
            t.path.display()
        );
    }
    Ok(ordered)
}

/// [`order`]'s ordering and its checks of world sizes and ranks.
fn order_by_rank(traces: Vec<RankTrace>, listed: bool) -> Result<(Vec<RankTrace>, RankSource)> {
    let n = traces.len();
    // One file given twice is one rank, whatever order could be put on the list.
    let mut seen = std::collections::HashSet::new();
    for t in &traces {
        let key = std::fs::canonicalize(&t.path).unwrap_or_else(|_| t.path.clone());
        if !seen.insert(key) {
            bail!(
                "{} is given twice: give each rank's trace once",
                t.path.display()
            );
        }
    }
    for t in &traces {
        if let Some(w) = t.world {
            if w as usize != n {
                bail!(
                    "{} was captured with {w} ranks, but {n} rank traces were given",
                    t.path.display()
                );
            }
        }
    }
    let recorded: Vec<Option<u64>> = traces.iter().map(|t| t.recorded).collect();
    if let Some(ranks) = distinct(&recorded) {
        return Ok((arrange(traces, &ranks, "records")?, RankSource::Recorded));
    }
    // Said where another source then decides; where none does, the error says why.
    let warn = |instead: &str| {
        if recorded.iter().any(Option::is_some) {
            eprintln!(
                "warning: the traces' recorded ranks ({}) do not tell them apart: taking them \
                 {instead}",
                describe(&traces, |t| t.recorded),
            );
        }
    };
    let named: Vec<Option<u64>> = traces.iter().map(|t| rank_in_name(&t.path)).collect();
    if let Some(ranks) = distinct(&named) {
        warn("from their file names");
        return Ok((arrange(traces, &ranks, "file name")?, RankSource::FileName));
    }
    if listed {
        warn("as listed (--rank-order)");
        return Ok((traces, RankSource::Listed));
    }
    bail!(
        "cannot tell which trace is which rank (0..{}): {}; {}; pass --rank-order to take them \
         as listed",
        n - 1,
        why_not(&traces, "their records", |t| t.recorded),
        why_not(&traces, "their file names", |t| rank_in_name(&t.path)),
    )
}

/// Why `rank` does not give each trace a rank of its own: a rank several traces share (named),
/// or the traces it gives none.
fn why_not(traces: &[RankTrace], source: &str, rank: impl Fn(&RankTrace) -> Option<u64>) -> String {
    let name = |t: &RankTrace| {
        t.path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string()
    };
    let mut by_rank: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    for t in traces {
        if let Some(r) = rank(t) {
            by_rank.entry(r).or_default().push(name(t));
        }
    }
    if let Some((r, files)) = by_rank.iter().find(|(_, f)| f.len() > 1) {
        return format!(
            "{source} give rank {r} to {} ({})",
            files.join(" and "),
            describe(traces, &rank)
        );
    }
    let none: Vec<String> = traces
        .iter()
        .filter(|t| rank(t).is_none())
        .map(name)
        .collect();
    format!(
        "{source} give no rank to {} ({})",
        none.join(", "),
        describe(traces, &rank)
    )
}

/// The values, when every trace has one and no two share it.
pub fn distinct(v: &[Option<u64>]) -> Option<Vec<u64>> {
    let all: Vec<u64> = v.iter().copied().collect::<Option<_>>()?;
    let mut sorted = all.clone();
    sorted.sort_unstable();
    sorted.dedup();
    (sorted.len() == all.len()).then_some(all)
}

/// The traces in rank order, where `ranks` (one each, distinct) are exactly 0..N-1.
fn arrange(traces: Vec<RankTrace>, ranks: &[u64], from: &str) -> Result<Vec<RankTrace>> {
    let n = traces.len();
    if let Some((t, r)) = traces.iter().zip(ranks).find(|(_, &r)| r as usize >= n) {
        // A rank beyond the count: most often a rank's trace left out of the set.
        let missing: Vec<String> = (0..n as u64)
            .filter(|k| !ranks.contains(k))
            .map(|k| k.to_string())
            .collect();
        bail!(
            "rank {} {} missing: {} traces were given, and {} is rank {r} (from its {from}); \
             a job's traces are its ranks 0..N-1, one each",
            missing.join(", "),
            if missing.len() == 1 { "is" } else { "are" },
            n,
            t.path.display(),
        );
    }
    let mut slots: Vec<Option<RankTrace>> = (0..n).map(|_| None).collect();
    for (t, &r) in traces.into_iter().zip(ranks) {
        slots[r as usize] = Some(t);
    }
    Ok(slots.into_iter().flatten().collect())
}

/// `file: rank` for each trace, `-` where `rank` has none.
fn describe(traces: &[RankTrace], rank: impl Fn(&RankTrace) -> Option<u64>) -> String {
    traces
        .iter()
        .map(|t| {
            let name = t.path.file_name().unwrap_or_default().to_string_lossy();
            match rank(t) {
                Some(r) => format!("{name}: {r}"),
                None => format!("{name}: -"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `*` and `?` in a file name.
fn glob_match(pat: &str, name: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    go(pat.as_bytes(), name.as_bytes())
}

/// File names with their digit runs compared as numbers (rank10 after rank9).
fn natural_key(p: &Path) -> Vec<(String, u64)> {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let mut out = Vec::new();
    let mut text = String::new();
    let mut digits = String::new();
    for c in name.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            if !digits.is_empty() {
                out.push((
                    std::mem::take(&mut text),
                    digits.parse().unwrap_or(u64::MAX),
                ));
                digits.clear();
            }
            text.push(c);
        }
    }
    out.push((text, digits.parse().unwrap_or(0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_is_read_from_the_usual_file_names() {
        let r = |n: &str| rank_in_name(Path::new(n));
        assert_eq!(r("dist_mlp_w2.rank1.et.json"), Some(1));
        assert_eq!(r("job_et_0.json"), Some(0));
        assert_eq!(r("model2_et_11.json.gz"), Some(11));
        assert_eq!(r("trace-rank3.json"), Some(3));
        assert_eq!(r("rank_7_of_8.et.json"), Some(7));
        assert_eq!(r("megatron.7.et.json"), Some(7));
        assert_eq!(r("RANK-2.json"), Some(2));
        // A number inside a word is not a rank; no number, none.
        assert_eq!(r("gpt2.json"), None);
        assert_eq!(r("first.et.json"), None);
    }

    #[test]
    fn files_are_told_apart_by_their_first_bytes() {
        assert_eq!(
            classify(r#"{"schema": "1.0.1", "pid": 1, "time": "", "nodes": [{"id": 1"#),
            Kind::ExecutionTrace
        );
        assert_eq!(
            classify("{\n  \"nodes\": [], \"schema\": \"1.1.1-chakra.0.0.4\""),
            Kind::ExecutionTrace
        );
        assert_eq!(
            classify(r#"{"schemaVersion": 1, "deviceProperties": [], "traceEvents": ["#),
            Kind::Kineto
        );
        assert_eq!(classify(r#"{"iter_ms_median": 3.1}"#), Kind::Other);
        assert_eq!(classify("not json at all"), Kind::Other);
    }

    fn t(path: &str, recorded: Option<u64>) -> RankTrace {
        RankTrace {
            path: PathBuf::from(path),
            recorded,
            world: None,
            largest_group: None,
            distributed: true,
        }
    }

    /// The probe reads what a full parse reads (the rank, the world size) from the records
    /// alone, on every shared multi-rank trace: schema 1.0.1 (the DLRM, inputs and parents
    /// as that version wrote them) and 1.1.x (Gloo, gzipped or not).
    #[test]
    fn a_probe_reads_the_rank_and_world_a_full_parse_reads() {
        let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
        let mut files: Vec<PathBuf> = (0..2)
            .map(|k| shared.join(format!("cpu/dist_mlp_w2.rank{k}.et.json")))
            .chain(
                (0..2).map(|k| shared.join(format!("cpu/dist_mlp_w2.rank{k}.linked.et.json.gz"))),
            )
            .collect();
        let dlrm = shared.join("public/param_dlrm_8rank_1.0.1");
        let mut listed: Vec<PathBuf> = std::fs::read_dir(&dlrm)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| probe(p) == Kind::ExecutionTrace)
            .collect();
        listed.sort();
        assert_eq!(listed.len(), 8, "{listed:?}");
        files.extend(listed);
        let mut ranks = std::collections::BTreeSet::new();
        for f in files {
            let full = RankTrace::of(f.clone(), &mystique_cli::read_trace(&f).unwrap());
            let probed = RankTrace::probe(f.clone()).unwrap();
            assert_eq!(
                (probed.recorded, probed.world),
                (full.recorded, full.world),
                "{}",
                f.display()
            );
            ranks.insert((full.world, full.recorded));
        }
        // The Gloo job records its world of 2 and no rank (no record_param_comms); the DLRM
        // (no group records) its eight ranks, told apart.
        assert!(ranks.contains(&(Some(2), None)), "{ranks:?}");
        assert_eq!(ranks.len(), 1 + 8, "{ranks:?}");
    }

    /// A node record is cut out of the bytes by its braces, strings and escapes followed.
    #[test]
    fn a_record_is_cut_out_by_its_braces() {
        let text = br#"{"nodes": [{"id": 2, "name": "record_param_comms", "attrs": [{"name": "x", "value": "a } \" {"}]}, {"id": 3}]}"#;
        let at = memchr::memmem::find(text, b"record_param_comms").unwrap();
        let (s, e) = enclosing_object(text, at).unwrap();
        assert_eq!(
            std::str::from_utf8(&text[s..e]).unwrap(),
            r#"{"id": 2, "name": "record_param_comms", "attrs": [{"name": "x", "value": "a } \" {"}]}"#
        );
        assert_eq!(enclosing_object(b"{\"a\": [1, 2", 3), None);
        // Keys sorted: the node's objects before its name are passed over.
        let sorted = br#"[{"attrs": [{"name": "rank"}], "inputs": {"values": []}, "name": "record_param_comms"}]"#;
        let at = memchr::memmem::find(sorted, b"record_param_comms").unwrap();
        assert_eq!(enclosing_object(sorted, at), Some((1, sorted.len() - 1)));
        assert_eq!(
            schema_of(br#"{"schema" : "1.0.1-chakra.0.0.4", "pid": 1"#),
            Some("1.0.1-chakra.0.0.4")
        );
    }

    #[test]
    fn ranks_that_do_not_fit_together_are_refused_with_what_would() {
        let gib = 1u64 << 30;
        let rank = |asked, comm_only| Peak { asked, comm_only };
        let set = || vec![rank(6 * gib, gib), rank(6 * gib, gib), rank(6 * gib, gib)];
        // 18 GiB in all, 20 available: runs.
        check_memory(&set(), 20 * gib, et_graph::Kind::All, false).unwrap();
        // 16 available: refused, each rank's figure, the total and the comm-only one named.
        let e = check_memory(&set(), 16 * gib, et_graph::Kind::All, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("3 ranks need about 18.0 GiB")
                && e.contains("rank 2: 6.0 GiB")
                && e.contains("16.0 GiB is available")
                && e.contains("--only comm would need about 3.0 GiB")
                && e.contains("--force"),
            "{e}"
        );
        // Already comm-only: no such suggestion; --force: runs.
        let e = check_memory(&set(), gib, et_graph::Kind::Comm, false)
            .unwrap_err()
            .to_string();
        assert!(!e.contains("--only comm would"), "{e}");
        check_memory(&set(), gib, et_graph::Kind::All, true).unwrap();
    }

    fn names(v: &[RankTrace]) -> Vec<String> {
        v.iter().map(|t| t.path.display().to_string()).collect()
    }

    #[test]
    fn ranks_come_from_records_then_names_then_the_listing() {
        // Recorded ranks, one each: they decide, whatever the names say.
        let (v, from) = order(vec![t("x_0.json", Some(1)), t("x_1.json", Some(0))], false).unwrap();
        assert_eq!(
            (names(&v), from),
            (
                vec!["x_1.json".into(), "x_0.json".into()],
                RankSource::Recorded
            )
        );
        // Both recorded rank 0: no evidence; the file names decide.
        let (v, from) = order(
            vec![t("b_et_1.json", Some(0)), t("a_et_0.json", Some(0))],
            false,
        )
        .unwrap();
        assert_eq!(
            (names(&v), from),
            (
                vec!["a_et_0.json".into(), "b_et_1.json".into()],
                RankSource::FileName
            )
        );
        // Nothing tells them apart: refused, unless the listing may decide.
        let set = || vec![t("first.json", None), t("second.json", None)];
        let e = order(set(), false).err().unwrap().to_string();
        assert!(
            e.contains("--rank-order") && e.contains("first.json: -"),
            "{e}"
        );
        let (v, from) = order(set(), true).unwrap();
        assert_eq!(
            (names(&v), from),
            (
                vec!["first.json".into(), "second.json".into()],
                RankSource::Listed
            )
        );
    }

    #[test]
    fn sets_that_cannot_be_one_run_are_refused_naming_the_file() {
        // A gap in 0..N-1.
        let e = order(vec![t("a.json", Some(0)), t("b.json", Some(2))], true)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("rank 1 is missing") && e.contains("b.json is rank 2 (from its records)"),
            "{e}"
        );
        // File names that skip a rank.
        let e = order(vec![t("r_0.json", None), t("r_5.json", None)], false)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("r_5.json"), "{e}");
        // Two traces record one rank, and the names give none: refused, naming both.
        let e = order(
            vec![
                t("a.json", Some(0)),
                t("b.json", Some(1)),
                t("c.json", Some(1)),
            ],
            false,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("their records give rank 1 to b.json and c.json"),
            "{e}"
        );
        // A world size other than the set's.
        let mut w = t("a_0.json", None);
        w.world = Some(4);
        let e = order(vec![w, t("a_1.json", None)], false)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("captured with 4 ranks"), "{e}");
    }
}
