"""Interleaved timing: rounds pair up, the order changes from round to round, and a race is
decided round by round."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from opsched.race import Standings, Turn, race
from opsched.timing import interleave, paired_ratio


def test_rounds_pair_up_and_no_contender_always_follows_the_same_one() -> None:
    ran: list[str] = []
    calls = {k: (lambda k=k: ran.append(k)) for k in "abcd"}

    def clock(call: Callable[[], object]) -> float:  # a call's "time" is its position in the run
        call()
        return float(len(ran))

    times = interleave(calls, rounds=20, warmup=2, clock=clock)
    assert all(len(t) == 20 for t in times.values())
    for r in range(20):  # the r-th time of every contender comes from timed round r
        assert sorted(times[k][r] for k in "abcd") == [float(4 * (r + 2) + i) for i in range(1, 5)]
    rounds = [ran[i:i + 4] for i in range(0, len(ran), 4)]
    assert len({tuple(r) for r in rounds}) > 1  # the order changes
    after_a = {r[r.index("a") + 1] for r in rounds if r.index("a") < 3}
    assert after_a == set("bcd")  # whatever follows "a" is not always the same contender
    again: list[str] = []
    interleave({k: (lambda k=k: again.append(k)) for k in "abcd"}, rounds=20, warmup=2)
    assert again == ran  # seeded: the same orders every time


def test_blocks_sample_the_median_of_a_turn_after_one_untimed_call() -> None:
    log: list[str] = []
    ticks = iter(range(1000))

    def clock(call):  # type: ignore[no-untyped-def]
        call()
        return float(next(ticks))  # 0, 1, 2, ...: a block of 3 has its middle tick as median

    times = interleave({k: (lambda k=k: log.append(k)) for k in "ab"}, rounds=2, warmup=1, clock=clock, block=3)
    assert len(log) == 3 * 2 * 4  # (1 untimed + 3 timed) per turn, 2 calls, 3 rounds
    assert all(len(v) == 2 for v in times.values())
    assert sorted(times["a"] + times["b"]) == [7.0, 10.0, 13.0, 16.0]  # rounds after the warm-up one


def test_a_race_is_decided_round_by_round_so_load_that_comes_and_goes_cancels() -> None:
    # "a" is 10% faster than "b" in four rounds of seven, the ones both ran under the same load;
    # in the other three only "a" met heavier load: its median is the higher one, and the
    # paired comparison still names it
    load = [1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]
    a = tuple(10.0 * f for f in load)
    b = tuple(11.0 * f for f in load[:3]) + (11.0, 11.0, 11.0, 33.0)
    standings = Standings({"a": a, "b": b})
    assert standings.medians == {"a": 30.0, "b": 11.0}  # the medians would keep "b"
    assert paired_ratio(a, b) == pytest.approx(10 / 11)  # four of seven rounds: 10/11
    assert standings.fastest == "a"
    assert standings.relative("a") == {"a": 1.0, "b": pytest.approx(11 / 10)}
    with pytest.raises(ValueError, match="two equal, non-empty series, got 2 and 1"):
        paired_ratio((1.0, 2.0), (1.0,))


def test_the_fastest_beats_every_other_contender_and_otherwise_has_the_mildest_worst_comparison() -> None:
    winner = Standings({"x": (3.0, 3.0, 3.0), "y": (2.0, 2.0, 2.0), "z": (2.5, 1.0, 4.0)})
    assert winner.fastest == "y"  # y beats x every round and z in two of three
    # a cycle (noise among plans of about one speed): p beats q, q beats r, r beats p, each in
    # two of three rounds; kept: the one whose losing comparison is the mildest
    cycle = Standings({"p": (1.0, 2.0, 3.0), "q": (2.0, 3.0, 1.0), "r": (3.0, 1.5, 2.0)})
    worst = {k: max(cycle.ratio(k, o) for o in "pqr" if o != k) for k in "pqr"}
    assert worst == pytest.approx({"p": 4 / 3, "q": 1.5, "r": 1.5})
    assert cycle.fastest == "p"
    tied = Standings({"first": (5.0, 4.0, 6.0), "second": (5.0, 4.0, 6.0)})
    assert tied.fastest == "first"  # a tie keeps the first named (optimize(): the scheduler asked for)
    assert Standings({"alone": (1.0,)}).fastest == "alone"


def test_race_returns_every_round_of_every_contender() -> None:
    times = iter(float(t) for t in range(100))

    def clock(call: Callable[[], object]) -> float:
        call()
        return next(times)

    standings = race({"a": lambda: None, "b": lambda: None}, clock=clock, rounds=5, warmup=1,
                     turn=Turn(settle_s=0.0, block=1))
    assert all(len(v) == 5 for v in standings.samples.values())
    assert sorted(standings.samples["a"] + standings.samples["b"]) == [float(t) for t in range(2, 12)]

