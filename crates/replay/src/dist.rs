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
    let local = gloo_address(d)
        .map_err(|e| ReplayError::Device(format!("choosing this rank's address for Gloo: {e}")))?;
    log::info!("rank {}: Gloo on {local}", d.rank);
    let mut comm = Comm::init(
        &d.master_addr,
        &local,
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

/// The address this rank's Gloo connections use: the interface `GLOO_SOCKET_IFNAME` names (as
/// PyTorch takes it), else this host's address on the route to `MASTER_ADDR` (loopback when the
/// master is this host). Never the master's own address on another host: a rank binds only
/// addresses of its own.
pub fn gloo_address(d: &DistOptions) -> Result<String, String> {
    if let Ok(name) = std::env::var("GLOO_SOCKET_IFNAME") {
        // PyTorch takes a list; the first interface serves here.
        let name = name
            .split(',')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        return interface_address(&name).ok_or_else(|| {
            format!("GLOO_SOCKET_IFNAME={name}: no interface with an IPv4 address")
        });
    }
    // A connected UDP socket sends nothing: its local address is the route's source.
    let s = std::net::UdpSocket::bind(("0.0.0.0", 0)).map_err(|e| e.to_string())?;
    s.connect((d.master_addr.as_str(), d.master_port))
        .map_err(|e| format!("MASTER_ADDR={}: {e}", d.master_addr))?;
    Ok(s.local_addr().map_err(|e| e.to_string())?.ip().to_string())
}

/// The first IPv4 address of network interface `name`.
fn interface_address(name: &str) -> Option<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below; entries are read while it lives.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned.
        let ifa = unsafe { &*at };
        // SAFETY: ifa_name is a NUL-terminated name.
        let this = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        let addr = ifa.ifa_addr;
        // SAFETY: a non-null address whose family says it is a sockaddr_in.
        if this.to_bytes() == name.as_bytes()
            && !addr.is_null()
            && unsafe { (*addr).sa_family } as i32 == libc::AF_INET
        {
            let sin = unsafe { &*(addr as *const libc::sockaddr_in) };
            found = Some(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).to_string());
            break;
        }
        at = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}
