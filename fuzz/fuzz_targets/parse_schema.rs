//! Op-schema and type-string parsers on arbitrary text: no panics, and Display re-parses.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(schema) = et_schema::OpSchema::parse(s) {
            let _ = et_schema::OpSchema::parse(&schema.to_string());
        }
        if let Ok(t) = et_schema::ValueType::parse(s) {
            let _ = et_schema::ValueType::parse(&t.to_string());
        }
    }
});
