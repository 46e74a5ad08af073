//! Reading the files a command takes from outside (manifests, plans, results, metadata) as a
//! hostile world may hand them over: a regular file, checked on the file opened (so what was
//! checked is what is read), within a size that fits its kind, and read once.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

/// A package's manifest: kilobytes in practice.
pub const MANIFEST_MAX: u64 = 16 << 20;
/// A capture's `NAME.meta.json`.
pub const META_MAX: u64 = 1 << 20;
/// A result of `mystique run` (per-op signatures of every rank).
pub const RESULT_MAX: u64 = 1 << 30;

/// The bytes of `path` (`what` it is, for messages), which must be a regular file of at most
/// `limit` bytes. With `no_follow`, a symbolic link is refused too (a package's own files).
pub fn read_bounded(path: &Path, what: &str, limit: u64, no_follow: bool) -> Result<Vec<u8>> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking: opening a FIFO must not wait for a writer (it is refused below).
        let mut flags = libc::O_NONBLOCK;
        if no_follow {
            flags |= libc::O_NOFOLLOW;
        }
        opts.custom_flags(flags);
    }
    let mut f = opts
        .open(path)
        .with_context(|| match std::fs::symlink_metadata(path) {
            Ok(m) if no_follow && m.file_type().is_symlink() => {
                format!("{what} {} is a symbolic link: refused", path.display())
            }
            _ => format!("reading {what} {}", path.display()),
        })?;
    let meta = f
        .metadata()
        .with_context(|| format!("reading {what} {}", path.display()))?;
    if let Some(kind) = et_schema::not_a_file(&meta) {
        bail!(
            "{what} {} is {kind}, not a regular file: refused",
            path.display()
        );
    }
    if meta.len() > limit {
        bail!(
            "{what} {} is {} bytes, more than the {} a {what} may be: refused",
            path.display(),
            meta.len(),
            limit
        );
    }
    let mut v = Vec::with_capacity(meta.len() as usize);
    // A file that grows while it is read stops at the limit.
    f.by_ref()
        .take(limit + 1)
        .read_to_end(&mut v)
        .with_context(|| format!("reading {what} {}", path.display()))?;
    if v.len() as u64 > limit {
        bail!(
            "{what} {} grew past {limit} bytes while read: refused",
            path.display()
        );
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Devices, FIFOs, directories and links (where refused) never get read; a file over its
    /// kind's size is refused by its size, before it is read.
    #[test]
    fn only_regular_files_within_their_size_are_read() {
        let dir = std::env::temp_dir().join(format!("mystique-input-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("m.json");
        std::fs::write(&file, b"{}").unwrap();
        assert_eq!(read_bounded(&file, "manifest", 16, false).unwrap(), b"{}");
        let e = read_bounded(&file, "manifest", 1, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than the 1"), "{e}");
        let e = read_bounded(Path::new("/dev/zero"), "manifest", 16, false).unwrap_err();
        assert!(e.to_string().contains("a device"), "{e}");
        let e = read_bounded(&dir, "manifest", 16, false).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_bounded(&fifo, "manifest", 16, false).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_bounded(&link, "manifest", 16, false).unwrap(), b"{}");
        let e = read_bounded(&link, "manifest", 16, true).unwrap_err();
        assert!(format!("{e:#}").contains("symbolic link"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
