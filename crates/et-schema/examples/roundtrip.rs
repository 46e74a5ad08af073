//! Writes a trace back out in its own layout: `roundtrip IN OUT`. Handy to check losslessness.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: roundtrip IN OUT");
        std::process::exit(2);
    }
    match et_schema::read_trace(std::path::Path::new(&args[1])) {
        Ok(t) => std::fs::write(&args[2], et_schema::write_trace_to_vec(&t)).expect("write"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
