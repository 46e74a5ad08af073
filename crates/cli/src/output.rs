//! Writing outputs safely: never over one of the command's inputs, checked before any long work
//! starts (a replay's report is not lost to a bad `--trace-out` path), and atomically (a
//! temporary file beside the output, renamed over it), so a failed write leaves the old file.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

fn is_stdout(p: &Path) -> bool {
    p.as_os_str() == "-"
}

fn dir_of(out: &Path) -> PathBuf {
    match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether two paths name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
        false
    }
    #[cfg(not(unix))]
    {
        matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    }
}

/// Where `p` is or would be: its longest existing ancestor made canonical, joined with the
/// rest of it (`None` where no ancestor resolves).
fn resolved(p: &Path) -> Option<PathBuf> {
    let p = if p.is_relative() {
        std::env::current_dir().ok()?.join(p)
    } else {
        p.to_path_buf()
    };
    let mut rest = Vec::new();
    let mut at = p.as_path();
    loop {
        if let Ok(c) = at.canonicalize() {
            return Some(rest.iter().rev().fold(c, |acc, n| acc.join(n)));
        }
        rest.push(at.file_name()?.to_owned());
        at = at.parent()?;
    }
}

/// Whether two paths name the same file, existing or not.
pub fn same_path(a: &Path, b: &Path) -> bool {
    same_file(a, b) || matches!((resolved(a), resolved(b)), (Some(x), Some(y)) if x == y)
}

/// Whether `out` is, or would be written, inside directory `dir` (existing or not).
pub fn inside(out: &Path, dir: &Path) -> bool {
    matches!((resolved(out), resolved(dir)), (Some(o), Some(d)) if o.starts_with(&d))
}

/// Checks an output path before work starts: it is not one of `inputs`, not a directory, and
/// its directory exists and takes a new file.
pub fn check(out: &Path, inputs: &[&Path]) -> Result<()> {
    if is_stdout(out) {
        return Ok(());
    }
    for i in inputs {
        if !is_stdout(i) && same_file(out, i) {
            bail!(
                "{} is also an input of this command: refusing to overwrite it (write the output elsewhere)",
                out.display()
            );
        }
    }
    if out.is_dir() {
        bail!("{} is a directory, not an output file", out.display());
    }
    check_parent(out)
}

/// Refuses `out` as a directory to write (a package, a job's ranks) unless it is new, with its
/// parent there, or empty; `-` is no directory.
pub fn check_new_dir(out: &Path) -> Result<()> {
    if is_stdout(out) {
        bail!("-o -: this command writes a directory of files, not one stream: name the directory");
    }
    if out.is_dir() {
        if out.read_dir()?.next().is_some() {
            bail!("{} exists and is not an empty directory", out.display());
        }
        return Ok(());
    }
    if out.exists() {
        bail!(
            "{} is a file: this command writes a new (or empty) directory there",
            out.display()
        );
    }
    check_parent(out)
}

/// Refuses `out` whose directory is missing or not writable, naming it: an output, or a
/// package directory, is made beside where it goes and renamed into place.
pub fn check_parent(out: &Path) -> Result<()> {
    let dir = dir_of(out);
    if !dir.is_dir() {
        bail!(
            "cannot write {}: {} {}",
            out.display(),
            dir.display(),
            if dir.exists() {
                "is not a directory"
            } else {
                "does not exist"
            }
        );
    }
    let probe = create_exclusive(&dir, "mystique-probe").with_context(|| {
        format!(
            "cannot write {}: {} is not writable",
            out.display(),
            dir.display()
        )
    })?;
    drop(probe);
    Ok(())
}

/// A new file in `dir` under a name no other process can guess ([`crate::signals::temp_name`]),
/// created exclusively and without following a link (a name planted in a shared directory
/// fails the creation instead of redirecting the write), registered for removal on every exit
/// path, signals included.
pub fn create_exclusive(dir: &Path, stem: &str) -> Result<(std::fs::File, crate::signals::Temp)> {
    exclusive(dir, stem, "file", |path| {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.custom_flags(libc::O_NOFOLLOW);
        }
        o.open(path)
    })
}

/// A new directory in `dir` under a name no other process can guess, created exclusively (an
/// existing name or link fails it), registered for removal as [`create_exclusive`]'s files.
pub fn create_exclusive_dir(dir: &Path, stem: &str) -> Result<crate::signals::Temp> {
    exclusive(dir, stem, "directory", |p| std::fs::create_dir(p)).map(|((), t)| t)
}

