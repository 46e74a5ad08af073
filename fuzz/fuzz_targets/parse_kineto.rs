//! Any bytes as a Kineto file: a trace or an error, never a panic; no event of a parsed trace
//! has a negative, non-finite or absurd time.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match et_schema::kineto::parse_kineto(data, "fuzz") {
        Ok(k) => {
            for e in &k.events {
                for t in [e.ts, e.dur, e.ts + e.dur] {
                    assert!(t.is_finite() && t >= 0.0 && t <= et_schema::kineto::MAX_TIME_US);
                }
            }
            let _ = k.main_pid();
        }
        Err(e) => assert!(e.to_string().len() < 2048),
    }
});
