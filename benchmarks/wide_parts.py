"""What ``max_states`` trades: the IOS search on wide parts, split to fit against searched whole
(-> docs/results/wide-parts.md).

The IOS DP's states on a part are its down-sets, counted before the search
(:func:`opsched.schedulers.partition.state_count`); a part with more than ``max_states`` is split
into as few pieces as fit (:func:`opsched.schedulers.partition.split_to_fit`). Per model: the
states of its widest part, the estimate of the sequential schedule, then the IOS search with
``max_states`` at its default (``--max-states``; split where over) and with no bound
(``max_states=None``), each within ``--budget`` seconds: its estimate, its search time, and
whether the budget ran out (then the unsolved parts fell back to greedy or sequential stages).
Nothing is measured on a device: the estimates are the analytic presets'
(``--presets``: a CPU's with its 2 lanes, where optimize() sets IOS's lanes to the cores, and a
GPU's with IOS's 8), the times this machine's search.

The models are those with the widest parts found across the zoo and the corpora (a probe of each
part's states), and torchvision's box decoding (``BoxCoder.decode_single`` with its clipping and
score activation, as a detector's post-processing graph hands it to the torch.compile backend;
written here from its arithmetic, so that the benchmark needs no torchvision).

The sweep (``--sweep MODEL``, -> docs/results/wide-parts-sweep.md) searches one model at a row of
bounds instead, from far below the default to none, on each preset: where concurrency pays and
the parts are split, the estimate the split gives up.

    python benchmarks/wide_parts.py
    python benchmarks/wide_parts.py --models box_decoding randwire_large --presets V100:8 --budget 30
    python benchmarks/wide_parts.py --sweep randwire_large --presets H100:8
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, corpus_model, geomean, write_table  # noqa: E402

from opsched import from_torch  # noqa: E402
from opsched.cost import AnalyticCostModel  # noqa: E402
from opsched.ir import Graph  # noqa: E402
from opsched.models import MODELS, example_inputs, get_model  # noqa: E402
from opsched.schedulers import schedule  # noqa: E402
from opsched.schedulers.ios import IosOptions  # noqa: E402
from opsched.schedulers.partition import partition, state_count  # noqa: E402
from opsched.schedulers.units import UnitGraph  # noqa: E402

#: The widest parts found: the box decoding, the wide corpus's decoder layers with parallel
#: attention and MLP (Phi, GPT-J, GPT-NeoX) and Mamba's mixer, RT-DETR's encoder, RandWire-large.
MODELS_DEFAULT = ["box_decoding", "phi", "mamba", "gptj", "gpt_neox", "rt_detr", "randwire_large"]
DEFAULT_STATES = IosOptions().max_states


class BoxDecoding(nn.Module):
    """A detector's box decoding after its heads: regression deltas applied to anchors (centre
    offsets scaled by the anchor's size, log-scale widths clamped), boxes clipped to the image,
    class scores through a sigmoid, each box's best class and its score."""

    def __init__(self, weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0), size: float = 320.0):
        super().__init__()
        self.weights, self.size, self.clamp = weights, size, math.log(1000.0 / 16)

    def forward(self, deltas: torch.Tensor, anchors: torch.Tensor, logits: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        wx, wy, ww, wh = self.weights
        widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
        cx, cy = anchors[:, 0] + 0.5 * widths, anchors[:, 1] + 0.5 * heights
        dx, dy = deltas[:, 0] / wx, deltas[:, 1] / wy
        dw, dh = (deltas[:, 2] / ww).clamp(max=self.clamp), (deltas[:, 3] / wh).clamp(max=self.clamp)
        px, py = dx * widths + cx, dy * heights + cy
        pw, ph = dw.exp() * widths, dh.exp() * heights
        boxes = torch.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw, py + 0.5 * ph], dim=1)
        scores = logits.sigmoid()
        return boxes.clamp(0, self.size), scores.amax(dim=1), scores.argmax(dim=1)


def box_decoding(boxes: int = 10, classes: int = 91) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(0)
    corner = torch.rand(boxes, 2, generator=gen) * 200
    anchors = torch.cat([corner, corner + 16 + torch.rand(boxes, 2, generator=gen) * 100], dim=1)
    return BoxDecoding().eval(), (torch.randn(boxes, 4, generator=gen), anchors,
                                  torch.randn(boxes, classes, generator=gen))


def imported(name: str) -> Graph:
    if name == "box_decoding":
        model, inputs = box_decoding()
    elif name in MODELS:
        model, inputs = get_model(name).eval(), example_inputs(name)
    else:
        model, inputs = corpus_model(name).build()
    return from_torch(model, inputs)


@dataclass(frozen=True)
class Searched:
    """One IOS search: its estimate (ms), how long it took, its DP states over all parts, its parts
    and how many were split, and whether the budget ran out (and how many parts then fell back)."""

    ms: float
    search_s: float
    states: int
    parts: int
    parts_split: int
    ran_out: bool
    parts_fallback: int

    def cell(self) -> str:
        ran_out = f" (ran out: {self.parts_fallback} of {self.parts} parts fell back)"
        return f"{self.ms:.4f}" + (ran_out if self.ran_out else "")


def search(graph: Graph, cost: AnalyticCostModel, lanes: int, budget: float, max_states: int | None) -> Searched:
    start = time.perf_counter()
    sched = schedule(graph, "ios", cost, max_lanes=lanes, budget_s=budget, max_states=max_states)
    stats = sched.stats
    return Searched(sched.estimated_ms, time.perf_counter() - start, stats["states"], stats["parts"],
                    stats["parts_split"], bool(stats["budget_exhausted"]), stats["parts_fallback"])


