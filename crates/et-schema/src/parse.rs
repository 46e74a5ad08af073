//! Reading execution traces: decompression, the structural scan, per-node parsing on all cores,
//! and the merge into one [`Trace`].
//!
//! Why per node: a whole-document DOM or simd-json tape costs several times the file in memory;
//! parsing each node record on its own keeps peak memory near the input size and lets the nodes
//! be split across threads. Values go straight into flat arenas, strings into an interner.

use crate::error::{clip, human_bytes, Error, Result, MSG_MAX};
use crate::intern::{Interner, Sym};
use crate::model::*;
use crate::scan::{self, ScanError};
use crate::types::ValueType;
use rustc_hash::FxHashMap;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::Arc as Rc;

mod fast;

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

/// The environment variable that sets [`ReadOptions::max_decompressed`] when that is `None`.
pub const MAX_DECOMPRESSED_ENV: &str = "MYSTIQUE_MAX_DECOMPRESSED";

/// The most a gzip input may inflate to by default, whatever its compressed size.
pub const DEFAULT_MAX_DECOMPRESSED: u64 = 16 << 30;
/// By default a gzip input may also inflate to at most this many times its compressed size...
const DEFAULT_MAX_RATIO: u64 = 128;
/// ... unless that is under this floor. Traces compress 10-30x (the shared ones); deflate's
/// ceiling is about 1032x, which only bombs (runs of one byte) reach.
const DEFAULT_RATIO_FLOOR: u64 = 1 << 30;

/// How to read input files: limits that keep a hostile file from exhausting memory.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// The most bytes a gzip input may decompress to; more is an
    /// [`Error::DecompressedTooLarge`] naming the limit. `None`: the environment variable
    /// [`MAX_DECOMPRESSED_ENV`] (`MYSTIQUE_MAX_DECOMPRESSED`, bytes or with a K/M/G/T suffix)
    /// when set, else 128 times the compressed size but at least 1 GiB, and at most
    /// [`DEFAULT_MAX_DECOMPRESSED`] (16 GiB).
    pub max_decompressed: Option<u64>,
}

impl ReadOptions {
    /// The limit for an input of `compressed` bytes, and how it was chosen (for the message).
    fn limit(&self, compressed: usize) -> Result<(u64, String)> {
        if let Some(l) = self.max_decompressed {
            return Ok((l, "the limit set by the caller".into()));
        }
        if let Some(v) = std::env::var_os(MAX_DECOMPRESSED_ENV) {
            let v = v.to_string_lossy();
            let l = parse_size(&v).ok_or_else(|| Error::BadLimit {
                var: MAX_DECOMPRESSED_ENV,
                value: clip(&v, MSG_MAX).into_owned(),
            })?;
            return Ok((l, format!("the limit {MAX_DECOMPRESSED_ENV}={v} sets")));
        }
        Ok((
            default_max_decompressed(compressed as u64),
            format!(
                "the default limit for {compressed} compressed bytes ({DEFAULT_MAX_RATIO}x that, at least {}, at most {})",
                human_bytes(DEFAULT_RATIO_FLOOR),
                human_bytes(DEFAULT_MAX_DECOMPRESSED)
            ),
        ))
    }
}

/// The default decompression limit for `compressed` bytes of gzip (see [`ReadOptions`]).
fn default_max_decompressed(compressed: u64) -> u64 {
    compressed
        .saturating_mul(DEFAULT_MAX_RATIO)
        .clamp(DEFAULT_RATIO_FLOOR, DEFAULT_MAX_DECOMPRESSED)
}

/// `17179869184`, `16G`, `16GiB`, `512m`, `1.5T`: binary multiples.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(1u64 << shift);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * (1u64 << shift) as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

/// Reads a file (or `-` for stdin) into memory, decompressing gzip when the magic bytes say so,
/// whatever the file name, within the default [`ReadOptions`].
pub fn read_input(path: &Path) -> Result<Vec<u8>> {
    read_input_with(path, &ReadOptions::default())
}

/// [`read_input`] within the limits of `ropts`.
pub fn read_input_with(path: &Path, ropts: &ReadOptions) -> Result<Vec<u8>> {
    let name = path.display().to_string();
    let raw = if path.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut v)
            .map_err(|source| Error::Io {
                path: name.clone(),
                source,
            })?;
        v
    } else {
        std::fs::read(path).map_err(|source| Error::Io {
            path: name.clone(),
            source,
        })?
    };
    decompress_with(raw, &name, ropts)
}

/// Plain files below this size are read, not mapped: mapping costs more than it saves there.
const MAP_MIN: u64 = 1 << 20;

/// An input file's bytes: a plain file is mapped read-only, anything else (stdin, gzip, small
/// files, a failed map) is read into memory. Derefs to the bytes.
///
/// Why map: `read` copies the file into fresh anonymous pages (a page fault and a copy per 4
/// KiB), and those pages stay resident until the parse ends, so peak memory was the file plus
/// the model. A mapping is filled from the page cache on demand, and the parser hands back
/// (`Input::release`) what it has read, so peak memory stays near the model's size.
///
/// A file truncated by another process while it is mapped makes reads past the new end fault
/// (SIGBUS), as with any mapped file (ripgrep and git map their inputs alike); traces are
/// written once by the observer and read afterwards. The CLI turns SIGBUS into exit 2 with a
/// message; other programs that map may want the same.
pub struct Input {
    inner: InputInner,
}

enum InputInner {
    Owned(Vec<u8>),
    #[cfg(unix)]
    Mapped {
        ptr: *mut libc::c_void,
        len: usize,
    },
}

// SAFETY: the mapping is private and read-only: no one writes through it, so sharing the
// pointer across threads is sharing an immutable slice.
unsafe impl Send for Input {}
// SAFETY: as above.
unsafe impl Sync for Input {}

impl std::ops::Deref for Input {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.inner {
            InputInner::Owned(v) => v,
            // SAFETY: `ptr` maps `len` readable bytes until `self` drops the mapping.
            #[cfg(unix)]
            InputInner::Mapped { ptr, len } => unsafe {
                std::slice::from_raw_parts(*ptr as *const u8, *len)
            },
        }
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let InputInner::Mapped { ptr, len } = self.inner {
            // SAFETY: the mapping made in `open_input`, unmapped once, here.
            unsafe { libc::munmap(ptr, len) };
        }
    }
}

impl Input {
    /// Whether the bytes are a mapping of the file (else they were read into memory).
    pub fn is_mapped(&self) -> bool {
        !matches!(self.inner, InputInner::Owned(_))
    }

    /// The parser will not read `range` again soon: a mapped input's resident pages wholly
    /// inside it leave this process (they stay in the page cache, and a later read maps them
    /// again, with the same bytes: the mapping is private and read-only). No-op for read input.
    pub(crate) fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let InputInner::Mapped { ptr, len } = self.inner {
            let page = 4096usize;
            let start = range.start.div_ceil(page) * page;
            let end = range.end.min(len) / page * page;
            if end > start {
                // SAFETY: a page-aligned range inside the mapping. MADV_DONTNEED on a private
                // file mapping that was never written drops the pages; reads refault them
                // from the file. Failure only means the pages stay resident.
                unsafe {
                    libc::madvise(
                        (ptr as *mut u8).add(start) as *mut libc::c_void,
                        end - start,
                        libc::MADV_DONTNEED,
                    )
                };
            }
        }
        let _ = range;
    }
}

