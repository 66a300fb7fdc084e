"""``cpu_ram_efficient_loading`` builds through the kernel's loader: rank 0 reads the weights with
``ktrain.builtin.hf_model.build_model``, the other ranks get its ``empty=True`` build, the same parameters
on the meta device; the plugin builds no model of its own."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

import ktrain_fsdp.loading
from ktrain.config.plan import load_plugins_and_config
from ktrain.testing import model_dir
from ktrain_fsdp.loading import RamEfficientLoader


def test_other_ranks_build_rank_0s_model_on_meta(tmp_path: Path, tiny_config) -> None:
    keys = {"fsdp_version": 2, "fsdp_config": {"cpu_ram_efficient_loading": True}, "tokens": ["<extra>"]}
    keys["base_model"] = str(model_dir(tmp_path))  # with its tokenizer: the embeddings grow to it
    keys["random_init_weights"] = True
    config = load_plugins_and_config(tiny_config(**keys), [])[1]
    loader = RamEfficientLoader(config, version=2)
    runs = [SimpleNamespace(rank=rank, tokenizer=None, device=torch.device("cpu")) for rank in (0, 1)]
    models = [loader.ktrain_load_model(run=run, model_kwargs={}) for run in runs]
    read, empty = ({n: p for n, p in m.state_dict().items()} for m in models)
    assert not any(p.is_meta for p in read.values()) and all(p.is_meta for p in empty.values())
    assert {n: (p.shape, p.dtype) for n, p in read.items()} == {n: (p.shape, p.dtype) for n, p in empty.items()}
    vocab = len(loader.ktrain_load_tokenizer(run=runs[0]))
    assert [m.get_input_embeddings().num_embeddings for m in models] == [vocab, vocab]
    assert models[0].config.use_cache is models[1].config.use_cache is False


def test_the_plugin_builds_no_model_of_its_own() -> None:
    """Model building (folder, random init, dtype, attention, meta) is the kernel's ``build_model``."""
    package = Path(ktrain_fsdp.loading.__file__).parent
    for path in sorted(package.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        for name in ("AutoConfig", "AutoModel", ".from_pretrained(", "attention_implementation", "fit_embeddings"):
            assert name not in text, f"{path.name} builds a model itself ({name}); call ktrain.builtin.hf_model"
    assert "build_model(" in (package / "loading.py").read_text(encoding="utf-8")
