"""Chat rows with images, as Axolotl's vision examples hold them, rendered and tokenized by the model's processor.

A row's turns are in ``messages`` (or ``conversations``); a turn's ``content`` is text or a list of parts,
``{"type": "text", "text": ...}`` and ``{"type": "image", ...}`` where the image is given by ``path``, ``url``
(a local file), ``image`` (a path or a PIL image) or ``base64``, or, for a part that names none, taken in
order from the row's ``images`` column. The processor's chat template renders the turns and its tokenizer
expands each image into the model's image tokens. Only the assistant turns count in the loss: the tokens
between the rendering of the turns before each answer (with the generation prompt) and through it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
from pathlib import Path
from typing import Any

from ktrain.data.formats import IGNORE
from ktrain_vision.keys import RESIZE_ALGORITHMS

ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}
SOURCES = ("path", "url", "image", "base64")


@functools.lru_cache(maxsize=4)
def load_processor(processor_type: str, source: str, trust_remote_code: bool) -> Any:
    """The processor class ``processor_type`` of transformers, read from ``source`` (once per process)."""
    import transformers

    cls = getattr(transformers, processor_type, None)
    if cls is None:
        raise ValueError(f"processor_type: transformers has no class {processor_type}")
    return cls.from_pretrained(source, trust_remote_code=trust_remote_code)


def processor_of(config: Any) -> Any:
    """The processor of a vision config: ``processor_type`` read from ``tokenizer_config`` or ``base_model``."""
    source = config.tokenizer_config or config.base_model
    return load_processor(config.processor_type, str(source), bool(config.trust_remote_code))


def _turns(row: dict) -> list[dict]:
    field = "messages" if "messages" in row or "conversations" not in row else "conversations"
    turns = row.get(field)
    if turns is None:
        raise KeyError(field)
    if not isinstance(turns, list):
        raise TypeError(f"field '{field}' is a {type(turns).__name__}, not a list of turns")
    out = []
    for turn in turns:
        role = ROLES.get(str(turn.get("role", turn.get("from"))))
        if role is None:
            raise ValueError(f"a turn has the role {turn.get('role', turn.get('from'))!r}")
        out.append({"role": role, "content": turn.get("content", turn.get("value"))})
    return out


def split_images(row: dict) -> tuple[list[dict], list[Any]]:
    """The turns with every image part reduced to ``{"type": "image"}`` (what chat templates read), and the
    images' sources in order: a part's own source, else the next item of the row's ``images`` column."""
    column = list(row.get("images") or [])
    turns, sources = [], []
    for turn in _turns(row):
        content = turn["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.get("type") == "image":
                    given = next((part[k] for k in SOURCES if part.get(k) is not None), None)
                    if given is None:
                        if not column:
                            raise ValueError("an image part names no image and the images column has no more")
                        given = column.pop(0)
                    sources.append(given)
                    parts.append({"type": "image"})
                elif part.get("type") == "text":
                    parts.append({"type": "text", "text": part.get("text", "")})
                else:
                    raise ValueError(f"content parts of type {part.get('type')!r} are not supported (text, image are)")
            content = parts
        turns.append({"role": turn["role"], "content": content})
    if column:
        raise ValueError(f"the images column holds {len(column)} image(s) no image part takes")
    return turns, sources


def open_image(source: Any, config: Any) -> Any:
    """A PIL RGB image from a source (a path, a ``file://`` url, base64 text, bytes or a mapping with ``path`` or
    ``bytes``, a PIL image), resized to ``image_size`` when written."""
    from PIL import Image

    if isinstance(source, dict):
        source = source.get("bytes") or source.get("path")
    if isinstance(source, bytes):
        image = Image.open(io.BytesIO(source))
    elif isinstance(source, str):
        if source.startswith(("http://", "https://")):
            raise ValueError(f"image {source} is remote; give a local path (images are not downloaded)")
        path = Path(source.removeprefix("file://"))
        if path.is_file():
            image = Image.open(path)
        elif len(source) > 256:  # not a file name: base64 content
            image = Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[-1])))
        else:
            raise ValueError(f"image file {source} does not exist")
    elif isinstance(source, Image.Image):
        image = source
    else:
        raise TypeError(f"an image is a {type(source).__name__}, not a path, bytes or an image")
    image = image.convert("RGB")
    if config.image_size:
        method = getattr(Image.Resampling, (config.image_resize_algorithm or RESIZE_ALGORITHMS[0]).upper())
        image = image.resize((config.image_size, config.image_size), method)
    return image


def _length(processor: Any, turns: list[dict], images: list[Any], generation_prompt: bool) -> int:
    text = processor.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt)
    return len(processor(text=[text], images=images or None)["input_ids"][0])


def _count_images(turns: list[dict]) -> int:
    return sum(1 for t in turns if isinstance(t["content"], list) for p in t["content"] if p.get("type") == "image")


def render(row: dict, config: Any) -> tuple[dict, list[Any]]:
    """``{"input_ids", "labels"}`` of a row (labels -100 outside the assistant turns) and its images' sources."""
    processor = processor_of(config)
    turns, sources = split_images(row)
    images = [open_image(source, config) for source in sources]
    text = processor.apply_chat_template(turns, tokenize=False)
    ids = [int(i) for i in processor(text=[text], images=images or None)["input_ids"][0]]
    labels = [IGNORE] * len(ids)
    for i, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        shown = images[: _count_images(turns[:i])]
        start = _length(processor, turns[:i], shown, True)
        end = _length(processor, turns[: i + 1], shown, False)
        labels[start:end] = ids[start:end]
    if len(ids) > config.sequence_len:  # truncating would cut an image's tokens from its pixels
        raise ValueError(f"it has {len(ids)} tokens with its images, over sequence_len ({config.sequence_len})")
    return {"input_ids": ids, "labels": labels}, sources


def sample_key(ids: Any, labels: Any) -> bytes:
    """The digest of a tokenized sample: how the objective finds the images of a cached row."""
    digest = hashlib.sha256()
    digest.update(bytes(str([int(i) for i in ids]), "ascii"))
    digest.update(bytes(str([int(i) for i in labels]), "ascii"))
    return digest.digest()


def tokenize_vision(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """The dataset format ``chat_template.vision``: a chat row with images, tokenized by the processor."""
    sample, _ = render(row, config)
    return sample
