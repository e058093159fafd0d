"""Two optimize() calls at once in one process: does each measure the machine alone?

A server that optimizes its models at start from several threads runs their searches at once.
Each search times stages on the machine and keeps the figures in its profile store; timed under
another search's load, they are wrong for good. ``optimize()`` takes turns
(:func:`opsched.timing.alone`). This page measures what the turns are worth.

Per repeat, every way with fresh profile stores, each model with a store of its own:

- *alone*: each model's ``optimize()`` by itself, one after the other; its stage figures are the
  reference;
- *at once*: every model's ``optimize()`` in a thread of its own, the threads started together;
- *at once, no turns*: the same with the turns switched off (``opsched.api.alone`` replaced by
  a context that holds nothing), as ``optimize()`` ran before them.

Per model and way: the median, and the 90th percentile, of the ratio of each stage's figure
to the *alone* figure of the same stage (over the stages both measured; > 1: timed slower than
it runs), and the wall time of all the calls of that way together.

    python benchmarks/concurrent_searches.py
    python benchmarks/concurrent_searches.py --models googlenet squeezenet1_1 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import RESULTS, geomean, write_table  # noqa: E402

import opsched  # noqa: E402
import opsched.api  # noqa: E402
from opsched.models import example_inputs, get_model  # noqa: E402

WAYS = ("alone", "at once", "at once, no turns")


def figures(cache: Path) -> dict[str, float]:
    """The stage figures a profile store holds, by stage key."""
    with contextlib.closing(sqlite3.connect(cache / "profiles.sqlite")) as db:
        return dict(db.execute("SELECT stage_key, latency_ms FROM measurements"))


@contextlib.contextmanager
def no_turns() -> Iterator[None]:
    """``optimize()`` as it ran before searches took turns."""
    held = opsched.api.alone

    @contextlib.contextmanager
    def nothing(*args: Any, **kwargs: Any) -> Iterator[bool]:
        yield True

    opsched.api.alone = nothing  # type: ignore[assignment]
    try:
        yield
    finally:
        opsched.api.alone = held


def search(name: str, cache: Path) -> None:
    with torch.no_grad():
        opsched.optimize(get_model(name).eval(), example_inputs(name), cache_dir=str(cache), verify=False,
                         progress=False)


def labels(models: list[str]) -> list[str]:
    """Each model's name, numbered where it is given more than once (``googlenet 2``)."""
    return [m if models.count(m) == 1 else f"{m} {models[:k + 1].count(m)}" for k, m in enumerate(models)]


def run_way(way: str, models: list[str], root: Path) -> tuple[dict[str, dict[str, float]], float]:
    """Every model's ``optimize()`` the way named: each one's stage figures (by its label), and
    the wall time."""
    named = dict(zip(labels(models), models))
    caches = {label: root / way.replace(" ", "_").replace(",", "") / label.replace(" ", "_") for label in named}
    start = time.perf_counter()
    if way == "alone":
        for label, m in named.items():
            search(m, caches[label])
    else:
        errors: list[BaseException] = []

        def each(label: str) -> Callable[[], None]:
            def body() -> None:
                try:
                    search(named[label], caches[label])
                except BaseException as e:  # noqa: BLE001 (raised below, in the main thread)
                    errors.append(e)
            return body

        with no_turns() if way == "at once, no turns" else contextlib.nullcontext():
            threads = [threading.Thread(target=each(label)) for label in named]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
    return {label: figures(cache) for label, cache in caches.items()}, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["googlenet", "googlenet"],
                   help="the models searched at once (one given twice: two searches of equal length)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--name", default="concurrent-searches")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    ratios: dict[tuple[str, str], list[float]] = {}
    walls: dict[str, list[float]] = {w: [] for w in WAYS}
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs = {}
            for way in WAYS:
                runs[way], wall = run_way(way, args.models, Path(tmp) / str(r))
                walls[way].append(wall)
                print(f"repeat {r}: {way}: {wall:.1f} s", flush=True)
        for way in WAYS[1:]:
            for m in labels(args.models):
                alone, other = runs["alone"][m], runs[way][m]
                ratios.setdefault((m, way), []).extend(other[k] / alone[k] for k in alone.keys() & other.keys())
    rows, data = [], []
    for m in labels(args.models):
        for way in WAYS[1:]:
            rs = sorted(ratios[(m, way)])
            p90 = rs[min(len(rs) - 1, int(0.9 * len(rs)))]
            rows.append([m, way, len(rs), f"{statistics.median(rs):.2f}", f"{p90:.2f}"])
            data.append({"model": m, "way": way, "stages": len(rs), "median": statistics.median(rs), "p90": p90})
    wall = {w: statistics.median(v) for w, v in walls.items()}
    intro = [
        "# Two optimize() calls at once in one process",
        "",
        "Zoo models at batch 1, `opsched.optimize` with its defaults (a measured search and race, fresh profile "
        "stores, one per model). *alone*: each by itself, one after the other (the reference); *at once*: each in "
        "a thread of its own, started together, taking turns to search and race (`opsched.timing.alone`); *no "
        "turns*: the same with the turns switched off, as before them. Per model and way: over the stages both "
        "runs measured, the median and 90th percentile of the ratio of the stage's figure to the *alone* one "
        f"(> 1: timed slower than it runs), pooled over {args.repeats} repeats. Wall time of all the calls, "
        "median over repeats: " + ", ".join(f"{w} {s:.1f} s" for w, s in wall.items()) + ".",
    ]
    write_table(args.name, intro, ["model", "way", "stages", "median ratio to alone", "90th percentile"], rows,
                {f"median ratio, {w}": geomean(float(r[3]) for r in rows if r[1] == w) for w in WAYS[1:]},
                {"rows": data, "walls": walls, "repeats": args.repeats}, args.out)


if __name__ == "__main__":
    main()
