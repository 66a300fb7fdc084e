"""``special_tokens`` and ``tokens``: the tokenizer gets them, the model's embeddings grow to match, and the
exported model and tokenizer agree; a name that is no special token stops the check, naming it."""

from __future__ import annotations

from pathlib import Path

import transformers

from ktrain.cli import main
from ktrain.testing import dataset, ktrain, model_dir, write_config


def test_new_special_and_plain_tokens_grow_the_embeddings_and_are_exported(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 40)
    before = len(transformers.AutoTokenizer.from_pretrained(tmp_path / "model"))
    config = write_config(
        tmp_path, special_tokens={"pad_token": "<|padding|>"}, tokens=["<|tool|>"], max_steps=2, micro_batch_size=4
    )
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    final = tmp_path / "out" / "final"
    tokenizer = transformers.AutoTokenizer.from_pretrained(final)
    model = transformers.AutoModelForCausalLM.from_pretrained(final)
    assert len(tokenizer) == before + 2 == model.get_input_embeddings().num_embeddings
    assert model.get_output_embeddings().out_features == before + 2
    assert tokenizer.pad_token == "<|padding|>" and tokenizer.pad_token_id >= before
    assert len(tokenizer("<|tool|>", add_special_tokens=False).input_ids) == 1  # one token, not characters


def test_a_name_that_is_no_special_token_is_refused(tiny_config, capsys) -> None:
    code = main(["check", str(tiny_config(special_tokens={"padd_token": "<pad>"}))])
    err = capsys.readouterr().err
    assert code == 2 and "special_tokens.padd_token: is no special token of a tokenizer; one of bos_token" in err
