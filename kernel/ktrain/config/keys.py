"""The kernel's own config keys, grouped by topic. Each field is a top-level YAML key.

Key names are the ones users already write (Axolotl's). ``help`` metadata
feeds ``ktrain check`` and docs/config.md.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ktrain.config.fast_defaults import AUTO_FRACTION, FP32_MASTERS, check_fraction


def key(default: Any, help: str, gpu_default: Any = None, **kw: Any) -> Any:
    """An attrs field with a default and a help text; ``gpu_default``, a ``ktrain.config.fast_defaults.GpuDefault``:
    its value on a GPU where the config does not write it."""
    metadata = {"help": help, "gpu_default": gpu_default}
    if isinstance(default, (list, dict)):
        return attrs.field(factory=type(default), metadata=metadata, **kw)
    return attrs.field(default=default, metadata=metadata, **kw)


@attrs.define(kw_only=True)
class DatasetEntry:
    """One item of ``datasets:``."""

    path: str = key("", "local jsonl/json/parquet/csv/arrow file or folder, or a Hugging Face Hub dataset id")
    name: str | None = key(None, "Hub dataset: its configuration (subset) to load")
    type: str | None = key(
        None, "row format: alpaca, chat_template, sharegpt, completion, input_output; none: pre-tokenized rows"
    )
    split: str = key("train", "split to read")
    data_files: str | list[str] | None = key(None, "files inside `path` (or the Hub dataset) to read")
    ds_type: Literal["json", "parquet", "csv", "arrow"] | None = key(None, "file type when not given by suffix")
    field: str | None = key(None, "field holding the text (completion, pretraining) or the segments (input_output)")
    text_column: str | None = key(None, "older spelling of field, for the raw text of pretraining_dataset")
    field_instruction: str | None = key(None, "alpaca: field holding the instruction (default `instruction`)")
    field_input: str | None = key(None, "alpaca: field holding the optional input (default `input`)")
    field_output: str | None = key(None, "alpaca: field holding the response (default `output`)")
    field_messages: str | None = key(None, "field holding the chat turns (default `messages`)")
    field_chosen: str | None = key(None, "preference pairs: field holding the chosen answer (default `chosen`)")
    field_rejected: str | None = key(None, "preference pairs: field holding the rejected answer (default `rejected`)")
    message_property_mappings: dict[str, str] | None = key(None, "names of `role`/`content` in each turn")
    message_field_role: str | None = key(None, "older spelling of message_property_mappings: {role: ...}")
    message_field_content: str | None = key(None, "older spelling of message_property_mappings: {content: ...}")
    field_thinking: str | None = key(None, "chat: field of a turn holding its reasoning, passed to the template")
    template_thinking_key: str | None = key(
        None, "chat: the name the template reads a turn's reasoning by (default reasoning_content)"
    )
    roles: dict[str, list[str]] | None = key(
        None, "chat: the role names of the data each template role is written as ({assistant: [gpt, model], ...})"
    )
    roles_to_train: list[str] | None = key(None, "roles whose turns carry labels (default assistant)")
    train_on_eos: Literal["turn", "last", "all", "none"] | None = key(
        None, "which end-of-turn tokens train: those of trained turns (turn, the default), last, all, none"
    )
    chat_template: str | None = key(None, "chat template for this dataset only (names as for chat_template)")
    drop_system_message: bool = key(False, "chat: leave out the conversation's first turn when it is a system turn")


@attrs.define(kw_only=True)
class ModelKeys:
    """What to load and how."""

    base_model: str | None = key(None, "local HF model directory or hub id")
    base_model_config: str | None = key(None, "directory or hub id of the model config, if not base_model's")
    revision_of_model: str | None = key(None, "the Hub revision (branch, tag or commit) of a hub-id base_model")
    tokenizer_config: str | None = key(None, "directory or hub id of the tokenizer, if not base_model's")
    model_type: str | None = key(None, "transformers Auto class to load with (default AutoModelForCausalLM)")
    model_config: dict[str, Any] | None = key(
        None, "settings of the model's config.json changed before it is built (output_router_logits: true, ...)"
    )
    trust_remote_code: bool = key(False, "run model code shipped with the checkpoint")
    random_init_weights: bool = key(False, "build the model from its config with random weights (tests, benchmarks)")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flex_attention"] | None = key(
        None, "attention implementation (default sdpa)"
    )
    flash_attention: bool | None = key(None, "older spelling of attn_implementation: flash_attention_2")
    sdp_attention: bool | None = key(None, "older spelling of attn_implementation: sdpa")
    flex_attention: bool | None = key(None, "older spelling of attn_implementation: flex_attention")
    gradient_checkpointing: bool | Literal["offload"] = key(
        False, "recompute activations in backward; offload: also hold each block's saved input in host memory (GPU)"
    )
    gradient_checkpointing_kwargs: dict[str, Any] | None = key(
        None, "keyword arguments of torch.utils.checkpoint (default use_reentrant: false)"
    )
    gradient_checkpointing_fraction: float | Literal["auto"] = key(
        1.0,
        "with gradient_checkpointing: the share of the blocks that recompute, spread evenly (above 0, at most 1; "
        "the others keep their activations); auto (on a GPU the default with gradient_checkpointing: true, without "
        "FSDP or DeepSpeed): the fewest blocks whose predicted peak stays within the config's peak on the plain path "
        "(no GPU defaults; bf16 weights for bf16 compute, as Axolotl loads them) and 90% of the GPU's memory; every "
        "block on a CPU",
        gpu_default=AUTO_FRACTION,
        validator=check_fraction,
    )
    unfrozen_parameters: list[str] | None = key(
        None, "train only the parameters whose names match one of these patterns (a period is literal); no adapter"
    )


@attrs.define(kw_only=True)
class DataKeys:
    """Datasets, lengths and masking."""

    datasets: list[DatasetEntry] = key([], "training datasets, mixed")
    pretraining_dataset: list[DatasetEntry] = key(
        [], "raw-text datasets streamed, tokenized and packed on the fly (instead of datasets; needs max_steps)"
    )
    test_datasets: list[DatasetEntry] = key([], "evaluation datasets (instead of val_set_size)")
    val_set_size: float = key(0.0, "held-out share (< 1) or number of rows (>= 1) for evaluation")
    sequence_len: int = key(2048, "longest row in tokens; longer rows are truncated and counted")
    min_sample_len: int | None = key(None, "drop a sample of fewer tokens than this (before truncation), counted")
    pad_to_sequence_len: bool = key(False, "pad every row to sequence_len")
    sample_packing: bool = key(False, "pack several samples into one row of sequence_len, attention kept apart")
    sample_packing_method: Literal["ffd", "best_fit"] = key(
        "ffd", "packing algorithm: first-fit-decreasing or best-fit (both by length, longest first)"
    )
    eval_sample_packing: bool | None = key(None, "pack the evaluation rows too (default: as sample_packing)")
    group_by_length: bool = key(
        False, "training rows of similar length batched together to pad less (unpacked rows; as transformers does)"
    )
    train_on_inputs: bool = key(False, "put labels on prompt tokens as well")
    special_tokens: dict[str, str] | None = key(
        None, "the tokenizer's special tokens to set (bos_token, eos_token, pad_token, ...), added when new"
    )
    tokens: list[str] | None = key(None, "tokens to add to the vocabulary; the model's embeddings grow to match")
    resize_token_embeddings_to_32x: bool = key(
        False, "grow the embeddings to the tokenizer's length rounded up to a multiple of 32 (where smaller)"
    )
    chat_template: str | None = key(
        None, "chat datasets' template: tokenizer_default, chatml, qwen, llama3, gemma, phi_3, or jinja"
    )
    chat_template_jinja: str | None = key(None, "the text of a Jinja chat template (chat_template: jinja)")
    eot_tokens: list[str] | None = key(
        None, "chat: the tokens that end a turn (default the tokenizer's EOS); train_on_eos chooses which train"
    )
    shuffle_merged_datasets: bool = key(True, "shuffle rows of all datasets together, with the seed")
    dataset_exact_deduplication: bool = key(
        False, "drop a sample whose tokens and labels an earlier sample of datasets (or of test_datasets) had"
    )
    dataset_prepared_path: str | None = key(
        None, "folder of the tokenized-dataset cache (default: prepared/ in output_dir); see `ktrain preprocess`"
    )
    dataset_processes: int | None = key(None, "not used: ktrain tokenizes in one process per machine (a warning)")


@attrs.define(kw_only=True)
class BatchKeys:
    """Batch size and length of training."""

    micro_batch_size: int = key(1, "rows per rank per forward pass")
    gradient_accumulation_steps: int = key(1, "micro-batches per optimizer step")
    eval_batch_size: int | None = key(None, "rows per rank per eval forward (default micro_batch_size)")
    num_epochs: float = key(1.0, "passes over the training data")
    max_steps: int | None = key(None, "optimizer steps to run; overrides num_epochs")


@attrs.define(kw_only=True)
class OptimizerKeys:
    """Optimizer, clipping and schedule."""

    optimizer: str = key("adamw_torch", "optimizer name (`ktrain keys` lists those registered)")
    learning_rate: float = key(2e-5, "peak learning rate")
    weight_decay: float = key(0.0, "decoupled weight decay, on matrices only")
    adam_beta1: float = key(0.9, "Adam beta1")
    adam_beta2: float = key(0.999, "Adam beta2")
    adam_epsilon: float = key(1e-8, "Adam epsilon")
    max_grad_norm: float = key(
        1.0, "clip the global gradient norm to this; 0 for no clipping", validator=attrs.validators.ge(0)
    )
    lr_scheduler: str = key("cosine", "schedule name: cosine, linear, constant, constant_with_warmup")
    warmup_steps: int | None = key(None, "steps of linear warm-up")
    warmup_ratio: float | None = key(None, "warm-up as a share of all steps")
    cosine_min_lr_ratio: float | None = key(None, "cosine ends at learning_rate times this (default 0)")
    cosine_constant_lr_ratio: float | None = key(
        None,
        "cosine reaches its end at this share of all steps and stays there (default 1: at the last step)",
        validator=attrs.validators.optional([attrs.validators.ge(0), attrs.validators.le(1)]),
    )


@attrs.define(kw_only=True)
class PrecisionKeys:
    """Numerics. Master weights and optimizer states stay fp32 (unless ``bfloat16``); bf16/fp16 choose the
    compute dtype."""

    bf16: bool | Literal["auto"] = key(False, "compute in bf16 (autocast); auto: where the device supports it")
    bfloat16: bool = key(
        False,
        "pure bf16: weights, gradients and optimizer states in bf16, computing in bf16 (8 bytes a parameter "
        "under AdamW instead of 16; updates below bf16's precision are lost); with optimizer: adamw_fp32_master "
        "the optimizer keeps fp32 masters and states. An adapter's own weights stay fp32, except under "
        "adamw_fp32_master (bf16 with fp32 masters); a 4-bit base keeps its 4-bit weights",
        gpu_default=FP32_MASTERS,
    )
    fp16: bool = key(False, "compute in fp16 with loss scaling")
    tf32: bool = key(False, "allow TF32 matmuls on Ampere and newer")


@attrs.define(kw_only=True)
class RunKeys:
    """Run directory, logging, evaluation, checkpoints, seed."""

    output_dir: str = key("./outputs/ktrain", "run directory: config, metrics.jsonl, checkpoints, final model")
    logging_steps: int = key(1, "log every this many optimizer steps")
    eval_steps: int | None = key(None, "evaluate every this many steps")
    evals_per_epoch: int | None = key(None, "evaluate this many times per epoch")
    save_steps: int | None = key(None, "save a checkpoint every this many steps")
    saves_per_epoch: int | None = key(None, "save this many checkpoints per epoch")
    save_total_limit: int | None = key(None, "keep at most this many checkpoints (the newest; never fewer than 2)")
    save_strategy: Literal["steps", "epoch", "no"] | None = key(None, "when to save; default from save_steps")
    resume_from_checkpoint: str | None = key(None, "checkpoint folder to resume from")
    auto_resume_from_checkpoints: bool = key(False, "resume from the latest checkpoint in output_dir")
    seed: int = key(42, "seed of weights, shuffling and dropout")
    nan_policy: Literal["stop", "skip"] = key(
        "stop", "a NaN or inf loss on any rank: stop before the optimizer step, or skip that step on every rank"
    )
    loss_watchdog_threshold: float | None = key(
        None, "stop the run when the logged loss stays above this (no final model; the checkpoints stay)"
    )
    loss_watchdog_patience: int = key(
        3, "logged steps in a row above loss_watchdog_threshold that stop the run", validator=attrs.validators.ge(1)
    )
    early_stopping_patience: int | None = key(
        None,
        "stop when the eval loss has not improved for this many evaluations in a row; the final model is then the "
        "checkpoint with the lowest eval loss (needs evaluation and saves)",
    )
    load_best_model_at_end: bool = key(
        False, "the final model is the checkpoint with the lowest eval loss (needs evaluation and saves)"
    )
    exact_match_eval: str | None = key(
        None, "chat jsonl whose assistant answers are checked by greedy generation before and after training"
    )
    exact_match_samples: int = key(200, "rows of exact_match_eval to score")


@attrs.define(kw_only=True)
class MeshKeys:
    """Sizes of the device mesh; their product is the number of ranks. -1 means the rest."""

    dp_shard_size: int = key(1, "ranks a model is sharded over (needs a sharding plugin)")
    dp_replicate_size: int = key(1, "replicas (data parallel); -1: the ranks left over")
    tensor_parallel_size: int = key(1, "tensor-parallel ranks (needs a tensor-parallel plugin)")
    context_parallel_size: int = key(1, "context-parallel ranks (needs a context-parallel plugin)")


KERNEL_SECTIONS = (ModelKeys, DataKeys, BatchKeys, OptimizerKeys, PrecisionKeys, RunKeys, MeshKeys)

# Keys of first-party plugins, so that a key of a plugin that is not installed names what to install.
PLUGIN_KEYS: dict[str, tuple[str, ...]] = {
    "ktrain-plugin-fsdp": ("fsdp_version", "fsdp_config", "fsdp"),
    "ktrain-plugin-deepspeed": ("deepspeed",),
    "ktrain-plugin-lora": (
        "adapter",
        "qlora",
        "load_in_4bit",
        "load_in_8bit",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_target_modules",
        "lora_target_linear",
        "lora_modules_to_save",
        "lora_model_dir",
        "peft_use_dora",
        "peft_use_rslora",
        "lora_fused_forward",
        "bnb_config_kwargs",
    ),
    "ktrain-plugin-liger": (
        "liger_rope",
        "liger_rms_norm",
        "liger_layer_norm",
        "liger_glu_activation",
        "liger_swiglu",
        "liger_cross_entropy",
        "liger_fused_linear_cross_entropy",
        "liger_flce_chunk_mem_const",
    ),
    "ktrain-plugin-parallel": ("sequence_parallel_degree", "heads_k_stride", "ring_attn_func"),
    "ktrain-plugin-compile": ("torch_compile", "torch_compile_backend", "torch_compile_mode"),
    "ktrain-plugin-qat": ("qat",),
    "ktrain-plugin-vision": ("processor_type", "image_size", "image_resize_algorithm", "freeze_mm_modules"),
    "ktrain-plugin-fused-loss": (
        "fused_linear_cross_entropy",
        "fused_linear_cross_entropy_chunks",
        "fused_linear_cross_entropy_fp8",
    ),
    "ktrain-plugin-fp8": (
        "fp8",
        "fp8_recipe",
        "fp8_amax_history_len",
        "fp8_fast_accumulation",
        "fp8_fused_mlp",
        "fp8_exclude_modules",
        "fp8_skip_small_layers",
        "fp8_enable_fsdp_float8_all_gather",
    ),
    "ktrain-plugin-tensorboard": ("use_tensorboard",),
    "ktrain-plugin-preference": (
        "rl",
        "rl_beta",
        "dpo_label_smoothing",
        "orpo_alpha",
        "simpo_gamma",
        "cpo_alpha",
        "kto_desirable_weight",
        "kto_undesirable_weight",
        "precompute_ref_log_probs",
    ),
    "ktrain-plugin-wandb": (
        "use_wandb",
        "wandb_project",
        "wandb_entity",
        "wandb_name",
        "wandb_run_id",
        "wandb_mode",
        "wandb_watch",
        "wandb_log_model",
    ),
    "ktrain-plugin-mlflow": (
        "use_mlflow",
        "mlflow_tracking_uri",
        "mlflow_experiment_name",
        "mlflow_run_name",
        "hf_mlflow_log_artifacts",
    ),
}
