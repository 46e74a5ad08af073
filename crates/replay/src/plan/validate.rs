//! Checking a plan that came from outside (a stored benchmark package) before it is bound.

use super::slots::extent;
use super::*;

/// Why a plan from outside is refused: what in it does not fit this build or points outside it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvalidPlan {
    /// A format this build does not read.
    #[error("plan format {found} (this build reads {oldest} to {newest})")]
    Version {
        /// The plan's format.
        found: u32,
        /// The oldest this build reads.
        oldest: u32,
        /// This build's.
        newest: u32,
    },
    /// Something its format did not have yet.
    #[error("plan format {version} with {what} (format {needs})")]
    Feature {
        /// The plan's format.
        version: u32,
        /// What it holds.
        what: &'static str,
        /// The format that brought it.
        needs: u32,
    },
    /// No process group: every plan has the world as group 0.
    #[error("no process group (the world is group 0)")]
    NoGroup,
    /// A slot past the plan's slots.
    #[error("node {node}: {what} slot {slot} of {n_slots}")]
    Slot {
        /// The step's node id (0 for the plan's own lists).
        node: u64,
        /// What the slot is for.
        what: &'static str,
        /// The slot.
        slot: Slot,
        /// The plan's slot count.
        n_slots: usize,
    },
    /// An external input with a shape no tensor has.
    #[error("external slot {slot}: bad shape {shape:?}")]
    ExternalShape {
        /// Its slot.
        slot: Slot,
        /// Its shape.
        shape: Vec<i64>,
    },
    /// A view with a shape or strides no tensor has.
    #[error("node {node}: view slot {slot}: bad shape {shape:?} strides {strides:?}")]
    ViewShape {
        /// The step's node id.
        node: u64,
        /// The view's slot.
        slot: Slot,
        /// Its shape.
        shape: Vec<i64>,
        /// Its strides.
        strides: Vec<i64>,
    },
    /// Autocast to a dtype autocast never casts to.
    #[error("node {node}: autocast to {dtype:?}")]
    Autocast {
        /// The step's node id.
        node: u64,
        /// The dtype.
        dtype: Option<et_schema::DType>,
    },
    /// A restored scalar of a step the plan does not have.
    #[error("restored scalar of step {step} of {steps}")]
    RestoredStep {
        /// The step.
        step: usize,
        /// The plan's step count.
        steps: usize,
    },
    /// More slots than the plan names values.
    #[error("{n_slots} slots for {mentions} values named: refused")]
    Slots {
        /// The plan's slot count.
        n_slots: usize,
        /// How many values its steps and external inputs name.
        mentions: usize,
    },
    /// A graph release after a step the plan does not have.
    #[error("graph release after step {step} of {steps}")]
    ReleaseStep {
        /// The step.
        step: usize,
        /// The plan's step count.
        steps: usize,
    },
    /// An index (operator, process group, collective wait) past its list.
    #[error("node {node}: {what} out of range")]
    Index {
        /// The step's node id.
        node: u64,
        /// Which index.
        what: String,
    },
}

impl Plan {
    /// Checks a plan that came from outside (a stored benchmark package): its version, and that
    /// every index in it points inside it, so that binding and running it cannot panic.
    pub fn validate(&self) -> Result<(), InvalidPlan> {
        if !(Plan::OLDEST_READABLE..=Plan::VERSION).contains(&self.version) {
            return Err(InvalidPlan::Version {
                found: self.version,
                oldest: Plan::OLDEST_READABLE,
                newest: Plan::VERSION,
            });
        }
        if self.version < 3 && self.steps.iter().any(|st| !st.views.is_empty()) {
            return Err(InvalidPlan::Feature {
                version: self.version,
                what: "views",
                needs: 3,
            });
        }
        if self.groups.is_empty() {
            return Err(InvalidPlan::NoGroup);
        }
        let slot = |s, what, id| self.check_slot(s, what, id);
        for (s, spec, _) in &self.externals {
            slot(*s, "external", 0)?;
            if spec.shape.len() != spec.strides.len() || spec.shape.iter().any(|&d| d < 0) {
                return Err(InvalidPlan::ExternalShape {
                    slot: *s,
                    shape: spec.shape.clone(),
                });
            }
        }
        for s in &self.grad_inputs {
            slot(*s, "grad input", 0)?;
        }
        if let Some(st) = self.steps.iter().find(|st| {
            st.autocast.is_some_and(|d| {
                !matches!(d, et_schema::DType::BFloat16 | et_schema::DType::Float16)
            })
        }) {
            return Err(InvalidPlan::Autocast {
                node: st.id,
                dtype: st.autocast,
            });
        }
        if let Some(r) = self.restored.iter().find(|r| r.step >= self.steps.len()) {
            return Err(InvalidPlan::RestoredStep {
                step: r.step,
                steps: self.steps.len(),
            });
        }
        if let Some(&step) = self.graph_releases.iter().find(|&&p| p >= self.steps.len()) {
            return Err(InvalidPlan::ReleaseStep {
                step,
                steps: self.steps.len(),
            });
        }
        for st in &self.steps {
            self.validate_step(st)?;
        }
        // Slots are made for the values the plan names: a slot count beyond every mention of
        // one is a count no compile made (a stored 10^12 would be allocated up front).
        let mentions = self.externals.len()
            + self
                .steps
                .iter()
                .map(|st| {
                    st.args.iter().map(|a| a.slots().len()).sum::<usize>()
                        + st.outs.len()
                        + st.out_specs.len()
                        + st.views.len()
                        + st.outs
                            .iter()
                            .map(|o| match o {
                                Out::List(v) => v.len(),
                                _ => 0,
                            })
                            .sum::<usize>()
                })
                .sum::<usize>();
        if self.n_slots > mentions.saturating_add(1) {
            return Err(InvalidPlan::Slots {
                n_slots: self.n_slots,
                mentions,
            });
        }
        Ok(())
    }

