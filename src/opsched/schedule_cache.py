"""The schedule cache: schedules the ``torch.compile`` backend searched, kept on disk across
processes, so that a server that restarts (or a second run of a script) loads each graph's
schedule instead of searching it again.

One file per schedule, under ``<cache_dir>/schedules/`` (the profile store's directory,
:func:`~opsched.cost.store.default_cache_dir`): a schedule file as :meth:`Schedule.save` writes it
(``opsched show`` prints it, :func:`opsched.load` applies it), with a ``"cached"`` entry beside
(the key, the backend, when, how long the search took). It is named by the hash of its
:class:`CacheKey`: what Dynamo
handed over (the graph's code, every input's shape and type, its integer arguments), the
backend's options that shape a plan, and the device and library versions it was made on. The key
is a fast first test; a schedule found is reapplied by :func:`opsched.load`, whose exact
structural check refuses one made for another import (the same code with weights that fold
differently), which is then searched and its file replaced.

Nothing goes wrong because of the cache, whatever state it is in: a file that cannot be read or
parsed is moved aside (``.corrupt``) with a warning and the graph searched; where the directory
cannot be written, schedules are searched as without the cache (one warning); two processes that
write one key at once each write a whole file (a unique temporary, then a rename), and the later
one stays.

The cache is bounded: past ``max_schedules`` files (:data:`MAX_SCHEDULES`, or
``OPSCHED_SCHEDULE_CACHE_MAX``), a write removes the least recently used (a file found is marked
used), so a server that meets a new shape every call (``specialize="shape"`` in a decoding loop)
keeps the schedules it uses and not every one it ever made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opsched.cost.store import default_cache_dir
from opsched.errors import OpschedError
from opsched.schedule import Schedule

__all__ = ["CacheKey", "CachedSchedule", "ScheduleCache", "code_version", "device_fingerprint", "FORMAT",
           "MAX_SCHEDULES"]

log = logging.getLogger(__name__)

#: Bumped whenever what a cache file holds, or what its key means, changes (older files then miss).
FORMAT = 1
#: How many schedules a cache directory keeps unless told otherwise (each file is 5-50 KB).
MAX_SCHEDULES = 1000
_PLAIN = (str, int, float, bool, type(None))
_UNWRITABLE: set[Path] = set()  # directories warned about, once a process each


def device_fingerprint(device: torch.device) -> str:
    """The device a schedule was made on and the libraries whose kernels it may run, as the
    backends that run plans there name them for their measurements (each available backend's
    :meth:`~opsched.backends.Backend.fingerprint` and :meth:`~opsched.backends.Backend.versions`):
    a schedule raced on one GPU or CPU, or with other kernels, is not reused on another."""
    from opsched.backends import backend_names, get_backend
    from opsched.execution import RunOptions

    run = RunOptions(device)
    here = [b for b in map(get_backend, backend_names()) if b.device_type == device.type and b.unavailable() is None]
    return " | ".join(dict.fromkeys(part for b in here for part in (b.fingerprint(run), b.versions())))


@functools.cache
def code_version() -> str:
    """opsched's version and a digest of its source: a schedule searched by other code, even at
    the same version number (an editable install a commit later), is not reused, since today's
    search may pick another plan. Read once a process (under 10 ms)."""
    from opsched import __version__

    root = Path(__file__).parent
    digest = hashlib.sha256()
    try:
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    except OSError:  # an install without its sources (a zip): the version alone
        return __version__
    return f"{__version__}+{digest.hexdigest()[:12]}"


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(map(_plain, value))
    return isinstance(value, _PLAIN)


@dataclass(frozen=True)
class CacheKey:
    """What a cached schedule was made for. ``graph`` is the hash of the captured graph's code,
    ``inputs`` every input's shape and dtype (lifted weights included), ``settings`` the options
    that shape a plan, ``device`` :func:`device_fingerprint`, ``opsched`` :func:`code_version`."""

    graph: str
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    ints: tuple[int, ...]
    settings: tuple[tuple[str, Any], ...]
    device: str
    opsched: str

    @classmethod
    def of(cls, code: str, inputs: tuple[tuple[tuple[int, ...], str], ...], ints: tuple[int, ...],
           settings: Mapping[str, Any], device: torch.device) -> CacheKey | None:
        """The key, or None where a setting is not plain data (a cost model object): such a
        schedule is not cached, as nothing would tell it from another's."""
        if not all(_plain(v) for v in settings.values()):
            return None
        plain = tuple(sorted((k, list(v) if isinstance(v, tuple) else v) for k, v in settings.items()))
        return cls(hashlib.sha256(code.encode()).hexdigest(), inputs, ints, plain, device_fingerprint(device),
                   code_version())

    @property
    def digest(self) -> str:
        text = json.dumps([FORMAT, dataclasses.astuple(self)], sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class CachedSchedule:
    """A schedule found in the cache: the schedule, the backend it runs on, and its file."""

    schedule: Schedule
    backend: str
    path: Path


def _max_schedules() -> int:
    text = os.environ.get("OPSCHED_SCHEDULE_CACHE_MAX")
    if not text:
        return MAX_SCHEDULES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise OpschedError(f"OPSCHED_SCHEDULE_CACHE_MAX is how many schedules the cache keeps, a whole number of at "
                           f"least 1; got {text!r}")
    return value


class ScheduleCache:
    """The cache directory's schedules (see the module docstring). ``cache_dir`` None: the
    default cache directory (``OPSCHED_CACHE_DIR`` or the user cache); ``max_schedules`` None:
    ``OPSCHED_SCHEDULE_CACHE_MAX``, else :data:`MAX_SCHEDULES`."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, max_schedules: int | None = None) -> None:
        self.directory = Path(cache_dir or default_cache_dir()) / "schedules"
        if max_schedules is not None and max_schedules < 1:
            raise OpschedError(f"a schedule cache keeps at least 1 schedule; got max_schedules={max_schedules}")
        self.max_schedules = _max_schedules() if max_schedules is None else max_schedules

    def path(self, key: CacheKey) -> Path:
        return self.directory / f"{key.digest}.json"

    def get(self, key: CacheKey) -> CachedSchedule | None:
        """The schedule cached for ``key``, or None (never cached, or its file unreadable, which
        is then moved aside)."""
        path = self.path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            cached = data["cached"]
            if cached["format"] != FORMAT or cached["digest"] != key.digest:
                raise ValueError(f"format {cached['format']}, key {cached['digest']}: not this key's file")
            found = CachedSchedule(Schedule.from_dict(data, os.fspath(path)), str(cached["backend"]), path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, OpschedError) as e:
            self._move_aside(path, e)
            return None
        with contextlib.suppress(OSError):  # used now: the last a bounded cache removes (read-only: as it was)
            os.utime(path)
        return found

    def put(self, key: CacheKey, schedule: Schedule, backend: str, search_seconds: float,
            description: Mapping[str, Any]) -> Path | None:
        """Keep ``schedule`` for ``key`` (``search_seconds`` and ``description`` are for whoever
        reads the file); returns its file, or None where the directory cannot be written (one
        warning a process)."""
        data = {**schedule.to_dict(), "cached": {
            "format": FORMAT, "digest": key.digest, "created": time.time(), "backend": backend,
            "search_seconds": search_seconds, "about": dict(description), "key": dataclasses.asdict(key)}}
        path = self.path(key)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")  # this writer's own
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(data, f, indent=1, default=list)
                    f.write("\n")
                os.replace(tmp, path)  # a reader meets the old file or the new one, whole
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        except OSError as e:
            if self.directory not in _UNWRITABLE:
                _UNWRITABLE.add(self.directory)
                log.warning("schedule cache %s cannot be written (%s): schedules searched now are not kept for "
                            "another process", self.directory, e.strerror or e)
            return None
        self._evict(keep=path)
        return path

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used schedules past ``max_schedules`` (never ``keep``, just
        written). Another process may remove the same files at once: each removal may find its
        file gone."""
        files = [p for p in self.files() if p != keep]
        extra = len(files) + 1 - self.max_schedules
        if extra <= 0:
            return
        used = {}
        for p in files:
            with contextlib.suppress(OSError):
                used[p] = p.stat().st_mtime
        for p in sorted(used, key=used.__getitem__)[:extra]:
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)
        log.info("schedule cache %s: removed %d least recently used schedules (it keeps %d)", self.directory,
                 min(extra, len(used)), self.max_schedules)

    def files(self) -> Iterator[Path]:
        if self.directory.is_dir():
            yield from sorted(self.directory.glob("*.json"))

    def entries(self) -> list[dict[str, Any]]:
        """What each file holds, for a listing: its name, its ``"cached"`` entry and the
        schedule's scheduler and estimate (files that cannot be read are left out)."""
        out = []
        for path in self.files():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                out.append({"file": path.name, **data["cached"], "scheduler": data.get("scheduler"),
                            "estimated_ms": data.get("estimated_ms")})
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def status(self) -> dict[str, Any]:
        files = list(self.files())
        return {"path": str(self.directory), "format": FORMAT, "schedules": len(files),
                "max_schedules": self.max_schedules, "bytes": sum(p.stat().st_size for p in files)}

    def clear(self) -> int:
        """Remove every cached schedule, any file moved aside and any a killed writer left
        half-written; returns how many schedules."""
        files = list(self.files())
        if self.directory.is_dir():
            for p in [*files, *self.directory.glob("*.corrupt"), *self.directory.glob(".*.tmp")]:
                p.unlink(missing_ok=True)
        return len(files)

    def _move_aside(self, path: Path, error: Exception) -> None:
        aside = path.with_suffix(".corrupt")
        try:
            os.replace(path, aside)
            where = f"moved it to {aside.name}"
        except OSError:
            where = "left it"
        log.warning("schedule cache file %s cannot be used (%s): %s and searching the graph again", path, error, where)