/// `make` at a fresh unguessable name in `dir`, tried again (8 times in all) where the name
/// exists; what it made, registered as a [`crate::signals::Temp`] as it is made, so that a
/// signal cannot come between the two ([`crate::signals::Temp::make`]).
fn exclusive<T>(
    dir: &Path,
    stem: &str,
    what: &str,
    make: impl Fn(&Path) -> std::io::Result<T>,
) -> Result<(T, crate::signals::Temp)> {
    let mut last = None;
    for _ in 0..8 {
        let path = dir.join(crate::signals::temp_name(stem));
        match crate::signals::Temp::make(path.clone(), &make) {
            Ok(made) => return Ok(made),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
    Err(last.map_or_else(|| anyhow::anyhow!("no name"), anyhow::Error::from))
        .with_context(|| format!("creating a temporary {what} in {}", dir.display()))
}

/// [`check`] for a plot: its extension must name a format plots are written in (.svg, .png),
/// checked before the work whose results it draws.
pub fn check_plot(out: &Path, inputs: &[&Path]) -> Result<()> {
    check(out, inputs)?;
    metrics::plot::Format::of(out)?;
    Ok(())
}

/// A plot drawn by `draw` in the format `out`'s extension names (.svg or .png), written to
/// `out` as [`write_atomic`] writes.
pub fn write_plot(
    out: &Path,
    draw: impl FnOnce(metrics::plot::Format) -> std::result::Result<Vec<u8>, metrics::plot::PlotError>,
) -> Result<()> {
    let bytes = metrics::plot::Format::of(out)
        .and_then(draw)
        .with_context(|| format!("plotting {}", out.display()))?;
    write_atomic(out, |w| Ok(w.write_all(&bytes)?))
}

/// Whether `out` names a gzipped file (`.gz`, in any case): outputs so named are compressed.
pub fn is_gz(out: &Path) -> bool {
    !is_stdout(out)
        && out
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gz"))
}

/// [`write_atomic`], gzipped where `out` [`is_gz`].
pub fn write_atomic_gz(out: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    if !is_gz(out) {
        return write_atomic(out, write);
    }
    write_atomic(out, |w| {
        let mut e = flate2::write::GzEncoder::new(w, flate2::Compression::default());
        write(&mut e)?;
        e.finish()?;
        Ok(())
    })
}

/// Writes `out` atomically (`-`: stdout): `write` fills a temporary file beside it, which then
/// replaces it; on any error the temporary file goes and `out` is untouched.
pub fn write_atomic(out: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    if is_stdout(out) {
        let mut o = std::io::stdout().lock();
        write(&mut o)?;
        o.flush()?;
        return Ok(());
    }
    let name = out
        .file_name()
        .with_context(|| format!("{} has no file name", out.display()))?;
    let result = (|| -> Result<()> {
        let (f, tmp) = create_exclusive(&dir_of(out), &name.to_string_lossy())?;
        let mut w = std::io::BufWriter::new(f);
        write(&mut w)?;
        w.flush()?;
        w.into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()
            .with_context(|| format!("writing {}", tmp.path().display()))?;
        // rename replaces `out` itself, a link planted there included: never its target.
        std::fs::rename(tmp.path(), out).with_context(|| format!("replacing {}", out.display()))?;
        tmp.keep();
        Ok(())
    })();
    result.with_context(|| format!("writing {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_is_never_an_output_and_failed_writes_keep_the_old_file() {
        let dir = std::env::temp_dir().join(format!("mystique-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("in.json");
        std::fs::write(&input, "original").unwrap();
        // The same file under another name is refused too.
        let alias = dir.join(".").join("in.json");
        assert!(check(&alias, &[&input])
            .unwrap_err()
            .to_string()
            .contains("input"));
        assert!(check(&dir, &[&input]).is_err(), "a directory");
        assert!(check(&dir.join("missing/x.json"), &[&input]).is_err());
        check(&dir.join("out.json"), &[&input]).unwrap();
        // A write that fails half-way leaves the existing file as it was.
        let e = write_atomic(&input, |w| {
            w.write_all(b"partial")?;
            bail!("disk full")
        });
        assert!(e.is_err());
        assert_eq!(std::fs::read_to_string(&input).unwrap(), "original");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        write_atomic(&input, |w| Ok(w.write_all(b"new")?)).unwrap();
        assert_eq!(std::fs::read_to_string(&input).unwrap(), "new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
