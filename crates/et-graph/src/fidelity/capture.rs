//! The reference as timed on the capture host: the original's and the plain replay's wall
//! times, with what each waited for a CPU, and their running-time form the gap model is
//! anchored on ([`Reference`]).

use super::Reference;
use serde::{Deserialize, Serialize};

/// A reference whose times do not fit together; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidReference(pub String);

/// The original's uninstrumented iteration and the plain replay's, timed on the capture host
/// (ms); what `mystique replay --reference-out` writes.
///
/// On a shared capture host each program's wall time holds the time it waited for a CPU while
/// another process had it, and how much of the core the scheduler gives a process is not the
/// same for the original and the replay (beside one CPU burner per core the zoo's originals
/// slowed x1.9-3.0, their plain replays x1.8-2.4, not by the same factor: the pair's ratio
/// there is the scheduler's as much as the programs'). The waits (the kernel's run delay, per
/// iteration), where recorded, are taken out before anchoring ([`CaptureReference::running`]), as the
/// replay's own calibration times this host in running time.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CaptureReference {
    /// The original's uninstrumented iteration (ms, median).
    pub original_ms: f64,
    /// The plain replay's iteration (ms, median).
    pub replay_ms: f64,
    /// Of `replay_ms`, the time in its ops (ms).
    pub replay_op_ms: f64,
    /// Of `original_ms`, the time the original waited for a CPU (ms per iteration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_wait_ms: Option<f64>,
    /// Of `replay_ms`, the time the plain replay waited for a CPU (ms per iteration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_wait_ms: Option<f64>,
}

impl CaptureReference {
    /// Every time positive and finite, the replay's op time within its iteration, and each
    /// wait a part of its time; the error names the field that is not.
    pub fn check(&self) -> Result<(), InvalidReference> {
        for (k, v) in [
            ("original_ms", self.original_ms),
            ("replay_ms", self.replay_ms),
            ("replay_op_ms", self.replay_op_ms),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(InvalidReference(format!(
                    "`{k}` must be a positive number of ms (got {v})"
                )));
            }
        }
        if self.replay_op_ms > self.replay_ms {
            return Err(InvalidReference(format!(
                "`replay_op_ms` ({}) is more than `replay_ms` ({}): the plain replay's time in \
                 ops is part of its iteration",
                self.replay_op_ms, self.replay_ms
            )));
        }
        for (k, wait, of, total) in [
            (
                "original_wait_ms",
                self.original_wait_ms,
                "original_ms",
                self.original_ms,
            ),
            (
                "replay_wait_ms",
                self.replay_wait_ms,
                "replay_ms",
                self.replay_ms,
            ),
        ] {
            if let Some(w) = wait {
                if !(w.is_finite() && w >= 0.0 && w < total) {
                    return Err(InvalidReference(format!(
                        "`{k}` must be a number of ms from 0 up to less than `{of}` ({total}): \
                         the time of it spent waiting for a CPU (got {w})"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The share of its time each program waited for a CPU, the original's and the plain
    /// replay's (0 where no wait was recorded).
    pub fn wait_shares(&self) -> (f64, f64) {
        let share = |w: Option<f64>, t: f64| w.map_or(0.0, |w| w / t);
        (
            share(self.original_wait_ms, self.original_ms),
            share(self.replay_wait_ms, self.replay_ms),
        )
    }

    /// The larger of [`CaptureReference::wait_shares`]: how shared the capture host was.
    pub fn waited_share(&self) -> f64 {
        let (original, replay) = self.wait_shares();
        original.max(replay)
    }

    /// The reference in running time: each program's time less what it waited for a CPU, the
    /// plain replay's ops by the same share as its iteration (the waits fall where the time
    /// goes). Without recorded waits, the times as they are.
    pub fn running(&self) -> Reference {
        let original_ms = self.original_ms - self.original_wait_ms.unwrap_or(0.0);
        let replay_ms = self.replay_ms - self.replay_wait_ms.unwrap_or(0.0);
        Reference {
            original_ms,
            replay_ms,
            replay_op_ms: self.replay_op_ms * replay_ms / self.replay_ms,
        }
    }
}

impl From<CaptureReference> for Reference {
    fn from(r: CaptureReference) -> Self {
        r.running()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(original_wait_ms: Option<f64>, replay_wait_ms: Option<f64>) -> CaptureReference {
        CaptureReference {
            original_ms: 6.0,
            replay_ms: 4.0,
            replay_op_ms: 3.0,
            original_wait_ms,
            replay_wait_ms,
        }
    }

    #[test]
    fn a_reference_is_anchored_in_running_time() {
        // Without waits: the times as they are.
        let r = reference(None, None).running();
        assert_eq!(
            (r.original_ms, r.replay_ms, r.replay_op_ms),
            (6.0, 4.0, 3.0)
        );
        // The original waited half its time, the replay a quarter: the ops lose their share.
        let busy = reference(Some(3.0), Some(1.0));
        busy.check().unwrap();
        let r = Reference::from(busy);
        assert_eq!(
            (r.original_ms, r.replay_ms, r.replay_op_ms),
            (3.0, 3.0, 2.25)
        );
        // A reference without the wait fields reads, and one with them round-trips.
        let old: CaptureReference = serde_json::from_value(
            serde_json::json!({"original_ms": 6.0, "replay_ms": 4.0, "replay_op_ms": 3.0}),
        )
        .unwrap();
        assert_eq!(old, reference(None, None));
        let back: CaptureReference =
            serde_json::from_value(serde_json::to_value(busy).unwrap()).unwrap();
        assert_eq!(back, busy);
        // How shared the host was: the larger of the two shares.
        assert_eq!(busy.waited_share(), 0.5);
        assert_eq!(reference(None, Some(1.0)).waited_share(), 0.25);
        assert_eq!(reference(None, None).waited_share(), 0.0);
    }

    #[test]
    fn a_wait_longer_than_its_time_or_negative_is_refused() {
        for (o, r, field) in [
            (Some(6.0), None, "original_wait_ms"),
            (Some(-0.1), None, "original_wait_ms"),
            (None, Some(f64::NAN), "replay_wait_ms"),
            (None, Some(4.5), "replay_wait_ms"),
        ] {
            let e = reference(o, r).check().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        reference(Some(0.0), Some(0.0)).check().unwrap();
    }
}
