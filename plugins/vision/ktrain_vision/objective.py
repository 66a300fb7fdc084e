"""The vision objective: the causal-LM loss on the assistant tokens, each row's images collated beside its tokens.

The tokenized rows in the preprocessing cache hold the image tokens the processor expanded but not the images;
the objective reads the datasets once more and finds each row's images by the digest of its tokens and labels
(``ktrain_vision.samples.sample_key``). Two rows with the same tokens but different images cannot be told apart
and are refused.
"""

from __future__ import annotations

from typing import Any

import torch

from ktrain.builtin.causal_lm import CausalLM
from ktrain.data.examples import Example
from ktrain.data.reading import DataError, iter_rows
from ktrain_vision.keys import VISION_FORMAT
from ktrain_vision.samples import open_image, processor_of, render, sample_key


def image_sources(config: Any) -> dict[bytes, list[Any]]:
    """Each sample's image sources by the digest of its tokens, for every row of ``datasets`` and
    ``test_datasets`` (rows that do not tokenize are left out, as the cache leaves them out)."""
    found: dict[bytes, list[Any]] = {}
    for key in ("datasets", "test_datasets"):
        for i, entry in enumerate(getattr(config, key, None) or []):
            if entry.type != VISION_FORMAT:
                continue
            for row in iter_rows(entry, f"{key}[{i}]"):
                try:
                    sample, sources = render(row.fields, config)
                except (KeyError, TypeError, ValueError):
                    continue
                digest = sample_key(sample["input_ids"], sample["labels"])
                if found.setdefault(digest, sources) != sources:
                    raise DataError(
                        f"{key}[{i}]: {row.place} has the tokens of an earlier sample but other images; "
                        "ktrain cannot tell their images apart: give one of them different text"
                    )
    return found


class VisionObjective(CausalLM):
    """The kernel's causal-LM loss (over the trained tokens of the global batch), with the rows' images given to
    the model as the processor's image tensors (``pixel_values`` and what the model family adds)."""

    def __init__(self, config: Any):
        super().__init__(config)
        self.processor = processor_of(config)
        self.sources = image_sources(config)

    def collate(
        self, rows: list[list[Example]], pad_id: int, pad_to: int | None, packed_attention: str | None, device: Any
    ) -> dict[str, Any]:
        """The padded tokens of the rows, then the processor's tensors of their images, in row order."""
        batch = super().collate(rows, pad_id, pad_to, packed_attention, device)
        images = []
        for (sample,) in rows:
            sources = self.sources.get(sample_key(sample.input_ids, sample.labels))
            if sources is None:
                raise DataError("a cached row matches no row of the datasets: the data changed; run with --overwrite")
            images.extend(open_image(source, self.config) for source in sources)
        if images:
            tensors = self.processor.image_processor(images=images, return_tensors="pt")
            batch.update({name: torch.as_tensor(value) for name, value in tensors.items()})
        return batch
