"""The profile store: persistence, sharing, concurrency, corruption, interruption; and the schedule
cache beside it: its command line, and whole files under concurrent writers."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import multiprocessing.synchronize
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from opsched.cli.main import main
from opsched.cost import AnalyticCostModel, MeasuredCostModel, SegmentCut, StageTiming, TimingPolicy
from opsched.cost.measured import Calibrations
from opsched.cost.store import ProfileContext, ProfileStore
from opsched.errors import OpschedError, ProfileStoreError
from opsched.execution import RunOptions
from opsched.ir import Graph, stage_key
from opsched.schedule import Schedule, Stage
from opsched.schedule_cache import CacheKey, ScheduleCache
from opsched.schedulers import schedule
from opsched.testing import random_dag

CTX = ProfileContext("test-device", "test-backend", "torch=x", 1)


class CountingBackend:
    """Times a stage as the analytic model prices it, counting how often it is asked (a stand-in
    for measuring); stages are priced directly, as on a GPU."""

    name = "counting"
    relative_pricing = False
    default_policy = TimingPolicy(warmup=0, repeat=1)

    def __init__(self, fail_after: int | None = None) -> None:
        self.inner = AnalyticCostModel("V100")
        self.calls = 0
        self.fail_after = fail_after

    def profile_tag(self, run: RunOptions) -> str:
        return "test-backend"

    def fingerprint(self, run: RunOptions) -> str:
        return "test-device"

    def versions(self) -> str:
        return "torch=x"

    def segment_cut(self, graph: Graph, run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> SegmentCut | None:
        return None

    def time_stages(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> list[StageTiming]:
        out = []
        for stage in stages:
            if self.fail_after is not None and self.calls >= self.fail_after:
                raise KeyboardInterrupt
            self.calls += 1
            price = self.inner.stage_latency(graph, stage)
            out.append(StageTiming((price,), (price,)))
        return out


def test_second_search_measures_nothing(tmp_path: Path) -> None:
    graph = random_dag(10, 3)
    first = CountingBackend()
    with ProfileStore(tmp_path) as store:
        a = schedule(graph, "ios", MeasuredCostModel(first, store=store))
    assert first.calls > 0
    second = CountingBackend()
    with ProfileStore(tmp_path) as store:
        b = schedule(graph, "ios", MeasuredCostModel(second, store=store))
        assert store.status()["measurements"] == first.calls
    assert second.calls == 0 and a.stages == b.stages


def _key(graph: Graph, stage: Stage) -> str:
    return stage_key(graph, stage.groups, stage.strategy)


def test_identical_stages_share_one_entry_across_graphs(tmp_path: Path) -> None:
    g1, g2 = random_dag(6, 11), random_dag(6, 11)  # same structure, fresh weights and objects
    stage1 = Stage(((g1.nodes[-1].name,),))
    assert _key(g1, stage1) == _key(g2, Stage(((g2.nodes[-1].name,),)))
    a, b = g1.nodes[0].name, g1.nodes[1].name
    assert _key(g1, Stage(((a,), (b,)))) == _key(g1, Stage(((b,), (a,))))  # group order
    assert _key(g1, Stage(((a,), (b,)))) != _key(g1, Stage(((a,),)))
    assert _key(g1, Stage(((a,), (b,)))) != _key(g1, Stage(((a,), (b,)), "merge"))


def test_interrupted_search_keeps_what_it_measured(tmp_path: Path) -> None:
    graph = random_dag(10, 5)
    backend = CountingBackend(fail_after=7)
    with ProfileStore(tmp_path) as store, pytest.raises(KeyboardInterrupt):
        schedule(graph, "ios", MeasuredCostModel(backend, store=store))
    with ProfileStore(tmp_path) as store:
        assert store.status()["measurements"] == 7


def test_contexts_do_not_mix(tmp_path: Path) -> None:
    with ProfileStore(tmp_path) as store:
        store.put(CTX, "k", 1.0)
        assert store.get(CTX, "k") == 1.0
        assert store.get(ProfileContext("test-device", "test-backend", "torch=x", 8), "k") is None
        assert store.get(ProfileContext("other", "test-backend", "torch=x", 1), "k") is None


@pytest.mark.parametrize("garbage", [b"this is not a database at all" * 40, b""])
def test_corrupted_store_is_moved_aside_and_rebuilt(tmp_path: Path, garbage: bytes,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with ProfileStore(tmp_path) as store:
        store.put(CTX, "k", 1.0)
    db = tmp_path / "profiles.sqlite"
    data = db.read_bytes()
    db.write_bytes(garbage or data[: len(data) // 3])  # foreign bytes, or a truncated file
    for extra in tmp_path.glob("profiles.sqlite-*"):
        extra.unlink()
    with caplog.at_level(logging.WARNING, logger="opsched.cost.store"), ProfileStore(tmp_path) as store:
        assert store.status()["measurements"] == 0
        store.put(CTX, "k2", 2.0)
        assert store.get(CTX, "k2") == 2.0
    if garbage:
        assert any("moved it to" in r.getMessage() for r in caplog.records)
        assert list(tmp_path.glob("profiles.sqlite.corrupt-*"))


def test_other_schema_version_is_moved_aside(tmp_path: Path) -> None:
    with ProfileStore(tmp_path) as store:
        store._conn.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    with ProfileStore(tmp_path) as store:
        assert store.status()["measurements"] == 0
    assert list(tmp_path.glob("profiles.sqlite.corrupt-*"))


def _writer(args: tuple[str, int, mp.synchronize.Barrier]) -> int:
    cache, worker, start = args
    start.wait()  # every process opens the new store at once, the moment that once lost a writer
    with ProfileStore(cache) as store:
        for i in range(40):
            store.put(CTX, f"shared-{i}", float(worker))
            store.put(CTX, f"own-{worker}-{i}", float(i))
        return int(store.writable)


def test_several_processes_at_once(tmp_path: Path) -> None:
    # Opening a new store together, one process used to find SQLite refusing its switch to WAL
    # ("database is locked", no wait) and kept all it measured in memory (6 processes: 39 of 300
    # rounds); a store now stays writable in the journal mode it has.
    workers, rounds = 4, 12
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(workers) as pool:
        for r in range(rounds):
            cache = str(tmp_path / str(r))
            start = manager.Barrier(workers)
            assert pool.map(_writer, [(cache, w, start) for w in range(workers)]) == [1] * workers, f"round {r}"
            with ProfileStore(cache) as store:
                assert store.status()["measurements"] == 40 + workers * 40, f"round {r}"


@contextlib.contextmanager
def _another_process(target: Callable[..., None], *args: Any) -> Iterator[None]:
    """``target(*args, ready, release)`` in a process of its own, from when it sets ``ready``
    until the block ends (then ``release`` is set and the process joined)."""
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    process = ctx.Process(target=target, args=(*args, ready, release))
    process.start()
    try:
        assert ready.wait(60)
        yield
    finally:
        release.set()
        process.join(30)


def _measurer(cache: str, ready: mp.synchronize.Event, release: mp.synchronize.Event) -> None:
    with ProfileStore(cache) as store, store.measuring() as alone:
        assert alone
        ready.set()
        release.wait(30)


def test_a_search_measuring_while_another_process_does_is_warned_and_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server's workers each optimizing at start time plans under each other's load: the
    second to measure with one store is told so (and goes on: a search does not wait minutes
    for another's); once the first is done, or its process gone, the next measures alone."""
    with (_another_process(_measurer, str(tmp_path)), caplog.at_level(logging.WARNING, logger="opsched.cost.store"),
          ProfileStore(tmp_path) as store, store.measuring() as alone):
        assert not alone
        store.put(CTX, "measured meanwhile", 1.0)
    assert [r.getMessage() for r in caplog.records] == [
        f"another process is measuring with the profile store {tmp_path / 'profiles.sqlite'}: each times plans "
        f"under the other's load and keeps those times; optimize once and hand the others the schedule "
        f"(opsched.load) or the module"]
    with ProfileStore(tmp_path) as store, store.measuring() as alone:
        assert alone and store.get(CTX, "measured meanwhile") == 1.0