/// Opens an input file (or `-` for stdin): maps a plain file of at least 1 MiB, reads and
/// decompresses gzip (by its magic bytes, whatever the name) within `ropts`' limits.
pub fn open_input(path: &Path, ropts: &ReadOptions) -> Result<Input> {
    #[cfg(unix)]
    if path.as_os_str() != "-" {
        if let Some(m) = map_file(path)? {
            return Ok(m);
        }
    }
    Ok(Input {
        inner: InputInner::Owned(read_input_with(path, ropts)?),
    })
}

/// Maps `path` if it is a plain, uncompressed file worth mapping; `None` to read it instead.
#[cfg(unix)]
fn map_file(path: &Path) -> Result<Option<Input>> {
    use std::os::unix::io::AsRawFd;
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    if !meta.is_file() || meta.len() < MAP_MIN || usize::try_from(meta.len()).is_err() {
        return Ok(None);
    }
    let mut magic = [0u8; 2];
    if f.read_exact(&mut magic).is_err() || magic == [0x1f, 0x8b] {
        return Ok(None);
    }
    let len = meta.len() as usize;
    // SAFETY: a new private read-only mapping of an open file; checked for MAP_FAILED.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Ok(None);
    }
    // Each parser thread reads its part front to back: ask for read-ahead. Advice only.
    // SAFETY: the whole mapping just made.
    unsafe { libc::madvise(ptr, len, libc::MADV_SEQUENTIAL) };
    Ok(Some(Input {
        inner: InputInner::Mapped { ptr, len },
    }))
}

/// Decompresses gzip input (possibly multi-member) within the default [`ReadOptions`]; other
/// input is returned as is.
pub fn decompress(raw: Vec<u8>, name: &str) -> Result<Vec<u8>> {
    decompress_with(raw, name, &ReadOptions::default())
}

