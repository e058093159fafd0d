"""ONNX Runtime's CPU memory arena in opsched's sessions: the memory it holds, and the time it saves.

An arena keeps the most memory it ever held for as long as it lives. A plan holds a session per
segment, and ``torch.compile(model, backend="opsched")`` a plan per graph and shape, so one
arena a session adds up. Without an arena, though, every call allocates its temporaries
afresh, and a large one is fresh memory the system must map and zero each time. opsched's
sessions share one arena, registered in ONNX Runtime's environment (``ort_program.shared_arena``).
This benchmark compares that with ONNX Runtime's default (an arena each) and with none:

- *Memory*: the peak resident memory of a fresh process (``ru_maxrss``) that runs Mistral3
  through the backend, each way. Mistral3 is shrunk by the transformers sweep's rule and given a
  1120 x 1120 image, so each of its vision tower's attention layers takes a 6400 x 6400 mask. It
  is 16 graphs, and eager PyTorch's own peak is printed beside.
- *Latency*: per call, for what ``optimize()`` returns (the sequential plan, one session) on
  corpus and zoo models, and on one attention call (``attention:T,H,W``: tokens, heads, head
  width; its scores are the large temporary). Each is built all three ways in one process and
  called in interleaved rounds of 20 calls. The figures are median per-round ratios over an arena
  each (below 1: faster than ONNX Runtime's default).

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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import geomean, write_table  # noqa: E402

import opsched  # noqa: E402
import opsched.backends.ort_program as ort_program  # noqa: E402

_MADE = ort_program.inference_session
SETTINGS = ("shared", "own", "none")  # opsched's (one arena for all sessions), one each (ORT's default), none


def _made_as(setting: str) -> Any:
    def made(model: Any, options: Any, providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> Any:
        options.add_session_config_entry("session.use_env_allocators", "1" if setting == "shared" else "0")
        options.enable_cpu_mem_arena = setting != "none"
        return _MADE(model, options, providers)
    return made


def arena(setting: str) -> None:
    """Build sessions from here on with ``setting``, one of :data:`SETTINGS`."""
    ort_program.inference_session = _made_as(setting)


class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def memory(side: int, setting: str) -> dict[str, float]:
    """In this process: Mistral3 through ``torch.compile(backend="opsched")``, its peak RSS in GB."""
    import resource

    import transformers_all as sweep

    arena(setting)
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


def latency(name: str, rounds: int) -> dict[str, float]:
    """Per setting, the median per-round ratio of a call's time over an arena each (ORT's default)."""
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
    for setting in SETTINGS:
        arena(setting)
        modules[setting] = opsched.optimize(model, inputs, cost="analytic", scheduler="sequential", progress=False)
    ort_program.inference_session = _MADE

    def call(setting: str) -> None:
        m = modules[setting]
        _ = m(**inputs) if isinstance(inputs, dict) else m(*inputs) if isinstance(inputs, tuple) else m(inputs)

    ratios: dict[str, list[float]] = {s: [] for s in SETTINGS}
    with torch.no_grad():
        for setting in SETTINGS:
            for _ in range(20):
                call(setting)
        for r in range(rounds):
            took = {}
            for setting in SETTINGS[r % 3:] + SETTINGS[:r % 3]:
                start = time.perf_counter()
                for _ in range(20):
                    call(setting)
                took[setting] = time.perf_counter() - start
            for setting in SETTINGS:
                ratios[setting].append(took[setting] / took["own"])
    return {setting: statistics.median(r) for setting, r in ratios.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["bert", "vit", "resnet", "googlenet", "squeezenet1_1",
                                                   "attention:197,12,64", "attention:512,12,64",
                                                   "attention:2048,4,16"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--side", type=int, default=1120, help="Mistral3's image side, pixels (a multiple of 28)")
    p.add_argument("--memory-worker", choices=SETTINGS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_worker:
        print(json.dumps(memory(args.side, args.memory_worker)))
        return
    peaks = {}
    for setting in SETTINGS:  # each in a fresh process: ru_maxrss is a process's peak
        done = subprocess.run([sys.executable, __file__, "--memory-worker", setting, "--side", str(args.side)],
                              capture_output=True, text=True, check=True)
        peaks[setting] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"Mistral3 at {args.side} through the backend, arena {setting}: {peaks[setting]}")
    rows, ratios = [], {}
    for name in args.models:
        ratios[name] = latency(name, args.rounds)
        rows.append([name, f"{ratios[name]['shared']:.3f}", f"{ratios[name]['none']:.3f}"])
        print(f"{name}: over an arena each, shared {ratios[name]['shared']:.3f}, none {ratios[name]['none']:.3f}")
    gb = {s: f"{peaks[s]['peak_gb']:.2f} GB" for s in SETTINGS}
    intro = ["# ONNX Runtime's memory arena in opsched's sessions", "",
             *(" ".join(part.split()) + "\n" for part in __doc__.split("\n\n")[1:3]),
             f"Mistral3 at {args.side} x {args.side} through `torch.compile(backend=\"opsched\")`: peak "
             f"{gb['shared']} with one shared arena (opsched's), {gb['own']} with an arena each (ONNX Runtime's "
             f"default), {gb['none']} with none (eager's own {peaks['shared']['eager_gb']:.2f} GB).", ""]
    write_table("ort-arena", intro, ["model", "shared / an arena each", "none / an arena each"], rows,
                {f"{s} / an arena each": geomean(r[s] for r in ratios.values()) for s in ("shared", "none")},
                {"memory": peaks, "latency": ratios})


if __name__ == "__main__":
    main()
