//! Benchmark packages and their results: the on-disk formats, and the checks that make a
//! package safe to run when it comes from someone else. A package is data, never code: nothing
//! in it is loaded or executed because it says so, no file name in it may point outside it, and
//! every file must match the hash its manifest records.
//!
//! ```text
//! DIR/manifest.json          Manifest (format "mystique-package/1")
//! DIR/rank<R>.et.json.gz     the selected (and, with --anonymize, anonymised) trace of rank R
//! DIR/rank<R>.plan.json.gz   its compiled replay plan (replay::plan::Plan, serde)
//! ```
//!
//! A run writes a [`RunResult`] (format "mystique-result/1"); `mystique diff` compares two.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

pub const PACKAGE_FORMAT: &str = "mystique-package/1";
/// The format of a package whose manifest records the original's `threads`: a build that reads
/// only [`PACKAGE_FORMAT`] refuses it by its format, not by an unknown field.
pub const PACKAGE_FORMAT_THREADS: &str = "mystique-package/2";
pub const RESULT_FORMAT: &str = "mystique-result/1";
pub const MANIFEST: &str = "manifest.json";

/// What a package holds and how it was made. Unknown fields are refused: a manifest cannot ask
/// for anything this build does not know (a library to load, a command to run).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    /// `mystique <version>` that generated it.
    pub created_by: String,
    /// The libtorch the plans were compiled against (operators and schemas).
    pub libtorch: String,
    /// The traces' schema version.
    pub schema: String,
    pub ranks: Vec<RankEntry>,
    pub selection: SelectionRecord,
    /// What-if edits applied before packaging (e.g. `scale 64 x2`).
    pub what_if: Vec<String>,
    /// Devices the original ran on (from the trace's tensors).
    pub devices_recorded: Vec<String>,
    /// Seed of the synthetic input values.
    pub seed: u64,
    pub warmup: usize,
    pub iters: usize,
    /// Namespaces of operators outside libtorch (`fbgemm`, ...): the person running the package
    /// loads their libraries with `--load-library`; the package never does.
    pub ops_from: Vec<String>,
    /// The original run's time, when a linked Kineto trace or `--original-ms` was given.
    pub original: Option<Original>,
    /// With `generate --emulate-gaps`: what `run` emulates the original's time between ops
    /// from. Absent from packages made without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gaps: Option<Gaps>,
    /// The intra-op threads the original ran with, where its capture's meta file recorded
    /// them: `run`'s default for a single-rank package. Absent where unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<i64>,
    /// With `--anonymize`: how many names of each kind were replaced by hashes.
    pub anonymized: Option<BTreeMap<String, usize>>,
    /// Every other file of the package and its SHA-256 (a name given twice is refused).
    #[serde(deserialize_with = "unique_keys")]
    pub files: BTreeMap<String, String>,
}

/// A JSON object into a map, refusing a key given twice (serde's maps keep the last).
fn unique_keys<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<BTreeMap<String, String>, D::Error> {
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of file names and hashes")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut a: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut m = BTreeMap::new();
            while let Some((k, v)) = a.next_entry::<String, String>()? {
                if m.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!(
                        "the file {k:?} is named twice"
                    )));
                }
                m.insert(k, v);
            }
            Ok(m)
        }
    }
    d.deserialize_map(Unique)
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RankEntry {
    pub rank: usize,
    pub trace: String,
    pub plan: String,
    /// SHA-256 of the source trace file it was made from.
    pub source_sha256: String,
    /// Ops in its replay set.
    pub ops: usize,
    /// This rank's original timing, from its own Kineto trace (multi-rank packages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<Original>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SelectionRecord {
    pub iterations: Option<Vec<u64>>,
    pub name: Option<String>,
    pub scope: Option<String>,
    pub ids: Option<String>,
    pub only: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Original {
    pub iter_ms: f64,
    pub ops_ms: Option<f64>,
    /// `kineto`, `reference`, `--original-ms`, a capture's `NAME.meta.json (iter_ms_median)`,
    /// or for a multi-rank package's whole step `kineto (slowest of N ranks)` (`meta files
    /// (slowest of N ranks)` where each rank's came from its meta file).
    pub from: String,
}

/// The gaps of a single-rank package: the capture's profile and, when given, the reference
/// their total is anchored on (`mystique replay --reference`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Gaps {
    /// The packaged Kineto profile (`rank0.timing.json.gz`).
    pub profile: String,
    pub reference: Option<Reference>,
}

/// A reference file's contents (`--reference`, a manifest's `gaps.reference`).
pub use et_graph::CaptureReference as Reference;