/// [`decompress`] within the limits of `ropts`.
pub fn decompress_with(raw: Vec<u8>, name: &str, ropts: &ReadOptions) -> Result<Vec<u8>> {
    if raw.len() < 2 || raw[0] != 0x1f || raw[1] != 0x8b {
        return Ok(raw);
    }
    let (limit, why) = ropts.limit(raw.len())?;
    // ISIZE (the last 4 bytes) is the uncompressed size mod 2^32: a good capacity hint, but
    // only a claim: never more than deflate can give from this many bytes (at most ~1032x),
    // nor more than the limit.
    let hint = if raw.len() >= 18 {
        u32::from_le_bytes(raw[raw.len() - 4..].try_into().unwrap_or([0; 4])) as u64
    } else {
        0
    };
    let hint = hint
        .min((raw.len() as u64).saturating_mul(1032))
        .max(raw.len() as u64 * 4)
        .min(limit.saturating_add(1));
    let mut out = Vec::with_capacity(usize::try_from(hint).unwrap_or(usize::MAX));
    let dec = flate2::read::MultiGzDecoder::new(&raw[..]);
    if let Err(source) = dec.take(limit.saturating_add(1)).read_to_end(&mut out) {
        return Err(Error::Gzip {
            path: name.to_string(),
            decompressed: out.len() as u64,
            source,
        });
    }
    if out.len() as u64 > limit {
        return Err(Error::DecompressedTooLarge {
            path: name.to_string(),
            limit,
            why,
        });
    }
    Ok(out)
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

fn parse_bytes(
    bytes: &[u8],
    input: Option<&Input>,
    source: &str,
    opts: &ParseOptions,
) -> Result<Trace> {
    let profile = std::env::var_os("ET_PARSE_PROFILE").is_some();
    let fast = !opts.visitors_only;
    let t0 = std::time::Instant::now();
    let threads = if opts.threads == 0 {
        // Small traces are not worth a thread.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cores.min(bytes.len() / (4 << 20) + 1)
    } else {
        opts.threads
    };
    // Fast path: split the nodes array at guessed element boundaries and scan+parse each part
    // on its own thread; each thread confirms the next one's start by arriving exactly there.
    // Any surprise (bad guess, bad input) falls back to the serial scan, which also produces
    // the precise error.
    let mut parts: Vec<Builder> = Vec::new();
    let fused = if threads > 1 {
        scan::scan_with(bytes, |open| {
            let (p, end) = parse_parallel(bytes, input, open, threads, source, fast)
                .ok_or(ScanError::Fallback)?;
            parts = p;
            Ok(end)
        })
        .ok()
    } else {
        None
    };
    let (top, saw_nodes) = match fused {
        Some(x) => x,
        None => {
            let scan = scan::scan(bytes).map_err(|e| scan_error(e, bytes, source))?;
            if profile {
                eprintln!("et-schema: serial scan {:?}", t0.elapsed());
            }
            let chunk = scan.nodes.len().div_ceil(threads.max(1)).max(1);
            let ranges: Vec<&[std::ops::Range<usize>]> = scan.nodes.chunks(chunk).collect();
            parts = if ranges.len() <= 1 {
                vec![parse_chunk(
                    bytes,
                    ranges.first().copied().unwrap_or(&[]),
                    source,
                    fast,
                )?]
            } else {
                std::thread::scope(|s| {
                    let handles: Vec<_> = ranges
                        .iter()
                        .map(|r| spawn(s, move || parse_chunk(bytes, r, source, fast)))
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                        .collect::<Result<Vec<_>>>()
                })?
            };
            (scan.top, scan.saw_nodes)
        }
    };
    if profile {
        let hwm = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let hwm = hwm.lines().find(|l| l.starts_with("VmHWM")).unwrap_or("");
        eprintln!("et-schema: scan+nodes {:?} {hwm}", t0.elapsed());
    }
    if !saw_nodes {
        return Err(Error::NotATrace {
            path: source.to_string(),
            msg: "no \"nodes\" array at the top level".into(),
        });
    }
    let mut meta = TraceMeta::default();
    for (key, range) in &top {
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

    let layout = parts.iter().find_map(|p| p.layout).unwrap_or(
        if meta.schema.starts_with("1.0.0") || meta.schema == "1.0.1" {
            Layout::Flat
        } else {
            Layout::Nested
        },
    );
    let mut parts = parts.into_iter();
    let mut trace = parts.next().map(Builder::into_trace).unwrap_or_default();
    for part in parts {
        if profile {
            eprintln!(
                "et-schema: merging {} strings, {} items, {} args, {} nodes at {:?}",
                part.strings.len(),
                part.items.len(),
                part.args.len(),
                part.nodes.len(),
                t0.elapsed()
            );
        }
        trace
            .absorb(part.into_trace())
            .map_err(|e| Error::TooLarge {
                path: source.to_string(),
                source: e,
            })?;
    }
    trace.meta = meta;
    trace.layout = layout;
    trace.source = source.to_string();
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
    if profile {
        eprintln!("et-schema: scan+nodes+merge {:?}", t0.elapsed());
    }
    if opts.validate {
        validate(&trace)?;
    }
    if profile {
        eprintln!("et-schema: total {:?}", t0.elapsed());
    }
    Ok(trace)
}

/// Checks structural invariants: unique ids, parents that exist, no parent cycles.
pub fn validate(t: &Trace) -> Result<()> {
    let path = || t.source.clone();
    let index = t.node_by_id();
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

fn scan_error(e: ScanError, bytes: &[u8], source: &str) -> Error {
    match e {
        ScanError::Syntax { offset, msg } => Error::Syntax {
            path: source.to_string(),
            offset: offset as u64,
            msg: msg.to_string(),
        },
        ScanError::Fallback => Error::Syntax {
            path: source.to_string(),
            offset: 0,
            msg: "internal: unconfirmed split".into(),
        },
        ScanError::Eof { offset, in_nodes } => {
            let (complete, last) = if in_nodes {
                complete_nodes_before(bytes, offset)
            } else {
                (0, String::new())
            };
            if offset == 0 || bytes.iter().all(|c| c.is_ascii_whitespace()) {
                return Error::NotATrace {
                    path: source.to_string(),
                    msg: "the input is empty".into(),
                };
            }
            Error::Truncated {
                path: source.to_string(),
                offset: offset as u64,
                context: if in_nodes {
                    "the nodes array"
                } else {
                    "the top-level object"
                },
                complete,
                last,
            }
        }
    }
}

/// For a truncated file: counts the complete node records before the cut and finds the last id.
fn complete_nodes_before(bytes: &[u8], _offset: usize) -> (usize, String) {
    // Re-scan the nodes array up to the cut, collecting complete elements.
    let Some(pos) = memchr::memmem::find(bytes, b"\"nodes\"") else {
        return (0, String::new());
    };
    let Some(open) = bytes[pos..].iter().position(|&c| c == b'[') else {
        return (0, String::new());
    };
    let mut i = pos + open + 1;
    let mut count = 0;
    let mut last = None;
    loop {
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b',') {
            i += 1;
        }
        match scan::skip_value(bytes, i) {
            Ok(end) => {
                #[derive(serde::Deserialize)]
                struct Id {
                    id: Option<u64>,
                }
                if let Ok(Id { id: Some(id) }) = serde_json::from_slice::<Id>(&bytes[i..end]) {
                    last = Some(id);
                }
                count += 1;
                i = end;
            }
            Err(_) => break,
        }
    }
    (
        count,
        last.map_or(String::new(), |id| format!(", the last one id {id}")),
    )
}

/// Per-thread parse state: its own interner and arenas, merged at the end.
#[derive(Default)]
struct Builder {
    strings: Interner,
    nodes: Vec<Node>,
    args: Vec<Arg>,
    items: Vec<Value>,
    tensors: Vec<TensorRef>,
    extra: Vec<ExtraAttr>,
    layout: Option<Layout>,
    /// Raw (untyped) values of the node being parsed; converted with the types at node end.
    raw: Vec<Value>,
    stack: Vec<Value>,
    types: FxHashMap<Sym, Option<Rc<ValueType>>>,
}

fn parse_chunk(
    bytes: &[u8],
    ranges: &[std::ops::Range<usize>],
    source: &str,
    fast: bool,
) -> Result<Builder> {
    let mut b = Builder::default();
    b.nodes.reserve(ranges.len());
    let mut acc = NodeAcc::default();
    let mut scratch = Vec::new();
    for r in ranges {
        parse_one(
            &mut b,
            &mut acc,
            &mut scratch,
            bytes,
            r.clone(),
            source,
            fast,
        )?;
    }
    Ok(b)
}

fn parse_one(
    b: &mut Builder,
    acc: &mut NodeAcc,
    scratch: &mut Vec<u8>,
    bytes: &[u8],
    r: std::ops::Range<usize>,
    source: &str,
    fast: bool,
) -> Result<()> {
    let text = &bytes[r.clone()];
    acc.clear();
    b.raw.clear();
    if !(fast && fast::node(text, 0, b, acc, scratch).is_ok_and(|end| end == text.len())) {
        // The visitors read it again, and say what is wrong if anything is.
        acc.clear();
        b.raw.clear();
        b.stack.clear();
        let mut de = serde_json::Deserializer::from_slice(text);
        let res = NodeSeed {
            b: &mut *b,
            acc: &mut *acc,
        }
        .deserialize(&mut de)
        .and_then(|()| de.end());
        if let Err(e) = res {
            return Err(node_error(e, text, r.start, acc, &b.strings, source));
        }
    }
    b.finish_node(acc, r.start as u64)
        .map_err(|msg| Error::Node {
            path: source.to_string(),
            node_id: acc.id,
            offset: r.start as u64,
            msg,
        })
}

/// Scans and parses the nodes array (from its `[` at `open`) on `threads` threads. Returns the
/// per-thread builders in order and the index after `]`, or `None` to fall back.
fn parse_parallel(
    bytes: &[u8],
    input: Option<&Input>,
    open: usize,
    threads: usize,
    source: &str,
    fast: bool,
) -> Option<(Vec<Builder>, usize)> {
    let first = scan::ws(bytes, open + 1);
    if bytes.get(first) == Some(&b']') {
        return Some((vec![Builder::default()], first + 1));
    }
    let len = bytes.len() - first;
    let mut starts = vec![first];
    for k in 1..threads {
        let guess = first + len / threads * k;
        // Objects inside a node (`attrs` entries) look like boundaries too: a candidate must
        // hold a whole node record (an object with an id and inputs). Probing a candidate
        // reads it to its end, and crafted nesting makes every candidate end at the end of the
        // file: the bytes probed per split are budgeted, and past the budget the serial path
        // (linear, and the one that gives precise errors) takes over.
        let mut budget = (len / threads).clamp(PROBE_MIN, PROBE_BUDGET);
        let window = budget;
        let mut from = guess;
        while let Some(s) = scan::find_boundary(bytes, from, window) {
            let window = &bytes[..bytes.len().min(s + budget)];
            let end = scan::skip_value(window, s).ok()?;
            budget = budget.saturating_sub(end - s);
            if looks_like_node(&bytes[s..end]) {
                if s > *starts.last().unwrap_or(&0) {
                    starts.push(s);
                }
                break;
            }
            if budget == 0 {
                return None;
            }
            from = s + 1;
        }
    }
    let results: Vec<Option<(Builder, usize)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..starts.len())
            .map(|k| {
                let (start, stop) = (starts[k], starts.get(k + 1).copied());
                spawn(s, move || {
                    parse_span(bytes, input, start, stop, source, fast)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    let mut parts = Vec::with_capacity(results.len());
    let mut end = 0;
    for r in results {
        let (b, e) = r?;
        parts.push(b);
        end = e;
    }
    Some((parts, end))
}

/// Bytes the parallel parser may read while looking for one split point: a thread's share of
/// the file, within these bounds. All probing then costs at most one more pass over the file,
/// which is also what falling back costs.
const PROBE_BUDGET: usize = 4 << 20;
const PROBE_MIN: usize = 4 << 10;

/// A parser thread with [`crate::PARSER_STACK`] bytes of stack, or, when no thread can be
/// made, the work already done on this one.
enum Spawned<'scope, T> {
    Thread(std::thread::ScopedJoinHandle<'scope, T>),
    Done(T),
}

impl<T> Spawned<'_, T> {
    fn join(self) -> std::thread::Result<T> {
        match self {
            Spawned::Thread(h) => h.join(),
            Spawned::Done(t) => Ok(t),
        }
    }
}

/// The closures only capture references and indices, so they are `Copy`: one copy goes to the
/// thread, the other runs here if the thread cannot be made.
fn spawn<'scope, T: Send + 'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    f: impl FnOnce() -> T + Send + Copy + 'scope,
) -> Spawned<'scope, T> {
    match std::thread::Builder::new()
        .name("et-parse".into())
        .stack_size(crate::PARSER_STACK)
        .spawn_scoped(s, f)
    {
        Ok(h) => Spawned::Thread(h),
        Err(_) => Spawned::Done(f()),
    }
}

/// Whether `record` (one JSON value) is a node record: an object with an id and inputs.
fn looks_like_node(record: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[allow(dead_code)]
        id: u64,
        #[allow(dead_code)]
        inputs: IgnoredAny,
    }
    serde_json::from_slice::<Probe>(record).is_ok()
}

thread_local! {
    /// The builder and node accumulator that [`NodeMarker`] parses into on this thread.
    static SINK: std::cell::Cell<Option<(*mut Builder, *mut NodeAcc)>> = const { std::cell::Cell::new(None) };
}

/// Parses one node into the thread's [`SINK`]. It exists so that serde_json's
/// `StreamDeserializer`, which reports where a value ends, can drive the node visitor: that
/// saves a separate structural pass over every record on the parallel path.
struct NodeMarker;

impl<'de> serde::Deserialize<'de> for NodeMarker {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<NodeMarker, D::Error> {
        let (b, acc) = SINK
            .with(|s| s.get())
            .ok_or_else(|| de::Error::custom("no node sink"))?;
        // SAFETY: `parse_span` sets SINK to pointers to its own locals for the duration of the
        // `next()` call that runs this, on this thread, and clears it before they go away; no
        // other reference to them is live meanwhile.
        let (b, acc) = unsafe { (&mut *b, &mut *acc) };
        NodeSeed { b, acc }.deserialize(d)?;
        Ok(NodeMarker)
    }
}

/// Parses elements from `start` until the index `stop` (exclusive, must be hit exactly) or the
/// closing `]` when `stop` is `None`.
fn parse_span(
    bytes: &[u8],
    input: Option<&Input>,
    start: usize,
    stop: Option<usize>,
    source: &str,
    fast: bool,
) -> Option<(Builder, usize)> {
    let mut b = Builder::default();
    let mut acc = NodeAcc::default();
    let mut scratch = Vec::new();
    let mut i = start;
    let mut released = start;
    loop {
        if bytes.get(i) != Some(&b'{') {
            return None;
        }
        if let Some(input) = input.filter(|_| i - released >= RELEASE_STEP) {
            input.release(released..i);
            released = i;
        }
        acc.clear();
        b.raw.clear();
        let read = fast
            .then(|| fast::node(bytes, i, &mut b, &mut acc, &mut scratch).ok())
            .flatten();
        let end = match read {
            Some(end) => end,
            None => {
                // The visitors, driven by a stream that says where the record ends.
                acc.clear();
                b.raw.clear();
                b.stack.clear();
                let mut stream =
                    serde_json::Deserializer::from_slice(&bytes[i..]).into_iter::<NodeMarker>();
                SINK.with(|s| s.set(Some((&mut b as *mut Builder, &mut acc as *mut NodeAcc))));
                let parsed = stream.next();
                SINK.with(|s| s.set(None));
                match parsed {
                    Some(Ok(NodeMarker)) => {}
                    _ => return None,
                }
                i + stream.byte_offset()
            }
        };
        b.finish_node(&mut acc, i as u64).ok()?;
        let _ = source;
        match next_element(bytes, end, stop) {
            Step::Next(j) => i = j,
            Step::Done(j) => return Some((b, j)),
            Step::Bad => return None,
        }
    }
}

/// How far a parser thread reads before it hands the pages behind it back ([`Input::release`]).
const RELEASE_STEP: usize = 4 << 20;

/// Where a span goes after the element that ends at `end`.
enum Step {
    /// The next element starts here.
    Next(usize),
    /// The span is done: the next span's start (`stop`), or after the array's `]`.
    Done(usize),
    /// Anything else: fall back.
    Bad,
}

fn next_element(bytes: &[u8], end: usize, stop: Option<usize>) -> Step {
    let j = scan::ws(bytes, end);
    match bytes.get(j) {
        Some(b',') => {
            let i = scan::ws(bytes, j + 1);
            match stop {
                Some(s) if i == s => Step::Done(i),
                Some(s) if i > s => Step::Bad,
                _ => Step::Next(i),
            }
        }
        Some(b']') if stop.is_none() => Step::Done(j + 1),
        _ => Step::Bad,
    }
}

/// Per-record parser timings for `cargo xtask bench parse` (feature `simd`): the nodes array's
/// records, found by the serial scan, parsed one by one on this thread by the serde_json
/// visitors, by the specialised record reader, by the same visitors over simd-json's tape
/// deserializer, and into simd-json's borrowed value (a lower bound for any walk over it).
/// Returns `(mode, nodes, seconds)`.
#[cfg(feature = "simd")]
#[doc(hidden)]
pub fn record_bench(bytes: &[u8]) -> Result<Vec<(&'static str, usize, f64)>> {
    let scan = scan::scan(bytes).map_err(|e| scan_error(e, bytes, "bench"))?;
    let syntax = |offset: usize, msg: String| Error::Syntax {
        path: "bench".into(),
        offset: offset as u64,
        msg,
    };
    let mut out = Vec::new();
    let t = std::time::Instant::now();
    let b = parse_chunk(bytes, &scan.nodes, "bench", false)?;
    out.push((
        "serde_json visitors",
        b.nodes.len(),
        t.elapsed().as_secs_f64(),
    ));
    drop(b);
    let t = std::time::Instant::now();
    let b = parse_chunk(bytes, &scan.nodes, "bench", true)?;
    out.push(("record reader", b.nodes.len(), t.elapsed().as_secs_f64()));
    drop(b);
    let mut buf = Vec::new();
    let mut buffers = simd_json::Buffers::new(64 << 10);
    let t = std::time::Instant::now();
    let mut b = Builder::default();
    let mut acc = NodeAcc::default();
    for r in &scan.nodes {
        buf.clear();
        buf.extend_from_slice(&bytes[r.clone()]);
        acc.clear();
        b.raw.clear();
        let mut de = simd_json::Deserializer::from_slice_with_buffers(&mut buf, &mut buffers)
            .map_err(|e| syntax(r.start, e.to_string()))?;
        NodeSeed {
            b: &mut b,
            acc: &mut acc,
        }
        .deserialize(&mut de)
        .map_err(|e| syntax(r.start, e.to_string()))?;
        b.finish_node(&mut acc, r.start as u64)
            .map_err(|msg| syntax(r.start, msg))?;
    }
    out.push((
        "simd-json tape + visitors",
        b.nodes.len(),
        t.elapsed().as_secs_f64(),
    ));
    drop(b);
    let t = std::time::Instant::now();
    let mut n = 0;
    for r in &scan.nodes {
        buf.clear();
        buf.extend_from_slice(&bytes[r.clone()]);
        let v = simd_json::value::borrowed::to_value_with_buffers(&mut buf, &mut buffers)
            .map_err(|e| syntax(r.start, e.to_string()))?;
        n += usize::from(matches!(v, simd_json::BorrowedValue::Object(_)));
    }
    out.push((
        "simd-json borrowed value only",
        n,
        t.elapsed().as_secs_f64(),
    ));
    Ok(out)
}

/// How many of the node records in `bytes` the specialised reader hands to the serde_json
/// visitors (gives up on); for tests: on real traces this is 0.
#[doc(hidden)]
pub fn records_read_by_visitors(bytes: &[u8]) -> Result<usize> {
    let scan = scan::scan(bytes).map_err(|e| scan_error(e, bytes, "input"))?;
    let (mut b, mut acc, mut scratch) = (Builder::default(), NodeAcc::default(), Vec::new());
    let mut n = 0;
    for r in &scan.nodes {
        acc.clear();
        b.raw.clear();
        b.stack.clear();
        let text = &bytes[r.clone()];
        if !fast::node(text, 0, &mut b, &mut acc, &mut scratch).is_ok_and(|e| e == text.len()) {
            n += 1;
        }
    }
    Ok(n)
}

/// A parser's message fit for an error: serde_json quotes whole input strings (a 2 GiB one
/// too), so long messages keep their start and end; the recursion limit is said in words.
pub(crate) fn serde_message(msg: &str) -> String {
    let msg = msg.rsplit_once(" at line ").map_or(msg, |(m, _)| m);
    if msg.starts_with("recursion limit exceeded") {
        return format!(
            "values nested deeper than {} levels (recursion limit exceeded)",
            crate::MAX_NESTING
        );
    }
    if msg.len() <= MSG_MAX {
        return msg.to_string();
    }
    let mut head = MSG_MAX * 3 / 4;
    while !msg.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = msg.len() - MSG_MAX / 4;
    while !msg.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{} [... {} bytes ...] {}",
        &msg[..head],
        tail - head,
        &msg[tail..]
    )
}

