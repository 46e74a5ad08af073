//! Distributed replay: this rank joins the others through c10d (a TCPStore rendezvous, Gloo
//! process groups made as the trace made them), so collectives run for real.

use crate::device::Device;
use crate::error::{CallError, ReplayError};
use crate::ffi::{Comm, CudaComm};
use crate::options::DistOptions;
use crate::plan::Plan;

/// How this rank's collectives on CUDA tensors run: NCCL when each rank on this host can have a
/// GPU of its own (NCCL refuses two ranks on one GPU), else Gloo through the host; none on CPU.
/// `MYSTIQUE_CUDA_COMM=nccl|gloo` decides instead.
pub fn cuda_comm(device: &Device, d: &DistOptions) -> CudaComm {
    if *device == Device::Cpu {
        return CudaComm::None;
    }
    match std::env::var("MYSTIQUE_CUDA_COMM").as_deref() {
        Ok("nccl") => return CudaComm::Nccl,
        Ok("gloo") => return CudaComm::Gloo,
        _ => {}
    }
    let local = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(d.world_size);
    // NCCL only where each local rank has its own GPU and this rank is on its own one.
    let own_gpu = matches!((device, d.local_rank), (Device::Cuda(i), Some(lr)) if *i == lr);
    if own_gpu && (tch::Cuda::device_count().max(0) as usize) >= local {
        CudaComm::Nccl
    } else {
        CudaComm::Gloo
    }
}

/// Joins the world and creates the plan's process groups (every rank creates every group, in
/// the plan's order, so group `k` of the plan is group `k` of the returned Comm).
pub fn connect(plan: &Plan, d: &DistOptions, device: &Device) -> Result<Comm, ReplayError> {
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
    // Under torchrun's agent, its store already listens at MASTER_ADDR:MASTER_PORT: every
    // rank joins it (rank 0 serving one too would fail to bind), under the agent's attempt.
    let (serve, prefix) = match d.store {
        crate::Store::RankZero => (d.rank == 0, "mystique".to_string()),
        crate::Store::Agent { attempt } => (false, format!("mystique/attempt_{attempt}")),
    };
    let mut comm = Comm::init(
        &d.master_addr,
        d.master_port,
        d.rank,
        d.world_size,
        d.timeout,
        cuda_comm(device, d),
        serve,
        &prefix,
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
