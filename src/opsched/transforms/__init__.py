"""Graph rewrites, one pass per module; :func:`canonicalize` is the pipeline frontends run."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opsched.ir import Graph
from opsched.transforms.eliminate_dead import eliminate_dead
from opsched.transforms.eliminate_identity import eliminate_identity
from opsched.transforms.flatten_sums import flatten_sums
from opsched.transforms.fold_batch_norm import fold_batch_norm
from opsched.transforms.fold_repeated_heads import fold_repeated_heads
from opsched.transforms.fuse_activation import fuse_activation
from opsched.transforms.reshape_as_flatten import reshape_as_flatten
from opsched.transforms.simplify_attention_masks import simplify_attention_masks
from opsched.transforms.split_instances import Split, split_instances

__all__ = [
    "CANONICAL_PIPELINE", "canonicalize", "eliminate_dead", "eliminate_identity", "flatten_sums", "fold_batch_norm",
    "fold_repeated_heads", "fuse_activation", "reshape_as_flatten", "simplify_attention_masks", "Split",
    "split_instances",
]

Pass = Callable[[Graph], Graph]

#: Order matters: a batch norm must be folded before the ReLU after it can fuse into the conv.
CANONICAL_PIPELINE: tuple[Pass, ...] = (eliminate_dead, eliminate_identity, simplify_attention_masks,
                                        fold_repeated_heads, reshape_as_flatten, fold_batch_norm, fuse_activation,
                                        flatten_sums)


def canonicalize(graph: Graph, passes: Sequence[Pass] = CANONICAL_PIPELINE) -> Graph:
    """Run ``passes`` in order, verifying the graph after each one."""
    for p in passes:
        graph = p(graph).verify()
    return graph
