"""The training objective: what a row counts for, how a micro-batch's rows become tensors, and their loss.

The owner of the role ``objective`` (``ktrain_build_objective``) answers all three, so a plugin can train
on rows of its own shape (a preference pair: prompt, chosen and rejected answers) with a loss of its own,
while the kernel keeps the loop, the batch plan, data parallelism, checkpoints and resume. The default is
the causal-LM loss over the trained tokens (``ktrain.builtin.causal_lm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

# A row is a list of ``ktrain.data.examples.Example`` (one, or several packed); not imported here, so that
# the hook contract (``ktrain.hookspecs``) can name this module without an import circle.
Row = list[Any]


class Objective(Protocol):
    """The training objective of a run; the loss of a step is the mean over the items of its global batch."""

    def items(self, row: Row) -> int:
        """How many items ``row`` adds to the divisor of the loss: trained tokens, pairs, ...

        The kernel sums it over the rows of the whole global batch (every micro-batch and data-parallel
        rank) and hands ``loss`` that sum divided by ``run.mesh.gradient_ranks``.
        """
        ...

    def collate(
        self, rows: list[Row], pad_id: int, pad_to: int | None, packed_attention: str | None, device: Any
    ) -> dict[str, Any]:
        """The tensors of one micro-batch's rows (on the CPU; the kernel moves them to the device).

        Arguments as for ``ktrain.data.batches.collate``: ``pad_to`` is the padded length when
        ``pad_to_sequence_len`` is set, ``packed_attention`` the attention implementation when rows hold
        several packed samples (else None), ``device`` where a mask may be built.
        """
        ...

    def loss(self, model: Any, batch: dict[str, Any], num_items: float) -> torch.Tensor:
        """The sum of the items' losses in ``batch`` divided by ``num_items``, from one call of ``model``.

        ``model`` is the engine's module (wrapped for data parallelism: call it once a micro-batch).
        """
        ...