fn node_error(
    e: serde_json::Error,
    text: &[u8],
    start: usize,
    acc: &NodeAcc,
    strings: &Interner,
    source: &str,
) -> Error {
    // serde_json reports line/column within the record; turn that into a file offset.
    let (line, col) = (e.line(), e.column());
    let mut off = 0usize;
    let mut l = 1;
    while l < line {
        match memchr::memchr(b'\n', &text[off..]) {
            Some(k) => off += k + 1,
            None => break,
        }
        l += 1;
    }
    let offset = (start + off + col.saturating_sub(1)) as u64;
    let mut msg = serde_message(&e.to_string());
    // The field whose value was being read, if the error is inside one.
    let field = match acc.field {
        FieldName::None => None,
        FieldName::Known(f) => Some(f),
        FieldName::Other(sym) => Some(strings.get(sym)),
    };
    if let Some(f) = field {
        msg = format!("field \"{}\": {msg}", clip(f, MSG_MAX));
    }
    let id = acc.id.or_else(|| {
        #[derive(serde::Deserialize)]
        struct Id {
            id: Option<u64>,
        }
        serde_json::from_slice::<Id>(text).ok().and_then(|x| x.id)
    });
    if e.is_syntax() || e.is_eof() {
        Error::Syntax {
            path: source.to_string(),
            offset,
            msg: match id {
                Some(i) => format!("in node {i}, {msg}"),
                None => msg,
            },
        }
    } else {
        Error::Node {
            path: source.to_string(),
            node_id: id,
            offset,
            msg,
        }
    }
}

