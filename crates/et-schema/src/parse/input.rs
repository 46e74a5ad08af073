//! Reading input: stdin or a file, a large plain file mapped, gzip inflated within limits that
//! keep a hostile file from exhausting memory.

use crate::error::{clip, human_bytes, Error, Result, MSG_MAX};
use std::io::Read;
use std::path::Path;

/// The environment variable that sets [`ReadOptions::max_decompressed`] when that is `None`.
pub const MAX_DECOMPRESSED_ENV: &str = "MYSTIQUE_MAX_DECOMPRESSED";

/// The most a gzip input may inflate to by default, whatever its compressed size.
pub const DEFAULT_MAX_DECOMPRESSED: u64 = 16 << 30;
/// By default a gzip input may also inflate to at most this many times its compressed size...
const DEFAULT_MAX_RATIO: u64 = 128;
/// ... unless that is under this floor. Traces compress 10-30x (the shared ones); deflate's
/// ceiling is about 1032x, which only bombs (runs of one byte) reach.
const DEFAULT_RATIO_FLOOR: u64 = 1 << 30;

/// How to read input files: limits that keep a hostile file from exhausting memory.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// The most bytes a gzip input may decompress to; more is an
    /// [`Error::DecompressedTooLarge`] naming the limit. `None`: the environment variable
    /// [`MAX_DECOMPRESSED_ENV`] (`MYSTIQUE_MAX_DECOMPRESSED`, bytes or with a K/M/G/T suffix)
    /// when set, else 128 times the compressed size but at least 1 GiB, and at most
    /// [`DEFAULT_MAX_DECOMPRESSED`] (16 GiB).
    pub max_decompressed: Option<u64>,
}

impl ReadOptions {
    /// The limit for an input of `compressed` bytes, and how it was chosen (for the message).
    pub(super) fn limit(&self, compressed: usize) -> Result<(u64, String)> {
        if let Some(l) = self.max_decompressed {
            return Ok((l, "the limit set by the caller".into()));
        }
        if let Some(v) = std::env::var_os(MAX_DECOMPRESSED_ENV) {
            let v = v.to_string_lossy();
            let l = parse_size(&v).ok_or_else(|| Error::BadLimit {
                var: MAX_DECOMPRESSED_ENV,
                value: clip(&v, MSG_MAX).into_owned(),
            })?;
            return Ok((l, format!("the limit {MAX_DECOMPRESSED_ENV}={v} sets")));
        }
        Ok((
            default_max_decompressed(compressed as u64),
            format!(
                "the default limit for {compressed} compressed bytes ({DEFAULT_MAX_RATIO}x that, at least {}, at most {})",
                human_bytes(DEFAULT_RATIO_FLOOR),
                human_bytes(DEFAULT_MAX_DECOMPRESSED)
            ),
        ))
    }
}

/// The default decompression limit for `compressed` bytes of gzip (see [`ReadOptions`]).
pub(super) fn default_max_decompressed(compressed: u64) -> u64 {
    compressed
        .saturating_mul(DEFAULT_MAX_RATIO)
        .clamp(DEFAULT_RATIO_FLOOR, DEFAULT_MAX_DECOMPRESSED)
}

/// `17179869184`, `16G`, `16GiB`, `512m`, `1.5T`: binary multiples.
pub(super) fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(1u64 << shift);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * (1u64 << shift) as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

/// Reads a file (or `-` for stdin) into memory, decompressing gzip when the magic bytes say so,
/// whatever the file name, within the default [`ReadOptions`].
pub fn read_input(path: &Path) -> Result<Vec<u8>> {
    read_input_with(path, &ReadOptions::default())
}

/// [`read_input`] within the limits of `ropts`.
pub fn read_input_with(path: &Path, ropts: &ReadOptions) -> Result<Vec<u8>> {
    let name = path.display().to_string();
    let raw = if path.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut v)
            .map_err(|source| Error::Io {
                path: name.clone(),
                source,
            })?;
        v
    } else {
        read_regular(path)?
    };
    decompress_with(raw, &name, ropts)
}

/// What kind of file `meta` describes, for [`Error::NotAFile`]; `None` for a regular file.
pub fn not_a_file(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() || t.is_block_device() {
            return Some("a device");
        }
        if t.is_fifo() {
            return Some("a FIFO");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some(if t.is_dir() {
        "a directory"
    } else {
        "not a plain file"
    })
}

/// Opens `path` for reading without waiting: a FIFO opens at once (and is then refused as not
/// a regular file) instead of blocking until some writer opens it. A regular file's reads
/// ignore the flag.
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    o.open(path)
}

/// The bytes of `path`, which must be a regular file (checked on the opened file, so what was
/// checked is what is read).
fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = open_nonblocking(path).map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    if let Some(kind) = not_a_file(&meta) {
        return Err(Error::NotAFile {
            path: path.display().to_string(),
            kind,
        });
    }
    let mut v = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    f.read_to_end(&mut v).map_err(io)?;
    Ok(v)
}

/// Plain files below this size are read, not mapped: mapping costs more than it saves there.
const MAP_MIN: u64 = 1 << 20;

/// An input file's bytes: a plain file is mapped read-only, anything else (stdin, gzip, small
/// files, a failed map) is read into memory. Derefs to the bytes.
///
/// Why map: `read` copies the file into fresh anonymous pages (a page fault and a copy per 4
/// KiB), and those pages stay resident until the parse ends, so peak memory would be the file
/// plus the model. A mapping is filled from the page cache on demand, and the parser hands back
/// (`Input::release`) what it has read, so peak memory stays near the model's size.
///
/// A file truncated by another process while it is mapped makes reads past the new end fault
/// (SIGBUS), as with any mapped file (ripgrep and git map their inputs alike); traces are
/// written once by the observer and read afterwards. The CLI turns SIGBUS into exit 2 with a
/// message; other programs that map may want the same.
pub struct Input {
    inner: InputInner,
}