/// What `mystique run` writes: the machine, and per rank the replay report, per op signature
/// and per iteration times. Stable field names; `format` changes when they do.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    pub format: String,
    /// SHA-256 of the package's manifest: two results of the same package compare.
    pub package: String,
    pub machine: Machine,
    pub ranks: Vec<RankResult>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub device: String,
    pub threads: i64,
    pub libtorch: String,
    pub cpu: String,
    pub cores: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RankResult {
    pub rank: usize,
    /// The replay's `--json` report.
    pub report: serde_json::Value,
    /// Per op signature (name, input shapes and dtypes): calls and time per iteration.
    pub signatures: Vec<Signature>,
    /// Each measured iteration's wall time (ms).
    pub iterations_ms: Vec<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Signature {
    pub signature: String,
    pub op: String,
    pub count: usize,
    /// Median time of its calls summed per iteration (ms).
    pub total_ms: f64,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A file name inside a package: one plain component, never a path out of it.
pub fn check_name(name: &str) -> Result<()> {
    let p = Path::new(name);
    let plain = !name.is_empty()
        && p.components().count() == 1
        && matches!(p.components().next(), Some(std::path::Component::Normal(_)))
        && !name.contains('\\')
        && !name.contains('\0');
    if !plain {
        bail!("the package names {name:?}, which is not a file inside it: refused");
    }
    Ok(())
}

/// Reads and checks a package's manifest: its format, its file names, and every file's hash.
pub fn read_manifest(dir: &Path) -> Result<(Manifest, String)> {
    let path = dir.join(MANIFEST);
    if std::fs::symlink_metadata(dir).is_err() {
        bail!("{} does not exist", dir.display());
    }
    if !path.exists() && std::fs::symlink_metadata(&path).is_err() {
        bail!(
            "{} is not a mystique package (no {MANIFEST})",
            dir.display()
        );
    }
    let bytes = crate::input::read_bounded(&path, "manifest", crate::input::MANIFEST_MAX, true)?;
    let m: Manifest =
        serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))?;
    if m.format != PACKAGE_FORMAT && m.format != PACKAGE_FORMAT_THREADS {
        bail!(
            "{} is a package of format {:?}; this build reads {PACKAGE_FORMAT:?} and \
             {PACKAGE_FORMAT_THREADS:?}",
            dir.display(),
            m.format
        );
    }
    if let Some(n) = m.threads.filter(|&n| n <= 0) {
        bail!(
            "{}: the manifest's threads ({n}) must be positive",
            dir.display()
        );
    }
    // Ranks 0..N-1, each once, in order: `run` starts one process per entry and each finds its
    // own by number. (A package of no rank is refused when it runs.)
    for (k, r) in m.ranks.iter().enumerate() {
        if r.rank != k {
            bail!(
                "{}: the manifest's ranks are {:?}, where a package's are 0..{} in order, each \
                 once",
                dir.display(),
                m.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(),
                m.ranks.len() - 1
            );
        }
    }
    for r in &m.ranks {
        for f in [&r.trace, &r.plan] {
            check_name(f)?;
            if !m.files.contains_key(f) {
                bail!(
                    "the manifest names {f:?} for rank {} but records no hash for it",
                    r.rank
                );
            }
        }
    }
    if let Some(g) = &m.gaps {
        check_name(&g.profile)?;
        anyhow::ensure!(
            m.files.contains_key(&g.profile),
            "the manifest names the profile {:?} but records no hash for it",
            g.profile
        );
        anyhow::ensure!(
            m.ranks.len() == 1,
            "the manifest carries gaps for a package of {} ranks: only a single rank's are made",
            m.ranks.len()
        );
        if let Some(r) = &g.reference {
            r.check().context("the manifest's reference")?;
        }
    }
    for name in m.files.keys() {
        check_name(name)?;
        let p = dir.join(name);
        let meta = std::fs::symlink_metadata(&p)
            .with_context(|| format!("the package's {name} is missing"))?;
        if !meta.file_type().is_file() {
            bail!("the package's {name} is not a plain file (a link?): refused");
        }
        raw_file(dir, &m, name)?;
    }
    Ok((m, sha256_hex(&bytes)))
}

/// The most bytes one file of a package may hold (before decompression).
const PACKAGE_FILE_MAX: u64 = 16 << 30;

/// A package file's bytes as stored, read once and checked against the manifest's hash: what
/// was hashed is what the caller gets (a file swapped after [`read_manifest`] checked it is
/// refused here, not used).
fn raw_file(dir: &Path, m: &Manifest, name: &str) -> Result<Vec<u8>> {
    check_name(name)?;
    let hash = m
        .files
        .get(name)
        .with_context(|| format!("the manifest records no hash for {name:?}"))?;
    let bytes = crate::input::read_bounded(
        &dir.join(name),
        &format!("the package's {name}"),
        PACKAGE_FILE_MAX,
        true,
    )?;
    let got = sha256_hex(&bytes);
    if &got != hash {
        bail!(
            "the package's {name} does not match its manifest (sha256 {got}, manifest {hash}): it was changed after it was generated"
        );
    }
    Ok(bytes)
}

