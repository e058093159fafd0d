"""Generation through ``torch.compile(backend="opsched")`` with Hugging Face's default dynamic cache:
every decoding step is a new length, so a new plan. Searched per shape (``specialize="shape"``)
against searched once per graph and reapplied (``"graph"``, the default), on this CPU. Both keep
making plans past the default ``max_new_in_a_row``, after which the backend runs new lengths as
Dynamo captured them: the figures are what a plan at every length costs.

Per model and setting, in a fresh profile store (so neither setting reuses the other's
measurements): a first ``generate()`` (every plan made: Dynamo's tracing, opsched's imports,
searches and races), then warm generations, each setting's interleaved with eager ones and with
Dynamo's own (``backend="eager"``: what it captures run as captured, so its guards and graph
breaks are priced apart from opsched's plans) in a fresh order each round
(:func:`opsched.timing.interleave`), their ratios paired by round. The
tokens must be eager's (greedy decoding), or the script stops. A second generation comes before
the warm ones: Dynamo then sends the first step's length to the dynamic graph too (its newest
entry is tried first), one plan more; the warm ones must make none.

    python benchmarks/dynamic_shapes.py
    python benchmarks/dynamic_shapes.py --models gpt2 --tokens 48 --rounds 9
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import RESULTS, geomean, write_table  # noqa: E402
from torch import nn  # noqa: E402

import opsched.dynamo as od  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402


def models() -> dict[str, Callable[[], nn.Module]]:
    """Decoder LMs at the corpus's sizes (``opsched.testing.corpus``), with their caches on."""
    import transformers as hf

    return {
        "gpt2": lambda: hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4)),
        "llama": lambda: hf.LlamaForCausalLM(hf.LlamaConfig(
            vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)),
    }


def run(name: str, specialize: str, tokens: int, rounds: int) -> tuple[list[object], dict[str, object]]:
    torch.manual_seed(0)
    eager = models()[name]().eval()
    compiled, traced = copy.deepcopy(eager), copy.deepcopy(eager)
    prompt = torch.randint(0, 100, (1, 8))
    settings = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    torch._dynamo.reset()
    od.reset()
    with tempfile.TemporaryDirectory() as store, torch.no_grad():
        want = eager.generate(prompt, **settings)
        compiled.forward = torch.compile(compiled.forward, backend="opsched",  # type: ignore[method-assign]
                                         options={"specialize": specialize, "max_shapes": tokens + 1,
                                                  "max_new_in_a_row": tokens + 1,  # a plan at every length
                                                  "cache_dir": store, "progress": False})
        start = time.perf_counter()
        got = compiled.generate(prompt, **settings)
        first_s = time.perf_counter() - start
        if not torch.equal(got, want):
            raise SystemExit(f"{name}, specialize={specialize!r}: tokens differ from eager's:\n{got}\n{want}")
        compiled.generate(prompt, **settings)  # Dynamo now routes the first step to the dynamic graph: one plan more
        graphs = od.compiled_graphs()
        traced.forward = torch.compile(traced.forward, backend="eager")  # type: ignore[method-assign]
        times = interleave({"eager": lambda: eager.generate(prompt, **settings),
                            "dynamo": lambda: traced.generate(prompt, **settings),
                            "compiled": lambda: compiled.generate(prompt, **settings)}, rounds, warmup=2,
                           settle_s=0.05)
    if len(od.compiled_graphs()) != len(graphs) or any(
            len(a.buckets) != len(b.buckets) for a, b in zip(od.compiled_graphs(), graphs)):
        raise SystemExit(f"{name}, specialize={specialize!r}: a warm generation made new plans:\n{od.report()}")
    buckets = [b for g in graphs for b in g.buckets]
    searched = sum(g.searches for g in graphs)
    made_s = sum(b.seconds for b in buckets)
    reapplied = [b.seconds for b in buckets if b.schedule_of is not None]
    by_search = [b.seconds for b in buckets if b.searched]
    ratio = paired_ratio(times["eager"], times["compiled"])
    over_dynamo = paired_ratio(times["dynamo"], times["compiled"])
    ms = {k: statistics.median(v) for k, v in times.items()}
    row: list[object] = [name, specialize, tokens, len(graphs), len(buckets), searched,
                         f"{statistics.median(by_search):.2f}",
                         f"{statistics.median(reapplied):.2f}" if reapplied else "",
                         f"{made_s:.1f}", f"{first_s:.1f}", f"{ms['eager']:.1f}", f"{ms['dynamo']:.1f}",
                         f"{ms['compiled']:.1f}", f"{ratio:.2f}", f"{over_dynamo:.2f}"]
    record = {"model": name, "specialize": specialize, "tokens": tokens, "graphs": len(graphs),
              "plans": len(buckets), "searched": searched, "search_bucket_s": by_search,
              "reapplied_bucket_s": reapplied,
              "plans_s": made_s, "first_generate_s": first_s, "warm_ms": ms, "speedup_vs_eager": ratio,
              "speedup_vs_dynamo": over_dynamo,
              "report": od.report()}
    return row, record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["gpt2", "llama"])
    p.add_argument("--tokens", type=int, default=24, help="new tokens a generation makes")
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--name", default="dynamic-shapes")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the .md and .json go")
    args = p.parse_args()
    rows, records = [], []
    for name in args.models:
        for specialize in ("shape", "graph"):
            row, record = run(name, specialize, args.tokens, args.rounds)
            rows.append(row)
            records.append(record)
            print(" | ".join(map(str, row)), flush=True)
    first = {(r["model"], r["specialize"]): float(r["first_generate_s"]) for r in records}  # type: ignore[arg-type]
    headers = ["model", "specialize", "new tokens", "graphs", "plans", "searched", "s a searched plan",
               "s a reapplied plan", "plans s", "first generate s", "eager generate ms", "Dynamo alone ms",
               "opsched ms", "opsched vs eager", "opsched vs Dynamo alone"]
    write_table(args.name, [
        "# Generation with a growing cache through the torch.compile backend", "",
        "Greedy decoding from an 8-token prompt with Hugging Face's default dynamic cache: every step is a new "
        "length. Dynamo hands over the prompt's graph, the first step's and, from the second step on, one dynamic "
        "graph. *specialize=shape* searches and races a schedule at each length; *graph* (the default) searches the "
        "dynamic graph once and reapplies its schedule at each later length. *s a searched plan*, *s a reapplied "
        "plan*: the median time to make one (import, search and race, or import and build); *plans s*: all of them; "
        "*first generate s*: the first generation's wall time, Dynamo's tracing included. Warm generations, medians "
        "over interleaved rounds: eager; *Dynamo alone*, `torch.compile(backend=\"eager\")`, which runs what "
        "Dynamo captures as captured (its guards, its graph breaks, no compiler); *opsched*, the backend's plans. "
        "*vs*: the other's time over opsched's, paired by round (> 1: opsched faster). Each setting in a fresh "
        "profile store; tokens equal to eager's in every row.",
    ], headers, rows, {
        "first generate, shape over graph": geomean(first[(m, "shape")] / first[(m, "graph")] for m in args.models),
        "warm, opsched vs eager": geomean(float(r["speedup_vs_eager"]) for r in records),  # type: ignore[arg-type]
        "warm, opsched vs Dynamo alone": geomean(float(r["speedup_vs_dynamo"]) for r in records),  # type: ignore[arg-type]
    }, {"rows": records, "rounds": args.rounds}, args.out)


if __name__ == "__main__":
    main()
