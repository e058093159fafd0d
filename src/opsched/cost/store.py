"""The profile store: every stage measurement, kept in one SQLite file across runs.

Keyed by the measuring context (device fingerprint, backend, library versions, batch size)
and the stage's *structural* key, so identical stages anywhere, in any model, share one
entry. The file lives under the user's cache directory (``OPSCHED_CACHE_DIR`` or
``cache_dir=`` overrides it). Several processes may use it at once: SQLite serialises writers
(WAL journal, busy timeout) and every measurement is committed as soon as it is taken, so an
interrupted search keeps what it measured. A file that is not a readable store of this schema
(corrupt, truncated, foreign) is moved aside with a warning and a new one is started.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from opsched.errors import ProfileStoreError

__all__ = ["ProfileContext", "ProfileStore", "default_cache_dir", "SCHEMA_VERSION"]

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1


def default_cache_dir() -> Path:
    return Path(os.environ.get("OPSCHED_CACHE_DIR") or platformdirs.user_cache_dir("opsched"))


@dataclass(frozen=True, slots=True)
class ProfileContext:
    """Everything a measurement depends on besides the stage itself."""

    device: str    # fingerprint: device name, memory, driver / CPU model and core count
    backend: str   # "cpu-threads", "cuda-graph", ...
    versions: str  # library versions that change kernels (torch, cuDNN, oneDNN)
    batch: int


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS measurements (
    device TEXT NOT NULL, backend TEXT NOT NULL, versions TEXT NOT NULL, batch INTEGER NOT NULL,
    stage_key TEXT NOT NULL, latency_ms REAL NOT NULL, samples TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (device, backend, versions, batch, stage_key)
);
"""


class ProfileStore:
    def __init__(self, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(cache_dir or default_cache_dir()) / "profiles.sqlite"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ProfileStoreError(f"cannot create the cache directory {self.path.parent}: {e.strerror}") from e
        self._conn = self._open()

    # --- opening, and recovering from a bad file -------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            conn = self._connect()
            self._init(conn)
            return conn
        except sqlite3.DatabaseError as e:
            self._move_aside(f"unreadable ({e})")
            conn = self._connect()
            self._init(conn)
            return conn

    def _init(self, conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise sqlite3.DatabaseError("integrity check failed")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(_SCHEMA)
        with _transaction(conn):
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema version {row[0]}, expected {SCHEMA_VERSION}")

    def _move_aside(self, why: str) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                os.replace(src, Path(f"{aside}{suffix}"))
        log.warning("profile store %s was %s; moved it to %s and started a new one", self.path, why, aside)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- measurements ---------------------------------------------------------------------
    def get(self, ctx: ProfileContext, stage_key: str) -> float | None:
        row = self._conn.execute(
            "SELECT latency_ms FROM measurements WHERE device=? AND backend=? AND versions=? AND batch=? "
            "AND stage_key=?", (ctx.device, ctx.backend, ctx.versions, ctx.batch, stage_key)).fetchone()
        return None if row is None else float(row[0])

    def put(self, ctx: ProfileContext, stage_key: str, latency_ms: float, samples: list[float] | None = None) -> None:
        with _transaction(self._conn):
            self._conn.execute("INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (ctx.device, ctx.backend, ctx.versions, ctx.batch, stage_key, float(latency_ms),
                                json.dumps(samples or [latency_ms]), time.time()))

    def status(self) -> dict[str, object]:
        count = self._conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        contexts = self._conn.execute(
            "SELECT device, backend, versions, batch, COUNT(*) FROM measurements "
            "GROUP BY device, backend, versions, batch ORDER BY COUNT(*) DESC").fetchall()
        size = sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*")
                   if p.is_file() and ".corrupt-" not in p.name)
        return {"path": str(self.path), "schema_version": SCHEMA_VERSION, "measurements": count, "bytes": size,
                "contexts": [dict(zip(("device", "backend", "versions", "batch", "measurements"), c))
                             for c in contexts]}

    def clear(self) -> int:
        with _transaction(self._conn):
            n = self._conn.execute("DELETE FROM measurements").rowcount
        self._conn.execute("VACUUM")
        return int(n)

    def export(self, path: str | os.PathLike[str]) -> int:
        """Write every measurement as one JSON object per line; returns how many."""
        rows = self._conn.execute("SELECT * FROM measurements ORDER BY created").fetchall()
        names = ("device", "backend", "versions", "batch", "stage_key", "latency_ms", "samples", "created")
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps({"format": "opsched.profiles", "schema_version": SCHEMA_VERSION}) + "\n")
            for row in rows:
                record = dict(zip(names, row))
                record["samples"] = json.loads(record["samples"])
                f.write(json.dumps(record) + "\n")
        os.replace(tmp, path)
        return len(rows)

    def import_(self, path: str | os.PathLike[str]) -> int:
        """Merge measurements exported by :meth:`export`; newer entries win. Returns how many."""
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise ProfileStoreError(f"cannot read {os.fspath(path)!r}: {e.strerror}") from e
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("format") != "opsched.profiles":
            raise ProfileStoreError(f"{os.fspath(path)}: not an opsched profile export (first line is no header)")
        count = 0
        with _transaction(self._conn):
            for number, line in enumerate(lines[1:], start=2):
                try:
                    r = json.loads(line)
                    values = (r["device"], r["backend"], r["versions"], int(r["batch"]), r["stage_key"],
                              float(r["latency_ms"]), json.dumps(r["samples"]), float(r["created"]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise ProfileStoreError(f"{os.fspath(path)}, line {number}: malformed record ({e})") from None
                self._conn.execute(
                    "INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                    "latency_ms=excluded.latency_ms, samples=excluded.samples, created=excluded.created "
                    "WHERE excluded.created > measurements.created", values)
                count += 1
        return count


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")

