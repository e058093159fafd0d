"""How often a race of plans keeps the faster one, on a shared machine: the rule ``optimize()``
decides by (each contender's samples paired with the others' from the same round, the fastest
the one whose worst paired ratio is the lowest) against comparing two medians, and the same rule
after a cutoff (:class:`opsched.race.Cutoff`, as ``optimize()`` races on a CPU: a contender
slower than the other by more than 10% in each of its first 3 rounds is timed no more) or after
the window it was chosen over (the same test on the last 3 rounds, made afresh each round).

Two contenders of known cost (``work`` and ``work * (1 + gap)`` products of 256x256 matrices, on
every torch thread) race exactly as ``optimize()`` races plans (7 rounds after one warm-up, a
turn of 50 ms sleep, one untimed call and 3 timed, their median the sample), ``--races`` times
per cell. Under *bursts* a second process keeps one core busy in
bursts of 20-300 ms with pauses of the same lengths (what another job, a compiler or a browser
does to a shared 2-core machine); *quiet* runs without it. Each decision rule sees the same
samples. A cell counts the races whose rule kept the faster contender, and those in which a
cutoff stopped timing the faster one. Cutoffs are replayed on each race's samples, round by
round, as the race would have applied them (what one decides after a round depends on that round
and those before it, which the replay sees as they were); *turns* is the share of a full race's
turns (warm-up included) that one timed.

    python benchmarks/race.py
    python benchmarks/race.py --races 60 --gaps 0.03 0.1
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import write  # noqa: E402

from opsched.race import Cutoff, Standings, Turn, race  # noqa: E402

K = TypeVar("K")
LOADS = ("quiet", "bursts")
#: The decision rules compared, on the same samples.
RULES = ("paired", "medians")


def bursts(stop: Any, seed: int) -> None:
    """Keep one core busy in bursts of 20-300 ms, with pauses as long, until ``stop`` is set."""
    rng = random.Random(seed)
    while not stop.is_set():
        length = rng.uniform(0.02, 0.3)
        if rng.random() < 0.5:
            until = time.perf_counter() + length
            while time.perf_counter() < until:
                pass
        else:
            time.sleep(length)


def products(count: int) -> Callable[[], object]:
    a = torch.randn(256, 256)

    def call() -> None:
        for _ in range(count):
            a @ a
    return call


@dataclass(frozen=True, slots=True)
class Window(Cutoff):
    """The rule the cutoff was chosen over: the same test on the last ``rounds`` rounds only, so
    that it is tested afresh each round."""

    def beaten(self, samples: Mapping[K, Sequence[float]]) -> set[K]:
        return Cutoff.beaten(self, {k: v[-self.rounds:] for k, v in samples.items()})


#: The cutoffs replayed: what optimize() applies, and the window it was chosen over.
CUTOFFS: dict[str, Cutoff] = {"cut off": Cutoff(), "window": Window()}


def cut_off(standings: Standings[str], cutoff: Cutoff) -> Standings[str]:
    """The race ``standings`` came from, run again with ``cutoff`` on its recorded samples: each
    call's clock gives that contender's next sample, so the race's own rounds apply the cutoff
    exactly as they would have."""
    recorded = {k: iter(v) for k, v in standings.samples.items()}
    return race({k: (lambda k=k: k) for k in recorded}, clock=lambda call: next(recorded[call()]),
                rounds=standings.rounds, warmup=0, turn=Turn(settle_s=0.0, block=1), cutoff=cutoff)


def cell(load: str, gap: float, races: int, work: int) -> tuple[list[object], dict[str, object]]:
    calls = {"faster": products(work), "slower": products(round(work * (1 + gap)))}
    stop = multiprocessing.Event()
    loader = multiprocessing.Process(target=bursts, args=(stop, 1), daemon=True) if load == "bursts" else None
    if loader is not None:
        loader.start()
    kept = dict.fromkeys(RULES, 0)
    wrong, turns = dict.fromkeys(CUTOFFS, 0), dict.fromkeys(CUTOFFS, 0)
    try:
        for _ in range(races):
            standings = race(calls)  # as optimize() races plans, every round
            med = standings.medians
            kept["paired"] += standings.fastest == "faster"
            kept["medians"] += min(med, key=med.__getitem__) == "faster"
            for name, cutoff in CUTOFFS.items():
                short = cut_off(standings, cutoff)
                wrong[name] += "faster" in short.cut_off
                turns[name] += sum(1 + len(v) for v in short.samples.values())  # the warm-up turn, then its rounds
    finally:
        stop.set()
        if loader is not None:
            loader.join()
    full = races * len(calls) * (1 + standings.rounds)
    share = {name: t / full for name, t in turns.items()}
    row: list[object] = [load, f"{gap:.0%}", races, *kept.values(),
                         *(x for name in CUTOFFS for x in (wrong[name], f"{share[name]:.0%}"))]
    return row, {"load": load, "gap": gap, "races": races, "kept_the_faster": kept,
                 "cut_off_the_faster": wrong, "turns": share}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--races", type=int, default=30)
    p.add_argument("--gaps", type=float, nargs="*", default=[0.05, 0.1, 0.25, 0.5])
    p.add_argument("--work", type=int, default=40, help="matrix products in the faster contender's call")
    p.add_argument("--name", default="race")
    args = p.parse_args()
    rows, records = [], []
    for load in LOADS:
        for gap in args.gaps:
            row, record = cell(load, gap, args.races, args.work)
            rows.append(row)
            records.append(record)
            print(" | ".join(map(str, row)), flush=True)
    from opsched.cli.table import format_table

    headers = ["load", "gap", "races", *(f"{rule}: kept the faster" for rule in RULES),
               *(x for name in CUTOFFS for x in (f"{name}: the faster cut", f"{name}: turns"))]
    md = "\n".join([
        "# Which plan a race keeps, on a shared machine", "",
        "Two contenders `gap` apart raced as `optimize()` races plans (7 rounds, blocks of 3, 50 ms settle): "
        "the races that kept the faster contender, decided as optimize() decides (*paired*: samples paired "
        "by round, `opsched.race.Standings`) and, on the same samples, by comparing the two medians. See "
        "`benchmarks/race.py`.", "",
        "Cutoffs, replayed on the same samples, round by round: *cut off* as `optimize()` races on a CPU "
        "(`opsched.race.Cutoff`: a contender slower than the other by more than 10% in each of its first 3 "
        "rounds is timed no more, and the race ends with one left); *window*, the rule it was chosen over, "
        "the same test on the last 3 rounds, made afresh each round. *the faster cut*: races in which the "
        "cutoff stopped timing the faster contender, so that the slower was kept; *turns*: the share of the "
        "full race's turns (warm-up included) timed.", "", format_table(headers, rows, markdown=True)])
    md_path, js_path = write(args.name, md, {"rows": records, "work": args.work})
    print(format_table(headers, rows))
    print(f"wrote {md_path} and {js_path}")

if __name__ == "__main__":
    main()
