"""`orch cache` and `orch cache clean`: what orch's cache folder holds, and the scratch dead writers left in it.

The cache is `recipes.runtime.cache.cache_root()` ($ORCH_CACHE_DIR, else ~/.cache/orch), or `--dir`. `orch cache`
lists it kind by kind (warm-start, presets, conf-trees, ...) with each entry's size and marks every writer's scratch
(dead, live, another host's); `orch cache clean` shows the dead writers' scratch it would remove and how many bytes,
and removes it with `--yes` (`recipes.runtime.cache.clean_cache`: the rule the builders sweep by). Exit codes: 0, 2 bad
input, 1 a scratch that could not be removed.
Only `typer` is imported at module level (the CLI must start fast).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=False)

DirOpt = Annotated[
    Path | None,
    typer.Option("--dir", help="The cache folder (default: $ORCH_CACHE_DIR, else ~/.cache/orch)."),
]


def _root(folder: Path | None) -> Path:
    """The cache folder to read; exit 2 with one line when `--dir` names something that is not a folder."""
    from orchlib.errors import error_line
    from recipes.runtime.cache import cache_root

    root = cache_root(str(folder) if folder is not None else None)
    if root.exists() and not root.is_dir():
        where = "--dir" if folder is not None else "$ORCH_CACHE_DIR" if _from_env() else "cache folder"
        typer.echo(error_line(f"{where} {root}: not a folder; give the cache folder (default: $ORCH_CACHE_DIR, "
                              "else ~/.cache/orch)"), err=True)
        raise typer.Exit(2)
    return root


def _from_env() -> bool:
    import os

    return bool(os.environ.get("ORCH_CACHE_DIR"))


def size_text(size: int) -> str:
    """Bytes for a person: `512 B`, `4.6 MB`, `1.2 GB` (powers of 1000, as `du --si`)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _writers(count: int) -> str:
    return f"{count} dead writer's" if count == 1 else f"{count} dead writers'"


def _where(root: Path, folder: Path | None) -> str:
    source = "--dir" if folder is not None else "$ORCH_CACHE_DIR" if _from_env() else "default; $ORCH_CACHE_DIR moves it"
    return f"cache {root} ({source})"


def _scratch_note(item) -> str:
    """What a scratch is and what becomes of it."""
    from recipes.runtime.cache import DEAD, ELSEWHERE, LIVE

    pid = item.writer_pid
    if item.writer == DEAD and item.busy:
        return f"scratch of a dead writer (PID {pid}); a builder of its key runs now and removes it"
    if item.writer == DEAD:
        return f"scratch of a dead writer (PID {pid} gone): `orch cache clean` removes it"
    if item.writer == LIVE:
        return f"being written by PID {pid} (kept)"
    if item.writer == ELSEWHERE:
        return f"written on host {item.writer_host} (kept: judged only there; run `orch cache clean` on it)"
    return "scratch"


@app.callback(invoke_without_command=True)
def cache_command(ctx: typer.Context, folder: DirOpt = None) -> None:
    """List orch's cache kind by kind (warm starts, presets, composed configs) with sizes; mark dead writers' scratch."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = folder  # `orch cache --dir D clean`
        return
    import datetime

    from recipes.runtime.cache import cache_contents

    root = _root(folder)
    items = cache_contents(root)
    typer.echo(_where(root, folder))
    if not items:
        typer.echo("  empty: nothing built yet")
        return
    kinds: dict[str, list] = {}
    for item in items:
        kinds.setdefault(item.kind, []).append(item)
    for kind, entries in kinds.items():
        built = [item for item in entries if item.what == "entry"]
        typer.echo(f"\n{kind}/: {len(built)} entr{'y' if len(built) == 1 else 'ies'}, "
                   f"{size_text(sum(item.size for item in entries))}")
        width = max(len(str(item.path.relative_to(root / kind))) for item in entries)
        for item in entries:
            name = str(item.path.relative_to(root / kind))
            if item.what == "entry":
                when = datetime.datetime.fromtimestamp(item.path.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
                note = f"built {when}{_describe(item.path)}"
            elif item.what == "partial":
                note = "a stopped warm start's epochs; the next build of its key resumes from them"
            elif item.what == "scratch":
                note = _scratch_note(item)
            else:
                note = "not an entry orch wrote"
            typer.echo(f"  {name:<{width}} {size_text(item.size):>9}  {note}")
    dead = [item for item in items if item.removable]
    total = sum(item.size for item in items)
    summary = f"\ntotal {size_text(total)}"
    if dead:
        summary += (f"; {_writers(len(dead))} scratch, "
                    f"{size_text(sum(item.size for item in dead))} (orch cache clean)")
    typer.echo(summary)


def _describe(path: Path) -> str:
    """`, task sokoban` for an entry whose inputs name its task; '' otherwise."""
    import json

    from recipes.runtime.cache import INPUTS_FILE

    try:
        inputs = json.loads((path / INPUTS_FILE).read_text())
    except (OSError, ValueError):
        return ""
    return f", task {inputs['task']}" if isinstance(inputs, dict) and isinstance(inputs.get("task"), str) else ""


@app.command("clean", short_help="Remove the scratch dead writers left in the cache.")
def clean_command(
    ctx: typer.Context,
    folder: DirOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Remove it (without: only show what and how many bytes).")] = False,
) -> None:
    """Show the scratch folders that killed warm-start and preset builders left in the cache, and their size; with
    --yes, remove them. A live writer's scratch, another host's, and every entry are kept."""
    from orchlib.errors import error_line
    from recipes.runtime.cache import clean_cache

    folder = folder if folder is not None else ctx.obj
    root = _root(folder)
    found = clean_cache(root, remove=False)
    typer.echo(_where(root, folder))
    if not found:
        typer.echo("  no dead writer's scratch: nothing to remove")
        return
    gone = clean_cache(root, remove=True) if yes else found
    for item in gone:
        typer.echo(f"  {'removed' if yes else 'would remove'} {item.path.relative_to(root)}  {size_text(item.size)}")
    total = size_text(sum(item.size for item in gone))
    if not yes:
        typer.echo(f"would remove {_writers(len(found))} scratch, {total}; "
                   "run `orch cache clean --yes` to remove it")
        return
    typer.echo(f"removed {_writers(len(gone))} scratch, {total}")
    left = [item for item in found if item.path.exists() and item.path not in {g.path for g in gone}]
    if left:
        typer.echo(error_line(f"{left[0].path}: could not be removed (a builder of its key holds its lock, or no "
                              f"permission); {len(left)} left"), err=True)
        raise typer.Exit(1)
