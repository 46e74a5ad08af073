//! Reference files: the original's uninstrumented iteration and the plain replay's, timed side
//! by side on the capture host. `mystique replay --reference-out` writes one
//! ([`reference_of_report`], [`to_json`]); `--reference` and a package's manifest
//! read one ([`read_reference`]); the gap model is anchored on it in running time
//! (`Reference::running`).

pub use et_graph::CaptureReference as Reference;
use std::path::Path;

/// Why a reference is refused.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// The file could not be read.
    #[error("reading the reference {path}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than any reference.
    #[error(
        "the reference {path} is over {} KiB: not a reference file (it holds `original_ms`, \
         `replay_ms` and `replay_op_ms`)",
        MAX_REFERENCE_BYTES >> 10
    )]
    TooLarge {
        /// The file.
        path: String,
    },
    /// The file is not JSON.
    #[error("the reference {path} is not JSON")]
    NotJson {
        /// The file.
        path: String,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A field is missing or not a number.
    #[error("the reference {path}: `{field}` must be {what}")]
    Field {
        /// The file.
        path: String,
        /// The field.
        field: &'static str,
        /// What it must be.
        what: &'static str,
    },
    /// The times do not fit together (the source names the field).
    #[error("the reference {path}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong with it.
        #[source]
        source: et_graph::InvalidReference,
    },
    /// A reference cannot be written from this replay.
    #[error(
        "--reference-out: the replay's iteration ({replay_ms} ms) or its time in ops \
         ({op_ms} ms) is not a positive time; no reference written"
    )]
    NotTimed {
        /// The replay's median iteration.
        replay_ms: f64,
        /// The median of its time in ops.
        op_ms: f64,
    },
}

/// A reference is three numbers and a few fields of provenance: a file larger than this is
/// refused instead of read whole (a wrong path: a trace, a device file).
const MAX_REFERENCE_BYTES: u64 = 1 << 20;

/// Above this share of its time waiting for a CPU, a reference was timed on a shared host.
const SHARED_HOST_WAIT: f64 = 0.05;

/// The original's side of `--reference-out`: its iteration, where that came from, and the
/// time of it spent waiting for a CPU (`--original-wait-ms`).
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceOriginal {
    /// The original's uninstrumented iteration (ms).
    pub ms: f64,
    /// Where `ms` came from (a flag, a meta file).
    pub from: String,
    /// Of `ms`, the time the original waited for a CPU (ms).
    pub wait_ms: Option<f64>,
}

/// The reference a plain replay's report and the original's time make.
///
/// The time in ops is its share of the iteration, the ratio of the means (which add up: an
/// iteration is its ops and what lies between them), put on the median iteration. The
/// medians' ratio does not add up where waits for a CPU fall in some iterations and not
/// others: beside CPU burners one model's read 0.46 where its quiet share was 0.90.
pub fn reference_of_report(
    r: &crate::Report,
    original: &ReferenceOriginal,
) -> Result<Reference, ReferenceError> {
    let (replay_ms, op_ms) = (r.iter_ms.median, r.op_ms.median);
    if !(replay_ms.is_finite() && replay_ms > 0.0 && op_ms.is_finite() && op_ms > 0.0) {
        return Err(ReferenceError::NotTimed { replay_ms, op_ms });
    }
    // What the replay waited for a CPU, as its share of the measured iterations' mean (the
    // sampler reads it once over them all) put on the median the reference holds; none
    // where the kernel does not account it.
    let replay_wait_ms = r
        .cpu
        .as_ref()
        .and_then(|c| c.waited_for_cpu_ms)
        .filter(|w| w.is_finite() && *w >= 0.0 && r.iter_ms.mean > 0.0)
        .map(|w| replay_ms * (w / r.iter_ms.mean).min(0.99));
    let share = match r.op_ms.mean / r.iter_ms.mean {
        s if s.is_finite() && s > 0.0 => s.min(1.0),
        _ => (op_ms / replay_ms).min(1.0),
    };
    Ok(Reference {
        original_ms: original.ms,
        replay_ms,
        replay_op_ms: replay_ms * share,
        original_wait_ms: original.wait_ms,
        replay_wait_ms,
    })
}

/// The reference as its file holds it: its own fields (the waits only where recorded), and
/// where it came from (`original_from`, the `trace`, the replay's `iters`, `created_by`).
pub fn to_json(r: &Reference, original_from: &str, trace: &str, iters: usize) -> serde_json::Value {
    let mut j = serde_json::to_value(r).unwrap_or_default();
    for (k, v) in [
        ("original_from", serde_json::json!(original_from)),
        ("trace", serde_json::json!(trace)),
        ("iters", serde_json::json!(iters)),
        (
            "created_by",
            serde_json::json!(concat!("mystique ", env!("CARGO_PKG_VERSION"))),
        ),
    ] {
        j[k] = v;
    }
    j
}

