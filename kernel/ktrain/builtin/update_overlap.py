"""``optimizer_overlap``: the update of ``adamw_fp32_master`` on a second CUDA stream, beside the next forward.

The update is memory-bound (28 bytes a parameter: about 10 ms a step for 1.5B parameters on an H200) and
the forward's matrix multiplies are compute-bound, so the two can share the device. After the backward the
update is queued on a side stream in the order the forward reads the weights, in parts: first everything
outside the transformer blocks but the output embedding (the input embedding, the final norm), then each
block, last the output embedding. Each part records an event when its update is queued. The next forward
waits for a part only where it reaches it: the model's forward for the first part, each block's forward for
its own, the end of the last block for the output embedding (fused losses read its weight without calling
its module), and the end of the model's forward for the whole update. So every forward, and all that
comes after one (the backward, the next update), sees the updated weights.

The model's and the optimizer's ``state_dict`` wait for the whole update (checkpoints, the export); what
else reads the weights other than through a forward (plugins' hooks) calls ``wait`` first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ktrain.model_blocks import transformer_blocks


def forward_parts(model: torch.nn.Module, params: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``params`` in the order the forward reads them: outside the blocks, each block, the output embedding.

    Each parameter is in one part; a block with no trainable parameter has an empty part. A model with no
    blocks has all in the first part but the last, empty one.
    """
    blocks = transformer_blocks(model)
    part = {}
    for i, block in reversed(list(enumerate(blocks))):  # a block inside a block belongs to the outer one
        for p in block.parameters():
            part[id(p)] = i + 1
    output = model.get_output_embeddings() if blocks and hasattr(model, "get_output_embeddings") else None
    for p in output.parameters() if output is not None else ():
        part[id(p)] = len(blocks) + 1
    input_embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    for p in input_embedding.parameters() if input_embedding is not None else ():
        part[id(p)] = 0  # also when the output embedding is tied to it
    parts: list[list[torch.Tensor]] = [[] for _ in range(len(blocks) + 2)]
    for p in params:
        parts[part.get(id(p), 0)].append(p)
    return parts


class UpdateOverlap:
    """The side stream of an optimizer's update, its events, and the hooks with which the forward waits."""

    def __init__(self, model: torch.nn.Module, params: Sequence[torch.Tensor], device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.parts = forward_parts(model, params)
        self.part_of = {id(p): i for i, part in enumerate(self.parts) for p in part}
        self.events: list[torch.cuda.Event | None] = [None] * len(self.parts)
        blocks = transformer_blocks(model)
        self.handles = [model.register_forward_pre_hook(self._waiter(0))]
        for i, block in enumerate(blocks):
            self.handles.append(block.register_forward_pre_hook(self._waiter(i + 1)))
        if blocks:
            self.handles.append(blocks[-1].register_forward_hook(self._waiter(len(blocks) + 1)))
        self.handles.append(model.register_forward_hook(lambda *_: self.wait()))
        self.handles.append(model.register_state_dict_pre_hook(lambda *_: self.wait()))

    def _waiter(self, part: int) -> Callable[..., None]:
        def wait_for_part(*_: Any) -> None:
            event = self.events[part]
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)

        return wait_for_part

    def run(self, work: list[Any], update: Callable[[list[Any]], None], read: Sequence[torch.Tensor]) -> None:
        """Queue ``update`` on the side stream for ``work`` (items whose second element is the parameter), part
        by part in forward order, after all that the current stream has queued.

        ``read`` are the tensors the update reads that the current stream may free (the gradients, the
        clipping coefficient): their memory is not reused until the update is done with them.
        """
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        by_part: dict[int, list[Any]] = {}
        for item in work:
            by_part.setdefault(self.part_of.get(id(item[1]), 0), []).append(item)
        with torch.cuda.stream(self.stream):
            for i in sorted(by_part):
                update(by_part[i])
                self.events[i] = self.stream.record_event()
        for t in read:
            t.record_stream(self.stream)

    def wait(self) -> None:
        """Make the current stream wait for the whole update queued so far."""
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
