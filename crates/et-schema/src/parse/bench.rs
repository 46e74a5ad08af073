//! Hooks for the parse benchmark and the reader's tests (cargo feature `bench-hooks`): the node
//! readers run record by record.

use super::errors::scan_error;
use super::fast;
use super::node::{Builder, NodeAcc};
#[cfg(feature = "simd")]
use super::{parallel::parse_chunk, seeds::NodeSeed};
#[cfg(feature = "simd")]
use crate::error::Error;
use crate::error::Result;
use crate::scan;
#[cfg(feature = "simd")]
use serde::de::DeserializeSeed;

/// Per-record parser timings for `cargo xtask bench parse` (feature `simd`): the nodes array's
/// records, found by the serial scan, parsed one by one on this thread by the serde_json
/// visitors, by the specialised record reader, by the same visitors over simd-json's tape
/// deserializer, and into simd-json's borrowed value (a lower bound for any walk over it).
/// Returns `(mode, nodes, seconds)`.
#[cfg(feature = "simd")]
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
