"""The bad-input corpus: every entry point (sweep files, `--set`, `orch train` overrides, rollout batches in every
format, CLI options, environment variables, store and tracking URLs, files in odd states) given bad input must end
with exit code 2 and ONE line on stderr naming the file, line or key -- no traceback, no hang -- and write nothing.

Cases: `tests/bad_input/sweeps/*.yaml` (bad sweep files, `# expect:` on their first line), `tests/bad_input/cases.yaml`
(command lines), and the rollout-batch cases built below (each format x each problem x each command that reads
batches). Every case runs in-process through click's runner in one working directory holding a real store and MLflow
database (a sweep `ok` already run with the TEST-ONLY backend); the whole tree is hashed before and after each case.

`python tests/test_bad_input_corpus.py` runs the corpus and prints the figures (cases, clean exits, tracebacks,
writes, accepted, hangs).
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import signal
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
DATA = HERE / "bad_input"
TEST_BACKEND_DIR = HERE / "orchestrator" / "testbackend"
CASE_TIMEOUT_S = 60  # the first case that imports torch may take this long on a busy machine
SQLITE_HEADER = b"SQLite format 3\x00"
CLEAN_ENV = ("ORCH_STORE", "MLFLOW_TRACKING_URI", "ORCH_TEST_FAIL_SEED", "ORCH_TEST_FAIL_FLAG")
OK_SWEEP = """\
name: ok
backend: orch-test
base: {trainer: test, trainer.total_steps: 1}
seeds: [0]
"""


@dataclass
class Case:
    id: str
    argv: list[str]
    expect: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, object] = field(default_factory=dict)


@dataclass
class Outcome:
    kind: str  # clean | traceback | writes | accepted | unclear | hang
    detail: str = ""


# --- the cases -------------------------------------------------------------------------------------------------------

def sweep_file_cases() -> list[Case]:
    cases = []
    for path in sorted((DATA / "sweeps").glob("*.yaml")):
        text = path.read_bytes()
        first = text.decode("utf-8", "replace").split("\n", 1)[0]
        expect = [part.strip() for part in first.removeprefix("# expect:").split(",")] if first.startswith("# expect:") else []
        cases.append(Case(f"sweep-file/{path.stem}", ["sweep", f"in/{path.name}", "--cluster", "debug"],
                          [f"in/{path.name}", *expect], files={path.name: {"bytes": text}}))
    return cases


def command_line_cases() -> list[Case]:
    return [Case(**entry) for entry in yaml.safe_load((DATA / "cases.yaml").read_text())]


BATCH_PROBLEMS = {  # name -> (rows, or raw content, and a word the message must hold)
    "no-reward-column": ([{"prompt_id": 1, "score": 1.0}, {"prompt_id": 1, "score": 0.0}], "reward"),
    "nan-reward": ([{"prompt_id": 1, "reward": 1.0}, {"prompt_id": 1, "reward": math.nan}], "reward"),
    "text-reward": ([{"prompt_id": 1, "reward": "1"}, {"prompt_id": 1, "reward": "lots"}], "reward"),
    "empty-prompt-id": ([{"prompt_id": "a", "reward": 1.0}, {"prompt_id": None, "reward": 0.0}], "prompt_id"),
    "fractional-step": ([{"prompt_id": 1, "reward": 1.0, "step": 1.5}, {"prompt_id": 1, "reward": 0.0, "step": 1}], "step"),
    "no-rows": ([], ""),
    "zero-bytes": (b"", ""),
    "garbage": (b"\x00\x01\x02garbage\xff\xfe\n", ""),
    "directory": ({"dir": True}, "directory"),
    "missing": (None, "no such"),
}
BATCH_FORMATS = ("parquet", "jsonl", "json", "csv")
BATCH_COMMANDS = ("predict-filter-gain", "filter")


def batch_cases() -> list[Case]:
    cases = []
    for fmt in BATCH_FORMATS:
        for problem, (content, word) in BATCH_PROBLEMS.items():
            name = f"batch.{fmt}"
            files = {} if content is None else {name: content if isinstance(content, dict) else
                                                {"bytes": content} if isinstance(content, bytes) else
                                                {"rows": content}}
            for command in BATCH_COMMANDS:
                cases.append(Case(f"batch/{command}/{fmt}/{problem}", [command, f"in/{name}"],
                                  [f"in/{name}", *([word] if word else [])], files=files))
    for name, content, word in (
        ("batch.txt", "prompt_id,reward\n1,1\n", "format"),
        ("batch", "prompt_id,reward\n1,1\n", "format"),
        ("bad-line.jsonl", '{"prompt_id": 1, "reward": 1}\n{"prompt_id": 1, "reward": 0}\n{"prompt_id": 2, oops}\n',
         "bad-line.jsonl:3"),
        ("scalar-lines.jsonl", '{"prompt_id": 1, "reward": 1}\n7\n', "scalar-lines.jsonl:2"),
        ("truncated.json", '[{"prompt_id": 1, "reward": 1}, {"prompt_id"', "truncated.json"),
        ("latin1.csv", b"prompt_id,reward,prompt\n1,1,caf\xe9\n1,0,x\n", "latin1.csv"),
        ("inf.csv", "prompt_id,reward\n1,inf\n1,0\n", "reward"),
    ):
        for command in BATCH_COMMANDS:
            cases.append(Case(f"batch/{command}/{name}", [command, f"in/{name}"], [f"in/{name}", word],
                              files={name: {"bytes": content} if isinstance(content, bytes) else content}))
    return cases


def all_cases() -> list[Case]:
    return [*sweep_file_cases(), *command_line_cases(), *batch_cases()]


# --- running a case --------------------------------------------------------------------------------------------------

class Hang(Exception):
    pass


def tree_digest(root: Path) -> dict[str, str]:
    """Every file and folder under `root` (the case's inputs included) with its bytes' hash, and each SQLite database
    also by its rows (a read-only dump, which reads through the write-ahead log: a write not yet checkpointed shows
    there). SQLite's `-wal`/`-shm` files themselves are skipped: they appear and change when a database is merely
    read."""
    digest = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            digest[os.path.relpath(os.path.join(folder, name), root) + "/"] = ""
        for name in files:
            if name.endswith(("-wal", "-shm", "-journal")):
                continue
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                content = handle.read()
            digest[os.path.relpath(path, root)] = hashlib.sha256(content).hexdigest()
            if content.startswith(SQLITE_HEADER):
                digest[os.path.relpath(path, root) + " (rows)"] = hashlib.sha256(sqlite_dump(path)).hexdigest()
    return digest


def sqlite_dump(path: str) -> bytes:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return "\n".join(connection.iterdump()).encode()
    finally:
        connection.close()


def make_file(path: Path, spec: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # a name may hold folders: "model/config.json"
    if isinstance(spec, str):
        path.write_text(spec)
    elif spec.get("dir"):
        path.mkdir()
    elif "bytes" in spec:
        path.write_bytes(spec["bytes"])
    elif "hex" in spec:
        path.write_bytes(bytes.fromhex(spec["hex"]))
    elif spec.get("big"):
        path.write_text("name: big\n" + "# padding\n" * 200_000)
    elif spec.get("sqlite"):
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
            connection.execute("INSERT INTO notes (text) VALUES ('not orch')")
        connection.close()
    elif "rows" in spec:
        write_rows(path, spec["rows"])
    else:
        raise ValueError(f"unknown file spec {spec!r}")


def write_rows(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows, columns=["prompt_id", "reward"] if not rows else None)
    suffix = path.suffix
    if suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_json(path, orient="records")


class Corpus:
    """One working directory with a real store and MLflow database; runs cases in it and restores it if one wrote."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"
        self.pristine = root / "pristine"
        self.cache = root / "cache"
        self.cell = ""

    def setup(self) -> None:
        from typer.testing import CliRunner

        from orchestrator.cli import app

        if str(TEST_BACKEND_DIR) not in sys.path:
            sys.path.insert(0, str(TEST_BACKEND_DIR))
        import orch_test_backend  # noqa: F401 - registers the TEST-ONLY backend

        self.work.mkdir(parents=True)
        self.cache.mkdir()
        (self.work / "ok.yaml").write_text(OK_SWEEP)
        write_rows(self.work / "good.parquet", [{"prompt_id": p, "reward": float(r), "step": 1}
                                                 for p in range(4) for r in (0, 1, 1, 0)])
        with self.environment({"ORCH_TEST_STEP_S": "0.01"}):
            result = CliRunner().invoke(app, ["sweep", "ok.yaml", "--cluster", "debug"])
            assert result.exit_code == 0, result.output
            from orchestrator.store import Store

            store = Store.open(create=False)
            self.cell = store.cell_rows(store.require_sweep("ok").id)[0].digest[:8]
            store.dispose()
        import gc

        gc.collect()  # close the engines of the commands above, then fold every write-ahead log into its database
        for path in (self.work / ".orch" / "orch.db", self.work / "mlflow.db"):
            with sqlite3.connect(path) as connection:
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            connection.close()
        shutil.copytree(self.work, self.pristine)

    def environment(self, env: dict[str, str]):
        from contextlib import contextmanager

        @contextmanager
        def scope():
            saved = {name: os.environ.get(name) for name in {*CLEAN_ENV, *env, "ORCH_CACHE_DIR"}}
            previous = os.getcwd()
            try:
                for name in CLEAN_ENV:
                    os.environ.pop(name, None)
                os.environ["ORCH_CACHE_DIR"] = str(self.cache)
                os.environ.update(env)
                os.chdir(self.work)
                yield
            finally:
                os.chdir(previous)
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value

        return scope()

    def run(self, case: Case) -> Outcome:
        from typer.testing import CliRunner

        from orchestrator.cli import app

        inputs = self.work / "in"
        shutil.rmtree(inputs, ignore_errors=True)
        inputs.mkdir()
        for name, spec in case.files.items():
            make_file(inputs / name, spec)
        argv = [part.replace("{cell}", self.cell) for part in case.argv]
        if argv[0] == "train" and not any(part.startswith("backend=") for part in argv):
            argv = ["train", "backend=orch-test", *argv[1:]]
        before = tree_digest(self.work)
        previous = signal.signal(signal.SIGALRM, _raise_hang)
        signal.alarm(CASE_TIMEOUT_S)
        try:
            with self.environment({"ORCH_TEST_STEP_S": "0.01", **case.env}):
                result = CliRunner().invoke(app, argv)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        after = tree_digest(self.work)
        shutil.rmtree(inputs, ignore_errors=True)
        if after != before:
            changed = sorted(set(before.items()) ^ set(after.items()))
            shutil.rmtree(self.work)
            shutil.copytree(self.pristine, self.work)
            return Outcome("writes", f"changed: {sorted({name for name, _ in changed})}; exit {result.exit_code}: "
                                     f"{result.stderr.strip()[:300]}")
        return classify(case, result)


def _raise_hang(*_args: object) -> None:
    raise Hang(f"no answer within {CASE_TIMEOUT_S} s")


def classify(case: Case, result) -> Outcome:  # noqa: ANN001 - click's Result
    stderr = result.stderr.strip()
    if isinstance(result.exception, Hang):
        return Outcome("hang", str(result.exception))
    if result.exception is not None and not isinstance(result.exception, SystemExit) or "Traceback" in stderr:
        return Outcome("traceback", f"{type(result.exception).__name__}: {result.exception}")
    if result.exit_code == 0:
        return Outcome("accepted", result.stdout[-300:])
    lines = stderr.splitlines()
    missing = [word for word in case.expect if word not in stderr]
    leaked = [word for word in case.absent if word in stderr]
    if result.exit_code != 2 or len(lines) != 1 or missing or leaked:
        return Outcome("unclear", f"exit {result.exit_code}, {len(lines)} line(s), missing {missing}, "
                                  f"leaked {leaked}: {stderr[:400]}")
    return Outcome("clean", lines[0])


# --- pytest ----------------------------------------------------------------------------------------------------------

CASES = all_cases()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    corpus = Corpus(tmp_path_factory.mktemp("bad-input"))
    corpus.setup()
    return corpus


def test_the_corpus_is_large_and_ids_are_unique() -> None:
    assert len(CASES) >= 150
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(corpus: Corpus, case: Case) -> None:
    outcome = corpus.run(case)
    assert outcome.kind == "clean", f"{outcome.kind}: {outcome.detail}"


SUBPROCESS_SAMPLE = ("sweep-file/billion_laughs", "sweep-file/sbatch_key_newline", "set-alias-bomb",
                     "train-seed-text", "train-tracking-scheme", "train-checkpoint-under-file", "status-store-otherdb",
                     "runs-tracking-otherdb", "unknown-command", "sweep-limit-text",
                     "batch/predict-filter-gain/bad-line.jsonl", "batch/filter/parquet/garbage")


def test_a_sample_through_the_real_command_line(corpus: Corpus, tmp_path: Path) -> None:
    """The in-process runner is faithful: the same cases as `orch` processes (all at once) give the same one line
    on the real stderr (where logging and warnings also go) and write nothing."""
    import subprocess

    env = {key: value for key, value in os.environ.items() if key not in CLEAN_ENV}
    env.update(ORCH_CACHE_DIR=str(corpus.cache), PYTHONPATH=os.pathsep.join([str(TEST_BACKEND_DIR), str(HERE.parent)]))
    by_id = {case.id: case for case in CASES}
    started = []
    for index, case_id in enumerate(SUBPROCESS_SAMPLE):
        case = by_id[case_id]
        work = tmp_path / str(index)
        shutil.copytree(corpus.pristine, work)
        (work / "in").mkdir()
        for name, spec in case.files.items():
            make_file(work / "in" / name, spec)
        argv = [part.replace("{cell}", corpus.cell) for part in case.argv]
        if argv[0] == "train":
            argv = ["train", "backend=orch-test", *argv[1:]]
        before = tree_digest(work)
        process = subprocess.Popen([sys.executable, "-c", "from orchestrator.cli import main; main()", *argv],
                                   cwd=work, env={**env, **case.env}, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        started.append((case, work, before, process))
    for case, work, before, process in started:
        _, stderr = process.communicate(timeout=180)
        lines = stderr.strip().splitlines()
        assert process.returncode == 2 and len(lines) == 1, (case.id, process.returncode, stderr[-2000:])
        assert all(word in lines[0] for word in case.expect), (case.id, lines[0])
        assert tree_digest(work) == before, case.id


def main() -> None:
    """Run every case and print the figures (and each case that is not clean)."""
    import tempfile
    import time

    sys.path.insert(0, str(HERE.parent))
    with tempfile.TemporaryDirectory() as folder:
        corpus = Corpus(Path(folder))
        corpus.setup()
        counts: dict[str, int] = {}
        start = time.perf_counter()
        for case in CASES:
            began = time.perf_counter()
            outcome = corpus.run(case)
            if time.perf_counter() - began > 2:
                print(f"{case.id}: slow: {time.perf_counter() - began:.1f} s")
            counts[outcome.kind] = counts.get(outcome.kind, 0) + 1
            if outcome.kind != "clean":
                print(f"{case.id}: {outcome.kind}: {outcome.detail}")
        elapsed = time.perf_counter() - start
    print(f"cases {len(CASES)}, clean exits {counts.get('clean', 0)}, tracebacks {counts.get('traceback', 0)}, "
          f"writes-before-validate {counts.get('writes', 0)}, accepted {counts.get('accepted', 0)}, "
          f"unclear messages {counts.get('unclear', 0)}, hangs {counts.get('hang', 0)}; {elapsed:.1f} s")


if __name__ == "__main__":
    main()