    /// `s` is one of the plan's slots (`what` it is for, in node `id`, for the message).
    fn check_slot(&self, s: Slot, what: &'static str, id: u64) -> Result<(), InvalidPlan> {
        if (s as usize) < self.n_slots {
            Ok(())
        } else {
            Err(InvalidPlan::Slot {
                node: id,
                what,
                slot: s,
                n_slots: self.n_slots,
            })
        }
    }

    /// Every index of one step inside the plan: its operator, argument, output, freed,
    /// pass-through and view slots, its process group and waits, its views' shapes.
    fn validate_step(&self, st: &Step) -> Result<(), InvalidPlan> {
        let slot = |s, what, id| self.check_slot(s, what, id);
        let id = st.id;
        if st.op.is_some_and(|o| o as usize >= self.ops.len()) {
            return Err(InvalidPlan::Index {
                node: id,
                what: "operator index".into(),
            });
        }
        for a in &st.args {
            for s in a.slots() {
                slot(s, "argument", id)?;
            }
            if let Arg::ProcessGroup(g) = a {
                if *g as usize >= self.groups.len() {
                    return Err(InvalidPlan::Index {
                        node: id,
                        what: format!("process group {g}"),
                    });
                }
            }
        }
        for s in st.outs.iter().flat_map(Out::slots) {
            slot(s, "output", id)?;
        }
        for (s, _) in &st.out_specs {
            slot(*s, "output", id)?;
        }
        for s in &st.frees {
            slot(*s, "freed", id)?;
        }
        for (a, b) in &st.passthrough {
            slot(*a, "pass-through", id)?;
            slot(*b, "pass-through", id)?;
        }
        for v in &st.views {
            slot(v.slot, "view", id)?;
            slot(v.base, "view base", id)?;
            if let ViewKind::AttentionLogsumexp { key, .. } = v.kind {
                slot(key, "view key", id)?;
                if self.version < 4 {
                    return Err(InvalidPlan::Feature {
                        version: self.version,
                        what: "an attention log-sum-exp",
                        needs: 4,
                    });
                }
            }
            if let ViewKind::WeightNormNorms { g, .. } = v.kind {
                slot(g, "view magnitude", id)?;
                if self.version < 5 {
                    return Err(InvalidPlan::Feature {
                        version: self.version,
                        what: "weight-norm norms",
                        needs: 5,
                    });
                }
            }
            if v.spec.shape.len() != v.spec.strides.len()
                || extent(&v.spec.shape, &v.spec.strides).is_none()
            {
                return Err(InvalidPlan::ViewShape {
                    node: id,
                    slot: v.slot,
                    shape: v.spec.shape.clone(),
                    strides: v.spec.strides.clone(),
                });
            }
        }
        if let StepKind::Collective(c) = &st.kind {
            if c.group as usize >= self.groups.len()
                || c.waits.iter().any(|&w| w >= self.steps.len())
            {
                return Err(InvalidPlan::Index {
                    node: id,
                    what: "collective group or wait".into(),
                });
            }
        }
        Ok(())
    }
}
