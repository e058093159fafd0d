"""Pictures and traces of runs: a Gantt chart (lanes by time), a race of plans round by round, and
the Chrome/Perfetto trace format."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opsched.report import RaceResult
from opsched.runtime.plan import MERGED_OP
from opsched.timeline import TraceEvent

__all__ = ["draw_timeline", "draw_race", "chrome_trace", "write_chrome_trace", "op_family"]

#: Each op category's family in pictures (several categories share one colour).
_FAMILIES = {
    "conv": "convolution", "gemm": "linear", "norm": "elementwise", "activation": "elementwise",
    "elementwise": "elementwise", "pool": "pooling", "reduce": "pooling", "data": "data movement",
    "view": "data movement", "const": "data movement", "opaque": "opaque (torch)", "layout": "layout conversion",
    "segment": "onnxruntime segment",
}
_COLORS = {"convolution": "#1f77b4", "merged convolution": "#17becf", "linear": "#9467bd", "pooling": "#2ca02c",
           "elementwise": "#ff7f0e", "data movement": "#8c564b", "onnxruntime segment": "#7f7f7f",
           "opaque (torch)": "#d62728", "layout conversion": "#e377c2", "other": "#bcbd22"}


def op_family(event: TraceEvent) -> str:
    """The family an event is drawn in: its category's, a merged convolution its own."""
    if event.op == MERGED_OP:
        return "merged convolution"
    return _FAMILIES.get(event.category, "other")


def draw_timeline(events: Sequence[TraceEvent], path: str | os.PathLike[str], title: str = "",
                  median_ms: float | None = None) -> None:
    """A Gantt chart: one row per lane, one bar per step (or kernel), coloured by what it does,
    labelled where the label fits inside its bar. ``median_ms``, the call's median latency where
    it was timed, is named beside the drawn run's length: a profiled run is one run, and profiling
    adds its own overhead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = max((e.lane for e in events), default=0) + 1
    end = max((e.end_ms for e in events), default=1.0)
    width_in = 12.0
    fig, ax = plt.subplots(figsize=(width_in, 1.2 + 0.6 * lanes))
    ms_per_char = end * 1.01 / (0.8 * width_in) * (6 * 0.6 / 72)  # fontsize 6 glyphs over the axis' data span
    used = set()
    for e in events:
        family = op_family(e)
        used.add(family)
        ax.barh(e.lane, e.end_ms - e.start_ms, left=e.start_ms, height=0.7, color=_COLORS[family],
                edgecolor="white", linewidth=0.3)
        label = e.label[:24]
        if e.end_ms - e.start_ms > (len(label) + 1) * ms_per_char:
            ax.text((e.start_ms + e.end_ms) / 2, e.lane, label, ha="center", va="center", fontsize=6,
                    color="white", clip_on=True)
    phase_starts: dict[int, float] = {}
    for e in events:
        phase_starts[e.phase] = min(phase_starts.get(e.phase, e.start_ms), e.start_ms)
    for t in phase_starts.values():
        ax.axvline(t, color="#dddddd", linewidth=0.5, zorder=0)
    ax.set_yticks(range(lanes), [f"lane {i}" for i in range(lanes)])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_xlim(0, end * 1.01)
    note = f"one profiled run, {end:.2f} ms"
    if median_ms is not None:
        note += f" (median call {median_ms:.2f} ms; profiling adds its own overhead)"
    ax.set_title(f"{title or 'timeline'}\n{note}", fontsize=10)
    ax.legend(handles=[Patch(color=_COLORS[f], label=f) for f in _COLORS if f in used], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def draw_race(race: RaceResult, path: str | os.PathLike[str], title: str = "") -> None:
    """The race that chose a plan, as it was decided: a row per contender (the kept one first), a
    dot per round at the contender's time over the kept plan's in that round, and a bar at the
    median of those ratios, the figure the race compared."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    standings, kept = race.standings, race.kept
    names = [kept, *sorted((k for k in standings.samples if k != kept), key=race.relative.__getitem__)]
    base = standings.samples[kept]
    fig, ax = plt.subplots(figsize=(9.0, 1.4 + 0.45 * len(names)))
    for row, name in enumerate(names):
        ratios = [a / b for a, b in zip(standings.samples[name], base)]
        ax.scatter(ratios, [row] * len(ratios), s=14, alpha=0.5, color="#1f77b4" if name == kept else "#7f7f7f",
                   edgecolors="none")
        ax.plot([race.relative[name]] * 2, [row - 0.3, row + 0.3], color="#d62728", linewidth=2)
    ax.axvline(1.0, color="#dddddd", linewidth=0.8, zorder=0)
    ax.set_yticks(range(len(names)), [f"{n}  {race.relative[n]:.2f}x, {race.times_ms[n]:.2f} ms"
                                      + (f"\n({cut})" if (cut := race.cut_off(n)) else "") for n in names])
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2f}x"))
    ax.set_xlabel(f"time over {kept}'s in the same round (dots: rounds; bar: their median)")
    ax.set_title(f"{title or 'race of plans'}: kept {kept}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def chrome_trace(events: Sequence[TraceEvent], name: str = "opsched") -> dict[str, object]:
    """The Chrome / Perfetto JSON trace format: open in chrome://tracing or ui.perfetto.dev."""
    trace: list[dict[str, object]] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}}]
    lanes = sorted({e.lane for e in events})
    trace += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": lane, "args": {"name": f"lane {lane}"}}
              for lane in lanes]
    trace += [{"name": e.label, "cat": op_family(e), "ph": "X", "pid": 0, "tid": e.lane,
               "ts": round(e.start_ms * 1e3, 3), "dur": round((e.end_ms - e.start_ms) * 1e3, 3),
               "args": {"op": e.op, "phase": e.phase}} for e in events]
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_chrome_trace(events: Sequence[TraceEvent], path: str | os.PathLike[str], name: str = "opsched") -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(events, name), f)
