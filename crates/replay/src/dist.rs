//! Distributed replay: this rank joins the others through c10d (a TCPStore rendezvous, Gloo
//! process groups made as the trace made them), so collectives run for real.

use crate::error::{CallError, ReplayError};
use crate::ffi::Comm;
use crate::options::DistOptions;
use crate::plan::Plan;

/// Joins the world and creates the plan's process groups (every rank creates every group, in
/// the plan's order, so group `k` of the plan is group `k` of the returned Comm).
pub fn connect(plan: &Plan, d: &DistOptions) -> Result<Comm, ReplayError> {
    let fail = |what: String, source: CallError| ReplayError::Dist {
        rank: d.rank,
        what,
        source,
    };
    if let Some(w) = plan.groups.first().map(|g| g.size).filter(|&s| s > 0) {
        if w as usize != d.world_size {
            return Err(ReplayError::Device(format!(
                "the trace was captured with {w} ranks, this run has WORLD_SIZE={}",
                d.world_size
            )));
        }
    }
    let mut comm = Comm::init(
        &d.master_addr,
        d.master_port,
        d.rank,
        d.world_size,
        d.timeout,
    )
    .map_err(|e| {
        fail(
            format!(
                "joining {} ranks at {}:{}",
                d.world_size, d.master_addr, d.master_port
            ),
            e,
        )
    })?;
    log::info!(
        "rank {} of {} joined at {}:{}",
        d.rank,
        d.world_size,
        d.master_addr,
        d.master_port
    );
    for g in plan.groups.iter().skip(1) {
        comm.new_group(&g.name, &g.ranks)
            .map_err(|e| fail(format!("creating process group {:?}", g.name), e))?;
    }
    Ok(comm)
}
