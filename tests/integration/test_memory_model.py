"""The memory model's model states are exact: what ``ktrain.memory`` predicts a rank holds in parameters,
gradients and optimizer states equals the bytes of the real run's tensors on every rank.

One step of a small Llama whose sizes do not divide evenly (FSDP2's last rank holds fewer rows, ZeRO pads its
flat buffers) per layout, on 2 or 4 CPU ranks with gloo; the plugin in memory_probe.py counts each rank's storages
(a 4-bit weight with its quantization state, which FSDP leaves whole on every rank). QLoRA under FSDP2 stands for
LoRA too (the same adapters, the base frozen, here also packed); DDP holds on every rank what one process holds,
checked to the byte by ``ktrain plan --measure`` below (DDP's gradient buckets are communication buffers, not
model states).
ZeRO-1 and ZeRO-2 keep the same model states (DeepSpeed's one optimizer for both stages, and one memory answer of
ktrain-plugin-deepspeed for both): ZeRO-1 runs here, on 4 ranks, where its flat buffers are padded to a multiple
of 8 elements.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ktrain.cli import main
from ktrain.memory.model import predict
from ktrain.testing import KtrainProject, write_chat_dataset, write_model_dir

PROBE = Path(__file__).with_name("memory_probe.py")
ODD = {"hidden_size": 66, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 12,
       "intermediate_size": 130, "vocab_size": 101}  # fmt: skip
LAYOUTS: dict[str, tuple[dict[str, Any], str | None, int]] = {  # name: (keys, plugin module needed, ranks)
    "fsdp2": ({"fsdp_version": 2}, "ktrain_fsdp", 4),
    "qlora_fsdp2": ({"fsdp_version": 2, "adapter": "qlora", "lora_target_linear": True}, "ktrain_fsdp", 2),
    "zero1": ({"deepspeed": "zero1"}, "ktrain_deepspeed", 4),
    "zero3": ({"deepspeed": "zero3"}, "ktrain_deepspeed", 2),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> KtrainProject:
    root = tmp_path_factory.mktemp("memory-model")
    project = KtrainProject(root, write_model_dir(root / "model", **ODD), write_chat_dataset(root / "d.jsonl", 16))
    project.install_plugin("memory_probe", PROBE.read_text(encoding="utf-8"))
    return project


def _held(project: KtrainProject, name: str, keys: dict[str, Any], ranks: int) -> list[dict[str, int]]:
    folder = project.root / f"held-{name}"
    folder.mkdir()
    project.env["KTRAIN_MEASURE_DIR"] = str(folder)
    project.train(project.config(name=name, max_steps=1, save_strategy="no", **keys), nproc=ranks)
    return [json.loads((folder / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(ranks)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_predicted_model_states_are_the_bytes_each_rank_holds(project: KtrainProject, name: str) -> None:
    keys, module, ranks = LAYOUTS[name]
    if module:
        pytest.importorskip(module)
    plan = project.plan(world_size=ranks, max_steps=1, **keys)
    predicted = []
    for rank in range(ranks):
        states = predict(plan.config, plan.mesh, plan.plugins, rank=rank).states
        predicted.append({"parameters": states.parameters, "gradients": states.gradients,
                          "optimizer": states.optimizer})  # fmt: skip
    assert predicted == _held(project, name, keys, ranks)


ACTIVATIONS_TOLERANCE = 0.05
"""How far ``ktrain plan --measure``'s saved activations may be from the prediction on CPU in fp32 (docs/plan.md)."""


def test_plan_measure_prints_equal_model_states_and_close_activations(tmp_path: Path, capsys) -> None:
    """Two steps of the small Llama in this process (CPU, fp32): the model-state rows are equal to the byte,
    the activations saved in the first micro-batch's forward within ``ACTIVATIONS_TOLERANCE``."""
    config = tmp_path / "run.yaml"
    model, data = write_model_dir(tmp_path / "model", **ODD), write_chat_dataset(tmp_path / "d.jsonl", 16)
    config.write_text(
        f"base_model: {model}\nrandom_init_weights: true\ndatasets: [{{path: {data}, type: chat_template}}]\n"
        f"output_dir: {tmp_path / 'out'}\nmicro_batch_size: 4\nsequence_len: 64\npad_to_sequence_len: true\n",
        encoding="utf-8",
    )
    assert main(["plan", str(config), "--measure"]) == 0
    printed = capsys.readouterr().out
    ratios = dict(re.findall(r"^  (\S.*?\S)\s+[0-9.]+ \S+\s+[0-9.]+ \S+\s+(\S+)$", printed, re.MULTILINE))
    assert [ratios[name] for name in ("parameters", "gradients", "optimizer states")] == ["equal"] * 3, printed
    assert abs(float(ratios["activations (saved)"]) - 1) < ACTIVATIONS_TOLERANCE, printed
    assert "micro-batch 4 x 64 tokens" in printed and not (tmp_path / "out").exists()
