"""ONNX Runtime's spinning threads, between calls and within them: what a one-session plan's
thread policy costs on this CPU, called back to back and called with torch work between calls.

Per zoo model, one ONNX Runtime session of the whole model (opsched's sequential plan is one
such session) under three policies, interleaved in one process in a fresh order each round
(:func:`opsched.timing.interleave`, 50 ms of sleep before each turn):

- *spin*: ORT's default, idle intra-op threads spin, and keep spinning after a run returns;
- *spin within runs*: they spin, and stop when a run returns (``session.force_spinning_stop``,
  what opsched's one-session plans do);
- *no spin*: idle threads sleep and are woken for every kernel.

Two workloads: *back to back*, ``--block`` calls in a row (their median); *with torch
between*, a call followed by a small torch convolution on all cores (the caller's own work, as
a decoding loop's sampling code or a pipeline's pre-processing), the pair timed. Ratios are
each policy's time over *spin within runs*', paired by round (> 1: slower than it).

    python benchmarks/spinning.py
    python benchmarks/spinning.py --models randwire_small inception_v3 --rounds 21
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import RESULTS, each_model, geomean, write_table  # noqa: E402

from opsched.models import example_inputs, get_model  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402

#: Each policy's session config entries.
POLICIES = {
    "spin": {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "0"},
    "spin within runs": {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "1"},
    "no spin": {"session.intra_op.allow_spinning": "0"},
}
BASE = "spin within runs"


def session(onnx: bytes, entries: dict[str, str]) -> object:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.log_severity_level = 3
    for key, value in entries.items():
        so.add_session_config_entry(key, value)
    return ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])


def run(name: str, rounds: int, block: int) -> tuple[list[object], dict[str, object]]:
    model, inputs = get_model(name), example_inputs(name)
    buffer = io.BytesIO()
    torch.onnx.export(model, inputs, buffer, input_names=["x"], dynamo=False)
    sessions = {k: session(buffer.getvalue(), v) for k, v in POLICIES.items()}
    feeds = {"x": inputs[0].numpy()}
    work, kernel = torch.randn(1, 64, 56, 56), torch.randn(64, 64, 3, 3)

    def between(s: object) -> object:
        s.run(None, feeds)  # type: ignore[attr-defined]
        return torch.nn.functional.conv2d(work, kernel, padding=1)

    with torch.no_grad():
        alone = interleave({k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()},  # type: ignore[attr-defined]
                           rounds, warmup=2, settle_s=0.05, block=block)
        mixed = interleave({k: (lambda s=s: between(s)) for k, s in sessions.items()}, rounds, warmup=2,
                           settle_s=0.05, block=block)
    ratios = {(w, k): paired_ratio(t[k], t[BASE]) for w, t in (("alone", alone), ("mixed", mixed)) for k in POLICIES}
    ms = {w: {k: statistics.median(v) for k, v in t.items()} for w, t in (("alone", alone), ("mixed", mixed))}
    row: list[object] = [name]
    for w in ("alone", "mixed"):
        row += [f"{ms[w][BASE]:.2f}", f"{ratios[(w, 'spin')]:.2f}x", f"{ratios[(w, 'no spin')]:.2f}x"]
    over = {f"{w}/{k}": r for (w, k), r in ratios.items()}
    return row, {"model": name, "median_ms": ms, "over_spin_within_runs": over}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["randwire_small", "squeezenet1_1", "googlenet", "nasnet_mobile",
                                                    "inception_v3"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--block", type=int, default=10, help="calls per turn (their median is the round's sample)")
    p.add_argument("--name", default="spinning")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the .md and .json go")
    args = p.parse_args()
    rows, records = each_model(args.models, lambda name: run(name, args.rounds, args.block))

    def mean(key: str) -> float:
        return geomean(float(r["over_spin_within_runs"][key]) for r in records)  # type: ignore[index]

    headers = ["model", "back to back: spin within runs ms", "spin", "no spin",
               "with torch between: spin within runs ms", "spin", "no spin"]
    write_table(args.name, [
        "# ONNX Runtime's spinning threads, between calls and within them", "",
        f"One ONNX Runtime session of each zoo model at batch 1, {torch.get_num_threads()} intra-op threads, under "
        "three thread policies (see `benchmarks/spinning.py`): ORT's default (*spin*: idle threads spin, also after a "
        "run returns), *spin within runs* (`session.force_spinning_stop`: they stop when a run returns; opsched's "
        "one-session plans), *no spin*. *Back to back*: calls in a row; *with torch between*: each call followed by "
        "a 3x3 convolution of 64 channels at 56x56 in torch, the pair timed. Medians over interleaved rounds; the "
        "policies' columns are their time over *spin within runs*', paired by round (> 1: slower).",
    ], headers, rows, {"back to back, spin": mean("alone/spin"), "back to back, no spin": mean("alone/no spin"),
                       "torch between, spin": mean("mixed/spin"), "torch between, no spin": mean("mixed/no spin")},
        {"rows": records, "rounds": args.rounds, "block": args.block}, args.out)


if __name__ == "__main__":
    main()
