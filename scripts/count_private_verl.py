"""Issue 50 item 5: the private veRL attributes orch's trainer code touches (overrides, calls, reads), per file.

A private attribute is a name starting with one underscore that veRL's trainer class defines (the legacy
`RayPPOTrainer` for recipes/verl/trainer.py, the V1 `PPOTrainerSync` for recipes/verl/v1.py) or that orch reads from a
veRL object (`_dispatch_info`, `_get_dp_size`, ...). The engine-level patches (recipes/verl/patches.py, P1-P6) are
counted apart: they stay on both paths.

    python scripts/count_private_verl.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def private_names(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ for name in vars(klass) if name.startswith("_") and not name.startswith("__")}


def touched(path: Path, verl_private: set[str]) -> dict[str, list[str]]:
    text = path.read_text()
    own = set(re.findall(r"^\s+def (_[a-z]\w*)", text, flags=re.M))  # methods the file defines
    found: dict[str, list[str]] = {}
    for name in sorted(verl_private):
        how = []
        if re.search(rf"^\s+def {name}\(", text, flags=re.M):
            how.append("override")
        if re.search(rf"(super\(\)|self|[A-Za-z]+)\.{name}\b(?!\s*=)", text) and not (name in own and "override" not in how):
            how.append("use")
        if how:
            found[name] = how
    return found


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    legacy = private_names(RayPPOTrainer)
    for rel in ("recipes/verl/trainer.py", "recipes/verl/task_runner.py"):
        found = touched(ROOT / rel, legacy)
        print(f"{rel} vs RayPPOTrainer: {len(found)}: {found}")
    try:
        from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    except ImportError as err:  # TransferQueue missing
        print(f"V1 not importable here: {err}")
        return 0
    found = touched(ROOT / "recipes/verl/v1.py", private_names(PPOTrainerSync))
    print(f"recipes/verl/v1.py vs PPOTrainerSync: {len(found)}: {found}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