def preset(text: str) -> tuple[str, int]:
    device, _, lanes = text.partition(":")
    return device, int(lanes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=MODELS_DEFAULT)
    p.add_argument("--presets", nargs="*", type=preset, default=[("CPU2", 2), ("H100", 8)],
                   help="analytic device presets and IOS's max_lanes on each, as DEVICE:LANES")
    p.add_argument("--budget", type=float, default=120.0, help="seconds of search for each IOS schedule")
    p.add_argument("--max-states", type=int, default=DEFAULT_STATES, help="the bound of the split search")
    p.add_argument("--sweep", metavar="MODEL", help="search MODEL at each of --bounds instead")
    p.add_argument("--bounds", nargs="*", type=int, default=[100, 500, 2000, 5000, DEFAULT_STATES],
                   help="max_states of the sweep (and no bound after them)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.getLogger("opsched").setLevel(logging.ERROR)
    if args.sweep:
        sweep(args)
        return
    rows, records, over, speed = [], [], [], []
    for name in args.models:
        graph = imported(name)
        ug = UnitGraph.build(graph)
        widest = max(state_count(ug, part) for part in partition(ug, IosOptions().max_part_size))
        for device, lanes in args.presets:
            cost = AnalyticCostModel(device)
            seq = schedule(graph, "sequential", cost).estimated_ms
            split, whole = (search(graph, cost, lanes, args.budget, bound) for bound in (args.max_states, None))
            records.append({"model": name, "device": device, "lanes": lanes, "units": len(ug),
                            "widest_part_states": widest, "sequential_ms": seq, "split": asdict(split),
                            "whole": asdict(whole)})
            if split.parts_split and not whole.ran_out:  # both exact: what the split costs the plan
                over.append(split.ms / whole.ms)
                speed.append(whole.search_s / max(split.search_s, 1e-3))
            rows.append([name, f"{device} x{lanes}", len(ug), f"{widest:,}", f"{seq:.4f}", split.parts_split,
                         split.cell(), f"{split.search_s:.1f}", whole.cell(), f"{whole.search_s:.1f}",
                         f"{split.ms / whole.ms:.3f}"])
            print(" | ".join(map(str, rows[-1])), flush=True)
    headers = ["model", "preset x lanes", "units", "widest part: states", "sequential ms", "parts split",
               f"split (max_states={args.max_states:,}) ms", "split search s", "whole ms", "whole search s",
               "split / whole"]
    bound = (f"at its default ({DEFAULT_STATES:,})" if args.max_states == DEFAULT_STATES
             else f"at {args.max_states:,} (its default: {DEFAULT_STATES:,})")
    write_table("wide-parts", [
        "# Wide parts: the IOS search split to max_states against searched whole", "",
        f"Analytic presets with IOS's max_lanes on each, batch 1, each search within a budget of {args.budget:g} s "
        f"on this machine. *widest part: states*: the DP states (down-sets) of the model's widest part. *split*: "
        f"the search with `max_states` {bound}, parts over it split into as few pieces "
        "as fit (*parts split*: how many were); *whole*: `max_states=None`. Estimates are the preset's, in ms; "
        "*ran out*: the budget ended the search and the unsolved parts fell back to greedy or sequential stages. "
        "*split / whole*: the estimates' ratio (> 1 where splitting lost concurrency, < 1 where the whole search "
        "ran out). The geometric means are over the rows with a part split and a whole search that finished: the "
        "estimate given up, and the search time saved.",
    ], headers, rows, {"split / whole estimate": geomean(over) if over else float("nan"),
                       "whole / split search time": geomean(speed) if speed else float("nan")},
        {"presets": [list(x) for x in args.presets], "budget_s": args.budget, "max_states": args.max_states,
         "models": records}, out=args.out)


def sweep(args: argparse.Namespace) -> None:
    """One model at each bound of ``args.bounds`` and with none, on each preset."""
    graph = imported(args.sweep)
    rows, records, worst = [], [], {}
    for device, lanes in args.presets:
        cost = AnalyticCostModel(device)
        seq = schedule(graph, "sequential", cost).estimated_ms
        results = {bound: search(graph, cost, lanes, args.budget, bound) for bound in (*args.bounds, None)}
        whole = results[None]
        for bound, r in results.items():
            rows.append([f"{device} x{lanes}", "none" if bound is None else f"{bound:,}", r.parts, r.parts_split,
                         r.states, r.cell(), f"{r.search_s:.1f}", f"{seq / r.ms:.3f}", f"{r.ms / whole.ms:.3f}"])
            print(" | ".join(map(str, rows[-1])), flush=True)
        records.append({"device": device, "lanes": lanes, "sequential_ms": seq,
                        "by_bound": [{"max_states": b, **asdict(r)} for b, r in results.items()]})
        if DEFAULT_STATES in results:  # --bounds may leave the default out
            worst[f"{device} split / whole at the default"] = results[DEFAULT_STATES].ms / whole.ms
    write_table("wide-parts-sweep", [
        f"# max_states swept on {args.sweep}", "",
        f"The IOS search of {args.sweep} with `max_states` at each bound (parts over it split into as few pieces as "
        f"fit) and with none, within a budget of {args.budget:g} s on this machine; analytic presets with IOS's "
        "max_lanes on each, batch 1. *states*: the DP states solved, over all parts; estimates in ms; *vs "
        "sequential*: the sequential schedule's estimate over this one's; *vs whole*: this estimate over the "
        "unbounded search's (> 1: what the split gave up). The figures below the table: the default's *vs whole*.",
    ], ["preset x lanes", "max_states", "parts", "parts split", "states", "estimate ms", "search s", "vs sequential",
        "vs whole"], rows, worst, {"model": args.sweep, "budget_s": args.budget, "presets": records}, out=args.out)


if __name__ == "__main__":
    main()