#[derive(Default)]
struct IoAcc {
    values: Vec<Value>,
    shapes: Vec<Value>,
    types: Vec<Sym>,
    strides: Option<Vec<Value>>,
}

impl IoAcc {
    fn clear(&mut self) {
        self.values.clear();
        self.shapes.clear();
        self.types.clear();
        self.strides = None;
    }
}

/// The key of a node record whose value is being read, for errors.
#[derive(Clone, Copy, Default)]
enum FieldName {
    #[default]
    None,
    Known(&'static str),
    Other(Sym),
}

#[derive(Default)]
struct NodeAcc {
    field: FieldName,
    id: Option<u64>,
    name: Option<Sym>,
    parent: Option<u64>,
    rf_id: Option<u64>,
    fw_parent: Option<u64>,
    seq_id: Option<i64>,
    scope: Option<u64>,
    tid: Option<u64>,
    fw_tid: Option<u64>,
    op_schema: Option<Sym>,
    kernel_backend: Option<Sym>,
    kernel_file: Option<Sym>,
    inputs: IoAcc,
    outputs: IoAcc,
    extra: Vec<ExtraAttr>,
    has_attrs: bool,
    layout: Option<Layout>,
}

impl NodeAcc {
    fn clear(&mut self) {
        let (mut i, mut o, mut e) = (
            std::mem::take(&mut self.inputs),
            std::mem::take(&mut self.outputs),
            std::mem::take(&mut self.extra),
        );
        i.clear();
        o.clear();
        e.clear();
        *self = NodeAcc {
            inputs: i,
            outputs: o,
            extra: e,
            ..Default::default()
        };
    }
}

impl Builder {
    fn type_of(&mut self, ty: Sym) -> Option<Rc<ValueType>> {
        if let Some(t) = self.types.get(&ty) {
            return t.clone();
        }
        let s = self.strings.get(ty);
        let parsed = if s.contains("Tensor") {
            ValueType::parse(s).ok().map(Rc::new)
        } else {
            None
        };
        self.types.insert(ty, parsed.clone());
        parsed
    }

    /// Copies a raw value into the arenas, decoding tensor tuples where the type says so.
    fn convert(&mut self, v: Value, ty: Option<&ValueType>) -> Value {
        let Value::List { start, len } = v else {
            return v;
        };
        let items = start as usize..(start + len) as usize;
        if let Some(ValueType::Tensor { .. } | ValueType::UndefinedTensor) = ty {
            if let Some(t) = self.tensor_tuple(&self.raw[items.clone()]) {
                self.tensors.push(t);
                return Value::Tensor(self.tensors.len() as u32 - 1);
            }
        }
        let elems: &[ValueType] = match ty {
            Some(ValueType::List(e) | ValueType::Tuple(e)) => e,
            _ => &[],
        };
        let base = self.stack.len();
        for (k, i) in items.enumerate() {
            let x = self.raw[i];
            let c = self.convert(x, elems.get(k));
            self.stack.push(c);
        }
        let start = self.items.len() as u32;
        self.items.extend(self.stack.drain(base..));
        Value::List { start, len }
    }

    fn tensor_tuple(&self, f: &[Value]) -> Option<TensorRef> {
        let int = |v: &Value| match *v {
            Value::Int(i) if i >= 0 => Some(i as u64),
            Value::UInt(u) => Some(u),
            _ => None,
        };
        if f.len() != 5 && f.len() != 6 {
            return None;
        }
        let device = match f.get(5) {
            Some(Value::Str(s)) => Some(*s),
            Some(_) => return None,
            None => None,
        };
        Some(TensorRef {
            id: int(&f[0])?,
            storage: int(&f[1])?,
            offset: int(&f[2])?,
            numel: int(&f[3])?,
            itemsize: int(&f[4])?,
            device,
        })
    }

    fn push_args(&mut self, io: &IoAcc) -> std::ops::Range<u32> {
        let start = self.args.len() as u32;
        for (k, &v) in io.values.iter().enumerate() {
            let ty = io.types.get(k).copied().unwrap_or(Interner::EMPTY);
            let parsed = self.type_of(ty);
            let value = self.convert(v, parsed.as_deref());
            let shape = io
                .shapes
                .get(k)
                .map_or(Value::List { start: 0, len: 0 }, |&s| self.convert(s, None));
            let strides = io
                .strides
                .as_ref()
                .and_then(|s| s.get(k))
                .map(|&s| self.convert(s, None));
            self.args.push(Arg {
                value,
                shape,
                ty,
                strides,
            });
        }
        start..self.args.len() as u32
    }

