//! Any bytes as an ET file: the parser returns a trace or an error, never panics, aborts or
//! hangs; one thread and two give the same model or the same error (the parallel split is only
//! taken with two); the record reader and the serde_json visitors
//! agree; a parsed trace writes back and re-parses to the same text; the accessors
//! other crates call on every node (op schema, argument types, value text) hold up too.
#![no_main]
use et_schema::{parse_trace, write_trace_to_vec, ParseOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let one = ParseOptions {
        threads: 1,
        validate: true,
        ..Default::default()
    };
    let two = ParseOptions {
        threads: 2,
        validate: true,
        ..Default::default()
    };
    let visitors = ParseOptions {
        visitors_only: true,
        ..one.clone()
    };
    let a = parse_trace(data, "fuzz", &one);
    for (b, what) in [
        (parse_trace(data, "fuzz", &two), "one thread and two"),
        (parse_trace(data, "fuzz", &visitors), "the record reader and the visitors"),
    ] {
        match (&a, &b) {
            (Ok(x), Ok(y)) => assert_eq!(write_trace_to_vec(x), write_trace_to_vec(y), "{what}"),
            (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string(), "{what}"),
            _ => panic!(
                "{what} disagree: {:?} / {:?}",
                a.as_ref().err().map(|e| e.to_string()),
                b.as_ref().err().map(|e| e.to_string())
            ),
        }
    }
    if let Ok(t) = a {
        let text = write_trace_to_vec(&t);
        let again = parse_trace(&text, "again", &one).expect("written trace re-parses");
        assert_eq!(write_trace_to_vec(&again), text);
        for n in &t.nodes {
            let _ = t.op_schema(n);
            for arg in t.inputs(n).iter().chain(t.outputs(n)) {
                let ty = t.arg_type(arg);
                let mut ts = Vec::new();
                t.tensors_typed(arg.value, &ty, &mut ts);
                assert!(t.value_text(arg.value, 64).len() <= 64 + 3);
            }
        }
        for w in &t.warnings {
            assert!(w.len() < 2048, "a warning of {} bytes", w.len());
        }
    }
});
