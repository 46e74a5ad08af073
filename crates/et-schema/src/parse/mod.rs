//! Reading execution traces: decompression, the structural scan, per-node parsing on all cores,
//! and the merge into one [`Trace`].
//!
//! Why per node: a whole-document DOM or simd-json tape costs several times the file in memory;
//! parsing each node record on its own keeps peak memory near the input size and lets the nodes
//! be split across threads. Values go straight into flat arenas, strings into an interner.
//!
//! The jobs, one file each: [`input`] (files, mapping, gzip and its limits), [`parallel`]
//! (splitting the nodes array across threads), [`node`] (the per-thread builder and the record
//! accumulator), [`seeds`] (the serde_json visitors), [`fast`] (the specialised record reader
//! tried first) and [`errors`] (turning the readers' errors into [`Error`]s).

#[cfg(feature = "bench-hooks")]
mod bench;
mod errors;
mod fast;
mod input;
mod node;
mod parallel;
mod seeds;
#[cfg(test)]
mod tests;

#[cfg(feature = "simd")]
pub use bench::record_bench;
#[cfg(feature = "bench-hooks")]
pub use bench::records_read_by_visitors;
pub(crate) use errors::serde_message;
pub use input::{
    decompress, decompress_with, not_a_file, open_input, read_input, read_input_with, Input,
    ReadOptions, DEFAULT_MAX_DECOMPRESSED, MAX_DECOMPRESSED_ENV,
};

use crate::error::{clip, Error, Result, MSG_MAX};
use crate::model::{IdIndex, Layout, Node, Trace, TraceMeta, KNOWN_SCHEMAS};
use crate::scan::{self, ScanError};
use errors::scan_error;
use node::Builder;
use parallel::{parse_parallel, parse_ranges};
use std::path::Path;

/// How to parse.
#[derive(Clone, Debug)]
pub struct ParseOptions {
    /// Worker threads for node records; 0 means one per available core.
    pub threads: usize,
    /// Check duplicate ids, missing parents and cycles.
    pub validate: bool,
    /// Read every node record with the serde_json visitors alone, not the specialised reader
    /// first. Slower; the result is the same (tests and fuzz targets compare the two).
    pub visitors_only: bool,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            threads: 0,
            validate: true,
            visitors_only: false,
        }
    }
}

/// Reads and parses an execution trace file (`.json`, `.json.gz`, or `-` for stdin).
pub fn read_trace(path: &Path) -> Result<Trace> {
    read_trace_with(path, &ParseOptions::default())
}

/// Reads and parses an execution trace file with `opts`, within the default [`ReadOptions`]
/// (read with [`read_input_with`] and parse with [`parse_trace`] for others).
pub fn read_trace_with(path: &Path, opts: &ParseOptions) -> Result<Trace> {
    let input = open_input(path, &ReadOptions::default())?;
    parse_input(&input, &path.display().to_string(), opts)
}

/// Parses an [`Input`] from [`open_input`]: as [`parse_trace`], and a mapped input's pages
/// are handed back as the parser passes them, so that peak memory stays near the model's size.
pub fn parse_input(input: &Input, source: &str, opts: &ParseOptions) -> Result<Trace> {
    parse_bytes(input, Some(input), source, opts)
}

/// Parses an execution trace from JSON text. `source` names it in errors.
pub fn parse_trace(bytes: &[u8], source: &str, opts: &ParseOptions) -> Result<Trace> {
    parse_bytes(bytes, None, source, opts)
}

/// Parses `bytes` (the mapped `input`'s, when there is one) into a [`Trace`], step by step.
fn parse_bytes(
    bytes: &[u8],
    input: Option<&Input>,
    source: &str,
    opts: &ParseOptions,
) -> Result<Trace> {
    let profile = Profile::start();
    let threads = thread_count(bytes.len(), opts.threads);
    let nodes = parse_nodes(bytes, input, source, threads, !opts.visitors_only, &profile)?;
    profile.memory("scan+nodes");
    if !nodes.saw_nodes {
        // Only on this error path: a Kineto (Chrome) trace is the file most often given here.
        let kineto = bytes.windows(13).any(|w| w == b"\"traceEvents\"");
        return Err(Error::NotATrace {
            path: source.to_string(),
            msg: if kineto {
                "no \"nodes\" array at the top level: it holds \"traceEvents\", a Kineto \
                 (profiler) trace, which goes after its execution trace (`replay ET --kineto \
                 K`, `compare ET K`, `link ET K`)"
                    .into()
            } else {
                "no \"nodes\" array at the top level".into()
            },
        });
    }
    let meta = read_meta(bytes, &nodes.top, source)?;
    let layout = layout_of(&nodes.parts, &meta);
    let mut trace = merge(nodes.parts, source, &profile)?;
    trace.meta = meta;
    trace.layout = layout;
    trace.source = source.to_string();
    warn_about_schema(&mut trace);
    profile.say("scan+nodes+merge");
    if opts.validate {
        // One index serves both: adopting orphans changes parents, not ids.
        let index = trace.node_by_id();
        adopt_orphans(&mut trace, &index);
        validate_with(&trace, &index)?;
    }
    profile.say("total");
    Ok(trace)
}

