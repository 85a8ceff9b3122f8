"""A sweep job's start: the store read and the cell's config, up to the trainer call (issue #47).

    python benchmarks/bench_job_start.py [--sweep sweeps/table4.yaml] [--profile NAME] [--cold 5]

The sweep is planned and its cells stored in a scratch SQLite store (nothing submitted, nothing trained); then each
cell's job start is timed as `orchestrator.job` does it: `Store.job_context(cell)` and `compose_cell_config(context)`
(the config with the cell's hosting keys, its identity checked, the host checks of `TrainConfig.check_host`).

* cold: one fresh process per cell, as every job is (`--cold` cells, spread over the sweep): the time of those two
  calls, with what they import on first use (Hydra and OmegaConf before #47). What every job imports before and
  after alike (the job and store modules, the typed config, transformers for the host check) is imported, and
  timed apart, before the clock starts;
* warm: every cell in one process, after the first: what a cell costs once the imports are paid.

The host checks (`TrainConfig.check_host`: the model folder's files and architecture, whose transformers module is
imported on first use) are timed apart: the same work before and after.

`model.path` folders the cells name are made in the scratch folder as empty Hugging Face checkpoints (a config.json,
a tokenizer file, an empty weights file): the host check passes on them as on the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURES = {  # folder name prefix -> (model_type, architecture, vision)
    "Qwen2.5-VL": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", True),
    "Qwen2.5": ("qwen2", "Qwen2ForCausalLM", False),
    "Llama": ("llama", "LlamaForCausalLM", False),
}
COLD = """
import json, sys, time
begin = time.perf_counter()
import transformers  # the host check's import (the trainer's too)
from orchestrator.job import compose_cell_config  # what unpickling the job imports
from orchestrator.store import Store
from recipes.config.schema import TrainConfig  # the typed config, before and after #47 alike
from bench_job_start import time_host_checks
host = time_host_checks(TrainConfig)
store = Store.open(sys.argv[1], create=False)
start = time.perf_counter()
cfg = compose_cell_config(store.job_context(int(sys.argv[2])))
print(json.dumps({"seconds": time.perf_counter() - start - host[0], "host": host[0], "imports": start - begin,
                  "digest": cfg.digest()}))
"""


def time_host_checks(config_class) -> list[float]:
    """Time `TrainConfig.check_host` apart (into the returned one-item list): the host checks (the model folder's
    architecture, which imports its transformers module on first use) are the same work before and after #47."""
    spent = [0.0]
    check = config_class.check_host

    def timed(self):
        start = time.perf_counter()
        try:
            return check(self)
        finally:
            spent[0] += time.perf_counter() - start

    config_class.check_host = timed
    return spent


def fake_checkpoint(folder: Path) -> None:
    """An empty Hugging Face checkpoint folder the host check accepts."""
    model_type, architecture, vision = next(value for prefix, value in ARCHITECTURES.items()
                                            if folder.name.startswith(prefix))
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type, "architectures": [architecture]}
    if vision:
        config["vision_config"] = {}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", type=Path, default=REPO / "sweeps" / "table4.yaml")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--cold", type=int, default=5, help="cells timed in a fresh process each (0: none)")
    args = parser.parse_args()
    sweep_file = args.sweep.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="bench-job-start-"))
    try:
        run(args, sweep_file, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args: argparse.Namespace, sweep_file: Path, scratch: Path) -> None:
    os.chdir(scratch)
    os.environ.setdefault("ORCH_CACHE_DIR", str(scratch / "cache"))
    sys.path.insert(0, str(REPO))

    from orchestrator.engine import cell_fields, save_sweep_row
    from orchestrator.job import compose_cell_config
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep
    from orchestrator.store import Store

    plan = build_plan(load_sweep(sweep_file, profile=args.profile))
    for cell in plan.cells:
        path = cell.settings.get("model.path")
        if isinstance(path, str) and not Path(path).is_absolute() and not Path(path).exists():
            fake_checkpoint(scratch / path)
    url = f"sqlite:///{scratch / 'orch.db'}"
    store = Store.open(url)
    sweep = save_sweep_row(store, plan.definition, "local", plan.varied, f"sqlite:///{scratch / 'mlflow.db'}")
    store.add_cells(sweep.id, cell_fields(plan))
    rows = store.cell_rows(sweep.id)
    print(f"{sweep_file.name}{f' --profile {args.profile}' if args.profile else ''}: {len(rows)} cells")

    import transformers  # noqa: F401  (see the module docstring)

    from recipes.config.schema import TrainConfig

    host = time_host_checks(TrainConfig)
    compose_cell_config(store.job_context(rows[0].id))  # the first cell pays the imports
    warm = []
    for row in rows:
        host[0] = 0.0
        start = time.perf_counter()
        cfg = compose_cell_config(store.job_context(row.id))
        warm.append(time.perf_counter() - start - host[0])
        assert cfg.digest() == row.digest
    print(f"warm: {statistics.mean(warm) * 1000:8.1f} ms per cell (median {statistics.median(warm) * 1000:.1f}, "
          f"max {max(warm) * 1000:.1f}); {sum(warm):7.2f} s over the {len(rows)} cells")

    if args.cold:
        picked = rows[:: max(1, len(rows) // args.cold)][: args.cold]
        cold, imports, hosts = [], [], []
        here = str(Path(__file__).resolve().parent)
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), here, os.environ.get("PYTHONPATH", "")])}
        for row in picked:
            out = subprocess.run([sys.executable, "-c", COLD, url, str(row.id)], capture_output=True, text=True,
                                 env=environment, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            assert result["digest"] == row.digest
            cold.append(result["seconds"])
            imports.append(result["imports"])
            hosts.append(result["host"])
        mean = statistics.mean(cold)
        print(f"paid alike by every job, not in the figures: imports {statistics.mean(imports):.2f} s, host checks "
              f"{statistics.mean(hosts):.2f} s")
        print(f"cold (a fresh process per job, {len(cold)} cells): {mean:6.3f} s per job (min {min(cold):.3f}, "
              f"max {max(cold):.3f}); x {len(rows)} cells = {mean * len(rows):7.1f} s of job start over the sweep")


if __name__ == "__main__":
    main()
