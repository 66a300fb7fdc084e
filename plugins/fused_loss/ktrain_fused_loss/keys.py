"""The config keys of ktrain-plugin-fused-loss: ``fused_linear_cross_entropy`` and its chunks (no torch here)."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key


@attrs.define(kw_only=True)
class FusedLossKeys:
    """The output layer and the cross entropy in one autograd function, with no host synchronization."""

    fused_linear_cross_entropy: bool = key(
        False,
        "compute the output layer and the token-sum cross entropy together: the gradient overwrites the "
        "bf16 logits in the forward, the logits are never upcast, and no step waits for the device",
    )
    fused_linear_cross_entropy_chunks: int = key(
        1,
        "split the tokens into this many chunks in the forward: with 1 the gradient of all the logits "
        "(tokens x vocab in the compute dtype) is held until the backward, which is fastest; more chunks "
        "hold one chunk's logits at a time",
    )
