//! Selecting part of a replay set: by iteration, op name, enclosing scope, id range and class,
//! optionally pulling in the producers of the inputs the selection needs.

use crate::class::OpClass;
use crate::graph::{Graph, ReplaySet, Skip, Windows};
use regex::Regex;
use std::ops::RangeInclusive;

/// Which kinds of ops to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kind {
    /// Every op.
    #[default]
    All,
    /// Everything but collectives.
    Compute,
    /// Collectives only.
    Comm,
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        match s {
            "all" => Ok(Kind::All),
            "compute" => Ok(Kind::Compute),
            "comm" => Ok(Kind::Comm),
            _ => Err(format!("unknown op kind {s:?} (all, compute, comm)")),
        }
    }
}

/// Which ops of a replay set to keep; the criteria all apply (the default keeps every op).
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// `ProfilerStep#N` iterations; `None` = the whole trace.
    pub iterations: Option<Vec<u64>>,
    /// Op name regex (searched, not anchored).
    pub name: Option<Regex>,
    /// Regex on the name of any enclosing annotation (`Optimizer.step`, `## backward ##`, ...);
    /// an annotation also encloses the ops other threads ran while it was open (the autograd
    /// thread's backward ops inside `## backward ##`, see [`crate::Threads`]).
    pub scope: Option<Regex>,
    /// Node ids to keep.
    pub ids: Option<RangeInclusive<u64>>,
    /// Kinds of ops to keep.
    pub kind: Kind,
    /// Also select, transitively, the ops producing inputs of selected ops.
    pub with_producers: bool,
}

/// Why a selection gives nothing to replay.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// No op matches.
    #[error(
        "{source_name}: the selection matches no op of the {total} in the replay set ({what})"
    )]
    Empty {
        /// The trace.
        source_name: String,
        /// Ops in the replay set.
        total: usize,
        /// The selection, in words.
        what: String,
    },
    /// The iterations asked for hold no op to replay (an empty last `ProfilerStep#N`, which
    /// the profiler opens at its last `step()`).
    #[error("{source_name}: {iterations} holds no op to replay (the trace's replay set has {total} ops in all)")]
    EmptyIterations {
        /// The trace.
        source_name: String,
        /// The iterations, as `ProfilerStep#N, ...`.
        iterations: String,
        /// Ops in the whole trace's replay set.
        total: usize,
    },
    /// An iteration asked for is not in the trace.
    #[error(
        "{source_name}: no ProfilerStep#{missing} in the trace ({})",
        if present.is_empty() {
            "it has no ProfilerStep#N iteration: leave out --iteration".to_string()
        } else {
            format!("iterations present: {present:?}")
        }
    )]
    NoIteration {
        /// The trace.
        source_name: String,
        /// The iteration asked for.
        missing: u64,
        /// The iterations the trace has.
        present: Vec<u64>,
    },
}

impl Selection {
    /// Whether it keeps less than every op: some filter is set (`with_producers` only adds).
    pub fn narrows(&self) -> bool {
        self.iterations.is_some()
            || self.name.is_some()
            || self.scope.is_some()
            || self.ids.is_some()
            || self.kind != Kind::All
    }

    fn describe(&self) -> String {
        let mut v = vec![];
        if let Some(i) = &self.iterations {
            v.push(format!("iterations {i:?}"));
        }
        if let Some(r) = &self.name {
            v.push(format!("name ~ /{r}/"));
        }
        if let Some(r) = &self.scope {
            v.push(format!("scope ~ /{r}/"));
        }
        if let Some(r) = &self.ids {
            v.push(format!("ids {}..={}", r.start(), r.end()));
        }
        if self.kind != Kind::All {
            v.push(format!("{:?}", self.kind).to_lowercase());
        }
        if v.is_empty() {
            "everything".into()
        } else {
            v.join(", ")
        }
    }
}

impl Graph<'_> {
    /// The replay set restricted by a selection; unselected ops get [`Skip::NotSelected`].
    pub fn select(&self, sel: &Selection) -> Result<ReplaySet, SelectError> {
        if let Some(its) = &sel.iterations {
            let present: Vec<u64> = self.iterations().iter().map(|x| x.1).collect();
            if let Some(&missing) = its.iter().find(|i| !present.contains(i)) {
                return Err(SelectError::NoIteration {
                    source_name: self.trace.source.clone(),
                    missing,
                    present,
                });
            }
        }
        let base = self.replay_set(sel.iterations.as_deref());
        if let (Some(its), true) = (&sel.iterations, base.ops.is_empty()) {
            return Err(SelectError::EmptyIterations {
                source_name: self.trace.source.clone(),
                iterations: its
                    .iter()
                    .map(|i| format!("ProfilerStep#{i}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                total: self.replay_set(None).ops.len(),
            });
        }
        // Matching scopes' windows, for the ops other threads ran inside them.
        let scope_windows = sel.scope.as_ref().map(|r| {
            let matching = (0..self.len() as u32).filter(|&a| {
                self.class[a as usize].contains(OpClass::ANNOTATION) && r.is_match(self.name(a))
            });
            Windows::new(self, self.threads(), matching)
        });
        let keep = |i: u32| -> bool {
            let c = self.class[i as usize];
            if let Some(r) = &sel.name {
                if !r.is_match(self.name(i)) {
                    return false;
                }
            }
            if let Some(r) = &sel.scope {
                let enclosed = self.ancestors(i).any(|a| {
                    self.class[a as usize].contains(OpClass::ANNOTATION) && r.is_match(self.name(a))
                });
                if !enclosed && !scope_windows.as_ref().is_some_and(|w| w.contains(self, i)) {
                    return false;
                }
            }
            if let Some(ids) = &sel.ids {
                if !ids.contains(&self.id(i)) {
                    return false;
                }
            }
            match sel.kind {
                Kind::All => true,
                Kind::Compute => !c.contains(OpClass::COLLECTIVE),
                Kind::Comm => c.contains(OpClass::COLLECTIVE),
            }
        };
        let mut chosen: Vec<bool> = base.ops.iter().map(|&i| keep(i)).collect();
        if sel.with_producers {
            let tensors = self.tensors(&base);
            // Edges point backwards, so one reverse sweep closes over producers.
            let mut preds: Vec<Vec<u32>> = vec![vec![]; base.ops.len()];
            for e in &tensors.edges {
                preds[e.to as usize].push(e.from);
            }
            for pos in (0..base.ops.len()).rev() {
                if chosen[pos] {
                    for &p in &preds[pos] {
                        chosen[p as usize] = true;
                    }
                }
            }
        }
        let mut out = ReplaySet {
            ops: Vec::new(),
            skip: base.skip,
        };
        for (pos, &i) in base.ops.iter().enumerate() {
            if chosen[pos] {
                out.ops.push(i);
            } else {
                out.skip[i as usize] = Some(Skip::NotSelected);
            }
        }
        if out.ops.is_empty() {
            return Err(SelectError::Empty {
                source_name: self.trace.source.clone(),
                total: base.ops.len(),
                what: sel.describe(),
            });
        }
        Ok(out)
    }
}
