"""The profile store: every stage measurement, kept in one SQLite file across runs.

Keyed by the measuring context (device fingerprint, backend, library versions, batch size)
and the stage's *structural* key, so identical stages anywhere, in any model, share one
entry. The file lives under the user's cache directory (``OPSCHED_CACHE_DIR`` or
``cache_dir=`` overrides it).

Nothing measured is lost, whatever state the file is in:

* several processes may use one store at once: SQLite serialises writers (WAL journal, busy
  timeout), and every measurement is committed as soon as it is taken, so an interrupted search
  keeps what it measured. Two processes searching the same model at once both measure it: a
  search takes minutes and holds no lock meanwhile, so the second does not wait for the first;
  equal keys simply keep the later figure (this is intended). Each measures under the other's
  load, though, and :meth:`ProfileStore.measuring` says so when it happens (a server's workers
  each optimizing at start);
* a store another process keeps locked is *locked, not corrupt*: reads go on, and what cannot be
  written within the timeout is kept in memory for this run (one warning says so); the file is
  never moved;
* a read-only store (file or directory) serves what it holds; new measurements stay in memory
  for this run (one warning says so);
* a file that is not a readable SQLite database (corrupt, truncated) or a store of another
  schema version is moved aside with a warning and a new one is started; an SQLite database that
  is not an opsched store is left alone, with an error naming it.
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


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS measurements (
    device TEXT NOT NULL, backend TEXT NOT NULL, versions TEXT NOT NULL, batch INTEGER NOT NULL,
    stage_key TEXT NOT NULL, latency_ms REAL NOT NULL, samples TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (device, backend, versions, batch, stage_key)
)""",
)
_COLUMNS = ("device", "backend", "versions", "batch", "stage_key", "latency_ms", "samples", "created")

Key = tuple[str, str, str, int, str]


def _busy(e: sqlite3.Error) -> bool:
    """Whether ``e`` says another connection holds the lock (not that the file is bad)."""
    text = str(e).lower()
    return "locked" in text or "busy" in text


def _read_only(e: sqlite3.Error) -> bool:
    text = str(e).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text or "permission" in text


class _NotOurs(Exception):
    """A readable SQLite database that is not an opsched profile store."""


