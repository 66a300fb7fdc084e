"""How many of Axolotl's example configs pass ``ktrain check``, and why the others do not.

    python tools/axolotl_examples.py PATH/TO/axolotl/examples [--base-model DIR]

Every ``*.yaml``/``*.yml`` under the folder whose top level is a mapping with ``base_model`` is checked as
``ktrain check FILE --set base_model=DIR`` would check it (in this process, from the folder above
``examples``, where Axolotl's configs expect to run, so that ``deepspeed: deepspeed_configs/...`` resolves).
Without ``--base-model`` the model is a tiny local Llama folder with ``--set random_init_weights=true``;
a config whose ``fsdp_config`` names the block classes to wrap gets a stand-in of the architecture that
defines them (the ``model_type`` of the transformers module with those classes), as its own base model has;
a config with ``processor_type`` gets a tiny vision-language model (LLaVA, ``ktrain_vision.tiny``).
A dataset whose path is local but not there is swapped for a local chat jsonl (``--set
datasets.N.path=...``). Prints the share that passes, the most frequent refusals (``datasets[3]`` counted as
``datasets[i]``), and every file that raised something other than a config error (a traceback); ``--causes``
adds the keys that alone refuse a config (and pairs of keys), the refusals whose answer passes most configs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import yaml

from ktrain.config.paths import exists, looks_local
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.testing.assets import write_chat_dataset, write_model_dir


def configs(examples: Path) -> Iterator[tuple[Path, dict]]:
    """The training configs under ``examples``: YAML mappings with ``base_model``."""
    for path in sorted([*examples.rglob("*.yaml"), *examples.rglob("*.yml")]):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and "base_model" in data:
            yield path, data


def layer_classes(data: dict) -> list[str]:
    """The block classes a config's ``fsdp_config`` names to wrap (either spelling, a string or a list)."""
    fsdp = data.get("fsdp_config")
    if not isinstance(fsdp, dict):
        return []
    named = fsdp.get("transformer_layer_cls_to_wrap") or fsdp.get("fsdp_transformer_layer_cls_to_wrap") or []
    names = named.split(",") if isinstance(named, str) else named
    return [str(name).strip() for name in names]


def architecture_of(classes: list[str]) -> str | None:
    """The transformers ``model_type`` whose modeling module defines every class in ``classes``, if any."""
    if not classes:
        return None
    import transformers

    models = Path(transformers.__file__).parent / "models"
    wanted = [re.compile(rf"^class {re.escape(name)}\(", re.MULTILINE) for name in classes]
    for modeling in sorted(models.glob("*/modeling_*.py")):
        if modeling.stem != f"modeling_{modeling.parent.name}":
            continue
        text = modeling.read_text(encoding="utf-8")
        if all(pattern.search(text) for pattern in wanted):
            return modeling.parent.name
    return None


def stand_in(data: dict, scratch: Path, default: str) -> str:
    """The stand-in model folder for a config: the tiny Llama, or one whose ``model_type`` has the block
    classes its ``fsdp_config`` wraps (made once per architecture)."""
    if data.get("processor_type"):
        return vision_stand_in(scratch, default)
    model_type = architecture_of(layer_classes(data))
    if model_type is None or model_type == "llama":
        return default
    folder = scratch / f"model-{model_type}"
    if not folder.exists():
        write_model_dir(folder, model_type=model_type)
    return str(folder)


def vision_stand_in(scratch: Path, default: str) -> str:
    """A tiny LLaVA folder (``ktrain_vision.tiny``) for a config with ``processor_type``; the tiny Llama where
    ktrain-plugin-vision is not installed (its check then names the plugin)."""
    try:
        from ktrain_vision.tiny import write_vision_model_dir
    except ImportError:
        return default
    folder = scratch / "model-vision"
    if not folder.exists():
        write_vision_model_dir(folder)
    return str(folder)


def overrides(data: dict, model: str, chat: Path, random_init: bool) -> list[str]:
    """The ``--set`` assignments of one config: the local model, and local stand-ins for missing local data."""
    out = [f"base_model={model}"] + (["random_init_weights=true"] if random_init else [])
    for key in ("datasets", "test_datasets"):
        for i, item in enumerate(data.get(key) or []):
            path = item.get("path") if isinstance(item, dict) else None
            if isinstance(path, str) and looks_local(path) and not exists(path):
                out.append(f"{key}.{i}.path={chat}")
    return out


def key_of(problem: str) -> str:
    """The key a refusal names (``datasets[3].type: ...`` -> ``datasets[i].type``)."""
    return re.sub(r"\[\d+\]", "[i]", problem.split(":", 1)[0])


def print_causes(failed: dict[str, list[str]]) -> None:
    """The keys that alone refuse a config, most configs first: taking one of them passes those configs."""
    keys = {name: {key_of(e) for e in errors} for name, errors in failed.items()}
    alone = collections.Counter(next(iter(k)) for k in keys.values() if len(k) == 1)
    print(f"refused for one key alone ({sum(alone.values())} configs):")
    for key, count in alone.most_common():
        print(f"  {count:4d}  {key}")
    pairs = collections.Counter(" + ".join(sorted(k)) for k in keys.values() if len(k) == 2)
    print(f"refused for two keys ({sum(pairs.values())} configs):")
    for key, count in pairs.most_common():
        print(f"  {count:4d}  {key}")


@contextlib.contextmanager
def working_directory(folder: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", type=Path, help="Axolotl's examples/ folder")
    parser.add_argument("--base-model", help="a local model folder with weights (default: a tiny random one)")
    parser.add_argument("--top", type=int, default=25, help="how many refusals to list")
    parser.add_argument("--failures", action="store_true", help="print every failing file with its problems")
    parser.add_argument(
        "--causes", action="store_true", help="list the keys that alone refuse a config (what to take first)"
    )
    args = parser.parse_args()
    examples = args.examples.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="axolotl-examples-"))
    model = args.base_model or str(write_model_dir(scratch / "model"))
    chat = write_chat_dataset(scratch / "chat.jsonl", count=8)
    passed, failed, crashed = [], {}, {}
    reasons: collections.Counter[str] = collections.Counter()
    with working_directory(examples.parent):
        for path, data in configs(examples):
            name = str(path.relative_to(examples))
            try:
                base = args.base_model or stand_in(data, scratch, model)
                prepare(path, overrides(data, base, chat, args.base_model is None))
                passed.append(name)
            except ConfigError as e:
                errors = [str(p) for p in e.report.errors]
                failed[name] = errors
                reasons.update({re.sub(r"\[\d+\]", "[i]", p) for p in errors})
            except Exception:  # a traceback: the thing this tool exists to find
                crashed[name] = traceback.format_exc()
    total = len(passed) + len(failed) + len(crashed)
    print(f"{len(passed)}/{total} pass ({100 * len(passed) / max(total, 1):.0f}%), {len(crashed)} traceback(s)")
    print(f"most frequent refusals (configs refused with each, of {len(failed)} refused):")
    for reason, count in reasons.most_common(args.top):
        print(f"  {count:4d}  {reason[:200]}")
    if args.causes:
        print_causes(failed)
    for name, text in crashed.items():
        print(f"TRACEBACK {name}\n{text}")
    if args.failures:
        for name, errors in failed.items():
            print(f"{name}:", *(f"\n  - {e}" for e in errors))


if __name__ == "__main__":
    main()
