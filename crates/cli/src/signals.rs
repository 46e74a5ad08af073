//! Temporary files and directories that must not outlive the command, even when it is
//! interrupted: [`install`] blocks SIGINT, SIGTERM and SIGHUP in every thread and waits for
//! them on a thread of its own, which removes what is registered ([`Temp`]) and then ends the
//! process by the same signal (its exit status says which, as an uncaught signal's would).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static TEMPS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn set() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is initialised by sigemptyset before use.
    let mut s: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `s` is a valid sigset_t.
    unsafe {
        libc::sigemptyset(&mut s);
        for sig in SIGNALS {
            libc::sigaddset(&mut s, sig);
        }
    }
    s
}

/// Call first in `main`, before any thread starts (threads inherit the blocked signals).
pub fn install() {
    let s = set();
    // SAFETY: a valid set; only this thread's mask changes, inherited by threads made later.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &s, std::ptr::null_mut()) } != 0 {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: a valid set and out-pointer.
            if unsafe { libc::sigwait(&s, &mut sig) } != 0 {
                return;
            }
            // Held until the process ends: a temporary being made ([`Temp::make`]) is made
            // and registered before this removes it, and none is made after.
            let temps = TEMPS.lock().unwrap_or_else(|e| e.into_inner());
            for p in temps.iter() {
                remove(p);
            }
            // SAFETY: back to the default action, unblocked, and raised: the process ends as
            // the signal would have ended it.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &s, std::ptr::null_mut());
                libc::raise(sig);
            }
            std::process::exit(128 + sig);
        });
    if spawned.is_err() {
        unblock();
    }
}

/// Exit status of a command cut short by a closed stdout or stderr: 128 + SIGPIPE, what a shell
/// reports for a process a closed pipe killed (`yes | head`).
pub const EXIT_CLOSED_OUTPUT: i32 = 128 + libc::SIGPIPE;

/// Call in `main`: a print to a closed stdout or stderr (`2>&1 | head`), which panics in
/// `println!` and `eprintln!`, ends the process as a closed pipe would end a C program: its
/// temporaries removed, exit status [`EXIT_CLOSED_OUTPUT`], no message (there is nowhere to
/// write one). Any other panic goes on to the hook that was there.
pub fn end_on_closed_output() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        // std's words for it: "failed printing to stderr: Broken pipe (os error 32)".
        let epipe = format!("(os error {})", libc::EPIPE);
        if msg.starts_with("failed printing to std") && msg.contains(&epipe) {
            // Not waited for: the thread holding the lock may be the one that panicked.
            if let Ok(temps) = TEMPS.try_lock() {
                for p in temps.iter() {
                    remove(p);
                }
            }
            // SAFETY: ends the process at once, without running other threads' destructors
            // or atexit handlers against state they may be in the middle of changing.
            unsafe { libc::_exit(EXIT_CLOSED_OUTPUT) };
        }
        previous(info)
    }));
}

/// Unblocks the signals [`install`] blocked: for a child process between fork and exec (it
/// inherits the mask), so that it can be interrupted. Async-signal-safe.
pub fn unblock() {
    let s = set();
    // SAFETY: a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &s, std::ptr::null_mut()) };
}

fn remove(p: &Path) {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(p);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(p);
        }
        Err(_) => {}
    }
}

/// A temporary path removed when dropped (unless [`Temp::keep`] was called) and on SIGINT,
/// SIGTERM or SIGHUP.
pub struct Temp {
    path: PathBuf,
    kept: bool,
}

impl Temp {
    /// Makes `path` with `make` and registers it, both under the lock the signal thread takes
    /// before it removes what is registered: a signal between the two leaves nothing behind.
    pub fn make<T>(
        path: PathBuf,
        make: impl FnOnce(&Path) -> std::io::Result<T>,
    ) -> std::io::Result<(T, Temp)> {
        let mut temps = TEMPS.lock().unwrap_or_else(|e| e.into_inner());
        let made = make(&path)?;
        temps.push(path.clone());
        Ok((made, Temp { path, kept: false }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// It was renamed into place: nothing to remove.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let mut temps = TEMPS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = temps.iter().position(|p| *p == self.path) {
            temps.swap_remove(k);
        }
        drop(temps);
        if !self.kept {
            remove(&self.path);
        }
    }
}

/// A name no other process can guess: `.{stem}.tmp-{pid}-{16 random hex digits}`.
pub fn temp_name(stem: &str) -> String {
    let mut r = [0u8; 8];
    random_bytes(&mut r);
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    format!(".{stem}.tmp-{}-{hex}", std::process::id())
}

/// Fills `out` from `/dev/urandom`, else (no such device) with the clock's nanoseconds.
pub fn random_bytes(out: &mut [u8]) {
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, out))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
            .to_le_bytes();
        for (b, t) in out.iter_mut().zip(t.iter().cycle()) {
            *b = *t;
        }
    }
}
