//! Checking a plan that came from outside (a stored benchmark package) before it is bound.

use super::slots::extent;
use super::*;

impl Plan {
    /// Checks a plan that came from outside (a stored benchmark package): its version, and that
    /// every index in it points inside it, so that binding and running it cannot panic.
    pub fn validate(&self) -> Result<(), String> {
        if !(Plan::OLDEST_READABLE..=Plan::VERSION).contains(&self.version) {
            return Err(format!(
                "plan format {} (this build reads {} to {})",
                self.version,
                Plan::OLDEST_READABLE,
                Plan::VERSION
            ));
        }
        if self.version < 3 && self.steps.iter().any(|st| !st.views.is_empty()) {
            return Err(format!(
                "plan format {} with views (format 3)",
                self.version
            ));
        }
        if self.groups.is_empty() {
            return Err("no process group (the world is group 0)".into());
        }
        let n = self.n_slots;
        let slot = |s: Slot, what: &str, id: u64| {
            if (s as usize) < n {
                Ok(())
            } else {
                Err(format!("node {id}: {what} slot {s} of {n}"))
            }
        };
        for (s, spec, _) in &self.externals {
            slot(*s, "external", 0)?;
            if spec.shape.len() != spec.strides.len() || spec.shape.iter().any(|&d| d < 0) {
                return Err(format!("external slot {s}: bad shape {:?}", spec.shape));
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
            return Err(format!("node {}: autocast to {:?}", st.id, st.autocast));
        }
        if let Some(r) = self.restored.iter().find(|r| r.step >= self.steps.len()) {
            return Err(format!(
                "restored scalar of step {} of {}",
                r.step,
                self.steps.len()
            ));
        }
        for st in &self.steps {
            let id = st.id;
            if st.op.is_some_and(|o| o as usize >= self.ops.len()) {
                return Err(format!("node {id}: operator index out of range"));
            }
            for a in &st.args {
                for s in a.slots() {
                    slot(s, "argument", id)?;
                }
                if let Arg::ProcessGroup(g) = a {
                    if *g as usize >= self.groups.len() {
                        return Err(format!("node {id}: process group {g} out of range"));
                    }
                }
            }
            for o in &st.outs {
                let slots: Vec<Slot> = match o {
                    Out::Tensor(s) => vec![*s],
                    Out::List(v) => v.iter().flatten().copied().collect(),
                    Out::Ignore => vec![],
                };
                for s in slots {
                    slot(s, "output", id)?;
                }
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
                        return Err(format!(
                            "plan format {} with an attention log-sum-exp (format 4)",
                            self.version
                        ));
                    }
                }
                if let ViewKind::WeightNormNorms { g, .. } = v.kind {
                    slot(g, "view magnitude", id)?;
                    if self.version < 5 {
                        return Err(format!(
                            "plan format {} with weight-norm norms (format 5)",
                            self.version
                        ));
                    }
                }
                if v.spec.shape.len() != v.spec.strides.len()
                    || extent(&v.spec.shape, &v.spec.strides).is_none()
                {
                    return Err(format!(
                        "node {id}: view slot {}: bad shape {:?} strides {:?}",
                        v.slot, v.spec.shape, v.spec.strides
                    ));
                }
            }
            if let StepKind::Collective(c) = &st.kind {
                if c.group as usize >= self.groups.len()
                    || c.waits.iter().any(|&w| w >= self.steps.len())
                {
                    return Err(format!("node {id}: collective group or wait out of range"));
                }
            }
        }
        Ok(())
    }
}
