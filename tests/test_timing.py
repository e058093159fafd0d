"""Interleaved timing: rounds pair up, and the order changes from round to round."""

from __future__ import annotations

from collections.abc import Callable

from opsched.timing import interleave


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
