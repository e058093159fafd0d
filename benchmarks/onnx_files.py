"""Published ONNX files (:mod:`opsched.testing.onnx_files`) on this CPU: what the import makes
of each, whether it computes what ONNX Runtime computes, and how fast ``optimize_graph``'s plan
runs against ONNX Runtime's own session of the file.

Per file: the ONNX nodes of the file and the operators of the import (of which generic ONNX
nodes), the import's time, ``optimize_graph`` with its defaults (measured cost, a fresh profile
store: a first run's time), the largest difference from ONNX Runtime's session over every
output, and then, interleaved in one process in a fresh order each round (50 ms of sleep and
one untimed call before five timed ones, their median the round's sample): ONNX Runtime's own
session of the file with its default options, fed the inputs fixed at a value too, the same
session called as a PyTorch program calls it (torch tensors in, as NumPy arrays, and out),
and the module ``optimize_graph`` returns. Each ratio is the median of per-round ratios, > 1
where opsched's module is faster.

    python benchmarks/onnx_files.py                     # every file (downloads 5 wheels once)
    python benchmarks/onnx_files.py --files yolov8n silero-vad --rounds 21
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from _report import geomean, write_table  # noqa: E402

import opsched  # noqa: E402
from opsched.backends.lanes import LaneExecutor  # noqa: E402
from opsched.testing.onnx_files import ONNX_FILES, OnnxFile, example_feeds, fetch  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402


def measure(entry: OnnxFile, rounds: int, cache_dir: str) -> dict[str, Any]:
    path = fetch(entry)
    start = time.perf_counter()
    graph = opsched.from_onnx(path, input_shapes=entry.shapes, input_values=entry.values)
    imported_s = time.perf_counter() - start
    start = time.perf_counter()
    module = opsched.optimize_graph(graph, cache_dir=cache_dir)
    optimize_s = time.perf_counter() - start
    feeds = example_feeds(entry, graph)
    tensors = {name: torch.from_numpy(v) for name, v in feeds.items()}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    file_feeds = {**feeds, **entry.values}
    want = session.run(None, file_feeds)
    got = module(**tensors)
    diff = max(float(np.abs(g.numpy().astype(np.float64) - w).max())
               for g, w in zip(got if isinstance(got, tuple) else (got,), want))
    def ort_from_torch() -> list[torch.Tensor]:  # as a PyTorch program calls the session: tensors in and out
        fed = {**{name: t.numpy() for name, t in tensors.items()}, **entry.values}
        return [torch.from_numpy(out) for out in session.run(None, fed)]

    times = interleave({"ort": lambda: session.run(None, file_feeds), "ort from torch": ort_from_torch,
                        "opsched": lambda: module(**tensors)}, rounds, warmup=1, settle_s=0.05, block=5)
    executor = module.executor
    race = module.outcome.race
    return {"file": entry.name, "what": entry.what, "onnx nodes": len(onnx.load(str(path)).graph.node),
            "operators": len(graph.nodes), "generic": sum(n.op.startswith("onnx.") for n in graph.nodes),
            "import s": imported_s, "optimize s": optimize_s, "max diff": diff,
            "kept": race.kept if race is not None else module.schedule.scheduler,
            "sessions": executor.sessions if isinstance(executor, LaneExecutor) else 0,
            "ort ms": float(np.median(times["ort"])), "opsched ms": float(np.median(times["opsched"])),
            "ort from torch ms": float(np.median(times["ort from torch"])),
            "speedup": paired_ratio(times["ort"], times["opsched"]),
            "from torch": paired_ratio(times["ort from torch"], times["opsched"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", nargs="*", default=[e.name for e in ONNX_FILES], choices=[e.name for e in ONNX_FILES])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cache-dir", help="profile store (default: a fresh temporary one)")
    p.add_argument("--name", default="onnx-files")
    args = p.parse_args()
    entries = [e for e in ONNX_FILES if e.name in args.files]
    with tempfile.TemporaryDirectory() as fresh:
        results = []
        for entry in entries:
            results.append(measure(entry, args.rounds, args.cache_dir or fresh))
            r = results[-1]
            print(f"{entry.name}: ORT {r['ort ms']:.3f} ms, from torch {r['ort from torch ms']:.3f} ms, opsched "
                  f"{r['opsched ms']:.3f} ms ({r['speedup']:.2f}x, {r['from torch']:.2f}x), max diff "
                  f"{r['max diff']:.1e}", flush=True)
    rows = [[r["file"], r["what"], r["onnx nodes"], f"{r['operators']} ({r['generic']})", f"{r['import s']:.2f}",
             f"{r['optimize s']:.1f}", f"{r['max diff']:.1e}", r["kept"], r["sessions"], f"{r['ort ms']:.3f}",
             f"{r['ort from torch ms']:.3f}", f"{r['opsched ms']:.3f}", f"{r['speedup']:.2f}x",
             f"{r['from torch']:.2f}x"] for r in results]
    write_table(args.name, [
        "# Published ONNX files on this CPU",
        "",
        "ONNX files as they ship inside Python packages on PyPI (`opsched.testing.onnx_files`: pinned wheels, "
        "batch 1), imported with `opsched.from_onnx` at the sizes and input values listed there and optimized by "
        "`opsched.optimize_graph` with its defaults (a fresh profile store). *operators (generic)*: the import's "
        "operators, of which generic ONNX nodes (run as ONNX defines them, by ONNX Runtime). *max diff*: the "
        "largest difference from ONNX Runtime's session of the file, over every output. *kept*: the plan the race "
        "kept; *sessions*: the ONNX Runtime sessions it runs. Latency: medians over interleaved rounds in one "
        "process; *speedup*: the median of per-round ratios, ONNX Runtime's own session (default options) over "
        "opsched's module, > 1 where opsched's is faster. *ORT from torch*: the same session called as a PyTorch "
        "program calls it, fed its inputs from torch tensors (`Tensor.numpy()`) and its outputs wrapped as tensors "
        "(`torch.from_numpy`), with no other work; *vs from torch*: that over opsched's module, which takes and "
        "returns torch tensors too.",
    ], ["file", "model", "ONNX nodes", "operators (generic)", "import s", "optimize s", "max diff", "kept",
        "sessions", "ORT ms", "ORT from torch ms", "opsched ms", "speedup", "vs from torch"], rows,
        {"speedup": geomean(r["speedup"] for r in results), "vs from torch": geomean(r["from torch"] for r in results)},
        {"results": results, "rounds": args.rounds})


if __name__ == "__main__":
    main()
