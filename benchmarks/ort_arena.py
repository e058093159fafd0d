"""ONNX Runtime's CPU memory arena in opsched's sessions: the memory it holds, and the time it saves.

An arena keeps the most memory its session ever took for as long as the session lives. A plan
holds a session per segment, and ``torch.compile(model, backend="opsched")`` a plan per graph
and shape, so the arenas add up. Without one, though, every call allocates its temporaries
afresh, and a large one is fresh memory the system must map and zero each time. opsched keeps
ONNX Runtime's default (an arena). This benchmark takes it away, for comparison.

- *Memory*: the peak resident memory of a fresh process (``ru_maxrss``) that runs Mistral3
  through the backend, each way. Mistral3 is shrunk by the transformers sweep's rule and given a
  1120 x 1120 image, so each of its vision tower's attention layers takes a 6400 x 6400 mask. It
  is 16 graphs, and eager PyTorch's own peak is printed beside.
- *Latency*: per call, for what ``optimize()`` returns (the sequential plan, one session) on
  corpus and zoo models, and on one attention call (``attention:T,H,W``: tokens, heads, head
  width; its scores are the large temporary). Each is built both ways in one process and called
  in interleaved rounds of 20 calls. The figure is the median per-round ratio, arena off over
  arena on (above 1: slower without).

    python benchmarks/ort_arena.py
    python benchmarks/ort_arena.py --models bert attention:512,12,64 --rounds 21 --side 672
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import geomean, write_table  # noqa: E402

import opsched  # noqa: E402
import opsched.backends.ort_program as ort_program  # noqa: E402

_MADE = ort_program.inference_session


def _without_arena(model: object, options: object, providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> object:
    options.enable_cpu_mem_arena = False  # type: ignore[attr-defined]
    return _MADE(model, options, providers)


def arena(on: bool) -> None:
    """Build sessions from here on as opsched does (with ONNX Runtime's arena), or without one."""
    ort_program.inference_session = _MADE if on else _without_arena  # type: ignore[assignment]


class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def memory(side: int, on: bool) -> dict[str, float]:
    """In this process: Mistral3 through ``torch.compile(backend="opsched")``, its peak RSS in GB."""
    import resource

    import transformers_all as sweep

    arena(on)
    torch.manual_seed(0)
    config = sweep.as_checkpoints_name(sweep.shrunk(sweep.default_config("mistral3"), sweep.SMALL))
    from transformers import AutoModel

    model = AutoModel.from_config(config).eval()
    text = sweep.example_inputs(model, config)
    image, size = torch.randn(1, 3, side, side), torch.tensor([[side, side]])
    inputs = sweep.image_placed(model, config, {**text, "pixel_values": image, "image_sizes": size})
    with torch.no_grad():
        model(**inputs)
    eager = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    start = time.perf_counter()
    compiled = torch.compile(model, backend="opsched", options={"cost": "analytic"})
    with torch.no_grad():
        compiled(**inputs)
    return {"eager_gb": eager, "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "seconds": time.perf_counter() - start}


def latency(name: str, rounds: int) -> float:
    """Median per-round ratio of a call's time, arena off over arena on, for ``name``'s sequential plan."""
    from opsched.models import example_inputs, get_model
    from opsched.testing.corpus import corpus

    if name.startswith("attention:"):
        tokens, heads, width = (int(n) for n in name.partition(":")[2].split(","))
        q = torch.randn(1, heads, tokens, width)
        model, inputs = Attention().eval(), (q, q, q)
    elif name in corpus():
        model, inputs = corpus()[name].build()
    else:
        model, inputs = get_model(name).eval(), example_inputs(name)
    modules = {}
    for on in (True, False):
        arena(on)
        modules[on] = opsched.optimize(model, inputs, cost="analytic", scheduler="sequential", progress=False)
    arena(True)

    def call(on: bool) -> None:
        m = modules[on]
        _ = m(**inputs) if isinstance(inputs, dict) else m(*inputs) if isinstance(inputs, tuple) else m(inputs)

    ratios = []
    with torch.no_grad():
        for on in (True, False):
            for _ in range(20):
                call(on)
        for r in range(rounds):
            took = {}
            for on in (True, False) if r % 2 else (False, True):
                start = time.perf_counter()
                for _ in range(20):
                    call(on)
                took[on] = time.perf_counter() - start
            ratios.append(took[False] / took[True])
    return statistics.median(ratios)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["bert", "vit", "resnet", "googlenet", "squeezenet1_1",
                                                   "attention:197,12,64", "attention:512,12,64",
                                                   "attention:2048,4,16"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--side", type=int, default=1120, help="Mistral3's image side, pixels (a multiple of 28)")
    p.add_argument("--memory-worker", choices=["on", "off"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_worker:
        print(json.dumps(memory(args.side, args.memory_worker == "on")))
        return
    peaks = {}
    for on in ("on", "off"):  # each in a fresh process: ru_maxrss is a process's peak
        done = subprocess.run([sys.executable, __file__, "--memory-worker", on, "--side", str(args.side)],
                              capture_output=True, text=True, check=True)
        peaks[on] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"Mistral3 at {args.side} through the backend, arena {on}: {peaks[on]}")
    rows, ratios = [], {}
    for name in args.models:
        ratios[name] = latency(name, args.rounds)
        rows.append([name, f"{ratios[name]:.3f}"])
        print(f"{name}: arena off / arena on {ratios[name]:.3f}")
    intro = ["# ONNX Runtime's memory arena in opsched's sessions", "",
             " ".join(__doc__.split("\n\n")[1].split()), "", " ".join(__doc__.split("\n\n")[2].split()), "",
             f"Mistral3 at {args.side} x {args.side} through `torch.compile(backend=\"opsched\")`: peak "
             f"{peaks['on']['peak_gb']:.2f} GB with arenas, {peaks['off']['peak_gb']:.2f} GB without (eager's own "
             f"{peaks['off']['eager_gb']:.2f} GB; the first call {peaks['on']['seconds']:.1f} s and "
             f"{peaks['off']['seconds']:.1f} s).", ""]
    write_table("ort-arena", intro, ["model", "arena off / on, per call"], rows,
                {"arena off / on": geomean(ratios.values())}, {"memory": peaks, "latency": ratios})


if __name__ == "__main__":
    main()
