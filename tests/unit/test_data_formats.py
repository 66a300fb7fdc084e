"""Dataset types on small files written here: labels token by token, field mappings, templates, bad input.

The quickstart tokenizer is one token per character (plus its special tokens), so the expected ids of
a text are those of its pieces laid end to end: each expectation below is built from the pieces of the
prompt and the answer, independently of how the formats find them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers
import yaml

from ktrain.config.plan import prepare
from ktrain.data import cache, templates
from ktrain.data.formats import ALPACA_PROMPT, IGNORE
from ktrain.data.reading import DataError
from ktrain.testing import model_dir

USER, ASSISTANT = "<|im_start|>user\n", "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(tmp_path_factory.mktemp("data-formats"))


@pytest.fixture(scope="module")
def tok(model: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(model)


def build(tmp: Path, model: Path, tok: Any, rows: list[Any], strict: bool = True, **entry: Any) -> Any:
    """Write ``rows`` as jsonl, a config with one dataset entry (``entry``), and tokenize it for real."""
    data = tmp / "data.jsonl"
    data.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    keys = entry.pop("keys", {})
    config = {
        "base_model": str(model),
        "random_init_weights": True,  # the tiny model folder holds no weights; only its tokenizer is used here
        "datasets": [{"path": str(data), **entry}],
        "output_dir": str(tmp / "out"),
        "sequence_len": 512,
        **keys,
    }
    (tmp / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    plan = prepare(tmp / "c.yaml", world_size=1)
    return cache.build(plan.config, tok, plan.formats, strict=strict)


def ids(tok: Any, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def expected(tok: Any, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """Ids and labels from (text, trained) pieces."""
    all_ids, labels = [], []
    for text, trained in pieces:
        piece = ids(tok, text)
        all_ids += piece
        labels += piece if trained else [IGNORE] * len(piece)
    return all_ids, labels


def only(prepared: Any) -> tuple[list[int], list[int]]:
    sample = prepared.train[0]
    return [int(i) for i in sample.input_ids], [int(i) for i in sample.labels]


def test_alpaca_labels_are_ignore_exactly_on_the_prompt(tmp_path: Path, model: Path, tok: Any) -> None:
    row = {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}
    prompt = ALPACA_PROMPT.format(
        with_input=", paired with an input that provides further context",
        instruction="Add the numbers.",
        input_block="### Input:\n2 and 3\n\n",
    )
    want_ids, want_labels = expected(tok, [(prompt, False), ("5<|im_end|>", True)])
    assert only(build(tmp_path, model, tok, [row], type="alpaca")) == (want_ids, want_labels)
    # field mapping, and train_on_inputs puts labels on the prompt too
    renamed = {"q": "Add the numbers.", "ctx": "2 and 3", "a": "5"}
    mapped = build(
        tmp_path,
        model,
        tok,
        [renamed],
        type="alpaca",
        field_instruction="q",
        field_input="ctx",
        field_output="a",
        keys={"train_on_inputs": True},
    )
    assert only(mapped) == (want_ids, want_ids)


def test_multi_turn_chat_labels_token_by_token(tmp_path: Path, model: Path, tok: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    want = expected(
        tok,
        [
            ("<|im_start|>system\nBe brief.<|im_end|>\n" + USER + "What is 2+2?<|im_end|>\n" + ASSISTANT, False),
            ("4<|im_end|>", True),
            ("\n" + USER + "And 3+3?<|im_end|>\n" + ASSISTANT, False),
            ("6<|im_end|>", True),
            ("\n", False),
        ],
    )
    assert only(build(tmp_path, model, tok, [{"messages": messages}], type="chat_template")) == want
    # ShareGPT spelling through the field mapping gives the same sample
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    conversations = [{"from": names[m["role"]], "value": m["content"]} for m in messages]
    shared = build(
        tmp_path,
        model,
        tok,
        [{"chat": conversations}],
        type="chat_template",
        field_messages="chat",
        message_property_mappings={"role": "from", "content": "value"},
    )
    assert only(shared) == want
    # roles_to_train and train_on_eos: the user turns' content trained, no end-of-turn token anywhere
    chat = [{"messages": messages}]
    users = build(tmp_path, model, tok, chat, type="chat_template", roles_to_train=["user"], train_on_eos="none")
    got_ids, got_labels = only(users)
    assert got_ids == want[0]
    trained = tok.decode([t for t, label in zip(got_ids, got_labels, strict=True) if label != IGNORE])
    assert trained == "What is 2+2?And 3+3?"
    last = build(tmp_path, model, tok, [{"messages": messages}], type="chat_template", train_on_eos="last")
    trained = tok.decode([t for t, label in zip(*only(last), strict=True) if label != IGNORE])
    assert trained == "46<|im_end|>"
    every = build(tmp_path, model, tok, chat, type="chat_template", train_on_eos="all")
    trained = tok.decode([t for t, label in zip(*only(every), strict=True) if label != IGNORE])
    assert trained == "<|im_end|><|im_end|>4<|im_end|><|im_end|>6<|im_end|>"


@pytest.mark.parametrize("name", sorted([*templates.NAMED, *templates.AXOLOTL]))
def test_named_templates_train_the_assistant_replies(name: str, tmp_path: Path, model: Path, tok: Any) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Ciao"},
    ]
    row = [{"messages": messages}]  # sequence_len fits the longest default system message of the templates
    prepared = build(tmp_path, model, tok, row, type="chat_template", chat_template=name, keys={"sequence_len": 4096})
    got_ids, got_labels = only(prepared)
    text = tok.decode(got_ids)
    assert "Hello" in text and "Bye" in text
    trained = tok.decode([t for t, label in zip(got_ids, got_labels, strict=True) if label != IGNORE])
    # each template ends a turn with its own marker; our tokenizer's EOS ends none of these but chatml's
    assert trained.lstrip().startswith("Hello") and "Ciao" in trained and "Bye" not in trained and "Hi" not in trained


def test_a_template_that_drops_an_earlier_thinking_block_is_masked_by_content(
    tmp_path: Path, model: Path, tok: Any
) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Ciao"},
    ]
    got_ids, got_labels = only(
        build(tmp_path, model, tok, [{"messages": messages}], type="chat_template", chat_template="qwen3")
    )
    assert tok.decode(got_ids) == (
        USER
        + "Hi<|im_end|>\n"
        + ASSISTANT
        + "Hello<|im_end|>\n"
        + USER
        + "Bye<|im_end|>\n"
        + ASSISTANT
        + "<think>\n\n</think>\n\nCiao<|im_end|>\n"
    )  # the first reply has no thinking block once a later turn follows: it is found by its content
    spans = "".join(tok.decode([t]) if label != IGNORE else "\0" for t, label in zip(got_ids, got_labels, strict=True))
    assert [s for s in spans.split("\0") if s] == ["Hello<|im_end|>", "</think>\n\nCiao<|im_end|>"]


def test_field_thinking_passes_a_reply_s_reasoning_to_the_template(tmp_path: Path, model: Path, tok: Any) -> None:
    turns = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "thinking": "two twos"}]
    row = [{"messages": turns}]
    plain = only(build(tmp_path, model, tok, row, type="chat_template", chat_template="qwen3"))
    assert "two twos" not in tok.decode(plain[0])
    got = only(build(tmp_path, model, tok, row, type="chat_template", chat_template="qwen3", field_thinking="thinking"))
    trained = tok.decode([t for t, label in zip(*got, strict=True) if label != IGNORE])
    assert trained == "two twos\n</think>\n\n4<|im_end|>"  # "<think>\n" ends qwen3's generation prompt


def test_eot_tokens_end_the_turns_and_drop_system_message(tmp_path: Path, model: Path, tok: Any) -> None:
    turns = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    phi = transformers.AutoTokenizer.from_pretrained(model)
    phi.add_tokens(["<|end|>"], special_tokens=True)
    row = [{"messages": turns}]

    def trained(**entry: Any) -> str:
        got = only(build(tmp_path, model, phi, row, type="chat_template", chat_template="phi_3", **entry))
        return phi.decode([t for t, label in zip(*got, strict=True) if label != IGNORE])

    assert trained() == "Hello<|end|>\n"  # the template's turn ends in no EOS: the turn trains to its end
    assert trained(keys={"eot_tokens": ["<|end|>"]}) == "Hello<|end|>"
    assert trained(keys={"eot_tokens": ["<|end|>"]}, train_on_eos="none") == "Hello"
    with pytest.raises(DataError, match=r"eot_tokens: '<end_of_turn>' is 13 tokens"):
        build(tmp_path, model, tok, row, type="chat_template", keys={"eot_tokens": ["<end_of_turn>"]})
    dropped = only(build(tmp_path, model, tok, row, type="chat_template", drop_system_message=True))
    assert tok.decode(dropped[0]) == USER + "Hi<|im_end|>\n" + ASSISTANT + "Hello<|im_end|>\n"


def test_older_chat_field_names_and_a_roles_mapping(tmp_path: Path, model: Path, tok: Any) -> None:
    plain = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}]
    want = only(build(tmp_path, model, tok, plain, type="chat_template"))
    spoken = [{"chat": [{"speaker": "human", "text": "Hi"}, {"speaker": "bot", "text": "Hello"}]}]
    got = build(
        tmp_path,
        model,
        tok,
        spoken,
        type="chat_template",
        field_messages="chat",
        message_field_role="speaker",
        message_field_content="text",
        roles={"user": ["human"], "assistant": ["bot", "model"]},
    )
    assert only(got) == want


def test_dataset_exact_deduplication_drops_repeated_samples(tmp_path: Path, model: Path, tok: Any) -> None:
    rows = [{"text": "one"}, {"text": "two"}, {"text": "one"}]
    assert len(build(tmp_path, model, tok, rows, type="completion").train) == 3
    prepared = build(tmp_path, model, tok, rows, type="completion", keys={"dataset_exact_deduplication": True})
    assert [tok.decode(sample.input_ids) for sample in prepared.train] == ["one<|im_end|>", "two<|im_end|>"]
    assert prepared.stats[0].describe().endswith("0 invalid, 1 duplicates")


def test_completion_input_output_and_pretokenized(tmp_path: Path, model: Path, tok: Any) -> None:
    text = build(tmp_path, model, tok, [{"body": "some text"}], type="completion", field="body")
    assert only(build(tmp_path, model, tok, [{"body": "some text"}], type="completion", text_column="body")) == only(
        text
    )
    want_ids = [*ids(tok, "some text"), tok.eos_token_id]
    assert only(text) == (want_ids, want_ids)
    segments = [{"text": "Q: hi ", "label": False}, {"text": "A: yo", "label": True}, {"text": " end", "label": False}]
    want = expected(tok, [("Q: hi ", False), ("A: yo", True), (" end", False)])
    assert only(build(tmp_path, model, tok, [{"segments": segments}], type="input_output")) == want
    row = {"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}
    assert only(build(tmp_path, model, tok, [row])) == ([5, 6, 7, 8], [-100, -100, 7, 8])


def test_truncation_and_untrained_samples_are_counted(tmp_path: Path, model: Path, tok: Any) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "x" * 600}, {"role": "assistant", "content": "y"}]},  # cut: no label
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a" * 600}]},  # cut, kept
        {"messages": [{"role": "user", "content": "only a question"}]},  # nothing to train
        {"messages": []},  # empty
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    ]
    prepared = build(tmp_path, model, tok, rows, type="chat_template")
    (stats,) = prepared.stats
    assert (stats.samples, stats.kept, stats.truncated, stats.untrained, stats.empty) == (5, 2, 2, 2, 1)
    assert list(prepared.train.lengths) == [512, len(ids(tok, USER + "q<|im_end|>\n" + ASSISTANT + "a<|im_end|>\n"))]


def test_bad_input_names_the_file_line_field_and_sample(tmp_path: Path, model: Path, tok: Any) -> None:
    good = {"instruction": "i", "output": "o"}
    with pytest.raises(DataError, match=r"datasets\[0\]: .*data\.jsonl line 3 is not valid JSON"):
        build(tmp_path, model, tok, [good, good, '{"instruction": "i", "output": '], type="alpaca")
    with pytest.raises(DataError, match=r"datasets\[0\]: sample 1 \(.*data\.jsonl line 2\) has no field 'output'"):
        build(tmp_path, model, tok, [good, {"instruction": "i"}], type="alpaca")
    with pytest.raises(DataError, match=r"sample 0 .* has no field 'segments\[1\]\.text'"):
        build(tmp_path, model, tok, [{"segments": [{"text": "a"}, {"label": True}]}], type="input_output")
    with pytest.raises(DataError, match=r"datasets\[0\]: no usable sample .*2 without a trained token"):
        build(tmp_path, model, tok, [{"messages": [{"role": "user", "content": "q"}]}] * 2, type="chat_template")
    # the check mode counts instead of stopping, and keeps the first problems
    checked = build(tmp_path, model, tok, [good, {"instruction": "i"}, {"output": "o"}], strict=False, type="alpaca")
    (stats,) = checked.stats
    assert (stats.kept, stats.invalid) == (1, 2)
    assert "sample 2" in stats.problems[1] and "'instruction'" in stats.problems[1]


def test_bad_keys_and_hub_ids_are_errors_naming_the_key(
    tmp_path: Path, model: Path, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ktrain.config.report import ConfigError

    (tmp_path / "data.jsonl").write_text('{"text": "a"}\n')
    config = {
        "base_model": str(model),
        "random_init_weights": True,
        "datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}],
        "test_datasets": [{"path": str(tmp_path / "data.jsonl"), "type": "completion", "chat_template": "chatlm"}],
        "output_dir": str(tmp_path / "out"),
        "chat_template": "llama9",
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as e:
        prepare(tmp_path / "c.yaml", world_size=1)
    text = str(e.value)
    assert "chat_template: no chat template named 'llama9'" in text
    assert "test_datasets[0].chat_template: no chat template named 'chatlm'; did you mean 'chatml'?" in text
    config.update(
        chat_template="jinja",
        test_datasets=[{"path": str(tmp_path / "data.jsonl"), "type": "completion"}],
        val_set_size=0.1,
        pretraining_dataset=[{"path": str(tmp_path / "data.jsonl"), "type": "alpaca"}],
    )
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as e:
        prepare(tmp_path / "c.yaml", world_size=1)
    text = str(e.value)
    for expected_error in (
        "chat_template: is jinja: give the template's text in chat_template_jinja",
        "test_datasets: evaluate on test_datasets or on a val_set_size split, not both",
        "pretraining_dataset: train on datasets or on pretraining_dataset, not both",
        "pretraining_dataset: a streamed dataset has no length: set max_steps",
        "val_set_size: a stream cannot be split",
        "pretraining_dataset[0].type: pretraining_dataset reads raw text",
    ):
        assert expected_error in text, (expected_error, text)
    for key in ("chat_template", "test_datasets", "val_set_size", "pretraining_dataset"):
        del config[key]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    plan = prepare(tmp_path / "c.yaml", world_size=1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match=r"datasets\[0\]\.path: tatsu-lab/alpaca .*\(HF_HUB_OFFLINE=1 is set\)"):
        cache.build(plan.config, tok, plan.formats)