enum InputInner {
    Owned(Vec<u8>),
    #[cfg(unix)]
    Mapped {
        ptr: *mut libc::c_void,
        len: usize,
    },
}

// SAFETY: the mapping is private and read-only: no one writes through it, so sharing the
// pointer across threads is sharing an immutable slice.
unsafe impl Send for Input {}
// SAFETY: as above.
unsafe impl Sync for Input {}

impl std::ops::Deref for Input {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.inner {
            InputInner::Owned(v) => v,
            // SAFETY: `ptr` maps `len` readable bytes until `self` drops the mapping.
            #[cfg(unix)]
            InputInner::Mapped { ptr, len } => unsafe {
                std::slice::from_raw_parts(*ptr as *const u8, *len)
            },
        }
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let InputInner::Mapped { ptr, len } = self.inner {
            // SAFETY: the mapping made in `open_input`, unmapped once, here.
            unsafe { libc::munmap(ptr, len) };
        }
    }
}

impl Input {
    /// Whether the bytes are a mapping of the file (else they were read into memory).
    pub fn is_mapped(&self) -> bool {
        !matches!(self.inner, InputInner::Owned(_))
    }

    /// The parser will not read `range` again soon: a mapped input's resident pages wholly
    /// inside it leave this process (they stay in the page cache, and a later read maps them
    /// again, with the same bytes: the mapping is private and read-only). No-op for read input.
    pub(crate) fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let InputInner::Mapped { ptr, len } = self.inner {
            let page = 4096usize;
            let start = range.start.div_ceil(page) * page;
            let end = range.end.min(len) / page * page;
            if end > start {
                // SAFETY: a page-aligned range inside the mapping. MADV_DONTNEED on a private
                // file mapping that was never written drops the pages; reads refault them
                // from the file. Failure only means the pages stay resident.
                unsafe {
                    libc::madvise(
                        (ptr as *mut u8).add(start) as *mut libc::c_void,
                        end - start,
                        libc::MADV_DONTNEED,
                    )
                };
            }
        }
        let _ = range;
    }
}

/// Opens an input file (or `-` for stdin): maps a plain file of at least 1 MiB, reads and
/// decompresses gzip (by its magic bytes, whatever the name) within `ropts`' limits.
pub fn open_input(path: &Path, ropts: &ReadOptions) -> Result<Input> {
    #[cfg(unix)]
    if path.as_os_str() != "-" {
        if let Some(m) = map_file(path)? {
            return Ok(m);
        }
    }
    Ok(Input {
        inner: InputInner::Owned(read_input_with(path, ropts)?),
    })
}

/// Maps `path` if it is a plain, uncompressed file worth mapping; `None` to read it instead.
#[cfg(unix)]
fn map_file(path: &Path) -> Result<Option<Input>> {
    use std::os::unix::io::AsRawFd;
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = open_nonblocking(path).map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    if !meta.is_file() || meta.len() < MAP_MIN || usize::try_from(meta.len()).is_err() {
        return Ok(None);
    }
    let mut magic = [0u8; 2];
    if f.read_exact(&mut magic).is_err() || magic == [0x1f, 0x8b] {
        return Ok(None);
    }
    let len = meta.len() as usize;
    // SAFETY: a new private read-only mapping of an open file; checked for MAP_FAILED.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Ok(None);
    }
    // Each parser thread reads its part front to back: ask for read-ahead. Advice only.
    // SAFETY: the whole mapping just made.
    unsafe { libc::madvise(ptr, len, libc::MADV_SEQUENTIAL) };
    Ok(Some(Input {
        inner: InputInner::Mapped { ptr, len },
    }))
}

/// Decompresses gzip input (possibly multi-member) within the default [`ReadOptions`]; other
/// input is returned as is.
pub fn decompress(raw: Vec<u8>, name: &str) -> Result<Vec<u8>> {
    decompress_with(raw, name, &ReadOptions::default())
}

/// [`decompress`] within the limits of `ropts`.
pub fn decompress_with(raw: Vec<u8>, name: &str, ropts: &ReadOptions) -> Result<Vec<u8>> {
    if raw.len() < 2 || raw[0] != 0x1f || raw[1] != 0x8b {
        return Ok(raw);
    }
    let (limit, why) = ropts.limit(raw.len())?;
    // ISIZE (the last 4 bytes) is the uncompressed size mod 2^32: a good capacity hint, but
    // only a claim: never more than deflate can give from this many bytes (at most ~1032x),
    // nor more than the limit.
    let hint = if raw.len() >= 18 {
        u32::from_le_bytes(raw[raw.len() - 4..].try_into().unwrap_or([0; 4])) as u64
    } else {
        0
    };
    let hint = hint
        .min((raw.len() as u64).saturating_mul(1032))
        .max(raw.len() as u64 * 4)
        .min(limit.saturating_add(1));
    let mut out = Vec::with_capacity(usize::try_from(hint).unwrap_or(usize::MAX));
    let dec = flate2::read::MultiGzDecoder::new(&raw[..]);
    if let Err(source) = dec.take(limit.saturating_add(1)).read_to_end(&mut out) {
        return Err(Error::Gzip {
            path: name.to_string(),
            decompressed: out.len() as u64,
            source,
        });
    }
    if out.len() as u64 > limit {
        return Err(Error::DecompressedTooLarge {
            path: name.to_string(),
            limit,
            why,
        });
    }
    Ok(out)
}
