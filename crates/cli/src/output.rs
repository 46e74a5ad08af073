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
    let dir = dir_of(out);
    if !dir.is_dir() {
        bail!(
            "cannot write {}: {} is not a directory",
            out.display(),
            dir.display()
        );
    }
    let probe = dir.join(format!(".mystique-probe-{}", std::process::id()));
    std::fs::File::create(&probe).with_context(|| {
        format!(
            "cannot write {}: {} is not writable",
            out.display(),
            dir.display()
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
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
    let tmp = dir_of(out).join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut w = std::io::BufWriter::new(f);
        write(&mut w)?;
        w.flush()?;
        w.into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, out).with_context(|| format!("replacing {}", out.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
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
