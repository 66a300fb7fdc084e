"""``precompute_ref_log_probs: true``: the reference's log-probabilities of every pair, computed once before training.

Before the first step the model is still the reference (the model as loaded; under an adapter, the base with
the adapter switched off, or left on while it does not change the base: ``unchanged_base``), so one forward
pass, no backward, over every sample of the preprocessing cache (the training samples and the test samples)
gives each pair's summed log-probabilities of its chosen and rejected answers, in the layout training collates
them in (``ktrain_preference.layout``). The ranks share the samples
and sum their parts. They are kept beside the cache's tables, in a file
named by the model and the compute dtype, so a resumed run (or the next run on the same data and model)
reads them. A sample is found again by a digest of its tokens and labels. Training then holds no reference
model and runs no reference forward. The pass's time is left on the objective (``passes``), which
``ktrain bench`` reports apart from the training steps.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ktrain.data import cache, pipeline
from ktrain.run import distributed
from ktrain_preference.pairs import sample_key


def _model_key(config: Any, dtype: torch.dtype) -> str:
    """The model's identity: its source (and, for a local folder, its files' sizes and times) and the dtypes."""
    facts: list[Any] = [config.base_model, config.revision_of_model, config.random_init_weights, str(dtype)]
    facts += [getattr(config, "bfloat16", None), config.seed if config.random_init_weights else None]
    source = Path(str(config.base_model))
    if source.is_dir():
        facts += [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(source.iterdir()) if p.is_file()]
    return hashlib.sha256(json.dumps(facts, default=str).encode()).hexdigest()[:16]


def _compute(run: Any, objective: Any, model: Any, samples: list[Any], as_policy: bool) -> np.ndarray:
    """``[samples, 2]`` summed log-probabilities (chosen, rejected) of ``model``, the ranks sharing the samples.

    ``as_policy``: the forward of a training step (training mode, autograd recording, the graph then dropped),
    so that a compiled model runs the very graph its first step runs; else evaluation mode without gradients."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    micro = run.config.micro_batch_size
    mine = list(range(rank, len(samples), world))
    batches = math.ceil(math.ceil(len(samples) / world) / micro)  # the same on every rank: sharded models need it
    pad_to = run.config.sequence_len if run.config.pad_to_sequence_len else None
    autocast = (
        torch.autocast(run.device.type, dtype=run.compute_dtype)
        if run.compute_dtype != torch.float32
        else contextlib.nullcontext()
    )
    out = torch.zeros(len(samples), 2, dtype=torch.float32, device=run.device)
    was_training = model.training
    model.train(as_policy)
    with torch.set_grad_enabled(as_policy), autocast:
        for b in range(batches):
            picked = mine[b * micro : (b + 1) * micro]
            rows = [[samples[i]] for i in picked] or [[samples[0]]]  # a rank without samples left runs one anyway
            batch = objective.collate(rows, run.pad_id, pad_to, None, run.device)
            inputs = {k: v.to(run.device) for k, v in batch.items()}
            sums = objective.answer_logps(model, inputs).detach()  # the graph goes now, before the next forward
            if picked:
                out[picked] = torch.stack(sums.float().chunk(2), dim=1)
    model.train(was_training)
    if world > 1:
        dist.all_reduce(out)
    return out.cpu().numpy()


def _dropout(model: Any) -> bool:
    """Whether a forward in training mode drops anything (a dropout module, or attention dropout, above 0)."""
    modules = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    return modules or float(getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0) > 0


def _sharded(model: Any) -> bool:
    """Whether the model is sharded (a DTensor, a ZeRO-3 partition, an FSDP1 unit): a shard shows a rank only its
    part, and a sharding engine's forward expects its backward."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(p, DTensor) or hasattr(p, "ds_id") for p in model.parameters()):
        return True
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


def unchanged_base(model: Any) -> bool:
    """Whether a peft model's adapter leaves its base's function unchanged, as peft initializes it: every
    ``lora_B`` zero, nothing trained in full beside it, no parameter sharded."""
    named = list(model.named_parameters())
    if _sharded(model) or any("modules_to_save" in n for n, _ in named):
        return False
    return all(not p.any() for n, p in named if "lora_B" in n)


def _as_reference(model: Any) -> tuple[Any, bool]:
    """The context the reference pass runs in, and whether it runs the policy's own forward: a peft model's
    adapter is switched off, unless it leaves the base unchanged. The policy's own forward (the model as it is,
    in training mode with autograd recording, as in the first step; where nothing drops out and nothing is
    sharded) is the reference's function computed the same way, so step 1's loss is ln 2 to the bit: a compiled
    forward without autograd, or the base's own forward, is another graph, whose fused element-wise work rounds
    differently in a bf16 residual stream."""
    if not hasattr(model, "disable_adapter") or unchanged_base(model):
        return contextlib.nullcontext(), not (_sharded(model) or _dropout(model))
    return model.disable_adapter(), False


def precomputed(run: Any, objective: Any, model: Any) -> dict[bytes, tuple[float, float]]:
    """Every cached sample's reference (chosen, rejected) log-probabilities: read, or computed with ``model`` (the
    model before any step; a peft model's adapter switched off where it changes the base) and written beside the
    cache."""
    folder = pipeline.cache_folder(run.config, run.output_dir, run.tokenizer, run.plan.formats)
    path = folder / f"reference-logps-{_model_key(run.config, run.compute_dtype)}.npz"
    if not path.is_file():
        prepared = cache.read(folder)
        tables = [t for t in (prepared.train, prepared.test) if t is not None]
        samples = [table[i] for table in tables for i in range(len(table))]
        start = time.perf_counter()
        reference, as_policy = _as_reference(model)
        with reference:
            values = _compute(run, objective, model, samples, as_policy)  # ends on the host: the device has finished
        objective.passes = [{"name": "reference log-probabilities", "seconds": time.perf_counter() - start,
                             "items": len(samples), "unit": "pairs"}]  # fmt: skip
        if run.local_rank == 0:
            digests = b"".join(sample_key(s.input_ids, s.labels) for s in samples)
            keys = np.frombuffer(digests, dtype=np.uint8).reshape(len(samples), 16)
            partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npz")
            np.savez(partial, keys=keys, values=values)
            os.replace(partial, path)
        distributed.barrier()
        if run.is_main:
            print(f"preference: the reference's log-probabilities of {len(samples)} samples into {path}", flush=True)
    elif run.is_main:
        print(f"preference: the reference's log-probabilities read from {path}", flush=True)
    stored = np.load(path)
    return {k.tobytes(): (float(c), float(r)) for k, (c, r) in zip(stored["keys"], stored["values"], strict=True)}
