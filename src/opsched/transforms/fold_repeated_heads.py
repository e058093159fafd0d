"""Fold the key and value heads an attention repeats for grouped-query attention into the call.

A model with fewer key/value heads than query heads (Llama, Mistral, Qwen2, Gemma: grouped-query
attention) has each key and value head serve a group of query heads. ``transformers`` repeats
them when the mask stops it from passing ``enable_gqa=True`` to ``scaled_dot_product_attention``,
which it does under ``torch.export``: ``x[:, :, None].expand(b, kv, groups, s, d).reshape(b, kv *
groups, s, d)``, a copy of every key and value per layer. Eagerly it passes the heads as they are
with ``enable_gqa=True``, which reads each key head for its group in place.

Where both the key and the value of an attention call are such repeats, by the same number of
groups and giving the query's number of heads, the call reads the heads before the repeat with
``enable_gqa=True``: the same attention (head ``h`` reads key head ``h // groups``, the repeat's
order), without the copies; a repeat nothing else reads goes.
"""

from __future__ import annotations

from opsched.ir import Graph, Node
from opsched.ir.ops.aten import SDPA, arguments
from opsched.transforms._rewrite import rename_uses
from opsched.transforms.eliminate_dead import eliminate_dead

__all__ = ["fold_repeated_heads"]

_UNSQUEEZE, _EXPAND = "aten::unsqueeze.default", "aten::expand.default"
_RESHAPES = frozenset({"aten::view.default", "aten::reshape.default", "aten::_unsafe_view.default"})


def fold_repeated_heads(graph: Graph) -> Graph:
    producer = {n.name: n for n in graph.nodes}
    changed = {n.name: new for n in graph.nodes
               if n.attr("target") == SDPA and (new := _folded(graph, producer, n)) is not None}
    if not changed:
        return graph
    # the repeats nothing reads any more are dead now
    return eliminate_dead(rename_uses(graph, [changed.get(n.name, n) for n in graph.nodes], {}))


def _folded(graph: Graph, producer: dict[str, Node], node: Node) -> Node | None:
    args = node.attrs["args"]
    if arguments(node).get("enable_gqa", False) or len(args) < 3 or any(args[p][0] != "t" for p in range(3)):
        return None
    query, key, value = (int(args[p][1]) for p in range(3))
    key_repeat, value_repeat = (_repeat(graph, producer, node.inputs[k]) for k in (key, value))
    if key_repeat is None or value_repeat is None or key_repeat[1] != value_repeat[1]:
        return None
    (key_heads, groups), (value_heads, _) = key_repeat, value_repeat
    if graph.types[key_heads].shape[-3] * groups != graph.types[node.inputs[query]].shape[-3]:
        return None
    inputs = list(node.inputs)
    inputs[key], inputs[value] = key_heads, value_heads
    kwargs = {**dict(node.attrs["kwargs"]), "enable_gqa": ("v", True)}  # keyword-only in the operator's schema
    return node.replace(inputs=tuple(inputs), attrs={**node.attrs, "kwargs": tuple(kwargs.items())})


def _repeat(graph: Graph, producer: dict[str, Node], value: str) -> tuple[str, int] | None:
    """The heads ``value`` repeats and how many times each, where it is ``transformers``'
    repeat (an unsqueeze before the heads' axis, an expand along it, a reshape merging them)."""
    reshape = producer.get(value)
    if reshape is None or (reshape.op != "reshape" and reshape.attr("target") not in _RESHAPES):
        return None
    expand = producer.get(reshape.inputs[0])
    if expand is None or expand.attr("target") != _EXPAND:
        return None
    unsqueeze = producer.get(expand.inputs[0])
    if unsqueeze is None or unsqueeze.attr("target") != _UNSQUEEZE:
        return None
    source = unsqueeze.inputs[0]
    *lead, heads, length, width = graph.types[source].shape
    groups = expand.out.shape[-3] if expand.out.rank == len(lead) + 4 else 0
    if (groups < 1 or unsqueeze.out.shape != (*lead, heads, 1, length, width)
            or expand.out.shape != (*lead, heads, groups, length, width)
            or reshape.out.shape != (*lead, heads * groups, length, width)):
        return None
    return source, groups
