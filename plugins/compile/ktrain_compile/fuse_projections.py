"""An inductor pass over each compiled block: the projections of one input in one matrix multiply.

A Llama-family block projects its attention's normed input three times (q, k, v) and its MLP's twice
(gate, up), one ``F.linear`` each; the backward then runs as many products for the input's gradient and
adds them up. This pass, run on the block's graph before autograd (inductor's ``pre_grad_custom_pass``),
replaces the bias-free linears that share an input by one linear over their weights concatenated, and
splits the result: forward and backward each run one wider product, and the input's gradient needs no
adds. The weights stay separate parameters (the concatenation is a copy made at each call, 25 MB a block
for the 1.5B shape's q/k/v and 67 MB for gate/up), so names, checkpoints and optimizers see no change.
"""

from __future__ import annotations

import collections
import operator

import torch
import torch.nn.functional as F
from torch._inductor.custom_graph_pass import CustomGraphPass

LINEARS = (F.linear, torch._C._nn.linear)


class FuseProjections(CustomGraphPass):
    """Fuse the bias-free ``F.linear`` calls of a graph that share their input (inductor's custom-pass protocol)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        by_input: dict[torch.fx.Node, list[torch.fx.Node]] = collections.defaultdict(list)
        for node in graph.nodes:
            if node.op == "call_function" and node.target in LINEARS and _bias_free(node):
                by_input[node.args[0]].append(node)
        for linears in by_input.values():
            if len(linears) > 1:
                _fuse(graph, linears)

    def uuid(self) -> str:
        """Identifies this pass in inductor's cache key."""
        return "ktrain-fuse-projections-1"


def _bias_free(node: torch.fx.Node) -> bool:
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    return bias is None and len(node.args) >= 2 and isinstance(node.args[1], torch.fx.Node)


def _fuse(graph: torch.fx.Graph, linears: list[torch.fx.Node]) -> None:
    """One linear over the concatenated weights where ``linears`` (graph order) share their input."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    first = linears[0]
    weights = [node.args[1] for node in linears]
    values = [w.meta.get("example_value") for w in weights]
    if any(order[w] > order[first] for w in weights) or any(v is None or v.dim() != 2 for v in values):
        return  # a weight computed after the first linear, or of unknown shape: left as it is
    if len({(v.shape[1], v.dtype, v.device) for v in values}) != 1:
        return
    with graph.inserting_before(first):
        weight = graph.call_function(torch.cat, (weights,), {"dim": 0})
        fused = graph.call_function(F.linear, (first.args[0], weight))
        parts = graph.call_function(torch.split, (fused, [v.shape[0] for v in values]), {"dim": -1})
        for i, node in enumerate(linears):
            part = graph.call_function(operator.getitem, (parts, i))
            part.meta.update(node.meta)
            node.replace_all_uses_with(part)
    for node in linears:
        graph.erase_node(node)
