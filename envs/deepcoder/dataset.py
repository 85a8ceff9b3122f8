"""Loaders for the public code sets the DeepCoder recipe trains on, read from a local file (nothing is downloaded).

A file is a JSON list, JSONL or Parquet of records in one of these schemas (Hugging Face's exports):

* `primeintellect` (PrimeIntellect/verifiable-coding-problems): `prompt` (the statement), `gold_standard_solution`
  (code, possibly fenced), `verification_info` (a JSON string or object: `language`, and `test_cases`, a list of
  `{"type": "stdin_stdout" | "function_call", "fn_name", "input", "output"}`; function-call inputs are argument
  lists). Records whose `language` is not python are skipped.
* `taco` (BAAI/TACO, the APPS schema): `question`, `starter_code`, `solutions` (a JSON string: list of code) and
  `input_output` (a JSON string: `{"inputs": [...], "outputs": [...], "fn_name"?}`; with `fn_name` the inputs
  are argument lists, without it stdin texts; a list-of-lines output is joined with newlines).
* `livecodebench` (livecodebench/code_generation_lite): `question_content`, `starter_code`, `public_test_cases`
  and `private_test_cases` (JSON strings, the private ones possibly base64 of zlib of a pickled JSON string, as
  the released files store them; only a pickled *string* is accepted, nothing else is unpickled), each a list of
  `{"input", "output", "testtype": "stdin" | "functional"}`; functional inputs are one JSON argument per line
  and `metadata.func_name` names the method of `class Solution`. No reference solution.

`auto` picks the schema from the first record's keys. Records without a usable test are skipped.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from envs.deepcoder.problem import CodeProblem, extract_code
from envs.records import SUFFIXES, read_records
from orchlib.errors import OrchError, choices_error

FORMATS = ("auto", "primeintellect", "taco", "livecodebench")
_MARKERS = {"verification_info": "primeintellect", "input_output": "taco", "question_content": "livecodebench"}


def _json(value: Any) -> Any:
    """A field stored either as JSON text or already decoded."""
    return json.loads(value) if isinstance(value, str) else value


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _problem(source: str, prompt: Any, mode: str, fn_name: Any, tests: list[tuple[Any, Any]], starter: Any = "",
             solution: Any = None) -> CodeProblem | None:
    if not isinstance(prompt, str) or not prompt.strip() or not tests or (mode == "call" and not fn_name):
        return None
    if mode == "call" and not all(isinstance(args, list) for args, _ in tests):
        return None
    return CodeProblem(
        prompt=prompt.strip(), mode=mode, tests=tuple(tests), fn_name=fn_name if mode == "call" else None,
        starter_code=starter if isinstance(starter, str) else "",
        solution=extract_code(solution) if isinstance(solution, str) and solution.strip() else None,
        source=source,
    )


def _primeintellect(record: dict[str, Any]) -> CodeProblem | None:
    info = _json(record.get("verification_info"))
    if not isinstance(info, dict) or str(info.get("language", "python")).lower() != "python":
        return None
    cases = [case for case in info.get("test_cases") or [] if isinstance(case, dict)]
    if not cases:
        return None
    kind = cases[0].get("type", "stdin_stdout")
    mode = "call" if kind == "function_call" else "stdio"
    tests = [(_json(c["input"]) if mode == "call" else _text(c["input"]), c["output"] if mode == "call"
              else _text(c["output"])) for c in cases if c.get("type", "stdin_stdout") == kind]
    return _problem("primeintellect", record.get("prompt"), mode, cases[0].get("fn_name"), tests,
                    solution=record.get("gold_standard_solution"))


def _taco(record: dict[str, Any]) -> CodeProblem | None:
    io_spec = _json(record.get("input_output") or "{}")
    if not isinstance(io_spec, dict):
        return None
    fn_name = io_spec.get("fn_name")
    mode = "call" if fn_name else "stdio"
    pairs = zip(io_spec.get("inputs") or [], io_spec.get("outputs") or [], strict=False)
    tests = [(i, o) if mode == "call" else (_text(i), _text(o)) for i, o in pairs]
    solutions = _json(record.get("solutions") or "[]")
    solution = solutions[0] if isinstance(solutions, list) and solutions else None
    return _problem("taco", record.get("question"), mode, fn_name, tests, record.get("starter_code"), solution)


def _lcb_cases(value: Any) -> list[dict[str, Any]]:
    if not value:
        return []
    if isinstance(value, str) and not value.lstrip().startswith("["):
        value = _RestrictedUnpickler(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load()
    cases = _json(value)
    return [case for case in cases if isinstance(case, dict)] if isinstance(cases, list) else []


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles plain values only (LiveCodeBench pickles a JSON string): any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def _livecodebench(record: dict[str, Any]) -> CodeProblem | None:
    cases = _lcb_cases(record.get("public_test_cases")) + _lcb_cases(record.get("private_test_cases"))
    if not cases:
        return None
    mode = "call" if cases[0].get("testtype") == "functional" else "stdio"
    tests = []
    for case in cases:
        if (case.get("testtype") == "functional") != (mode == "call"):
            continue
        if mode == "call":
            tests.append(([json.loads(line) for line in str(case["input"]).splitlines() if line.strip()],
                          json.loads(case["output"])))
        else:
            tests.append((str(case["input"]), str(case["output"])))
    metadata = _json(record.get("metadata") or "{}")
    fn_name = metadata.get("func_name") if isinstance(metadata, dict) else None
    return _problem("livecodebench", record.get("question_content"), mode, fn_name, tests, record.get("starter_code"))


READERS = {"primeintellect": _primeintellect, "taco": _taco, "livecodebench": _livecodebench}


def detect_format(record: Any) -> str:
    """The schema of a record, from its keys; OrchError naming the keys looked for otherwise."""
    if isinstance(record, dict):
        for key, name in _MARKERS.items():
            if key in record:
                return name
    raise OrchError(f"cannot tell the data format: no record key among {', '.join(_MARKERS)}; "
                    f"set data_format to one of {', '.join(FORMATS[1:])}")


@lru_cache(maxsize=4)
def load_problems(path: str, data_format: str = "auto") -> tuple[CodeProblem, ...]:
    """The usable problems of `path` in file order. OrchError for a missing or unreadable file, an unknown suffix
    or format, or a file with no usable record."""
    where = f"deepcoder data_path {path}"
    if data_format not in FORMATS:
        raise choices_error("data_format", data_format, list(FORMATS), where=where)
    file = Path(path)
    if file.suffix not in SUFFIXES:
        raise choices_error("data file suffix", file.suffix, list(SUFFIXES), where=where)
    if not file.is_file():
        raise OrchError(f"{where}: no such file")
    try:
        records = read_records(file)
        if data_format == "auto":
            data_format = detect_format(records[0] if records else None)
        reader = READERS[data_format]
        problems = tuple(p for p in (reader(r) for r in records if isinstance(r, dict)) if p is not None)
    except OrchError as err:
        raise OrchError(f"{where}: {err}") from None
    except (ValueError, OSError, KeyError, TypeError, zlib.error, pickle.UnpicklingError) as err:
        raise OrchError(f"{where}: cannot read records ({err.__class__.__name__}: {err})") from None
    if not problems:
        raise OrchError(f"{where}: no usable {data_format} record (a statement and at least one test)")
    return problems
