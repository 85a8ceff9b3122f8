"""The GPU stack's own torch, torchvision and transformers, installed beside this CPU environment so the veRL smoke run
can be tested under them without a GPU (tests/test_gpu_stack.py; `scripts/test.sh` starts it in the background).

    python scripts/gpu/cpu_stack.py DEST      # then: PYTHONPATH=DEST python scripts/gpu_smoke.py --cpu

Installs into the folder DEST (`pip install --target`, nothing else touched) torch, torchvision and transformers at
the pins of scripts/gpu/constraints.txt, plus the wheels torch loads at import: PyPI's torch 2.11.0 is the CUDA 13
build, which imports and trains on a CPU (CUDA reported unavailable) once its CUDA runtime wheels (cuda-toolkit's
libraries, cuDNN, NCCL, triton, ...) are beside it. uv resolves that closure against the lock for Linux x86_64; every
other package of the closure that this environment already has stays the environment's own (numpy, pillow,
sympy, ...), so only the stack's versions differ from the rest of the suite. About 2.6 GB downloaded, 4.6 GB
installed. Writes DEST/stack.json (name -> version installed) last: its presence means the folder is complete.
Exit 0 on success; 1 with the installer's last lines otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "scripts" / "gpu" / "constraints.txt"
STACK = ("torch", "torchvision", "transformers")
DONE = "stack.json"


def pins(text: str) -> dict[str, str]:
    """name -> version of every `name==version` line (names normalised as PyPI does)."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-\[\],]+)==([^\s;#]+)", line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match[1].split("[")[0]).lower()] = match[2]
    return found


def present(name: str) -> bool:
    """Whether this environment has the distribution `name`."""
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def closure() -> dict[str, str]:
    """name -> version of everything torch and torchvision need at the lock's pins, for Linux x86_64 (uv, from PyPI's
    metadata), less what this environment already has, plus the three stack packages themselves."""
    locked = pins(LOCK.read_text())
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        raise SystemExit("cpu_stack: uv not found (a dev dependency: pip install -e '.[dev]')")
    with tempfile.TemporaryDirectory() as scratch:
        wanted = Path(scratch) / "stack.in"
        wanted.write_text("".join(f"{name}=={locked[name]}\n" for name in STACK[:2]))
        result = subprocess.run(
            [uv, "pip", "compile", str(wanted), "--constraint", str(LOCK), "--python-version", "3.11",
             "--python-platform", "x86_64-manylinux_2_28", "--index-url", "https://pypi.org/simple", "--no-header",
             "--no-annotate", "--quiet"],
            capture_output=True, text=True, timeout=600, env={**os.environ, "UV_HTTP_RETRIES": "5"})
    if result.returncode != 0:
        raise SystemExit(f"cpu_stack: uv could not resolve the stack: {result.stderr.strip()[-2000:]}")
    install = {name: version for name, version in pins(result.stdout).items() if name in STACK or not present(name)}
    install["transformers"] = locked["transformers"]
    return install


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python scripts/gpu/cpu_stack.py DEST", file=sys.stderr)
        return 2
    dest = Path(sys.argv[1])
    (dest / DONE).unlink(missing_ok=True)
    install = closure()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(dest),
         *(f"{name}=={version}" for name, version in sorted(install.items()))],
        capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        print(f"cpu_stack: pip failed: {(result.stdout + result.stderr).strip()[-2000:]}", file=sys.stderr)
        return 1
    (dest / DONE).write_text(json.dumps(install, indent=1, sort_keys=True))
    print(f"cpu_stack: {dest}: torch {install['torch']}, torchvision {install['torchvision']}, transformers "
          f"{install['transformers']} and {len(install) - 3} CUDA runtime wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
