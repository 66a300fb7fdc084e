"""Vision-language configs as Axolotl writes them: a LoRA config of a tiny LLaVA checks and trains on CPU, its
each row's image collated beside its tokens; what images cannot be trained with is refused before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from ktrain.cli import main
from ktrain.config.plan import prepare
from ktrain.data.examples import Example
from ktrain.data.formats import IGNORE
from ktrain.testing import ktrain, read_metrics
from ktrain_vision.objective import VisionObjective
from ktrain_vision.runtime import freeze_multimodal
from ktrain_vision.samples import render
from ktrain_vision.tiny import IMAGE_TOKEN, write_vision_model_dir

LLAVA_LORA = Path(__file__).parent / "fixtures" / "axolotl_llava_lora.yaml"
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def _rows(root: Path) -> Path:
    """Images of one colour each, asked about in both of Axolotl's forms: a part with its path, the images column."""
    from PIL import Image

    rows = []
    for i, (name, rgb) in enumerate(COLOURS.items()):
        path = root / f"{name}.png"
        Image.new("RGB", (40 + 8 * i, 32), rgb).save(path)
        asked = {"type": "text", "text": "What colour is it?"}
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "path": str(path)}, asked]},
                    {"role": "assistant", "content": [{"type": "text", "text": name}]},
                ]
            }
        )
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": "Name colours."},
                    {"role": "user", "content": [asked, {"type": "image"}]},
                    {"role": "assistant", "content": f"It is {name}."},
                ],
                "images": [str(path)],
            }
        )
    (root / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return root / "rows.jsonl"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vision")
    write_vision_model_dir(path / "model")
    _rows(path)
    return path


def _sets(root: Path, **keys: object) -> list[str]:
    pairs = {"base_model": root / "model", "datasets.0.path": root / "rows.jsonl", "output_dir": root / "out", **keys}
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


def test_rows_of_both_forms_collate_with_their_images(root: Path) -> None:
    """Each row's image becomes the processor's 16 image tokens and one image tensor; only the answers train."""
    config = prepare(LLAVA_LORA, [arg for arg in _sets(root) if arg != "--set"]).config
    objective = VisionObjective(config)
    rows = [json.loads(line) for line in (root / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    samples = [render(row, config)[0] for row in rows[:2]]
    batch = objective.collate([[Example(s["input_ids"], s["labels"])] for s in samples], 0, None, None, "cpu")
    assert tuple(batch["pixel_values"].shape) == (2, 3, 28, 28)
    image_token = objective.processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert (batch["input_ids"] == image_token).sum(-1).tolist() == [16, 16]
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(root / "model"))
    seen = objective.loss(model, batch, 1.0)
    blank = objective.loss(model, {**batch, "pixel_values": torch.zeros_like(batch["pixel_values"])}, 1.0)
    assert not torch.allclose(seen, blank)  # the images reach the model
    assert freeze_multimodal(model) > 0
    trainable = {name.split(".")[-2] for name, p in model.named_parameters() if p.requires_grad}
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert all(name.startswith(("model.vision_tower.", "model.multi_modal_projector.")) for name in frozen)
    assert {"q_proj", "gate_proj"} <= trainable, trainable
    answers = [[i for i, label in zip(s["input_ids"], s["labels"], strict=True) if label != IGNORE] for s in samples]
    assert objective.processor.tokenizer.decode(answers[0]).startswith("red")
    assert objective.processor.tokenizer.decode(answers[1]).startswith("It is red.")


def test_axolotl_llava_lora_config_checks_and_trains(root: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["check", str(LLAVA_LORA), *_sets(root)]) == 0, capsys.readouterr().err[-2000:]
    checked = capsys.readouterr().out
    assert "model_loader, objective: 'vision' (ktrain-plugin-vision" in checked
    done = ktrain("run", str(LLAVA_LORA), *_sets(root))
    assert done.returncode == 0, done.stderr[-3000:]
    losses = list(read_metrics(root / "out").values())
    assert len(losses) == 4 and losses[-1] < losses[0], losses


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [("sample_packing", "true", "sample_packing"), ("deepspeed", "zero2", "deepspeed")],
)
def test_what_images_cannot_train_with_is_refused_by_its_key(
    root: Path, capsys: pytest.CaptureFixture, key: str, value: str, named: str
) -> None:
    assert main(["check", str(LLAVA_LORA), *_sets(root), "--set", f"{key}={value}"]) == 2
    assert f"{named}:" in capsys.readouterr().err
