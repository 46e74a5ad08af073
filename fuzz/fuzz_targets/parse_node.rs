//! Any bytes as one node record inside a well-formed trace: the specialised record reader and
//! the serde_json visitors give the same model or the same error. Wrapping the bytes puts every
//! run inside the record grammar, where the two readers could differ, rather than in the
//! top-level scan that `parse_trace` mostly explores.
#![no_main]
use et_schema::{parse_trace, write_trace_to_vec, ParseOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut text = br#"{"schema": "1.1.1-chakra.0.0.4", "nodes": [{"id": 1, "name": "root", "ctrl_deps": 1}, "#.to_vec();
    text.extend_from_slice(data);
    text.extend_from_slice(b"]}");
    let fast = ParseOptions {
        threads: 1,
        ..Default::default()
    };
    let visitors = ParseOptions {
        visitors_only: true,
        ..fast.clone()
    };
    let a = parse_trace(&text, "fuzz", &fast);
    let b = parse_trace(&text, "fuzz", &visitors);
    match (&a, &b) {
        (Ok(x), Ok(y)) => {
            assert_eq!(x.nodes, y.nodes);
            assert_eq!(write_trace_to_vec(x), write_trace_to_vec(y));
        }
        (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string()),
        _ => panic!(
            "the record reader and the visitors disagree: {:?} / {:?}",
            a.as_ref().err().map(|e| e.to_string()),
            b.as_ref().err().map(|e| e.to_string())
        ),
    }
});
