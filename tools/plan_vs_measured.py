"""Predicted against measured peak memory for the configs of configs/bench, from the reports in docs/results.

Each row is a config (with the ``--set`` values its report ran with) and a ``ktrain bench`` report of one H200;
the prediction is ``ktrain.memory``'s peak per rank for one rank (what ``torch.cuda.max_memory_allocated``
measures: the allocator's overhead and the CUDA context are left out). No device needed:

    python tools/plan_vs_measured.py
"""

from __future__ import annotations

import json
from pathlib import Path

from ktrain.config.plan import prepare
from ktrain.memory.model import predict

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
ROWS = [  # config, --set values, report (its ktrain.peak_memory_gib)
    ("llama_1p5b", [], "h200-2026-12-02/llama_1p5b.json"),
    ("llama_1p5b", ["fsdp_version=2"], "h200-2026-12-02/llama_1p5b_fsdp2.json"),
    ("llama_1p5b_zero2", [], "h200-2026-12-02/llama_1p5b_zero2.json"),
    ("llama_1p5b_fsdp2_liger", [], "h200-2026-12-02/llama_1p5b_fsdp2_liger.json"),
    ("llama_1p5b_fsdp2_liger_ac", [], "h200-2026-12-02/llama_1p5b_fsdp2_liger_ac.json"),
    ("llama_1p5b_liger_master", [], "h200-2026-12-03c/llama_1p5b_liger_master_config.json"),
    ("llama_1p5b_compile_master", [], "h200-2026-12-03d/compile_call2.json"),
    ("llama_1p5b_fused_loss_master", [], "h200-2026-12-03g/llama_1p5b_fused_loss_master_call2.json"),
    ("llama_1p5b_packed", [], "h200-2026-12-02b/llama_1p5b_packed.json"),
    ("llama_8b_qlora", [], "h200-2026-12-03/llama_8b_qlora.json"),
    ("llama_8b_qlora_liger", [], "h200-2026-12-03/llama_8b_qlora_liger.json"),
]


def compare() -> list[tuple[str, float, float, str]]:
    """(config as run, predicted GiB, measured GiB, what is not modelled) for each row of ``ROWS``."""
    out = []
    for name, sets, report in ROWS:
        measured = json.loads((REPO / "docs" / "results" / report).read_text(encoding="utf-8"))["ktrain"]
        config = REPO / "configs" / "bench" / f"{name}.yaml"
        plan = prepare(config, [*sets, "datasets=[{path: .}]"], world_size=1)
        prediction = predict(plan.config, plan.mesh, plan.plugins)
        shown = name + "".join(f" --set {s}" for s in sets)
        out.append((shown, prediction.peak / GIB, measured["peak_memory_gib"], ", ".join(prediction.not_modelled)))
    return out


def main() -> None:
    """Print the table (markdown)."""
    print("| config | predicted GiB | measured GiB | predicted / measured | not modelled |")
    print("| --- | --- | --- | --- | --- |")
    for shown, got, want, missing in compare():
        print(f"| `{shown}` | {got:.1f} | {want:.1f} | {got / want:.2f} | {missing} |")


if __name__ == "__main__":
    main()
