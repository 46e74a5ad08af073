//! Parsing the nodes array on threads: chunks of the records the serial scan found, or spans
//! from guessed split points, each thread confirming the next one's start by arriving there.

use super::errors::node_error;
use super::fast;
use super::input::Input;
use super::node::{Builder, NodeAcc};
use super::seeds::NodeSeed;
use crate::error::{Error, Result};
use crate::scan;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny};

/// Parses the node records at `ranges` (from the serial scan) in `threads` chunks, one thread
/// each when there is more than one. Returns the chunks' builders in order.
pub(super) fn parse_ranges(
    bytes: &[u8],
    ranges: &[std::ops::Range<usize>],
    threads: usize,
    source: &str,
    fast: bool,
) -> Result<Vec<Builder>> {
    let chunk = ranges.len().div_ceil(threads.max(1)).max(1);
    let chunks: Vec<&[std::ops::Range<usize>]> = ranges.chunks(chunk).collect();
    if chunks.len() <= 1 {
        return Ok(vec![parse_chunk(
            bytes,
            chunks.first().copied().unwrap_or(&[]),
            source,
            fast,
        )?]);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|r| spawn(s, move || parse_chunk(bytes, r, source, fast)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Result<Vec<_>>>()
    })
}

/// Parses the node records at `ranges` on this thread into one builder.
pub(super) fn parse_chunk(
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

/// Parses the node record at `r` into `b`: the specialised reader first (when `fast`), the
/// visitors when it gives up.
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
pub(super) fn parse_parallel(
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

/// The step after the element that ends at `end`; `stop` is the next span's start, if any.
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
