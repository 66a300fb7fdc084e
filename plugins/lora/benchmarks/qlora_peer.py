"""The QLoRA peer: transformers + peft + bitsandbytes as a user writes them, timed like ``ktrain bench``.

    python plugins/lora/benchmarks/qlora_peer.py CONFIG [--steps 6] [--warmup 2] [--json FILE] [--weights DIR]

From a ktrain config (configs/bench/llama_8b_qlora.yaml) it reads the model (``base_model`` or
``base_model_config``, random weights), ``sequence_len``, ``micro_batch_size``,
``gradient_checkpointing``, ``lora_r``, ``lora_alpha``, ``learning_rate`` and ``bf16``, and builds what a
user writes: the weights quantized at load (nf4, double quantization, compute in the run's dtype),
``prepare_model_for_kbit_training``, LoRA on every linear layer (peft's ``all-linear``), SDPA,
``torch.optim.AdamW``. Random tokens, every token trained. It prints tokens/s and the peak GPU memory
from the start of the build (none on a CPU); run it in the same device call as ``ktrain bench`` on the
same config, so that the two are measured on one machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import peft
import torch
import transformers
import yaml


def build(config: dict, device: torch.device, weights: Path | None = None) -> torch.nn.Module:
    """The quantized model with its adapter, as the peer builds it; ``weights``: a model folder to load."""
    dtype = torch.bfloat16 if config.get("bf16") is True else torch.float32
    quantization = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
    )
    load = {
        "quantization_config": quantization,
        "dtype": dtype,
        "attn_implementation": "sdpa",
        "device_map": {"": device},
    }
    if weights is not None:
        model = transformers.AutoModelForCausalLM.from_pretrained(weights, **load)
    else:
        shape = transformers.AutoConfig.from_pretrained(config.get("base_model_config") or config["base_model"])
        torch.manual_seed(config.get("seed", 0))
        dense = transformers.AutoModelForCausalLM.from_config(shape, dtype=dtype, attn_implementation="sdpa")
        model = type(dense).from_pretrained(None, config=shape, state_dict=dense.state_dict(), **load)
        del dense
    model.config.use_cache = False
    checkpointing = bool(config.get("gradient_checkpointing"))
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    lora = peft.LoraConfig(
        r=config.get("lora_r", 8), lora_alpha=config.get("lora_alpha", 16), target_modules="all-linear"
    )
    return peft.get_peft_model(model, lora)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--weights", type=Path, help="load this model folder instead of random weights")
    args = parser.parse_args()
    config = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    model = build(config, device, args.weights)
    print(f"qlora peer built in {time.perf_counter() - start:.1f} s", flush=True)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config["learning_rate"])
    rows, length = config["micro_batch_size"], config["sequence_len"]
    ids = torch.randint(0, model.config.vocab_size, (rows, length), device=device)

    def step() -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    report = {
        "peer": "transformers + peft + bitsandbytes (nf4, double quantization, all-linear LoRA)",
        "tokens_per_s": rows * length * args.steps / seconds,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        "last_loss": float(loss),
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    memory = f"{report['peak_memory_gib']:.1f} GiB" if report["peak_memory_gib"] is not None else "n/a (CPU)"
    print(f"qlora peer: {report['tokens_per_s']:,.0f} tokens/s, peak {memory}, loss {report['last_loss']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