    fn finish_node(&mut self, acc: &mut NodeAcc, offset: u64) -> Result<(), String> {
        let id = acc.id.ok_or("node has no \"id\"")?;
        for (what, io) in [("inputs", &acc.inputs), ("outputs", &acc.outputs)] {
            if io.types.len() != io.values.len() {
                return Err(format!(
                    "{what}: {} values but {} types",
                    io.values.len(),
                    io.types.len()
                ));
            }
            if !io.shapes.is_empty() && io.shapes.len() != io.values.len() {
                return Err(format!(
                    "{what}: {} values but {} shapes",
                    io.values.len(),
                    io.shapes.len()
                ));
            }
        }
        // The arenas are indexed with 32 bits: each node's values must fit in what is left
        // (every raw value lands in at most one of them).
        let fits = |len: usize, add: usize| len.checked_add(add).is_some_and(|n| n <= ARENA_MAX);
        let values = acc.inputs.values.len() + acc.outputs.values.len();
        for (what, len, add) in [
            ("arguments", self.args.len(), values),
            ("list items", self.items.len(), self.raw.len()),
            ("tensors", self.tensors.len(), self.raw.len()),
            ("attributes", self.extra.len(), acc.extra.len()),
        ] {
            if !fits(len, add) {
                return Err(format!(
                    "more than {ARENA_MAX} {what} in one trace: the model indexes its arenas with 32 bits"
                ));
            }
        }
        if let Some(l) = acc.layout {
            self.layout.get_or_insert(l);
        }
        let inputs = self.push_args(&acc.inputs);
        let outputs = self.push_args(&acc.outputs);
        let estart = self.extra.len() as u32;
        for e in acc.extra.drain(..) {
            let value = self.convert(e.value, None);
            self.extra.push(ExtraAttr { value, ..e });
        }
        let mut flags = 0;
        if acc.inputs.strides.is_some() {
            flags |= NodeFlags::INPUT_STRIDES;
        }
        if acc.outputs.strides.is_some() {
            flags |= NodeFlags::OUTPUT_STRIDES;
        }
        if acc.has_attrs {
            flags |= NodeFlags::HAS_ATTRS;
        }
        self.nodes.push(Node {
            id,
            name: acc.name.unwrap_or(Interner::EMPTY),
            parent: acc.parent,
            rf_id: acc.rf_id,
            fw_parent: acc.fw_parent,
            seq_id: acc.seq_id,
            scope: acc.scope,
            tid: acc.tid,
            fw_tid: acc.fw_tid,
            op_schema: acc.op_schema,
            kernel_backend: acc.kernel_backend,
            kernel_file: acc.kernel_file,
            inputs,
            outputs,
            extra: estart..self.extra.len() as u32,
            flags: NodeFlags(flags),
            offset,
        });
        Ok(())
    }

    fn into_trace(self) -> Trace {
        Trace {
            strings: self.strings,
            nodes: self.nodes,
            args: self.args,
            items: self.items,
            tensors: self.tensors,
            extra_attrs: self.extra,
            layout: self.layout.unwrap_or_default(),
            ..Trace::default()
        }
    }
}

// ---- serde visitors -------------------------------------------------------------------------

/// A raw JSON value into the node-local arena.
struct RawSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
}

impl<'de> DeserializeSeed<'de> for RawSeed<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RawSeed<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::Str(self.strings.intern(v)))
    }
    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value, A::Error> {
        let base = self.stack.len();
        while let Some(v) = seq.next_element_seed(RawSeed {
            strings: self.strings,
            raw: self.raw,
            stack: self.stack,
        })? {
            self.stack.push(v);
        }
        if self.raw.len() + (self.stack.len() - base) > ARENA_MAX {
            return Err(de::Error::custom(format!(
                "more than {ARENA_MAX} values in one node record"
            )));
        }
        let start = self.raw.len() as u32;
        let len = (self.stack.len() - base) as u32;
        self.raw.extend(self.stack.drain(base..));
        Ok(Value::List { start, len })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Value, A::Error> {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(Value::Raw(self.strings.intern(&v.to_string())))
    }
}

/// A sequence of raw values appended to `out`.
struct RawListSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
    out: &'a mut Vec<Value>,
}

impl<'de> DeserializeSeed<'de> for RawListSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RawListSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(v) = seq.next_element_seed(RawSeed {
            strings: self.strings,
            raw: self.raw,
            stack: self.stack,
        })? {
            self.out.push(v);
        }
        Ok(())
    }
}

/// A list of strings (type strings) interned into `out`.
struct SymListSeed<'a> {
    strings: &'a mut Interner,
    out: &'a mut Vec<Sym>,
}

impl<'de> DeserializeSeed<'de> for SymListSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for SymListSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of type strings")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(s) = seq.next_element_seed(SymSeed {
            strings: self.strings,
        })? {
            self.out.push(s);
        }
        Ok(())
    }
}

/// A map key matched against a fixed list without interning; unknown keys give `None`.
struct NameSeed(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Option<usize>, E> {
        Ok(self.0.iter().position(|k| *k == v))
    }
}

struct SymSeed<'a> {
    strings: &'a mut Interner,
}

impl<'de> DeserializeSeed<'de> for SymSeed<'_> {
    type Value = Sym;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Sym, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for SymSeed<'_> {
    type Value = Sym;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Sym, E> {
        Ok(self.strings.intern(v))
    }
}

#[derive(Clone, Copy)]
enum Field {
    Id,
    Name,
    CtrlDeps,
    Parent,
    RfId,
    FwParent,
    SeqId,
    Scope,
    Tid,
    FwTid,
    OpSchema,
    KernelBackend,
    KernelFile,
    Inputs,
    Outputs,
    InputShapes,
    InputTypes,
    InputStrides,
    OutputShapes,
    OutputTypes,
    OutputStrides,
    Attrs,
    Other,
}

/// The key of a known field (the inverse of [`field`]).
fn field_name(f: Field) -> &'static str {
    match f {
        Field::Id => "id",
        Field::Name => "name",
        Field::CtrlDeps => "ctrl_deps",
        Field::Parent => "parent",
        Field::RfId => "rf_id",
        Field::FwParent => "fw_parent",
        Field::SeqId => "seq_id",
        Field::Scope => "scope",
        Field::Tid => "tid",
        Field::FwTid => "fw_tid",
        Field::OpSchema => "op_schema",
        Field::KernelBackend => "kernel_backend",
        Field::KernelFile => "kernel_file",
        Field::Inputs => "inputs",
        Field::Outputs => "outputs",
        Field::InputShapes => "input_shapes",
        Field::InputTypes => "input_types",
        Field::InputStrides => "input_strides",
        Field::OutputShapes => "output_shapes",
        Field::OutputTypes => "output_types",
        Field::OutputStrides => "output_strides",
        Field::Attrs => "attrs",
        Field::Other => "",
    }
}

