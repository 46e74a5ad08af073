//! Per-record parse timings (feature `simd` of et-schema): today's serde_json visitors against
//! simd-json on each node record, one thread, the same records. `cargo xtask bench parse`
//! prints them. Prints one JSON line.

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: record-bench TRACE");
        std::process::exit(2);
    };
    let bytes = match et_schema::read_input(std::path::Path::new(&path)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    match et_schema::record_bench(&bytes) {
        Ok(rows) => {
            let rows: Vec<_> = rows
                .into_iter()
                .map(|(mode, nodes, s)| serde_json::json!({"mode": mode, "nodes": nodes, "s": s}))
                .collect();
            println!(
                "{}",
                serde_json::json!({"bytes": bytes.len(), "rows": rows})
            );
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
