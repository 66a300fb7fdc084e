"""The peer of ``ktrain bench --peer trl``: TRL's ``DPOTrainer`` on the same model shape and the same pairs.

The model is built as the ``hf`` peer builds it (fp32 weights, SDPA; under an adapter, a bf16 base where the
ktrain side's is: ``bfloat16``); TRL's ``bf16``/``fp16`` setting follows the config, which makes the Hugging
Face Trainer autocast to that dtype, as the ktrain side does. The reference is a
frozen copy of the model as built (full fine-tuning), or, under ``adapter: lora``, the base with the adapter
switched off (TRL makes the peft model from the ``LoraConfig`` the lora keys describe). The pairs are handed
over already as token ids (``prompt_ids``, ``chosen_ids``, ``rejected_ids``: TRL's own tokenized columns), so
neither side times tokenization. Same micro batch, accumulation, ``rl_beta``, learning rate, clipping,
gradient checkpointing as the config; AdamW fused on a GPU, a constant schedule, no warm-up, no logging but
the first step's loss (TRL's per-step metrics are still computed, as in every TRL run); the pairs in order, not
shuffled, so both sides train on the same micro-batches.

TRL's step is timed from the start of step ``warmup + 1`` to the end of the last (callbacks mark the end of
the backward passes and of the optimizer step: the ``data`` part is inside ``forward_backward``). ``trl``
and ``datasets`` are imported only when this peer is chosen.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from typing import Any

import torch

from ktrain.bench.peer import build_model
from ktrain.bench.rows import PairRows, pad_tokenizer
from ktrain.bench.timing import Timed, Timeline, peak_memory_gib
from ktrain.run.metrics import flops_per_token


def _lora_config(config: Any) -> Any:
    """The ``LoraConfig`` of the lora keys (None without ``adapter: lora``)."""
    if getattr(config, "adapter", None) is None:
        return None
    import peft

    # lora_target_linear: every linear layer but the output layer, as the lora plugin adapts them
    targets = "all-linear" if config.lora_target_linear else config.lora_target_modules
    return peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=targets,
    )


def describe(config: Any, compute_dtype: torch.dtype) -> str:
    """The peer's name in the report."""
    import trl

    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(compute_dtype, "fp32")
    what = "LoRA, adapter off as reference" if _lora_config(config) else "frozen copy as reference"
    if getattr(config, "precompute_ref_log_probs", False):
        what += ", its log-probabilities precomputed (no reference model held)"
    weights = "a bf16 base, fp32 adapter weights" if _bf16_base(config) else "fp32 weights"
    return f"TRL {trl.__version__} DPOTrainer: {weights} + {dtype} autocast, {what}"


def _bf16_base(config: Any) -> bool:
    """Whether the peer's frozen base loads in bf16: under an adapter where the ktrain side's does
    (``bfloat16``), as TRL's LoRA users load it; peft keeps the adapter's weights in fp32."""
    return bool(config.bfloat16) and _lora_config(config) is not None


def run_trl_peer(
    config: Any, pairs: PairRows, pad_id: int, device: torch.device, compute_dtype: torch.dtype, warmup: int, steps: int
) -> tuple[Timed, float, list[dict[str, Any]]]:
    """Build TRL's ``DPOTrainer`` on ``pairs`` and time its steps; return the timing, the training FLOPs a token of
    the model, and its pass before training under ``precompute_ref_log_probs`` (timed apart, as on the ktrain
    side; TRL computes every pair of its dataset, one a step). Everything it built is freed when it returns."""
    import datasets
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.manual_seed(config.seed)
    model = build_model(config, device, "bf16" if _bf16_base(config) else "mixed")
    lora = _lora_config(config)
    precompute = bool(getattr(config, "precompute_ref_log_probs", False))  # the preference plugin's key
    reference = None if lora or precompute else copy.deepcopy(model)
    timeline = Timeline(device)
    total = warmup + steps
    found: dict[str, Any] = {}

    class Marks(TrainerCallback):
        """The timeline's start before the first timed step, its marks, and its stop after the last step."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == warmup:
                timeline.start()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            timeline.mark("forward_backward")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            timeline.mark("optimizer")
            if state.global_step == total:
                found["stopped"] = timeline.stop()
                found["peak"] = peak_memory_gib(device)

    class PreTokenized(DPOTrainer):
        """TRL's DPOTrainer given its tokenized columns directly; it keeps its last micro-batch's loss (the
        trainer logs only the mean over all steps at the end)."""

        def _prepare_dataset(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
            return dataset

        def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int) -> Any:
            start = time.perf_counter()
            out = super()._precompute_ref_logps(dataset, name, batch_size)
            done = {"name": "reference log-probabilities", "seconds": time.perf_counter() - start}
            found.setdefault("passes", []).append({**done, "items": len(dataset), "unit": "pairs"})
            return out

        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            out = super().compute_loss(*args, **kwargs)
            found["loss"] = (out[0] if isinstance(out, tuple) else out).detach()
            return out

    with tempfile.TemporaryDirectory(prefix="ktrain-bench-trl-") as out:
        args = DPOConfig(
            output_dir=out,
            report_to="none",
            save_strategy="no",
            max_steps=total,
            per_device_train_batch_size=config.micro_batch_size,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            learning_rate=config.learning_rate,
            lr_scheduler_type="constant",
            weight_decay=config.weight_decay,
            adam_beta1=config.adam_beta1,
            adam_beta2=config.adam_beta2,
            adam_epsilon=config.adam_epsilon,
            max_grad_norm=config.max_grad_norm or math.inf,
            optim="adamw_torch_fused" if device.type == "cuda" else "adamw_torch",
            bf16=compute_dtype == torch.bfloat16,
            fp16=compute_dtype == torch.float16,
            use_cpu=device.type != "cuda",
            gradient_checkpointing=bool(config.gradient_checkpointing),
            beta=config.rl_beta if config.rl_beta is not None else 0.1,
            loss_type=["sigmoid"],
            precompute_ref_log_probs=precompute,
            max_length=config.sequence_len,
            logging_first_step=True,
            logging_steps=10**9,
            dataloader_num_workers=0,
            train_sampling_strategy="sequential",  # the pairs in the order the ktrain side takes them
            seed=config.seed,
            disable_tqdm=True,
        )
        trainer = PreTokenized(
            model=model,
            ref_model=reference,
            args=args,
            train_dataset=datasets.Dataset.from_dict(pairs.columns(total)),
            processing_class=pad_tokenizer(pad_id),
            peft_config=lora,
            callbacks=[Marks()],
        )
        flops = flops_per_token(trainer.model, config.sequence_len)  # after TRL made the peft model: frozen weights
        trainer.train()
        first = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
        last = float(found["loss"])
        del trainer, model, reference
    seconds, parts, state = found["stopped"]
    tokens, collections = pairs.tokens_per_step * steps, timeline.collections.totals()
    timed = Timed(steps, tokens, seconds, parts, first, last, found["peak"], state, collections)
    return timed, flops, found.get("passes", [])