fn field(s: &str) -> Field {
    match s {
        "id" => Field::Id,
        "name" => Field::Name,
        "ctrl_deps" => Field::CtrlDeps,
        "parent" => Field::Parent,
        "rf_id" => Field::RfId,
        "fw_parent" => Field::FwParent,
        "seq_id" => Field::SeqId,
        "scope" => Field::Scope,
        "tid" => Field::Tid,
        "fw_tid" => Field::FwTid,
        "op_schema" => Field::OpSchema,
        "kernel_backend" => Field::KernelBackend,
        "kernel_file" => Field::KernelFile,
        "inputs" => Field::Inputs,
        "outputs" => Field::Outputs,
        "input_shapes" => Field::InputShapes,
        "input_types" => Field::InputTypes,
        "input_strides" => Field::InputStrides,
        "output_shapes" => Field::OutputShapes,
        "output_types" => Field::OutputTypes,
        "output_strides" => Field::OutputStrides,
        "attrs" => Field::Attrs,
        _ => Field::Other,
    }
}

/// A map key: borrowed when the input allows, and its field.
struct KeySeed<'a> {
    strings: &'a mut Interner,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = (Field, Sym);
    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<(Field, Sym), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = (Field, Sym);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<(Field, Sym), E> {
        let f = field(v);
        // Only unknown keys need their name kept.
        let sym = if matches!(f, Field::Other) {
            self.strings.intern(v)
        } else {
            Interner::EMPTY
        };
        Ok((f, sym))
    }
}

struct NodeSeed<'a> {
    b: &'a mut Builder,
    acc: &'a mut NodeAcc,
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

/// Stores a node record's integer field `f` (one of the ids, `seq_id`, `scope`, `tid`...);
/// the error says what the value must be.
fn store_scalar(acc: &mut NodeAcc, f: Field, v: Value) -> std::result::Result<(), String> {
    if let Field::SeqId = f {
        return match v {
            Value::Int(i) => {
                acc.seq_id = Some(i);
                Ok(())
            }
            _ => Err("\"seq_id\" must be an integer".into()),
        };
    }
    let slot = match f {
        Field::Id => &mut acc.id,
        Field::Parent => {
            acc.layout.get_or_insert(Layout::Flat);
            &mut acc.parent
        }
        Field::CtrlDeps => {
            acc.layout.get_or_insert(Layout::Nested);
            &mut acc.parent
        }
        Field::RfId => &mut acc.rf_id,
        Field::FwParent => &mut acc.fw_parent,
        Field::Scope => &mut acc.scope,
        Field::Tid => &mut acc.tid,
        Field::FwTid => &mut acc.fw_tid,
        _ => return Err(format!("\"{}\" is not an integer field", field_name(f))),
    };
    *slot = Some(match v {
        Value::Int(i) if i >= 0 => i as u64,
        Value::UInt(u) => u,
        _ => {
            return Err(format!(
                "\"{}\" must be a non-negative integer",
                field_name(f)
            ))
        }
    });
    Ok(())
}

impl<'de> Visitor<'de> for NodeSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a node object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let NodeSeed { b, acc } = self;
        while let Some((f, key)) = map.next_key_seed(KeySeed {
            strings: &mut b.strings,
        })? {
            acc.field = match f {
                Field::Other => FieldName::Other(key),
                known => FieldName::Known(field_name(known)),
            };
            let Builder {
                strings,
                raw,
                stack,
                ..
            } = &mut *b;
            macro_rules! raw_value {
                () => {
                    map.next_value_seed(RawSeed {
                        strings,
                        raw,
                        stack,
                    })?
                };
            }
            match f {
                Field::Name => acc.name = Some(map.next_value_seed(SymSeed { strings })?),
                Field::OpSchema => acc.op_schema = Some(map.next_value_seed(SymSeed { strings })?),
                Field::KernelBackend => {
                    acc.kernel_backend = Some(map.next_value_seed(SymSeed { strings })?)
                }
                Field::KernelFile => {
                    acc.kernel_file = Some(map.next_value_seed(SymSeed { strings })?)
                }
                Field::Inputs | Field::Outputs => {
                    let io = if matches!(f, Field::Inputs) {
                        &mut acc.inputs
                    } else {
                        &mut acc.outputs
                    };
                    let layout = map.next_value_seed(IoSeed {
                        strings,
                        raw,
                        stack,
                        io,
                    })?;
                    acc.layout.get_or_insert(layout);
                }
                Field::InputShapes => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: &mut acc.inputs.shapes,
                })?,
                Field::OutputShapes => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: &mut acc.outputs.shapes,
                })?,
                Field::InputTypes => map.next_value_seed(SymListSeed {
                    strings,
                    out: &mut acc.inputs.types,
                })?,
                Field::OutputTypes => map.next_value_seed(SymListSeed {
                    strings,
                    out: &mut acc.outputs.types,
                })?,
                Field::InputStrides => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: acc.inputs.strides.get_or_insert_with(Vec::new),
                })?,
                Field::OutputStrides => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: acc.outputs.strides.get_or_insert_with(Vec::new),
                })?,
                Field::Attrs => {
                    acc.has_attrs = true;
                    acc.layout.get_or_insert(Layout::Nested);
                    map.next_value_seed(AttrsSeed {
                        strings,
                        raw,
                        stack,
                        acc,
                    })?
                }
                Field::Other => {
                    let value = raw_value!();
                    acc.extra.push(ExtraAttr {
                        name: key,
                        ty: None,
                        value,
                    });
                }
                // The integer fields (id, parent, rf_id, seq_id...); store_scalar refuses any other.
                f => store_scalar(acc, f, raw_value!()).map_err(de::Error::custom)?,
            }
            acc.field = FieldName::None;
        }
        Ok(())
    }
}

/// `inputs`/`outputs`: a list (flat layout) or `{values, shapes, types, strides}` (nested).
struct IoSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
    io: &'a mut IoAcc,
}

impl<'de> DeserializeSeed<'de> for IoSeed<'_> {
    type Value = Layout;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Layout, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IoSeed<'_> {
    type Value = Layout;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of values or an object {values, shapes, types}")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Layout, A::Error> {
        RawListSeed {
            strings: self.strings,
            raw: self.raw,
            stack: self.stack,
            out: &mut self.io.values,
        }
        .visit_seq(seq)?;
        Ok(Layout::Flat)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Layout, A::Error> {
        let IoSeed {
            strings,
            raw,
            stack,
            io,
        } = self;
        while let Some(key) =
            map.next_key_seed(NameSeed(&["values", "shapes", "types", "strides"]))?
        {
            match key {
                Some(0) => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: &mut io.values,
                })?,
                Some(1) => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: &mut io.shapes,
                })?,
                Some(2) => map.next_value_seed(SymListSeed {
                    strings,
                    out: &mut io.types,
                })?,
                Some(3) => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: io.strides.get_or_insert_with(Vec::new),
                })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Layout::Nested)
    }
}

/// The nested layout's `attrs: [{name, type, value}]`.
struct AttrsSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
    acc: &'a mut NodeAcc,
}

impl<'de> DeserializeSeed<'de> for AttrsSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for AttrsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of {name, type, value} attributes")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let AttrsSeed {
            strings,
            raw,
            stack,
            acc,
        } = self;
        while let Some(a) = seq.next_element_seed(AttrSeed {
            strings,
            raw,
            stack,
        })? {
            store_attr(acc, strings, a);
        }
        Ok(())
    }
}

