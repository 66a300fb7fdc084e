"""A preference run's part of one rank's memory model: the plugin's answer to ``ktrain_collect_memory``.

No torch here. A pair's chosen and rejected sequences share one forward, so the blocks hold the activations
of twice the micro-batch's rows (KTO's unpaired samples: once): an upper bound where a pair's prompt is
computed once for both answers (``ktrain_preference.layout``), its row then holding the prompt once. DPO
and IPO against a live reference without an adapter keep a frozen copy of the model as loaded, whole on
every rank; with an adapter the reference is the base with the adapter off (no copy), and ORPO, SimPO and
precomputed reference log-probabilities need none. The answers' log-probabilities are computed a chunk of
logits at a time (``ktrain_preference.logps``), not the whole micro-batch's logits: a frozen output layer (an
adapter's base) holds one chunk's logits and their gradient, in the compute dtype (on a GPU the work between them
is compiled and keeps no fp32 copy); a trained one keeps its logits' gradients for the backward, up to
``KEPT_ELEMENTS`` of them, beside one chunk's logits.
"""

from __future__ import annotations

from typing import Any

from ktrain.memory.parts import PairsModel
from ktrain_preference.keys import REFERENCE_FREE

CHUNK_ELEMENTS = 2**28
"""Logits of one chunk (``ktrain_preference.logps.CHUNK_ELEMENTS``, not imported: that module imports torch)."""
KEPT_ELEMENTS = 2**29
"""Logits' gradients a trained output layer keeps (``ktrain_preference.logps.KEPT_ELEMENTS``)."""


def collect_memory(config: Any) -> dict[str, Any] | None:
    """The ``"pairs"`` model when ``rl`` chooses a preference method."""
    if not config.rl:
        return None
    copy = config.rl not in REFERENCE_FREE and not config.precompute_ref_log_probs and not config.adapter
    element = 2 if (config.bf16 or config.bfloat16 or config.fp16) else 4
    chunk = element * CHUNK_ELEMENTS + element * (KEPT_ELEMENTS if not config.adapter else CHUNK_ELEMENTS)
    return {"pairs": PairsModel(rows=1 if config.rl == "kto" else 2, reference_copy=copy, loss_bytes=chunk)}
