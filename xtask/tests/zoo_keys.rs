//! The zoo's cache keys (`xtask/scripts/zoo.py list`): a model's key follows its own code, and
//! the machinery key the code that runs and records every model, so that adding or changing a
//! model recaptures that model alone and changing the capture recaptures all. Runs the real
//! script on a copy edited in one place; skipped where torch is not installed yet (`cargo xtask
//! setup` links it as `.libtorch`).

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// `zoo.py list` of the script at `script`: model -> (key, machinery key).
fn keys(script: &Path, torch: &Path) -> BTreeMap<String, (String, String)> {
    let out = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg(script)
        .arg("list")
        .env("PYTHONPATH", torch)
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("zoo.py list prints JSON");
    v.as_array()
        .expect("a list of models")
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            (s("name"), (s("key"), s("machinery")))
        })
        .collect()
}

/// A copy of zoo.py with `from` replaced by `to` (once; it must occur).
fn edited(dir: &Path, src: &str, from: &str, to: &str, name: &str) -> PathBuf {
    assert!(src.contains(from), "zoo.py no longer has {from:?}");
    let p = dir.join(name);
    std::fs::write(&p, src.replacen(from, to, 1)).unwrap();
    p
}

#[test]
fn a_models_key_follows_its_own_code_and_the_machinery_key_the_capture() {
    let root = workspace_root();
    let torch = root.join(".libtorch");
    if !torch.join("torch").is_dir() {
        eprintln!("skipped: torch is not installed (cargo xtask setup)");
        return;
    }
    let script = root.join("xtask/scripts/zoo.py");
    let src = std::fs::read_to_string(&script).unwrap();
    let base = keys(&script, &torch);
    assert!(base.len() >= 12, "{} models", base.len());
    let machinery = &base["mlp_sgd"].1;
    for (name, (key, m)) in &base {
        assert_eq!(key.len(), 16, "{name}: {key:?}");
        assert!(
            key.chars().all(|c| c.is_ascii_hexdigit()),
            "{name}: {key:?}"
        );
        assert_eq!(m, machinery, "{name}: one machinery key for all");
    }
    let distinct: std::collections::HashSet<_> = base.values().map(|(k, _)| k).collect();
    assert_eq!(distinct.len(), base.len(), "models share a key");

    let dir = std::env::temp_dir().join(format!("mystique-zoo-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A class only the VAE uses: its key moves, no other model's does, nor the machinery's.
    let vae = keys(
        &edited(&dir, &src, "kl = -0.5 *", "kl = -0.50 *", "vae.py"),
        &torch,
    );
    // The capture: every model's machinery key moves, no model's own key.
    let cap = keys(
        &edited(
            &dir,
            &src,
            "def capture(out, name, busy):\n",
            "def capture(out, name, busy):\n    pass\n",
            "capture.py",
        ),
        &torch,
    );
    // A setting every capture runs under: the machinery's key moves.
    let setting = keys(
        &edited(
            &dir,
            &src,
            "TIMING_ACTIVE = 10",
            "TIMING_ACTIVE = 11",
            "setting.py",
        ),
        &torch,
    );
    std::fs::remove_dir_all(&dir).ok();
    for (name, (key, m)) in &base {
        assert_eq!(&vae[name].1, m, "{name}: the machinery did not change");
        assert_eq!(
            vae[name].0 != *key,
            name == "vae_adam",
            "{name}: only the VAE's code changed"
        );
        assert_ne!(&cap[name].1, m, "{name}: the capture changed");
        assert_eq!(&cap[name].0, key, "{name}: its own code did not change");
        assert_ne!(&setting[name].1, m, "{name}: a setting changed");
        assert_eq!(&setting[name].0, key, "{name}: its own code did not change");
    }
}
