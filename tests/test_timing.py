"""Interleaved timing: rounds pair up, the order changes from round to round, and a race is
decided round by round."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from opsched.race import Cutoff, Standings, Turn, race
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



def test_dropped_calls_keep_a_prefix_of_the_rounds_and_the_rounds_end_with_one_left() -> None:
    ran: list[str] = []
    calls = {k: (lambda k=k: ran.append(k)) for k in "abc"}
    seen: list[dict[str, int]] = []

    def drop(samples):  # type: ignore[no-untyped-def]
        seen.append({k: len(v) for k, v in samples.items()})
        done = len(seen)
        return {"c"} if done == 2 else {"b"} if done == 4 else set()

    progress: list[tuple[int, int]] = []
    times = interleave(calls, rounds=10, warmup=1, drop=drop, on_round=lambda d, t: progress.append((d, t)))
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 2}
    assert seen == [dict.fromkeys("abc", 1), dict.fromkeys("abc", 2), dict.fromkeys("ab", 3), dict.fromkeys("ab", 4)]
    assert sorted(ran) == sorted("abc" * 3 + "ab" * 2)  # the warm-up round, 2 timed rounds of 3, 2 of 2
    assert progress[-1] == (11, 11)  # the bar ends full when the rounds end early
    alone = interleave({"a": lambda: None}, rounds=3, warmup=0, drop=lambda s: set())
    assert len(alone["a"]) == 3  # one call from the start runs every round


def test_a_cutoff_needs_a_lead_beyond_its_margin_in_every_round_so_far() -> None:
    cutoff = Cutoff(rounds=3, margin=0.1)
    assert cutoff.beaten({"a": [1.0, 1.0], "b": [9.0, 9.0]}) == set()  # too few rounds
    assert cutoff.beaten({"a": [1.0, 1.0, 1.0], "b": [1.2, 1.2, 1.2]}) == {"b"}
    assert cutoff.beaten({"a": [1.0, 1.0, 1.0], "b": [1.2, 1.05, 1.2]}) == set()  # one round within 10%
    assert cutoff.beaten({"a": [1.0, 1.0, 1.0], "b": [1.2, 0.9, 1.2]}) == set()  # one round won
    # every round counts, not the last few: "b" won the first round, then lost three by more than 10%
    assert cutoff.beaten({"a": [1.0, 1.0, 1.0, 1.0], "b": [0.5, 1.2, 1.2, 1.2]}) == set()
    assert cutoff.beaten({"a": [1.0, 1.0, 1.0, 1.0], "b": [1.2, 1.2, 1.2, 1.2]}) == {"b"}
    # beaten by any other contender, not only the fastest; the round's fastest is never beaten
    three = {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0], "c": [2.5, 2.5, 2.5]}
    assert cutoff.beaten(three) == {"b", "c"}
    assert cutoff.beaten({"a": [1.0, 2.0, 1.0], "b": [2.0, 1.0, 2.0]}) == set()
    with pytest.raises(ValueError, match="rounds >= 1 and margin >= 0"):
        Cutoff(rounds=0)


def test_a_race_with_a_cutoff_stops_timing_the_beaten_and_keeps_the_fastest() -> None:
    cost = {"fast": 1.0, "slow": 1.5, "close": 1.04}

    def clock(call: Callable[[], object]) -> float:
        return cost[call()]  # type: ignore[index]

    calls = {k: (lambda k=k: k) for k in cost}
    standings = race(calls, clock=clock, rounds=7, warmup=1, turn=Turn(settle_s=0.0, block=1), cutoff=Cutoff())
    # "slow" is cut off after 3 rounds; "close" is within the margin, so both it and "fast" run every round
    assert standings.cut_off == {"slow"} and standings.rounds == 7
    assert {k: len(v) for k, v in standings.samples.items()} == {"fast": 7, "slow": 3, "close": 7}
    assert standings.fastest == "fast" and standings.ratio("slow", "fast") == pytest.approx(1.5)
    duel = race({k: calls[k] for k in ("slow", "fast")}, clock=clock, rounds=7, warmup=1,
                turn=Turn(settle_s=0.0, block=1), cutoff=Cutoff())
    assert duel.rounds == 3 and duel.cut_off == {"slow"} and duel.fastest == "fast"  # decided: the race ends
    # a contender cut off is never kept, even where the rounds it ran were better than the survivor's
    assert Standings({"a": (1.0, 1.0, 9.0), "b": (0.5,)}).fastest == "b"
    assert Standings({"a": (1.0, 1.0, 9.0), "b": (0.5,)}, frozenset({"b"})).fastest == "a"
    full = race(calls, clock=clock, rounds=7, warmup=1, turn=Turn(settle_s=0.0, block=1))
    assert full.cut_off == frozenset() and all(len(v) == 7 for v in full.samples.values())


def test_a_report_names_the_contenders_a_race_cut_off_and_the_rounds_they_ran() -> None:
    from opsched.report import RaceResult

    standings = Standings({"ios": (1.0, 1.0, 1.0), "greedy": (1.5, 1.5, 1.5), "est": (1.2, 0.9, 1.0)},
                          frozenset({"greedy"}))
    result = RaceResult(standings, standings.fastest)
    assert result.kept == "ios" and result.cut_off("greedy") == "cut off after 3 rounds"
    assert result.cut_off("est") == result.cut_off("ios") == ""
    assert str(result) == ("ios 1.00 ms, greedy 1.50 ms (1.50x), cut off after 3 rounds, "
                           "est 1.00 ms (1.00x): kept ios")


def test_a_search_whose_progress_fails_as_its_turn_comes_lets_the_machine_go() -> None:
    """The progress callback of a search that waited for its turn is called with the machine
    held: where it raises, the search fails and the machine is free for the next."""
    import threading

    from opsched import timing

    holding, waiting, release = threading.Event(), threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def first() -> None:
        with timing.alone("first"):
            holding.set()
            release.wait(30)

    def progress(done: int, total: int, what: str) -> None:
        waiting.set()
        if done == total:
            raise RuntimeError(f"the progress bar of {what} failed")

    def second() -> None:
        try:
            with timing.alone("second", waiting=progress):
                pass
        except RuntimeError as e:
            failures.append(e)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert holding.wait(30)
    threads[1].start()
    assert waiting.wait(30)  # the second waits for its turn
    release.set()
    for t in threads:
        t.join(30)
    assert [str(e) for e in failures] == ["the progress bar of second failed"]
    with timing.alone("third", wait=False) as held:
        assert held