def test_export_import_round_trip_and_bad_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with ProfileStore(a) as store:
        store.put(CTX, "k1", 1.0, [1.0, 1.1])
        store.put(CTX, "k2", 2.0)
        assert store.export(tmp_path / "p.jsonl") == 2
    with ProfileStore(b) as store:
        assert store.import_(tmp_path / "p.jsonl") == 2
        assert store.get(CTX, "k1") == 1.0 and store.get(CTX, "k2") == 2.0
        (tmp_path / "bad.jsonl").write_text("hello\n")
        with pytest.raises(ProfileStoreError, match="not an opsched profile export"):
            store.import_(tmp_path / "bad.jsonl")
        lines = (tmp_path / "p.jsonl").read_text().splitlines()
        (tmp_path / "broken.jsonl").write_text("\n".join([lines[0], '{"device": 1}']))
        with pytest.raises(ProfileStoreError, match="line 2: malformed record"):
            store.import_(tmp_path / "broken.jsonl")


def test_cache_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ProfileStore(tmp_path) as store:
        store.put(CTX, "k", 1.0)
    (tmp_path / "schedules").mkdir()
    for name in ("a.json", "b.json", "c.corrupt", ".d.json.1.2.tmp"):  # two schedules, one set aside, one half-written
        (tmp_path / "schedules" / name).write_text("{}")
    assert main(["cache", "status", "--cache-dir", str(tmp_path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["measurements"] == 1 and status["schedule_cache"]["schedules"] == 2
    assert main(["cache", "export", str(tmp_path / "e.jsonl"), "--cache-dir", str(tmp_path)]) == 0
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert "removed 1 measurements" in (out := capsys.readouterr().out) and "and 2 schedules" in out
    assert not list((tmp_path / "schedules").iterdir())
    assert main(["cache", "import", str(tmp_path / "e.jsonl"), "--cache-dir", str(tmp_path)]) == 0
    assert main(["cache", "status", "--cache-dir", str(tmp_path)]) == 0
    assert "1 measurements" in capsys.readouterr().out


# --- locked, read-only and foreign files: nothing measured is lost, nothing healthy is moved ------
def _holder(path: str, ready: mp.synchronize.Event, release: mp.synchronize.Event) -> None:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = DELETE")  # no WAL: an exclusive lock keeps readers out too
    conn.execute("BEGIN EXCLUSIVE")
    ready.set()
    release.wait(60)
    conn.execute("ROLLBACK")


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_store_another_process_holds_locked_is_not_moved(tmp_path: Path, journal: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    with ProfileStore(tmp_path) as store:
        store.put(CTX, "kept", 1.0)
    db = tmp_path / "profiles.sqlite"
    if journal == "delete":
        import sqlite3

        sqlite3.connect(db, isolation_level=None).execute("PRAGMA journal_mode = DELETE").close()
    with _another_process(_holder, str(db)):
        with (caplog.at_level(logging.WARNING, logger="opsched.cost.store"),
              ProfileStore(tmp_path, timeout_s=0.3) as store):
            store.put(CTX, "new", 2.0)  # cannot be written now: kept in memory for this run
            assert store.get(CTX, "new") == 2.0
            assert store.get(CTX, "kept") in (1.0, None)  # readable where the lock lets readers in
        assert any("locked by another process" in r.getMessage() for r in caplog.records)
    assert not list(tmp_path.glob("*.corrupt-*")) and db.exists()
    with ProfileStore(tmp_path) as store:
        assert store.get(CTX, "kept") == 1.0


def _unprivileged(check: Callable[[], None]) -> None:
    """Run ``check`` as a user without write access (a forked child dropping to nobody where the
    tests run as root, which writes anywhere); its failure fails the test."""
    if os.geteuid() != 0:
        check()
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the outcome through the pipe, then leave at once
        os.close(r)
        message = b""
        try:
            os.setgid(65534)
            os.setuid(65534)
            check()
        except BaseException as e:  # noqa: BLE001 (every failure is the test's to report)
            message = f"{type(e).__name__}: {e}".encode()
        os.write(w, message)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    assert not message, message


def _shared_dir(tmp_path: Path) -> Path:
    """A directory every user can read (pytest's own are private to their owner)."""
    base = Path(tempfile.mkdtemp(prefix="opsched-ro-", dir="/tmp"))
    base.chmod(0o755)
    return base


def test_a_read_only_store_serves_what_it_holds(tmp_path: Path) -> None:
    base = _shared_dir(tmp_path)
    with ProfileStore(base) as store:
        store.put(CTX, "kept", 1.0)
    (base / "empty").mkdir()
    for p in base.iterdir():
        p.chmod(0o555 if p.is_dir() else 0o444)
    base.chmod(0o555)

    def check() -> None:
        with ProfileStore(base) as store:
            assert not store.writable and store.get(CTX, "kept") == 1.0
            store.put(CTX, "new", 2.0)  # kept for this run, not in the file
            assert store.get(CTX, "new") == 2.0
        for empty in (base / "missing", base / "empty"):  # nothing stored, and nowhere to store it
            with ProfileStore(empty) as store:
                assert not store.writable and store.get(CTX, "kept") is None
                store.put(CTX, "new", 2.0)
                assert store.get(CTX, "new") == 2.0
    try:
        _unprivileged(check)
        assert not list(base.glob("*.corrupt-*"))
    finally:
        base.chmod(0o755)
        for p in base.iterdir():
            p.chmod(0o755 if p.is_dir() else 0o644)


def test_a_foreign_sqlite_file_is_named_and_left_alone(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "profiles.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE measurements (name TEXT, value REAL)")
    conn.execute("INSERT INTO measurements VALUES ('theirs', 1.0)")
    conn.commit()
    conn.close()
    with pytest.raises(ProfileStoreError, match="is an SQLite database but not an opsched profile store"):
        ProfileStore(tmp_path)
    assert sqlite3.connect(db).execute("SELECT value FROM measurements").fetchone() == (1.0,)


# --- the schedule cache beside the store --------------------------------------------------------
def _write_and_read(cache_dir: str, key: CacheKey, schedules: list[dict[str, object]], rounds: int,
                    seen: mp.Queue[list[object]]) -> None:
    """One process of the race below: writes its schedules under ``key`` and reads back, by turns."""
    cache, mine = ScheduleCache(cache_dir), [Schedule.from_dict(s) for s in schedules]
    read: set[object] = set()
    for i in range(rounds):
        cache.put(key, mine[i % len(mine)], "ort", 0.0, {})
        got = cache.get(key)
        read.add("missing" if got is None else got.schedule.estimated_ms)
    seen.put(sorted(read, key=str))


def test_processes_writing_one_schedule_key_at_once_each_leave_a_whole_file(tmp_path: Path) -> None:
    """Two processes put and get one key 200 times each: every read finds a whole schedule, one of
    the two written (never a torn file, which would be moved aside as corrupt, never none)."""
    graph = random_dag(6, seed=1)
    made = [schedule(graph, name, AnalyticCostModel("V100")) for name in ("sequential", "greedy")]
    key = CacheKey.of("code", (((1, 4, 8, 8), "torch.float32"),), (), {"scheduler": "ios"}, torch.device("cpu"))
    assert key is not None
    seen: mp.Queue[list[object]] = mp.get_context("spawn").Queue()
    procs = [mp.get_context("spawn").Process(target=_write_and_read,
                                             args=(str(tmp_path), key, [s.to_dict() for s in made[i:] + made[:i]],
                                                   200, seen)) for i in range(2)]
    for p in procs:
        p.start()
    results = [seen.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs)
    estimates = {s.estimated_ms for s in made}
    assert all(set(r) <= estimates for r in results), results  # never "missing": no torn file was read
    assert not list((tmp_path / "schedules").glob("*.corrupt")) and not list((tmp_path / "schedules").glob(".*.tmp"))


def _cache_key(n: int) -> CacheKey:
    key = CacheKey.of(f"code {n}", (((1, 4, 8, 8), "torch.float32"),), (), {"scheduler": "ios"}, torch.device("cpu"))
    assert key is not None
    return key


def test_the_schedule_cache_keeps_the_most_recently_used_schedules(tmp_path: Path) -> None:
    """Past its bound, a write removes the least recently used files; a file read counts as used."""
    made = schedule(random_dag(6, seed=1), "sequential", AnalyticCostModel("V100"))
    cache = ScheduleCache(tmp_path, max_schedules=3)
    paths = [cache.put(_cache_key(n), made, "ort", 0.0, {}) for n in range(3)]
    for age, p in enumerate(paths):  # written long ago, oldest first (a file system's clock may be coarse)
        assert p is not None
        os.utime(p, (1000.0 + age, 1000.0 + age))
    assert cache.get(_cache_key(0)) is not None  # used now: key 1 is the least recently used
    cache.put(_cache_key(3), made, "ort", 0.0, {})
    assert [cache.get(_cache_key(n)) is not None for n in range(4)] == [True, False, True, True]
    cache.put(_cache_key(3), made, "ort", 0.0, {})  # written again: nothing more to remove
    assert len(list(cache.files())) == 3
    assert ScheduleCache(tmp_path).status()["max_schedules"] == 1000


def test_the_schedule_cache_bound_comes_from_the_environment_and_is_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCHED_SCHEDULE_CACHE_MAX", "2")
    assert ScheduleCache(tmp_path).max_schedules == 2
    for bad in ("0", "many"):
        monkeypatch.setenv("OPSCHED_SCHEDULE_CACHE_MAX", bad)
        with pytest.raises(OpschedError, match=f"OPSCHED_SCHEDULE_CACHE_MAX .* at least 1; got '{bad}'"):
            ScheduleCache(tmp_path)
    with pytest.raises(OpschedError, match="max_schedules=0"):
        ScheduleCache(tmp_path, max_schedules=0)


def test_a_schedule_cache_key_names_the_code_that_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other source at the same version number is another key: a schedule searched by older code
    is searched again, not reused."""
    from opsched import __version__, schedule_cache

    assert schedule_cache.code_version().startswith(f"{__version__}+")
    assert _cache_key(0).opsched == schedule_cache.code_version()
    before = _cache_key(0).digest
    monkeypatch.setattr(schedule_cache, "code_version", lambda: f"{__version__}+other")
    assert _cache_key(0).digest != before
