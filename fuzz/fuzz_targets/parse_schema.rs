//! Any text as a TorchScript op schema: parsed or an error with a position inside the text,
//! never a panic or a stack overflow; a parsed schema prints as text that parses back to it.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        match et_schema::OpSchema::parse(s) {
            Ok(schema) => {
                let printed = schema.to_string();
                let again = et_schema::OpSchema::parse(&printed)
                    .unwrap_or_else(|e| panic!("{printed:?} does not re-parse: {e}"));
                assert_eq!(again, schema, "{printed:?}");
                let _ = (schema.mutates(), schema.full_name(), schema.namespace());
                for a in schema.args.iter().chain(&schema.returns) {
                    let _ = (a.ty.alias(), a.ty.base_name(), a.ty.is_write());
                }
            }
            Err(e) => assert!(e.pos <= s.len() && e.msg.len() < 1024),
        }
    }
});
