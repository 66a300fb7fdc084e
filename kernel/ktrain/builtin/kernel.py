"""The kernel's entry module: its config keys, the names it registers, and its cross-key checks.

Like every entry module it imports nothing heavy; the factories it registers are ``lazy`` references.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from ktrain import hookimpl
from ktrain.builtin import freezing
from ktrain.config.keys import KERNEL_SECTIONS
from ktrain.config.paths import looks_local
from ktrain.data import templates
from ktrain.data.formats import ALPACA_STYLES
from ktrain.registry import lazy

OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adamw_fp32_master", "adamw", "sgd", "adafactor")
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
FORMATS = ("chat_template", "sharegpt", "alpaca", "completion", "input_output")


@hookimpl
def ktrain_register_config(register) -> None:
    for section in KERNEL_SECTIONS:
        register(section)


@hookimpl
def ktrain_register_optimizers(register) -> None:
    for name in OPTIMIZERS:
        register(name, lazy(f"ktrain.builtin.optimizers:{name}"))


@hookimpl
def ktrain_register_lr_schedulers(register) -> None:
    for name in SCHEDULERS:
        register(name, lazy(f"ktrain.builtin.schedulers:{name}"))


@hookimpl
def ktrain_register_dataset_formats(register) -> None:
    for name in FORMATS:
        register(name, lazy(f"ktrain.data.formats:{name}"))
    for name in ALPACA_STYLES:
        register(name, lazy("ktrain.data.formats:alpaca_style"))


@hookimpl
def ktrain_register_checkpoint_formats(register) -> None:
    register("ktrain-full", lazy("ktrain.builtin.local_checkpoint:read_state_dict"))


SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")
"""The names ``special_tokens`` takes: the special tokens every transformers tokenizer has."""


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """The kernel's checks between keys; each message says what to do."""
    _check_batch(config, report)
    _check_attention(config, report)
    _check_run(config, report)
    _check_data(config, report)
    if config.bf16 is True and config.fp16:
        report.error("bf16", "bf16 and fp16 are both true; choose one")
    if config.bfloat16 and config.fp16:
        report.error("bfloat16", "trains in bf16, and fp16 is true; choose one")
    if config.optimizer == "adamw_fp32_master" and not config.bfloat16:
        report.error(
            "optimizer",
            "adamw_fp32_master keeps fp32 masters of bf16 weights; set bfloat16: true "
            "(with fp32 weights, adamw_torch_fused is the same update)",
        )
    if config.gradient_checkpointing_kwargs and not config.gradient_checkpointing:
        report.warn("gradient_checkpointing_kwargs", "has no effect while gradient_checkpointing is false")
    if config.is_set("gradient_checkpointing_fraction") and not config.gradient_checkpointing:
        report.warn("gradient_checkpointing_fraction", "has no effect while gradient_checkpointing is false")
    for name in sorted(set(config.special_tokens or {}) - set(SPECIAL_TOKENS)):
        report.error(
            f"special_tokens.{name}", f"is no special token of a tokenizer; one of {', '.join(SPECIAL_TOKENS)}"
        )


def _check_batch(config: Any, report: Any) -> None:
    for name in (
        "micro_batch_size",
        "gradient_accumulation_steps",
        "sequence_len",
        "logging_steps",
        "exact_match_samples",
    ):
        if getattr(config, name) < 1:
            report.error(name, f"must be at least 1, not {getattr(config, name)}")
    for name in (
        "max_steps",
        "eval_steps",
        "save_steps",
        "saves_per_epoch",
        "evals_per_epoch",
        "save_total_limit",
        "min_sample_len",
    ):
        value = getattr(config, name)
        if name == "evals_per_epoch" and value == 0:
            report.warn(name, "is 0: no evaluation within the epochs, as when left out")
        elif value is not None and value < 1:
            report.error(name, f"must be at least 1 (or left out), not {value}")
    if config.num_epochs <= 0 and config.max_steps is None:
        report.error("num_epochs", f"must be positive, not {config.num_epochs}")
    if config.learning_rate < 0:
        report.error("learning_rate", f"must not be negative, not {config.learning_rate}")
    if config.warmup_steps is not None and config.warmup_ratio is not None:
        report.error("warmup_ratio", "set warmup_steps or warmup_ratio, not both")
    if config.warmup_ratio is not None and not 0 <= config.warmup_ratio < 1:
        report.error("warmup_ratio", f"must be in [0, 1), not {config.warmup_ratio}")
    if config.val_set_size < 0:
        report.error("val_set_size", f"must not be negative, not {config.val_set_size}")
    if (config.eval_steps or config.evals_per_epoch) and config.val_set_size == 0:
        report.warn("eval_steps", "evaluation needs a held-out split: set val_set_size; nothing is evaluated")
    if not config.output_dir.strip():
        report.error("output_dir", "must name a folder (for the current one, write ./)")
    if not config.datasets and not config.pretraining_dataset:
        report.error("datasets", "no training data: add a `datasets:` list (path and type of each)")


def _check_attention(config: Any, report: Any) -> None:
    older = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "flex_attention": "flex_attention"}
    chosen = [(key, impl) for key, impl in older.items() if getattr(config, key)]
    if len(chosen) > 1:
        report.error(", ".join(k for k, _ in chosen), "choose one attention implementation")
    if chosen and config.attn_implementation and config.attn_implementation != chosen[0][1]:
        report.error(
            "attn_implementation",
            f"is {config.attn_implementation} but {chosen[0][0]}: true asks for {chosen[0][1]}; keep one",
        )