/// Puts one `{name, type, value}` attribute where it belongs: known attributes go to fields
/// when their value has the expected kind; anything else is kept verbatim so that nothing is
/// lost.
fn store_attr(acc: &mut NodeAcc, strings: &mut Interner, a: RawAttr) {
    // Indices into ATTR_WORDS: the names and types the observer writes on every node.
    const UINT64: u8 = 9;
    const INT64: u8 = 10;
    const STRING: u8 = 11;
    let stored = match (a.name, a.ty, a.value) {
        (Word::Known(n @ (0 | 1 | 3 | 4 | 5)), Word::Known(UINT64), v) => {
            let slot = match n {
                0 => &mut acc.rf_id,
                1 => &mut acc.fw_parent,
                3 => &mut acc.scope,
                4 => &mut acc.tid,
                _ => &mut acc.fw_tid,
            };
            let v = match v {
                Value::Int(i) if i >= 0 => Some(i as u64),
                Value::UInt(u) => Some(u),
                _ => None,
            };
            v.is_some() && slot.is_none() && {
                *slot = v;
                true
            }
        }
        (Word::Known(n @ 6..=8), Word::Known(STRING), Value::Str(v)) => {
            let slot = match n {
                6 => &mut acc.op_schema,
                7 => &mut acc.kernel_backend,
                _ => &mut acc.kernel_file,
            };
            slot.is_none() && {
                *slot = Some(v);
                true
            }
        }
        (Word::Known(2), Word::Known(INT64), Value::Int(i)) if acc.seq_id.is_none() => {
            acc.seq_id = Some(i);
            true
        }
        _ => false,
    };
    if !stored {
        let (name, ty) = (a.name.sym(strings), a.ty.sym(strings));
        acc.extra.push(ExtraAttr {
            name,
            ty: Some(ty),
            value: a.value,
        });
    }
}

struct AttrSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
}

struct RawAttr {
    name: Word,
    ty: Word,
    value: Value,
}

/// Attribute names and types the observer writes on every node: matched without interning.
const ATTR_WORDS: &[&str] = &[
    "rf_id",
    "fw_parent",
    "seq_id",
    "scope",
    "tid",
    "fw_tid",
    "op_schema",
    "kernel_backend",
    "kernel_file",
    "uint64",
    "int64",
    "string",
    "tensor_range",
];

/// A string that is one of [`ATTR_WORDS`] or else interned.
#[derive(Clone, Copy)]
enum Word {
    Known(u8),
    Other(Sym),
}

impl Word {
    /// `s` as one of [`ATTR_WORDS`], or interned.
    #[inline]
    fn of(s: &str, strings: &mut Interner) -> Word {
        let known = match s {
            "rf_id" => 0,
            "fw_parent" => 1,
            "seq_id" => 2,
            "scope" => 3,
            "tid" => 4,
            "fw_tid" => 5,
            "op_schema" => 6,
            "kernel_backend" => 7,
            "kernel_file" => 8,
            "uint64" => 9,
            "int64" => 10,
            "string" => 11,
            "tensor_range" => 12,
            _ => return Word::Other(strings.intern(s)),
        };
        debug_assert_eq!(ATTR_WORDS[known as usize], s);
        Word::Known(known)
    }
    fn sym(&self, strings: &mut Interner) -> Sym {
        match *self {
            Word::Known(i) => strings.intern(ATTR_WORDS[i as usize]),
            Word::Other(s) => s,
        }
    }
}

struct WordSeed<'a> {
    strings: &'a mut Interner,
}

impl<'de> DeserializeSeed<'de> for WordSeed<'_> {
    type Value = Word;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Word, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for WordSeed<'_> {
    type Value = Word;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Word, E> {
        Ok(Word::of(v, self.strings))
    }
}

impl<'de> DeserializeSeed<'de> for AttrSeed<'_> {
    type Value = RawAttr;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<RawAttr, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AttrSeed<'_> {
    type Value = RawAttr;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an attribute {name, type, value}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<RawAttr, A::Error> {
        let AttrSeed {
            strings,
            raw,
            stack,
        } = self;
        let (mut name, mut ty, mut value) = (None, None, None);
        while let Some(key) = map.next_key_seed(NameSeed(&["name", "type", "value"]))? {
            match key {
                Some(0) => name = Some(map.next_value_seed(WordSeed { strings })?),
                Some(1) => ty = Some(map.next_value_seed(WordSeed { strings })?),
                Some(2) => {
                    value = Some(map.next_value_seed(RawSeed {
                        strings,
                        raw,
                        stack,
                    })?)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(RawAttr {
            name: name.ok_or_else(|| de::Error::custom("attribute without \"name\""))?,
            ty: ty.unwrap_or(Word::Other(Interner::EMPTY)),
            value: value.unwrap_or(Value::Null),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_the_environment_read_as_binary_multiples() {
        assert_eq!(parse_size("17179869184"), Some(16 << 30));
        assert_eq!(parse_size("16G"), Some(16 << 30));
        assert_eq!(parse_size(" 16 GiB "), Some(16 << 30));
        assert_eq!(parse_size("512m"), Some(512 << 20));
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("0"), Some(0));
        for bad in ["", "lots", "-1G", "1Q", "99999999999999T", "1e9"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_default_decompression_limit_follows_the_compressed_size() {
        // Small files: the floor; bombs (~1000x) of a few MB stop at 1 GiB.
        assert_eq!(default_max_decompressed(32), 1 << 30);
        assert_eq!(default_max_decompressed(4 << 20), 1 << 30);
        // Real traces compress 10-30x: well inside 128x.
        assert_eq!(default_max_decompressed(64 << 20), 8 << 30);
        assert_eq!(default_max_decompressed(1 << 40), DEFAULT_MAX_DECOMPRESSED);
        let (limit, why) = ReadOptions {
            max_decompressed: Some(5),
        }
        .limit(100)
        .unwrap();
        assert_eq!((limit, why.as_str()), (5, "the limit set by the caller"));
    }

    #[test]
    fn serde_messages_are_cut_in_the_middle_and_name_the_depth_limit() {
        let long = format!(
            "invalid type: string \"{}\", expected u64",
            "9".repeat(1 << 20)
        );
        let m = serde_message(&long);
        assert!(m.len() < 2 * MSG_MAX, "{}", m.len());
        assert!(m.starts_with("invalid type: string \"999"), "{m}");
        assert!(m.ends_with("\", expected u64"), "{m}");
        assert!(
            serde_message("recursion limit exceeded at line 1 column 300")
                .contains("nested deeper than 128 levels")
        );
        assert_eq!(
            serde_message("expected value at line 3 column 4"),
            "expected value"
        );
    }

    #[test]
    fn attribute_words_are_their_own_index() {
        let mut strings = Interner::default();
        for (i, w) in ATTR_WORDS.iter().enumerate() {
            assert!(
                matches!(Word::of(w, &mut strings), Word::Known(k) if k as usize == i),
                "{w}"
            );
        }
        assert!(matches!(Word::of("rf_i", &mut strings), Word::Other(_)));
    }

    #[test]
    fn field_names_are_the_keys_they_come_from() {
        for k in [
            "id",
            "name",
            "ctrl_deps",
            "parent",
            "rf_id",
            "fw_parent",
            "seq_id",
            "scope",
            "tid",
            "fw_tid",
            "op_schema",
            "kernel_backend",
            "kernel_file",
            "inputs",
            "outputs",
            "input_shapes",
            "input_types",
            "input_strides",
            "output_shapes",
            "output_types",
            "output_strides",
            "attrs",
        ] {
            assert_eq!(field_name(field(k)), k);
        }
    }
}