/// Timings on stderr when the environment variable `ET_PARSE_PROFILE` is set.
struct Profile {
    on: bool,
    t0: std::time::Instant,
}

impl Profile {
    fn start() -> Profile {
        Profile {
            on: std::env::var_os("ET_PARSE_PROFILE").is_some(),
            t0: std::time::Instant::now(),
        }
    }

    /// The time since the start, after `what`.
    fn say(&self, what: &str) {
        if self.on {
            eprintln!("et-schema: {what} {:?}", self.t0.elapsed());
        }
    }

    /// As [`Profile::say`], with the peak resident memory so far (Linux).
    fn memory(&self, what: &str) {
        if self.on {
            let hwm = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let hwm = hwm.lines().find(|l| l.starts_with("VmHWM")).unwrap_or("");
            eprintln!("et-schema: {what} {:?} {hwm}", self.t0.elapsed());
        }
    }
}

/// Parser threads for `len` bytes: `requested`, or with 0 one per core, but small traces are
/// not worth a thread (one per 4 MiB).
fn thread_count(len: usize, requested: usize) -> usize {
    if requested == 0 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cores.min(len / (4 << 20) + 1)
    } else {
        requested
    }
}

/// The nodes array parsed into per-thread builders (in order), and the other top-level keys.
struct Nodes {
    parts: Vec<Builder>,
    top: Vec<(String, std::ops::Range<usize>)>,
    saw_nodes: bool,
}

/// Parses the nodes array. Fast path: split it at guessed element boundaries and scan+parse
/// each part on its own thread; each thread confirms the next one's start by arriving exactly
/// there. Any surprise (bad guess, bad input) falls back to the serial scan, which also
/// produces the precise error.
fn parse_nodes(
    bytes: &[u8],
    input: Option<&Input>,
    source: &str,
    threads: usize,
    fast: bool,
    profile: &Profile,
) -> Result<Nodes> {
    if threads > 1 {
        if let Some(nodes) = scan_and_parse_together(bytes, input, source, threads, fast) {
            return Ok(nodes);
        }
    }
    let scan = scan::scan(bytes).map_err(|e| scan_error(e, bytes, source))?;
    profile.say("serial scan");
    Ok(Nodes {
        parts: parse_ranges(bytes, &scan.nodes, threads, source, fast)?,
        top: scan.top,
        saw_nodes: scan.saw_nodes,
    })
}

/// The fast path of [`parse_nodes`]: the scan hands the nodes array to [`parse_parallel`].
/// `None` to fall back.
fn scan_and_parse_together(
    bytes: &[u8],
    input: Option<&Input>,
    source: &str,
    threads: usize,
    fast: bool,
) -> Option<Nodes> {
    let mut parts = Vec::new();
    let (top, saw_nodes) = scan::scan_with(bytes, |open| {
        let (p, end) =
            parse_parallel(bytes, input, open, threads, source, fast).ok_or(ScanError::Fallback)?;
        parts = p;
        Ok(end)
    })
    .ok()?;
    Some(Nodes {
        parts,
        top,
        saw_nodes,
    })
}

/// The top-level keys other than `nodes`: the known ones into their fields, the rest kept as
/// JSON text.
fn read_meta(
    bytes: &[u8],
    top: &[(String, std::ops::Range<usize>)],
    source: &str,
) -> Result<TraceMeta> {
    let mut meta = TraceMeta::default();
    for (key, range) in top {
        let text = &bytes[range.clone()];
        let bad = |msg: &str| Error::Syntax {
            path: source.to_string(),
            offset: range.start as u64,
            msg: format!(
                "top-level \"{}\": {}",
                clip(key, MSG_MAX),
                serde_message(msg)
            ),
        };
        match key.as_str() {
            "schema" => {
                meta.schema =
                    serde_json::from_slice::<String>(text).map_err(|e| bad(&e.to_string()))?
            }
            "pid" => meta.pid = serde_json::from_slice(text).map_err(|e| bad(&e.to_string()))?,
            "time" => meta.time = serde_json::from_slice(text).map_err(|e| bad(&e.to_string()))?,
            "start_ts" => {
                meta.start_ts = serde_json::from_slice(text).map_err(|e| bad(&e.to_string()))?
            }
            "finish_ts" => {
                meta.finish_ts = serde_json::from_slice(text).map_err(|e| bad(&e.to_string()))?
            }
            _ => {
                let v: serde_json::Value =
                    serde_json::from_slice(text).map_err(|e| bad(&e.to_string()))?;
                meta.extra.push((key.clone(), v.to_string()));
            }
        }
    }
    Ok(meta)
}

/// The layout the nodes use; when no node says, the one the schema version implies.
fn layout_of(parts: &[Builder], meta: &TraceMeta) -> Layout {
    parts.iter().find_map(|p| p.layout).unwrap_or(
        if meta.schema.starts_with("1.0.0") || meta.schema == "1.0.1" {
            Layout::Flat
        } else {
            Layout::Nested
        },
    )
}

