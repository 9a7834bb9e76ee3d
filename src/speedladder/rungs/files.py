"""A user's rungs: `--rung-file FILE.py` or `--rung-file package.module`, each declaring rungs with speedladder.rung.

A file is loaded once per process; what it declares is tagged with it. Every run records each file with the sha256
of its content (RunConfig.rung_hashes), and a saved configuration run again (`run --config`, `check`, `train
--config`, `speedladder.apply`) refuses a file whose content changed since: the same name must mean the same rung.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from speedladder.errors import UsageError, one_line
from speedladder.rungs.registry import RUNGS, declaring

_LOADED: dict[str, str] = {}  # where -> its hash, for what this process has loaded


def where_of(entry: str) -> tuple[Path, str]:
    """A --rung-file entry as (the file, its canonical name): a path ending in .py, else an importable module."""
    if entry.endswith(".py"):
        path = Path(entry).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"rung file not found: {entry}")
        return path, str(path)
    try:
        spec = importlib.util.find_spec(entry)
    except (ImportError, ValueError) as e:
        raise UsageError(f"rung module {entry!r} cannot be found: {one_line(e)}") from None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise UsageError(f"rung module {entry!r} cannot be found (give a FILE.py or an importable package.module)")
    return Path(spec.origin), entry


def content_hash(entry: str) -> str:
    """sha256 of a rung file's content (a module: of its source file)."""
    path, _ = where_of(entry)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hashes(entries: tuple[str, ...]) -> dict[str, str]:
    return {where_of(e)[1]: content_hash(e) for e in entries}


def load(entries: tuple[str, ...], recorded: dict[str, str] | None = None) -> list[str]:
    """Load each rung file (once per process), after checking it against the hash a saved configuration recorded;
    the names of the rungs declared. One line, exit 2, for a file that is missing, changed, raises at import,
    declares no rung, or declares a name already taken."""
    names: list[str] = []
    for entry in entries:
        path, key = where_of(entry)
        digest = content_hash(entry)
        want = (recorded or {}).get(key)
        if want is not None and want != digest:
            raise UsageError(f"rung file {key} has changed since this configuration was saved (sha256 {want[:12]}… "
                             f"recorded, {digest[:12]}… now): the same rung names would mean other rungs")
        if key in _LOADED:
            if _LOADED[key] != digest:
                raise UsageError(f"rung file {key} changed while this process had it loaded")
            continue
        with declaring(key) as declared:
            try:
                _import(entry, path, digest)
            except UsageError:
                raise
            except Exception as e:  # noqa: BLE001 -- the user's code: one line, exit 2
                raise UsageError(f"rung file {key} raised at import: {one_line(e)}") from None
        if not declared:
            raise UsageError(f"rung file {key} declares no rung (declare one with speedladder.rung; docs/rungs.md)")
        _LOADED[key] = digest
        names += declared
    return names


def _import(entry: str, path: Path, digest: str) -> None:
    if not entry.endswith(".py"):
        importlib.import_module(entry)
        return
    name = f"speedladder_rungs_{path.stem}_{digest[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so that dataclasses and pickling inside it find their module
    spec.loader.exec_module(module)


def source_files() -> dict[str, str]:
    """The rung files loaded so far, with their hashes."""
    return dict(_LOADED)


__all__ = ["RUNGS", "content_hash", "hashes", "load", "source_files", "where_of"]
