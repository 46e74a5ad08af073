//! CUDA events on a stream: marks recorded in the stream's order of work and resolved to times
//! after the work is done, so a timed loop never waits on the device per mark.
//!
//! Events are created once and reused (creating one costs microseconds, recording one costs
//! a launch's worth of host time). Times are relative to the first mark of a round; a caller
//! puts them on its host clock by adding the host time of that first mark.
//!
//! Without the `cuda` feature the same types exist and every call returns
//! [`Error::NoCudaSupport`].

use crate::Error;

/// Marks on a CUDA stream.
pub struct EventTimer {
    #[cfg(feature = "cuda")]
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    #[cfg(feature = "cuda")]
    events: Vec<cudarc::driver::CudaEvent>,
    used: usize,
}

#[cfg(feature = "cuda")]
impl EventTimer {
    /// A timer recording on `stream`.
    pub fn new(stream: std::sync::Arc<cudarc::driver::CudaStream>) -> EventTimer {
        EventTimer {
            stream,
            events: Vec::new(),
            used: 0,
        }
    }

    /// Records the next mark on the stream; returns its index in this round.
    pub fn record(&mut self) -> Result<usize, Error> {
        if self.used == self.events.len() {
            // Timing enabled (the default flags), unlike cudarc's default of disabled.
            let e = self
                .stream
                .context()
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(call_failed("creating a CUDA event"))?;
            self.events.push(e);
        }
        self.events[self.used]
            .record(&self.stream)
            .map_err(call_failed("recording a CUDA event"))?;
        self.used += 1;
        Ok(self.used - 1)
    }

    /// Waits for the last mark and returns every mark's time in µs after the first.
    pub fn resolve(&self) -> Result<Vec<f64>, Error> {
        let Some(first) = self.events[..self.used].first() else {
            return Ok(Vec::new());
        };
        // The last mark done, every earlier one on the stream is: one wait, then plain reads
        // (cudarc's `elapsed_ms` would bind the context and wait on both events per mark).
        self.events[self.used - 1]
            .synchronize()
            .map_err(call_failed("waiting for a CUDA event"))?;
        self.stream
            .context()
            .bind_to_thread()
            .map_err(call_failed("binding the CUDA context"))?;
        self.events[..self.used]
            .iter()
            .map(|e| {
                // SAFETY: both events belong to this timer's context and have completed.
                unsafe { cudarc::driver::result::event::elapsed(first.cu_event(), e.cu_event()) }
                    .map(|ms| ms as f64 * 1e3)
                    .map_err(call_failed("reading a CUDA event"))
            })
            .collect()
    }
}

/// The error of a failed CUDA call made to do `call`.
#[cfg(feature = "cuda")]
fn call_failed(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::CudaCall {
        call,
        error: Box::new(e),
    }
}

#[cfg(not(feature = "cuda"))]
impl EventTimer {
    pub fn record(&mut self) -> Result<usize, Error> {
        Err(Error::NoCudaSupport)
    }

    pub fn resolve(&self) -> Result<Vec<f64>, Error> {
        Err(Error::NoCudaSupport)
    }
}

/// With or without CUDA.
impl EventTimer {
    /// Starts a new round (events are reused).
    pub fn clear(&mut self) {
        self.used = 0;
    }

    /// Marks recorded this round.
    pub fn len(&self) -> usize {
        self.used
    }

    pub fn is_empty(&self) -> bool {
        self.used == 0
    }
}

/// Whether the CUDA driver library can be loaded here, and how many devices it sees; `Err` says
/// why not. Checked before any other CUDA call: cudarc panics on first use without libcuda.
pub fn driver_devices() -> Result<usize, Error> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only tries to load the library by its usual names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoCudaDriver);
        }
        cudarc::driver::CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| Error::CudaDriver(Box::new(e)))
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::NoCudaSupport)
}

#[cfg(test)]
mod tests {
    #[test]
    fn driver_check_answers_without_panicking() {
        match super::driver_devices() {
            Ok(n) => eprintln!("{n} CUDA devices"),
            Err(e) => assert!(e.to_string().contains("CUDA"), "{e}"),
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA device: cargo xtask gpu-check runs it"]
    fn events_time_work_in_stream_order() {
        if super::driver_devices().unwrap_or(0) == 0 {
            panic!("no CUDA device");
        }
        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        let stream = ctx.new_stream().unwrap();
        let mut t = super::EventTimer::new(stream.clone());
        for _ in 0..2 {
            t.clear();
            t.record().unwrap();
            // 256 MiB of memset between the marks: measurable on any GPU.
            let mut buf = stream.alloc_zeros::<u8>(256 << 20).unwrap();
            t.record().unwrap();
            stream.memset_zeros(&mut buf).unwrap();
            t.record().unwrap();
            let us = t.resolve().unwrap();
            assert_eq!(us.len(), 3);
            assert_eq!(us[0], 0.0);
            assert!(us[2] > us[1] && us[1] >= 0.0, "{us:?}");
        }
    }
}