/// Says on stderr when the reference was timed on a shared host: its running time is used,
/// yet programs slow differently beside other work even in running time (the zoo's
/// originals x1.0-1.56 beside a CPU burner on every core, their plain replays x1.0-1.27,
/// and one model's growth ranged from x1.03 to x1.44 between runs), so a quiet host's
/// reference is the better one. `what`: the reference's name in the message.
pub fn warn_shared_host(r: &Reference, what: &str) {
    if r.waited_share() > SHARED_HOST_WAIT {
        let (original, replay) = r.wait_shares();
        eprintln!(
            "warning: the reference {what} was timed on a shared host (the original waited \
             {:.0}% of its time for a CPU, the plain replay {:.0}%): both are taken in \
             running time, but a program's running time grows too beside other work, not by \
             the same factor for the original and the replay; time the reference on a quiet \
             host where you can",
            100.0 * original,
            100.0 * replay
        );
    }
}

/// A reference file (`--reference`): `original_ms`, `replay_ms` and `replay_op_ms`, all
/// positive, the replay's op time no more than its iteration. Warns where it was timed on a
/// shared host.
pub fn read_reference(path: &Path) -> Result<Reference, ReferenceError> {
    read_reference_and_trace(path).map(|(r, _)| r)
}

/// [`read_reference`], with the trace the reference names (`trace`, where recorded).
pub fn read_reference_and_trace(
    path: &Path,
) -> Result<(Reference, Option<String>), ReferenceError> {
    let p = || path.display().to_string();
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            use std::io::Read;
            f.take(MAX_REFERENCE_BYTES + 1).read_to_string(&mut text)
        })
        .map_err(|source| ReferenceError::Read { path: p(), source })?;
    if text.len() as u64 > MAX_REFERENCE_BYTES {
        return Err(ReferenceError::TooLarge { path: p() });
    }
    let j: serde_json::Value = serde_json::from_str(&text)
        .map_err(|source| ReferenceError::NotJson { path: p(), source })?;
    const TIMES: &str = "a positive number of ms (the original's uninstrumented iteration, the \
                         plain replay's and its time in ops, timed side by side on the capture \
                         host)";
    let ms = |field: &'static str| -> Result<f64, ReferenceError> {
        j[field].as_f64().ok_or_else(|| ReferenceError::Field {
            path: p(),
            field,
            what: TIMES,
        })
    };
    // Optional: what each program waited for a CPU (a reference without them has neither), a
    // number where present.
    let wait = |field: &'static str| -> Result<Option<f64>, ReferenceError> {
        match &j[field] {
            serde_json::Value::Null => Ok(None),
            v => v.as_f64().map(Some).ok_or_else(|| ReferenceError::Field {
                path: p(),
                field,
                what: "a number of ms (the time waited for a CPU, per iteration)",
            }),
        }
    };
    let r = Reference {
        original_ms: ms("original_ms")?,
        replay_ms: ms("replay_ms")?,
        replay_op_ms: ms("replay_op_ms")?,
        original_wait_ms: wait("original_wait_ms")?,
        replay_wait_ms: wait("replay_wait_ms")?,
    };
    r.check()
        .map_err(|source| ReferenceError::Invalid { path: p(), source })?;
    warn_shared_host(&r, &p());
    Ok((r, j["trace"].as_str().map(str::to_string)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_file_round_trips_and_bad_ones_name_the_field() {
        let dir = std::env::temp_dir().join(format!("mystique-ref-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("ref.json");
        let r = Reference {
            original_ms: 6.0,
            replay_ms: 4.0,
            replay_op_ms: 3.0,
            original_wait_ms: Some(0.5),
            replay_wait_ms: None,
        };
        std::fs::write(
            &p,
            to_json(&r, "--original-ms", "t.et.json", 10).to_string(),
        )
        .unwrap();
        assert_eq!(read_reference(&p).unwrap(), r);
        std::fs::write(
            &p,
            r#"{"original_ms": 6, "replay_ms": "4", "replay_op_ms": 3}"#,
        )
        .unwrap();
        let e = read_reference(&p).unwrap_err().to_string();
        assert!(e.contains("`replay_ms`"), "{e}");
        std::fs::write(
            &p,
            r#"{"original_ms": 6, "replay_ms": 4, "replay_op_ms": 5}"#,
        )
        .unwrap();
        let e = read_reference(&p).unwrap_err();
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(chain.contains("replay_op_ms"), "{chain}");
        std::fs::write(&p, "not json").unwrap();
        assert!(matches!(
            read_reference(&p),
            Err(ReferenceError::NotJson { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
