//! Any bytes: the ET parser returns a trace or an error, never panics; a parsed trace writes
//! back and re-parses to the same text. Kineto parsing too.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = et_schema::ParseOptions { threads: 1, validate: true };
    if let Ok(t) = et_schema::parse_trace(data, "fuzz", &opts) {
        let text = et_schema::write_trace_to_vec(&t);
        let again = et_schema::parse_trace(&text, "again", &opts).expect("written trace re-parses");
        assert_eq!(et_schema::write_trace_to_vec(&again), text);
    }
    let _ = et_schema::kineto::parse_kineto(data, "fuzz");
    let _ = et_schema::decompress(data.to_vec(), "fuzz");
});
