//! One measured parse of a trace file in a fresh process, so that peak RSS is this parse's own.
//! Prints one JSON line: bytes, seconds (read+decompress+parse+validate), MB/s, peak RSS.
//! `cargo xtask bench parse` runs it beside Python's `json.load` of the same file.

use std::time::Instant;

fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: parse-bench TRACE [threads]");
        std::process::exit(2);
    };
    let threads = std::env::args()
        .nth(2)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let t0 = Instant::now();
    // As `mystique` reads: a plain file is mapped, and its pages handed back as parsed.
    let bytes = match et_schema::open_input(
        std::path::Path::new(&path),
        &et_schema::ReadOptions::default(),
    ) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let read_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let opts = et_schema::ParseOptions {
        threads,
        validate: true,
        ..Default::default()
    };
    let trace = match et_schema::parse_input(&bytes, &path, &opts) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let parse_s = t1.elapsed().as_secs_f64();
    let parse_rss = peak_rss_bytes();
    let n = bytes.len();
    drop(bytes);
    // Graph build + replay set + tensor analysis, the work every command does after parsing.
    let t2 = Instant::now();
    let (ops, edges) = {
        let g = et_graph::Graph::new(&trace);
        let set = g.replay_set(None);
        let tensors = g.tensors(&set);
        (set.ops.len(), tensors.edges.len())
    };
    let graph_s = t2.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "bytes": n,
            "nodes": trace.nodes.len(),
            "read_s": read_s,
            "parse_s": parse_s,
            "mb_per_s": n as f64 / 1e6 / parse_s,
            "total_mb_per_s": n as f64 / 1e6 / (read_s + parse_s),
            "graph_s": graph_s,
            "replay_ops": ops,
            "data_edges": edges,
            "model_bytes": trace.heap_bytes(),
            "peak_rss": peak_rss_bytes(),
            "peak_rss_after_parse": parse_rss,
        })
    );
}
