"""Write a model folder with random weights, made on the GPU: for benchmarks of shapes too large to build on a CPU.

    python tools/device/random_weights.py configs/bench/llama_8b /tmp/llama_8b [--dtype bfloat16]

Reads ``config.json`` from the first folder, builds the model from it on the GPU (the CPU when there
is none) with transformers' own initialization and the seed 0, and saves it (safetensors) with the
config into the second. Building the 8B shape from its config on the device's CPU takes minutes; on the
GPU, seconds. Then ``--set base_model=/tmp/llama_8b --set random_init_weights=false`` loads it as a
user's model is loaded, from disk.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import transformers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    start = time.perf_counter()
    config = transformers.AutoConfig.from_pretrained(args.config_dir)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    model.save_pretrained(args.out_dir, safe_serialization=True)
    count = sum(p.numel() for p in model.parameters())
    print(f"{args.out_dir}: {count:,} random parameters in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
