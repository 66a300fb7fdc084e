"""Before launch: the block classes to wrap must exist in the base model's architecture.

For a local model folder the ``model_type`` of its ``config.json`` names the transformers modeling module;
the classes it defines are the candidates. (A hub id is checked on the ranks, on the loaded model,
by ``ktrain_fsdp.sharding.layer_classes``.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Any

from ktrain_fsdp.options import FsdpOptions, layer_key


def architecture_classes(config: Any) -> set[str] | None:
    """Names of the classes defined by the local base model's modeling module (its source read, nothing
    imported, so that ``ktrain check`` stays without torch); None when unknown here."""
    source = config.base_model_config or config.base_model or ""
    path = os.path.join(os.path.expanduser(source), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        model_type = str(json.load(f).get("model_type", "")).replace("-", "_")
    # The top-level package is found without importing it (a submodule's find_spec would import transformers).
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    modeling = os.path.join(os.path.dirname(spec.origin), "models", model_type, f"modeling_{model_type}.py")
    if not model_type or not os.path.isfile(modeling):  # remote code, or an architecture this transformers lacks
        return None
    with open(modeling, encoding="utf-8") as f:
        return set(re.findall(r"^class (\w+)\(", f.read(), flags=re.MULTILINE))


def check_layer_classes(config: Any, options: FsdpOptions, report: Any) -> None:
    """Report the written layer classes that the local base model's architecture does not define."""
    if not options.layer_classes:
        return
    present = architecture_classes(config)
    if present is None:
        return
    missing = [name for name in options.layer_classes if name not in present]
    if missing:
        blocks = sorted(name for name in present if name.endswith(("DecoderLayer", "Block", "Layer")))
        report.error(
            layer_key(options),
            f"the base model's architecture has no {', '.join(missing)}; its layer classes: {', '.join(blocks)}",
        )
