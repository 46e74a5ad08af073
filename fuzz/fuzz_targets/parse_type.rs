//! Any text as an ET type string: parsed or an error with a position inside the text, never a
//! panic or a stack overflow; a parsed type prints as text that parses back to it.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        match et_schema::ValueType::parse(s) {
            Ok(t) => {
                let printed = t.to_string();
                let again = et_schema::ValueType::parse(&printed)
                    .unwrap_or_else(|e| panic!("{printed:?} does not re-parse: {e}"));
                assert_eq!(again, t, "{printed:?}");
                let _ = (t.is_tensor(), t.contains_tensor());
            }
            Err(e) => assert!(e.pos <= s.len() && e.msg.len() < 1024),
        }
    }
});
