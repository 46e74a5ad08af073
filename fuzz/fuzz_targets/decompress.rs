//! Any bytes as a possibly gzipped input: decompressed within the limit or an error, never
//! more than the limit in memory, whatever the gzip trailer claims.
#![no_main]
use libfuzzer_sys::fuzz_target;

/// Small, so that each run is quick; the ratio of bombs to their limit is what matters.
const LIMIT: u64 = 256 << 10;

fuzz_target!(|data: &[u8]| {
    let ro = et_schema::ReadOptions {
        max_decompressed: Some(LIMIT),
    };
    match et_schema::decompress_with(data.to_vec(), "fuzz", &ro) {
        Ok(out) => {
            assert!(out.len() as u64 <= LIMIT);
            assert!(out.capacity() as u64 <= 2 * LIMIT + 2 * data.len() as u64 + 64);
        }
        Err(e) => assert!(e.to_string().len() < 2048),
    }
});
