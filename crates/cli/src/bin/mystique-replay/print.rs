//! The replay report and the gap model as text.

use anyhow::Result;
use mystique_cli::inspect::human_bytes;
use std::io::Write;

/// The replay report as text: what ran and how long it took, the resources it used, the GPU's
/// counters, what did not run as recorded, the collectives and the top ops.
pub(crate) fn print_table(out: &mut impl Write, r: &replay::Report, source: &str) -> Result<()> {
    writeln!(out, "trace      {source}")?;
    print_summary(out, r)?;
    print_resources(out, r)?;
    print_gpu(out, r)?;
    print_exceptions(out, r)?;
    print_ops(out, r)
}

/// Device, rank, coverage, iteration time, timing source, bookkeeping and gaps.
fn print_summary(out: &mut impl Write, r: &replay::Report) -> Result<()> {
    writeln!(
        out,
        "device     {} ({} thread{})",
        r.device,
        r.threads,
        if r.threads == 1 { "" } else { "s" }
    )?;
    if let (Some(rank), Some(world)) = (r.rank, r.world_size) {
        writeln!(
            out,
            "rank       {rank} of {world} (Gloo over the c10d rendezvous)"
        )?;
    }
    writeln!(
        out,
        "coverage   {} of {} ops replayed, {} failed{}",
        r.ops_replayed,
        r.ops_selected,
        r.ops_failed,
        if r.ops_skipped > 0 {
            format!(", {} left out by --only", r.ops_skipped)
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "iteration  median {:.3} ms  (min {:.3}, max {:.3}; {} measured)",
        r.iter_ms.median, r.iter_ms.min, r.iter_ms.max, r.iters
    )?;
    writeln!(out, "timing     {}", r.timing)?;
    if let Some(e) = &r.event_error {
        writeln!(out, "           (CUDA events failed, host clock used: {e})")?;
    }
    // Thousands of page faults an iteration: tensors over the allocator's mmap threshold are
    // mapped and unmapped afresh each iteration, and the unmapping (between ops) is no cost of
    // the replay's own (hta_simple_add: 41,000 faults, 1.7 ms an op).
    let mapped = r.page_faults_per_iter.filter(|f| *f >= 1000.0);
    writeln!(
        out,
        "overhead   {:.2} us/op of replay bookkeeping{}",
        r.overhead_us_per_op,
        match mapped {
            Some(f) => format!(
                " and freeing tensors ({f:.0} minor page faults per iteration: large tensors \
                 are mapped and unmapped afresh each iteration, as the allocator does for any \
                 program)"
            ),
            None => String::new(),
        }
    )?;
    if r.gaps_ms > 0.0 {
        writeln!(
            out,
            "gaps       {:.3} ms per iteration emulated between ops (from Kineto){}",
            r.gaps_ms,
            match r.gap_pace {
                Some(p) =>
                    format!(", at {p:.3}x the calibration's (they follow this host's speed)"),
                None => String::new(),
            }
        )?;
    }
    Ok(())
}

/// Memory, page faults, the CUDA allocator, CPU time and hardware counters.
fn print_resources(out: &mut impl Write, r: &replay::Report) -> Result<()> {
    writeln!(
        out,
        "memory     peak {} live, {} in {} external inputs",
        human_bytes(r.peak_bytes),
        human_bytes(r.external_bytes),
        r.externals
    )?;
    if let Some(m) = &r.iteration_memory {
        writeln!(
            out,
            "allocated  {} at the iteration's peak over its start, {} still held after it ({} \
             allocator, as the original's profile counts)",
            human_bytes(m.peak_over_start_bytes),
            human_bytes(m.held_after_bytes),
            if r.cuda_memory.is_some() {
                "CUDA"
            } else {
                "CPU"
            }
        )?;
    }
    if let Some(f) = &r.frees_followed {
        writeln!(
            out,
            "frees      as the original's memory profile: {} of {} tensors the steps make \
             matched, {} freed later than at last use, {} held to the iteration's end",
            f.matched, f.storages, f.delayed, f.held
        )?;
    }
    if let Some(p) = &r.pool {
        writeln!(
            out,
            "pool       communication only: {} reused buffers, {} (estimated {}); the \
             collectives carry zeros, not the model's values",
            p.buffers,
            human_bytes(p.bytes),
            human_bytes(p.estimated_bytes)
        )?;
    }
    if let Some(f) = r.page_faults_per_iter {
        writeln!(out, "faults     {f:.1} minor page faults per iteration")?;
    }
    if let Some(m) = &r.cuda_memory {
        writeln!(
            out,
            "cuda mem   allocator peak {} allocated, {} reserved ({:.0}% fragmented); inputs arena {}",
            human_bytes(m.allocator.peak_allocated_bytes),
            human_bytes(m.allocator.peak_reserved_bytes),
            m.fragmentation * 100.0,
            human_bytes(m.arena_bytes)
        )?;
    }
    if let Some(c) = &r.cpu {
        let u = &c.per_iter;
        writeln!(
            out,
            "cpu        {:.2} ms user + {:.2} ms sys per iteration, {} + {} context switches, {} major faults",
            u.user_ms, u.sys_ms, u.voluntary_switches, u.involuntary_switches, u.major_faults
        )?;
        if let Some(w) = c.waited_for_cpu_ms {
            let iter = &r.iter_ms;
            // Worth a line when the host was busy: time the replay lost to other processes.
            if w > 0.01 * iter.mean {
                writeln!(
                    out,
                    "           waited {w:.2} ms per iteration for a CPU ({:.0}% of it): a busy host",
                    100.0 * w / iter.mean
                )?;
            }
        }
        match (&c.hw_per_iter, &c.hw_unavailable) {
            (Some(h), _) => writeln!(
                out,
                "           {} cycles, {} instructions (IPC {:.2}), {} cache misses per iteration",
                h.cycles,
                h.instructions,
                h.ipc(),
                h.cache_misses
            )?,
            (None, Some(why)) => writeln!(out, "           no hardware counters: {why}")?,
            (None, None) => {}
        }
    }
    Ok(())
}

/// NVML's counters over the measured iterations, or why there are none.
fn print_gpu(out: &mut impl Write, r: &replay::Report) -> Result<()> {
    if let Some(g) = &r.gpu {
        writeln!(
            out,
            "gpu        {} ({} NVML samples every {} ms{})",
            g.device,
            g.samples,
            g.period_ms,
            if g.gpm { ", GPM" } else { "" }
        )?;
        for (name, m) in &g.measured.metrics {
            writeln!(
                out,
                "  {name:<18} mean {:>8.1}  p50 {:>8.1}  p99 {:>8.1}  max {:>8.1} {}",
                m.mean, m.p50, m.p99, m.max, m.unit
            )?;
        }
        if let Some(e) = g.measured.energy_j {
            writeln!(
                out,
                "  energy             {e:.2} J over the measured iterations"
            )?;
        }
        if !g.measured.throttle_reasons.is_empty() {
            writeln!(
                out,
                "  throttled by       {}",
                g.measured.throttle_reasons.join(", ")
            )?;
        }
    } else if let Some(why) = &r.gpu_unavailable {
        writeln!(out, "gpu        no NVML counters: {why}")?;
    }
    Ok(())
}

/// The failed ops, under `heading`, each with its count, kind and reason; nothing without.
pub(crate) fn print_failures(
    out: &mut impl Write,
    heading: &str,
    r: &replay::Report,
) -> Result<()> {
    if !r.failures.is_empty() {
        writeln!(out, "{heading}")?;
        for f in &r.failures {
            writeln!(
                out,
                "  {:>4}x {}: [{:?}] {}",
                f.count, f.op, f.kind, f.reason
            )?;
        }
    }
    Ok(())
}

/// Failures, scalars restored, and ops run otherwise than recorded.
fn print_exceptions(out: &mut impl Write, r: &replay::Report) -> Result<()> {
    print_failures(out, "failures", r)?;
    if !r.restored_scalars.is_empty() {
        writeln!(out, "restored scalars (rounded to 0 in the trace)")?;
        for x in &r.restored_scalars {
            writeln!(
                out,
                "  {:>4}x {} `{}` = {:e}: {}",
                x.count, x.op, x.arg, x.value, x.why
            )?;
        }
    }
    if !r.fallbacks.is_empty() {
        writeln!(out, "fallbacks (ops run otherwise than recorded)")?;
        for f in &r.fallbacks {
            writeln!(out, "  {:>4}x {}: {}", f.count, f.op, f.ran_as)?;
        }
    }
    Ok(())
}

/// Collectives and the top ops by time per iteration.
fn print_ops(out: &mut impl Write, r: &replay::Report) -> Result<()> {
    if !r.collectives.is_empty() {
        print_collectives(out, &r.collectives, None)?;
    }
    if let Some(p) = &r.paced {
        writeln!(
            out,
            "paced      {} collectives issued at the trace's times; iteration {:.3} ms, the \
             trace's {:.3} ms",
            p.collectives, r.iter_ms.median, p.trace_ms
        )?;
    }
    if let Some(c) = &r.check {
        let unchecked: Vec<String> = c
            .unchecked
            .iter()
            .map(|(op, n)| format!("{op} x{n}"))
            .collect();
        writeln!(
            out,
            "checked    {} collective calls per iteration returned what their inputs make{}",
            c.checked,
            if unchecked.is_empty() {
                String::new()
            } else {
                format!(" (not modelled, not verified: {})", unchecked.join(", "))
            }
        )?;
    }
    writeln!(out, "top ops by time per iteration")?;
    let gpu = r.timing == "cuda events";
    if gpu {
        writeln!(
            out,
            "  {:>9} {:>6} {:>9} {:>9}  op",
            "ms", "calls", "us/call", "launch us"
        )?;
    } else {
        writeln!(out, "  {:>9} {:>6} {:>9}  op", "ms", "calls", "us/call")?;
    }
    for o in r.ops.iter().take(15) {
        if gpu {
            writeln!(
                out,
                "  {:>9.3} {:>6} {:>9.1} {:>9.1}  {}",
                o.total_ms, o.count, o.mean_us, o.launch_us, o.op
            )?;
        } else {
            writeln!(
                out,
                "  {:>9.3} {:>6} {:>9.1}  {}",
                o.total_ms, o.count, o.mean_us, o.op
            )?;
        }
    }
    Ok(())
}

/// Where the emulated gaps come from.
pub(crate) fn print_gap_model(out: &mut impl Write, m: &et_graph::GapModel) -> Result<()> {
    writeln!(
        out,
        "gap model  {:.3} ms emulated of the capture's {:.3} ms: this host at {:.3}x the capture's \
         op time ({} ops), instrumentation {:.2} us per op event, {} events with arguments in gaps, {:.2} us per event without ({} in gaps) and {:.2} us per op boundary{}",
        m.emulated_ms,
        m.capture_gaps_ms,
        m.speed,
        m.speed_ops,
        m.per_event_us,
        m.events_with_args,
        m.per_gap_event_us,
        m.events_in_gaps - m.events_with_args,
        m.per_boundary_us,
        match (m.call_probed, m.boxing_us, m.op_in_window_us) {
            (n, Some(b), _) if n > 0 => format!(
                " on average (each op's own call probed, {n} of {} boundaries, with {b:.2} us of \
                 boxing)",
                m.boundaries
            ),
            (_, _, Some(w)) => format!(" (the probed op's {w:.2} us inside its window left out)"),
            _ => String::new(),
        }
    )?;
    if let Some(a) = &m.anchored {
        // The total is the reference's, not the line above's: say so first.
        writeln!(
            out,
            "anchored   on the reference: {:.3} ms per iteration, the original's {:.3} ms there \
             x this host's op time {:.3} ms{} / the plain replay's {:.3} ms there (x{:.3}); the \
             gaps x{:.3} of the profile's shape ({:.3} ms from the profile alone)",
            a.target_ms,
            a.reference.original_ms,
            a.replay_op_ms,
            if m.time_base.is_some() {
                " (between the gaps)"
            } else {
                ""
            },
            a.reference.replay_op_ms,
            a.host_ratio,
            a.scale,
            a.profiled_ms
        )?;
    }
    if let Some(b) = &m.ops_between_gaps {
        writeln!(
            out,
            "time base  the ops run x{:.3} their time back to back between the gaps here \
             ({} settled iterations of each, in alternating runs; each step's median): the gaps \
             follow this host's speed from there",
            b.factor, b.iterations
        )?;
    }
    if let Some(b) = &m.time_base {
        writeln!(
            out,
            "time base  the ops take {:.3} ms per iteration between the gaps, {:.3} ms back to \
             back (median of {} iterations each step): the gaps follow this host's speed from \
             the first",
            b.with_gaps_ms, b.plain_ms, b.iterations
        )?;
    }
    writeln!(
        out,
        "           captured under the {}: the calibration replay ran under the same",
        m.instrumentation
    )?;
    if let Some((per, per_tensor)) = m.per_backward_event_us {
        writeln!(
            out,
            "           events with arguments (autograd's backward nodes, {} tensors) probed at {per:.2} us + {per_tensor:.2} us per tensor",
            m.tensors_in_gap_events
        )?;
    }
    if m.calibrations_ms.len() > 1 {
        let each: Vec<String> = m
            .calibrations_ms
            .iter()
            .map(|ms| format!("{ms:.3}"))
            .collect();
        writeln!(
            out,
            "           calibrated {} times on this host: {} ms emulated; the model is the median one's by emulated time per unit of its op time",
            m.calibrations_ms.len(),
            each.join(", ")
        )?;
    }
    if m.capture_iterations > 1 {
        writeln!(
            out,
            "           gaps and op times typical of the capture's {} like iterations (the least of each)",
            m.capture_iterations
        )?;
    }
    if m.slices_in_ops > 0 {
        writeln!(
            out,
            "           the capture lost {} time slices in ops (a shared CPU; {} gaps held one): {}",
            m.slices_in_ops,
            m.slices_in_gaps,
            if m.local_speed {
                "each gap put on this host by the speed of the ops around it"
            } else {
                "gaps put on this host by the iteration's speed"
            }
        )?;
    }
    Ok(())
}

/// The collectives by kind: calls and time per iteration, latency statistics over the calls,
/// bandwidth as nccl-tests reports it, and by message size where a kind has several sizes.
/// `waits`: per kind, the time ranks spent beyond the fastest rank (a job's summary).
pub fn print_collectives(
    out: &mut impl Write,
    kinds: &std::collections::BTreeMap<String, replay::CollectiveTiming>,
    waits: Option<&std::collections::BTreeMap<String, f64>>,
) -> Result<()> {
    let blocking = kinds.values().any(|c| c.skew_us.is_some());
    writeln!(
        out,
        "collectives per iteration{} (latency per call in µs over the measured calls; \
         bandwidth in GB/s as nccl-tests reports it)",
        if waits.is_some() { ", per rank" } else { "" }
    )?;
    let mut head = format!(
        "  {:<15} {:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "kind", "calls", "size", "time ms", "min", "p50", "p95", "max", "algbw", "busbw"
    );
    if waits.is_some() {
        head.push_str(&format!(" {:>9}", "wait ms"));
    }
    if blocking {
        head.push_str(&format!(" {:>9} {:>9}", "skew p50", "global95"));
    }
    writeln!(out, "{head}")?;
    let gbps = |v: Option<f64>| v.map_or("-".to_string(), |g| format!("{g:.3}"));
    for (kind, c) in kinds {
        let l = &c.latency_us;
        let mut row = format!(
            "  {kind:<15} {:>6} {:>10} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8} {:>8}",
            c.count,
            human_bytes(c.size_bytes),
            c.total_ms,
            l.min,
            l.p50,
            l.p95,
            l.max,
            gbps(c.algbw_gbps),
            gbps(c.busbw_gbps)
        );
        if let Some(w) = waits {
            row.push_str(&format!(" {:>9.3}", w.get(kind).copied().unwrap_or(0.0)));
        }
        if blocking {
            let f = |v: Option<&replay::Latency>, p: fn(&replay::Latency) -> f64| {
                v.map_or("-".to_string(), |x| format!("{:.1}", p(x)))
            };
            row.push_str(&format!(
                " {:>9} {:>9}",
                f(c.skew_us.as_ref(), |x| x.p50),
                f(c.global_latency_us.as_ref(), |x| x.p95)
            ));
        }
        writeln!(out, "{row}")?;
        if c.sizes.len() > 1 {
            // Measured calls per call of an iteration (iterations, times ranks in a job).
            let per = (c.calls as f64 / c.count.max(1) as f64).max(1.0);
            for b in &c.sizes {
                let l = &b.latency_us;
                writeln!(
                    out,
                    "    <= {:<9} {:>6} {:>10} {:>9} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                    human_bytes(b.max_bytes),
                    {
                        let x = b.calls as f64 / per;
                        if x.fract() == 0.0 {
                            format!("{x}")
                        } else {
                            format!("{x:.2}")
                        }
                    },
                    "",
                    "",
                    l.min,
                    l.p50,
                    l.p95,
                    l.max
                )?;
            }
        }
    }
    Ok(())
}