class ProfileStore:
    """Stage measurements by context and structural key (see the module docstring).

    ``timeout_s``: how long a write waits for another process's lock before the figure is kept
    in memory instead.
    """

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, *, timeout_s: float = 30.0) -> None:
        self.path = Path(cache_dir or default_cache_dir()) / "profiles.sqlite"
        self.timeout_s = timeout_s
        self.writable = True
        self._memory: dict[Key, tuple[float, list[float]]] = {}  # figures the file could not take
        self._warned = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            self._no_writes(f"cannot be created ({self.path.parent} may not be written)")
            self._conn: sqlite3.Connection | None = None
            return
        except OSError as e:
            raise ProfileStoreError(f"cannot create the cache directory {self.path.parent}: {e.strerror}") from e
        self._conn = self._open()

    # --- opening, and recovering from a bad file -------------------------------------------
    def _connect(self, read_only: bool = False, immutable: bool = False) -> sqlite3.Connection:
        mode = "ro" if read_only else "rwc"
        uri = f"{self.path.resolve().as_uri()}?mode={mode}" + ("&immutable=1" if immutable else "")
        conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
        return conn

    def _open(self) -> sqlite3.Connection | None:
        if not os.access(self.path.parent, os.W_OK) or (self.path.exists() and not os.access(self.path, os.W_OK)):
            return self._open_read_only("is read-only")
        try:
            conn = self._connect()
            self._init(conn)
            return conn
        except _NotOurs as e:
            raise ProfileStoreError(f"{self.path} is an SQLite database but not an opsched profile store ({e}); "
                                    f"it is left as it is: give opsched another cache directory") from None
        except sqlite3.OperationalError as e:
            if _busy(e):
                self._no_writes(f"is locked by another process (waited {self.timeout_s:g} s)")
                return None
            if _read_only(e):
                return self._open_read_only(f"cannot be written ({e})")
            return self._recreate(f"unreadable ({e})")
        except sqlite3.DatabaseError as e:
            return self._recreate(f"unreadable ({e})")

    def _open_read_only(self, why: str) -> sqlite3.Connection | None:
        self._no_writes(why)
        if not self.path.exists():
            return None
        try:
            try:
                conn = self._connect(read_only=True)
                self._check(conn)
            except sqlite3.OperationalError:
                # a WAL store in a directory nobody may write: its lock files cannot be made, so it
                # is read as a file nobody changes (so it is, for whoever cannot write it)
                conn = self._connect(read_only=True, immutable=True)
                self._check(conn)
            return conn
        except _NotOurs as e:
            raise ProfileStoreError(f"{self.path} is an SQLite database but not an opsched profile store "
                                    f"({e})") from None
        except sqlite3.Error as e:
            log.warning("profile store %s cannot be read either (%s): measuring everything anew", self.path, e)
            return None

    def _recreate(self, why: str) -> sqlite3.Connection:
        self._move_aside(why)
        conn = self._connect()
        self._init(conn)
        return conn

    def _check(self, conn: sqlite3.Connection) -> bool:
        """Whether ``conn`` holds an opsched store of this schema (False: an empty file);
        raises :class:`_NotOurs` for another database, DatabaseError for a bad or older one."""
        if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise sqlite3.DatabaseError("integrity check failed")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return False
        if "meta" not in tables or "measurements" not in tables:
            raise _NotOurs(f"its tables are {sorted(tables)}")
        columns = tuple(r[1] for r in conn.execute("PRAGMA table_info(measurements)"))
        if columns != _COLUMNS:
            raise _NotOurs(f"no opsched schema: its measurements table has columns {list(columns)}")
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            return False  # ours, being created by another process right now
        if row[0] != str(SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {row[0]}, expected {SCHEMA_VERSION}")
        return True

    def _init(self, conn: sqlite3.Connection) -> None:
        if not self._check(conn):
            # one transaction: a process opening the file meanwhile sees no tables or all of them (the
            # tables created one by one, another saw 'meta' alone and refused the file as not a store)
            with _transaction(conn):
                for statement in _SCHEMA:
                    conn.execute(statement)
                if conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() is None:
                    conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        self._use_wal(conn)

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Journal the file ahead of writing (WAL), so that readers never wait for a writer. The
        mode is the file's, so one process's switch serves all. SQLite refuses the switch at once,
        waiting for no lock, while another connection is using the file (processes opening a new
        store together): the file then keeps its journal, as safe and only less concurrent, and
        the next process to open it switches it."""
        if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            return
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as e:
            if not _busy(e):
                raise
            log.debug("profile store %s stays in its journal mode for now: %s", self.path, e)

    def _move_aside(self, why: str) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                os.replace(src, Path(f"{aside}{suffix}"))
        log.warning("profile store %s was %s; moved it to %s and started a new one", self.path, why, aside)

    def _no_writes(self, why: str) -> None:
        self.writable = False
        if not self._warned:
            self._warned = True
            log.warning("profile store %s %s: new measurements of this run are kept in memory only, not in it",
                        self.path, why)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def measuring(self) -> Iterator[bool]:
        """Mark this process as measuring with the store while the block runs (an advisory
        lock on ``measuring.lock`` beside it, which the system drops when the process ends):
        where another process holds it, a warning says both measure under each other's load,
        and the block runs all the same (a search does not wait minutes for another's). Yields
        whether this process measures alone; True where the lock cannot be taken at all (no
        ``fcntl``, a store that cannot be written)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no advisory locks of this kind
            yield True
            return
        try:
            fd = os.open(self.path.parent / "measuring.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # a read-only store: nothing to mark
            yield True
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except BlockingIOError:  # held: another process measures
                alone = False
                log.warning("another process is measuring with the profile store %s: each times plans under the "
                            "other's load and keeps those times; optimize once and hand the others the schedule "
                            "(opsched.load) or the module", self.path)
            except OSError:  # a file system without such locks (some network ones): nothing to tell
                alone = True
            yield alone
        finally:
            os.close(fd)  # drops the lock where it was taken

    # --- measurements ---------------------------------------------------------------------
    def get(self, ctx: ProfileContext, stage_key: str) -> float | None:
        key = (ctx.device, ctx.backend, ctx.versions, ctx.batch, stage_key)
        if key in self._memory:
            return self._memory[key][0]
        if self._conn is None:
            return None
        try:
            row = self._conn.execute(
                "SELECT latency_ms FROM measurements WHERE device=? AND backend=? AND versions=? AND batch=? "
                "AND stage_key=?", key).fetchone()
        except sqlite3.OperationalError as e:
            if not _busy(e):
                raise
            return None  # held exclusively for longer than the timeout: measured again, not lost
        return None if row is None else float(row[0])

    def put(self, ctx: ProfileContext, stage_key: str, latency_ms: float, samples: list[float] | None = None) -> None:
        key = (ctx.device, ctx.backend, ctx.versions, ctx.batch, stage_key)
        record = (float(latency_ms), list(samples or [latency_ms]))
        if self._conn is None or not self.writable:
            self._memory[key] = record
            return
        try:
            with _transaction(self._conn):
                self._conn.execute("INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                   (*key, record[0], json.dumps(record[1]), time.time()))
        except sqlite3.OperationalError as e:
            if not (_busy(e) or _read_only(e)):
                raise
            self._memory[key] = record
            self._no_writes("is locked by another process" if _busy(e) else f"cannot be written ({e})")

    def _require(self, what: str) -> sqlite3.Connection:
        if self._conn is None or (not self.writable and what != "read"):
            raise ProfileStoreError(f"profile store {self.path} cannot be {what} now: it is "
                                    f"{'locked or missing' if self._conn is None else 'read-only'}")
        return self._conn

    def status(self) -> dict[str, object]:
        conn = self._require("read")
        count = conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        contexts = conn.execute(
            "SELECT device, backend, versions, batch, COUNT(*) FROM measurements "
            "GROUP BY device, backend, versions, batch ORDER BY COUNT(*) DESC").fetchall()
        size = sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*")
                   if p.is_file() and ".corrupt-" not in p.name)
        return {"path": str(self.path), "schema_version": SCHEMA_VERSION, "measurements": count, "bytes": size,
                "writable": self.writable,
                "contexts": [dict(zip(("device", "backend", "versions", "batch", "measurements"), c))
                             for c in contexts]}

    def clear(self) -> int:
        conn = self._require("written")
        with _transaction(conn):
            n = conn.execute("DELETE FROM measurements").rowcount
        conn.execute("VACUUM")
        return int(n)

    def export(self, path: str | os.PathLike[str]) -> int:
        """Write every measurement as one JSON object per line; returns how many."""
        rows = self._require("read").execute("SELECT * FROM measurements ORDER BY created").fetchall()
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps({"format": "opsched.profiles", "schema_version": SCHEMA_VERSION}) + "\n")
            for row in rows:
                record = dict(zip(_COLUMNS, row))
                record["samples"] = json.loads(record["samples"])
                f.write(json.dumps(record) + "\n")
        os.replace(tmp, path)
        return len(rows)

    def import_(self, path: str | os.PathLike[str]) -> int:
        """Merge measurements exported by :meth:`export`; newer entries win. Returns how many."""
        conn = self._require("written")
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ProfileStoreError(f"cannot read {os.fspath(path)!r}: {e}") from e
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if not isinstance(header, dict) or header.get("format") != "opsched.profiles":
            raise ProfileStoreError(f"{os.fspath(path)}: not an opsched profile export (first line is no header)")
        count = 0
        with _transaction(conn):
            for number, line in enumerate(lines[1:], start=2):
                try:
                    r = json.loads(line)
                    values = (r["device"], r["backend"], r["versions"], int(r["batch"]), r["stage_key"],
                              float(r["latency_ms"]), json.dumps(r["samples"]), float(r["created"]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise ProfileStoreError(f"{os.fspath(path)}, line {number}: malformed record ({e})") from None
                conn.execute(
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