/// The per-thread builders merged, in order, into one trace.
fn merge(parts: Vec<Builder>, source: &str, profile: &Profile) -> Result<Trace> {
    let mut parts = parts.into_iter();
    let mut trace = parts.next().map(Builder::into_trace).unwrap_or_default();
    for part in parts {
        if profile.on {
            eprintln!(
                "et-schema: merging {} strings, {} items, {} args, {} nodes at {:?}",
                part.strings.len(),
                part.items.len(),
                part.args.len(),
                part.nodes.len(),
                profile.t0.elapsed()
            );
        }
        trace
            .absorb(part.into_trace())
            .map_err(|e| Error::TooLarge {
                path: source.to_string(),
                source: e,
            })?;
    }
    Ok(trace)
}

/// A warning when the trace names no schema version, or one this crate does not know.
fn warn_about_schema(trace: &mut Trace) {
    if trace.meta.schema.is_empty() {
        trace
            .warnings
            .push("no schema version in the trace; assuming the layout its nodes use".into());
    } else if !trace.schema_is_known() {
        trace.warnings.push(format!(
            "schema version {:?} is newer or other than the versions this tool knows ({}); parsed on a best-effort basis",
            clip(&trace.meta.schema, MSG_MAX),
            KNOWN_SCHEMAS.join(", ")
        ));
    }
}

/// Puts nodes whose parent the file does not hold under the trace's root, with a warning.
/// PyTorch's observer now and then leaves out a node whose children it wrote: autograd's
/// backward nodes around the recomputation of activation checkpointing, an iteration's parent
/// under DDP. The children are whole ops; under the root they are top-level ops, which is
/// what they were under an annotation that is not an op.
fn adopt_orphans(t: &mut Trace, index: &IdIndex) {
    let root = t
        .nodes
        .iter()
        .find(|n| n.parent.is_none_or(|p| p == 0 || p == n.id))
        .map(|n| n.id);
    let mut missing = std::collections::BTreeSet::new();
    let mut adopted = 0usize;
    for n in &mut t.nodes {
        let Some(p) = n.parent.filter(|&p| p != 0 && p != n.id) else {
            continue;
        };
        if !index.contains(p) {
            missing.insert(p);
            n.parent = root;
            adopted += 1;
        }
    }
    if adopted > 0 {
        let ids: Vec<String> = missing.iter().take(5).map(|p| p.to_string()).collect();
        t.warnings.push(format!(
            "{adopted} nodes name {} parents the trace does not hold (ids {}{}): the observer \
             left them out (seen around activation checkpointing and under DDP); those nodes \
             are read as top-level ops",
            missing.len(),
            ids.join(", "),
            if missing.len() > 5 { ", ..." } else { "" }
        ));
    }
}

/// Checks structural invariants: unique ids, parents that exist, no parent cycles.
pub fn validate(t: &Trace) -> Result<()> {
    validate_with(t, &t.node_by_id())
}

/// [`validate`] with the trace's id index already built.
fn validate_with(t: &Trace, index: &IdIndex) -> Result<()> {
    let path = || t.source.clone();
    // The index keeps the last node of an id: any node that is not the one found is a duplicate.
    for (i, n) in t.nodes.iter().enumerate() {
        let last = index.position(n.id).unwrap_or(i);
        if last != i {
            return Err(Error::DuplicateId {
                path: path(),
                id: n.id,
                first_offset: n.offset,
                second_offset: t.nodes[last].offset,
            });
        }
    }
    let parent_of = |n: &Node| n.parent.filter(|&p| p != 0 && p != n.id);
    for n in &t.nodes {
        if let Some(p) = parent_of(n) {
            if !index.contains(p) {
                return Err(Error::MissingParent {
                    path: path(),
                    id: n.id,
                    parent: p,
                });
            }
        }
    }
    // Where every parent id is below its child's (the observer numbers nodes as they start, so
    // a parent before its children), ids fall along every chain and no cycle can exist: one
    // sequential pass instead of walking chains through the index.
    if t.nodes
        .iter()
        .all(|n| parent_of(n).is_none_or(|p| p < n.id))
    {
        return Ok(());
    }
    // Each node has at most one parent: follow chains, colouring nodes (0 new, 1 on path, 2 done).
    let mut state = vec![0u8; t.nodes.len()];
    let mut path_stack = Vec::new();
    for start in 0..t.nodes.len() {
        let mut i = start;
        while state[i] == 0 {
            state[i] = 1;
            path_stack.push(i);
            match parent_of(&t.nodes[i]) {
                Some(p) => i = index.position(p).unwrap_or(i),
                None => break,
            }
        }
        if state[i] == 1 && parent_of(&t.nodes[i]).is_some() {
            return Err(Error::Cycle {
                path: path(),
                id: t.nodes[i].id,
            });
        }
        for j in path_stack.drain(..) {
            state[j] = 2;
        }
    }
    Ok(())
}