/// A package file's bytes, hashed as read against the manifest and decompressed when gzipped
/// (within et-schema's decompression limits).
pub fn read_file(dir: &Path, m: &Manifest, name: &str) -> Result<Vec<u8>> {
    let raw = raw_file(dir, m, name)?;
    et_schema::decompress(raw, name).with_context(|| format!("reading the package's {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_file_names_are_package_files() {
        for ok in ["rank0.plan.json.gz", "manifest.json", "a b"] {
            check_name(ok).unwrap();
        }
        for bad in ["", "..", ".", "../x", "/etc/passwd", "a/b", "a\\\\b", "./x"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unknown_manifest_fields_are_refused() {
        let m = serde_json::json!({"format": PACKAGE_FORMAT, "load_library": ["x.so"]});
        let e = serde_json::from_value::<Manifest>(m)
            .unwrap_err()
            .to_string();
        assert!(e.contains("load_library"), "{e}");
    }

    /// Manifests as a forger hands them over: thousands of seeded mutations of a real one
    /// (values replaced by extremes, strings, nulls; entries dropped or doubled; bytes cut) are
    /// read without a panic, each refused or read.
    #[test]
    fn mutated_manifests_are_refused_or_read_without_a_panic() {
        let dir = std::env::temp_dir().join(format!("mystique-pkg-mut-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rank0.et.json.gz"), b"t").unwrap();
        std::fs::write(dir.join("rank0.plan.json.gz"), b"p").unwrap();
        let files: BTreeMap<String, String> = [
            ("rank0.et.json.gz".to_string(), sha256_hex(b"t")),
            ("rank0.plan.json.gz".to_string(), sha256_hex(b"p")),
        ]
        .into();
        let m = Manifest {
            format: PACKAGE_FORMAT.into(),
            created_by: "mystique".into(),
            libtorch: "2.11.0".into(),
            schema: "1.1.1".into(),
            ranks: vec![RankEntry {
                rank: 0,
                trace: "rank0.et.json.gz".into(),
                plan: "rank0.plan.json.gz".into(),
                source_sha256: "00".into(),
                ops: 3,
                original: None,
            }],
            selection: SelectionRecord::default(),
            what_if: Vec::new(),
            devices_recorded: vec!["cpu".into()],
            seed: 0,
            warmup: 1,
            iters: 2,
            ops_from: Vec::new(),
            original: Some(Original {
                iter_ms: 1.0,
                ops_ms: None,
                from: "kineto".into(),
            }),
            gaps: None,
            threads: None,
            anonymized: None,
            files,
        };
        let text = serde_json::to_string_pretty(&m).unwrap().into_bytes();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n.max(1) as u64) as usize
        };
        let pieces: [&[u8]; 9] = [
            b"-1",
            b"1e309",
            b"18446744073709551616",
            b"null",
            b"\"../x\"",
            b"[]",
            b"{}",
            b"\"\\u0000\"",
            b"\"rank0.plan.json.gz\": \"00\",",
        ];
        let (mut read, mut refused) = (0, 0);
        for _ in 0..3000 {
            let mut t = text.clone();
            for _ in 0..1 + next(3) {
                let at = next(t.len());
                match next(4) {
                    0 => t.truncate(at),
                    1 => {
                        let end = (at + 1 + next(12)).min(t.len());
                        t.drain(at..end);
                    }
                    _ => {
                        let p = pieces[next(pieces.len())];
                        t.splice(at..at, p.iter().copied());
                    }
                }
            }
            std::fs::write(dir.join(MANIFEST), &t).unwrap();
            match read_manifest(&dir) {
                Ok(_) => read += 1,
                Err(_) => refused += 1,
            }
        }
        assert!(refused > 0, "{read} read, {refused} refused");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What a package's reader uses is what it hashed: a file changed after the manifest was
    /// checked is refused when it is read, not used.
    #[test]
    fn a_file_changed_after_the_check_is_refused_when_read() {
        let dir = std::env::temp_dir().join(format!("mystique-pkg-toctou-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.bin"), b"checked").unwrap();
        let m = Manifest {
            format: PACKAGE_FORMAT.into(),
            created_by: String::new(),
            libtorch: String::new(),
            schema: String::new(),
            ranks: Vec::new(),
            selection: SelectionRecord::default(),
            what_if: Vec::new(),
            devices_recorded: Vec::new(),
            seed: 0,
            warmup: 0,
            iters: 1,
            ops_from: Vec::new(),
            original: None,
            gaps: None,
            threads: None,
            anonymized: None,
            files: [("a.bin".to_string(), sha256_hex(b"checked"))].into(),
        };
        std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        let (m, _) = read_manifest(&dir).unwrap();
        assert_eq!(read_file(&dir, &m, "a.bin").unwrap(), b"checked");
        std::fs::write(dir.join("a.bin"), b"swapped").unwrap();
        let e = read_file(&dir, &m, "a.bin").unwrap_err().to_string();
        assert!(e.contains("does not match its manifest"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