def _check_run(config: Any, report: Any) -> None:
    if config.save_steps and config.saves_per_epoch:
        report.error("saves_per_epoch", "set save_steps or saves_per_epoch, not both")
    if config.eval_steps and config.evals_per_epoch:
        report.error("evals_per_epoch", "set eval_steps or evals_per_epoch, not both")
    if config.save_strategy == "no" and (config.save_steps or config.saves_per_epoch):
        report.warn("save_strategy", "is 'no', so save_steps/saves_per_epoch have no effect")
    _check_best_checkpoint(config, report)
    _check_group_by_length(config, report)
    if config.resume_from_checkpoint and config.auto_resume_from_checkpoints:
        report.warn("auto_resume_from_checkpoints", "resume_from_checkpoint names the checkpoint; this is unused")


def _check_group_by_length(config: Any, report: Any) -> None:
    """``group_by_length`` orders unpacked rows; packed or streamed rows are all about ``sequence_len`` long."""
    if config.group_by_length and (config.sample_packing or config.pretraining_dataset):
        why = "sample_packing" if config.sample_packing else "pretraining_dataset"
        report.warn("group_by_length", f"no effect with {why}: its rows are all about sequence_len long")


def _check_best_checkpoint(config: Any, report: Any) -> None:
    """``early_stopping_patience`` and ``load_best_model_at_end`` rank checkpoints by eval loss: they need
    evaluations and saves, and (as Axolotl requires) saves at steps with an evaluation. ``load_best_model_at_end``
    alone without an evaluation split has no effect, as in Axolotl."""
    key = "early_stopping_patience" if config.early_stopping_patience is not None else "load_best_model_at_end"
    if config.early_stopping_patience is None and not config.load_best_model_at_end:
        return
    evaluated = bool(config.val_set_size or config.test_datasets)
    if config.early_stopping_patience is not None and config.early_stopping_patience < 1:
        report.error(key, f"must be at least 1 (or left out), not {config.early_stopping_patience}")
    elif config.early_stopping_patience is None and not evaluated:
        report.warn(key, "no effect: nothing is evaluated (Axolotl sets it only with an evaluation split)")
    elif not evaluated or not (config.eval_steps or config.evals_per_epoch):
        report.error(key, "needs evaluations: set val_set_size (or test_datasets) and eval_steps or evals_per_epoch")
    elif config.save_strategy == "no" or not (
        config.save_steps or config.saves_per_epoch or config.save_strategy == "epoch"
    ):
        report.error(key, "keeps the best checkpoint as the final model: set save_steps or saves_per_epoch")
    elif config.save_steps and config.eval_steps and config.save_steps % config.eval_steps:
        report.error(
            key,
            f"save_steps ({config.save_steps}) must be a multiple of eval_steps ({config.eval_steps}), as in "
            "Axolotl, so that every checkpoint has its eval loss",
        )


def _check_data(config: Any, report: Any) -> None:
    for key in ("datasets", "test_datasets", "pretraining_dataset"):
        for i, entry in enumerate(getattr(config, key)):
            where = f"{key}[{i}]"
            if not entry.path:
                report.error(f"{where}.path", "required: the file or folder to read")
            if entry.chat_template is not None and entry.chat_template not in templates.CHOICES:
                report.error(f"{where}.chat_template", _unknown_template(entry.chat_template))
            if key == "pretraining_dataset" and entry.type not in (None, "pretrain", "pretraining"):
                report.error(
                    f"{where}.type", "pretraining_dataset reads raw text; leave type out (or write pretraining)"
                )
            if key != "pretraining_dataset" and entry.type in ("pretrain", "pretraining"):
                report.error(
                    f"{where}.type", "raw text for pretraining is streamed: move this entry to pretraining_dataset"
                )
    if config.chat_template is not None and config.chat_template not in templates.CHOICES:
        report.error("chat_template", _unknown_template(config.chat_template))
    if config.chat_template == "jinja" and not config.chat_template_jinja:
        report.error("chat_template", "is jinja: give the template's text in chat_template_jinja")
    if config.chat_template_jinja and config.chat_template not in (None, "jinja"):
        report.error("chat_template_jinja", f"chat_template is {config.chat_template}; keep one of the two")
    if config.pretraining_dataset:
        if config.datasets:
            report.error("pretraining_dataset", "train on datasets or on pretraining_dataset, not both")
        if not config.max_steps:
            report.error("pretraining_dataset", "a streamed dataset has no length: set max_steps")
        if config.val_set_size:
            report.error("val_set_size", "a stream cannot be split: give test_datasets for evaluation")
    if config.test_datasets and config.val_set_size:
        report.error("test_datasets", "evaluate on test_datasets or on a val_set_size split, not both")
    for i, text in enumerate(config.unfrozen_parameters or []):
        try:
            freezing.name_pattern(text)
        except ValueError as e:
            report.error(f"unfrozen_parameters[{i}]", str(e))
    if config.unfrozen_parameters and getattr(config, "adapter", None):
        report.error("unfrozen_parameters", "the adapter chooses what trains; leave out adapter or this")
    if config.revision_of_model and config.base_model and looks_local(config.base_model):
        report.warn("revision_of_model", "base_model is a local folder, which has no revisions: not used")
    if config.dataset_processes is not None:
        report.warn("dataset_processes", "has no effect: ktrain tokenizes in one process per machine")


def _unknown_template(name: str) -> str:
    close = difflib.get_close_matches(name, templates.CHOICES, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"no chat template named '{name}'; {hint}known: {', '.join(templates.CHOICES)}"


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """The exact-match evaluation takes part when ``exact_match_eval`` names a file."""
    if config.exact_match_eval and os.path.isfile(config.exact_match_eval):  # else resolve reports the key
        from ktrain.builtin.exact_match import ExactMatch

        activate(ExactMatch(config), keys=("exact_match_eval",))
