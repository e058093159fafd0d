"""The ceiling for split plans on this CPU: the whole model data-parallel against ONNX Runtime's
own session (the figure docs/results/memory.md cites).

Every maximal run of batch-splittable nodes is one sub-graph split ``--factor`` ways along the
batch (the others stay whole), ordered depth-first and bound to the cores, one lane each; so each
core runs its slice of the batch through the model in its own ONNX Runtime sessions. In one
process, interleaved: ORT's own session of the model's torch.onnx export, the sequential plan and
the data-parallel plan, both on the ORT backend. Prints the medians and ORT / data-parallel.

    python benchmarks/data_parallel.py --models resnet18 squeezenet1_1 googlenet --batch 8
    python benchmarks/data_parallel.py --models resnet50 inception_v3 --batch 32 --factor 8
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from memory import zoo_model  # noqa: E402

from opsched import from_torch  # noqa: E402
from opsched.cost import AnalyticCostModel, host_cpu_spec  # noqa: E402
from opsched.ir import Graph  # noqa: E402
from opsched.models import list_models  # noqa: E402
from opsched.module import ScheduledModule  # noqa: E402
from opsched.schedule import Schedule  # noqa: E402
from opsched.schedulers import schedule  # noqa: E402
from opsched.schedulers.graphturbo import GraphTurboOptions  # noqa: E402
from opsched.schedulers.memory import Group, bind, depth_first, instance_dag  # noqa: E402
from opsched.schedulers.registry import laned  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402
from opsched.transforms.split_instances import split_refusal  # noqa: E402


def data_parallel(graph: Graph, cost: AnalyticCostModel, factor: int, cores: int) -> Schedule:
    """Every maximal run of batch-splittable nodes one sub-graph of ``factor`` instances."""
    batch = graph.inputs[0].type.shape[0]
    groups: list[Group] = []
    run: list[str] = []
    for n in graph.nodes:
        if split_refusal(graph, n, batch) is None:
            run.append(n.name)
            continue
        if run:
            groups.append(Group(tuple(run), factor))
            run = []
        groups.append(Group((n.name,)))
    if run:
        groups.append(Group(tuple(run), factor))
    dag = instance_dag(graph, groups)
    order = depth_first(dag.preds)
    return laned(graph, cost, bind(dag, order, cores).lanes(dag, order, cores), "graphturbo",
                 GraphTurboOptions(max_lanes=cores), splits=dag.splits)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["resnet18", "squeezenet1_1", "googlenet"], choices=list_models())
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_grad_enabled(False)
    cost = AnalyticCostModel(host_cpu_spec())
    cores = torch.get_num_threads()
    for name in args.models:
        model, inputs, onnx_bytes = zoo_model(name, args.batch)
        session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
        graph = from_torch(model, inputs)
        plans = {"sequential": schedule(graph, "sequential", cost),
                 "data parallel": data_parallel(graph, cost, args.factor, cores)}
        modules = {k: ScheduledModule(graph, s, backend="ort") for k, s in plans.items()}
        feeds = {session.get_inputs()[0].name: inputs[0].numpy()}
        calls = {"ORT session": functools.partial(session.run, None, feeds),
                 **{k: functools.partial(m, *inputs) for k, m in modules.items()}}
        times = interleave(calls, args.rounds, warmup=1, settle_s=0.05, block=2)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = paired_ratio(times["ORT session"], times["data parallel"])
        print(f"{name} batch {args.batch} factor {args.factor}: "
              + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items()) + f"; ORT / data parallel {ratio:.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
