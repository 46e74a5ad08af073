"""The `mystique` and `mystique-replay` commands of the wheel.

The binaries in `_bin/` link libtorch but do not bundle it: they load the torch package of the
Python environment they are installed in. This launcher finds that package without importing
torch (which takes seconds), checks that its version is the one the binaries were built
against (libtorch's C++ ABI changes between minor versions: another one fails to load, or
crashes later), puts its libraries on the loader's path and becomes the binary (exec), so the
binary's exit status, signals and streams are the command's.
"""

import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_BIN = _HERE / "_bin"

# The subcommands `mystique` hands to `mystique-replay`, the binary that loads libtorch.
_LIBTORCH_COMMANDS = {"replay", "compare", "env", "generate", "run"}


def built_against():
    """The torch version the binaries were built against (written by `cargo xtask wheel`)."""
    try:
        with open(_HERE / "_build.json") as f:
            return json.load(f)["torch"]
    except (OSError, ValueError, KeyError):
        return None


def find_torch():
    """The environment's torch package: (its directory, its version), or None. Found as
    `import torch` would find it, without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    where = Path(list(spec.submodule_search_locations)[0])
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(_read_version_py(where), "version", None) or "unknown"
    return where, version


def _read_version_py(where):
    """torch/version.py's `__version__`, for a torch installed without metadata."""
    try:
        text = (where / "version.py").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("__version__"):
            return type("V", (), {"version": line.split("=", 1)[1].strip().strip("'\"")})
    return None


def compatible(found, built):
    """Whether torch `found` (e.g. `2.11.0+cpu`) has the release (major.minor) of `built`."""
    def release(v):
        return v.split("+", 1)[0].split(".")[:2]
    return release(found) == release(built)


def _fail(message):
    sys.stderr.write(f"error: {message}\n")
    sys.exit(2)


def _exec(binary, argv, needs_torch):
    exe = _BIN / binary
    if not exe.is_file():
        _fail(f"{exe} is missing: this installation of mystique is incomplete (reinstall the wheel)")
    env = dict(os.environ)
    built = built_against() or "unknown"
    torch = find_torch()
    if torch is not None:
        where, version = torch
        lib = where / "lib"
        if needs_torch and not compatible(version, built):
            _fail(
                f"mystique was built against torch {built}; this Python environment has torch "
                f"{version} ({where}). Install torch=={'.'.join(built.split('.')[:2])}.* here, "
                f"or mystique in an environment that has it."
            )
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(lib)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        )
        env["MYSTIQUE_TORCH"] = str(where)
        env["MYSTIQUE_TORCH_VERSION"] = version
    elif needs_torch:
        _fail(
            f"mystique needs torch {built} in this Python environment ({sys.executable}): "
            f"pip install torch=={'.'.join(built.split('.')[:2])}.*"
        )
    env["MYSTIQUE_TORCH_BUILT"] = built
    # `mystique` finds `mystique-replay` beside itself.
    os.execve(str(exe), [binary] + argv, env)


def main():
    """`mystique ...`: the front binary; torch is needed by the subcommands that load it."""
    argv = sys.argv[1:]
    words = [a for a in argv if not a.startswith("-")]
    command = words[0] if words else None
    # `compose world` finds the ranks as `replay --ranks` does, in mystique-replay.
    needs = command in _LIBTORCH_COMMANDS or words[:2] == ["compose", "world"]
    _exec("mystique", argv, needs_torch=needs)


def main_replay():
    """`mystique-replay ...`: the binary that loads libtorch."""
    _exec("mystique-replay", sys.argv[1:], needs_torch=True)
