"""``fp8_recipe: delayed`` under FSDP2 on two CPU ranks (gloo; torch emulates the float8 products).

FSDP2 gathers each block's weights before its forward, so every rank casts the whole weight, with the scale of
the whole weight's maximum; each rank's inputs and output gradients are its own rows', and so are their
histories, which the kernel saves in each rank's own ``rank-R.pt``. Two ranks fed the same rows must therefore
train exactly as one process fed them: the same losses to the bit and the same histories.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fp8_tiny import delayed_keys, tiny_llama, train_steps
from torch.distributed.fsdp import fully_shard

from ktrain_fp8.runtime import convert

STEPS = 4


def _train(model: torch.nn.Module, rows: slice) -> list[float]:
    """``STEPS`` AdamW steps on ``rows`` of each batch; the losses."""
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 96, (2, 32), generator=generator)[rows] for _ in range(STEPS)]
    return train_steps(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batches)


def _sharded_run(rows: slice) -> dict:
    """A tiny Llama converted to delayed scaling, then sharded by FSDP2 over the group, trained on ``rows``."""
    model = tiny_llama()
    scales = convert(model, delayed_keys())  # before sharding, as the runtime converts
    for block in model.model.layers:
        fully_shard(block)
    fully_shard(model)
    return {"losses": _train(model, rows), "history": scales.history.tolist()}


def _rank(rank: int, folder: str) -> None:
    """Rank ``rank`` of two: a run on the same rows as the other rank, then one on its own row of each batch."""
    sys.path.insert(0, str(Path(__file__).parent))
    dist.init_process_group("gloo", store=dist.FileStore(f"{folder}/store", 2), rank=rank, world_size=2)
    runs = [_sharded_run(slice(None)), _sharded_run(slice(rank, rank + 1))]
    Path(folder, f"rank{rank}.json").write_text(json.dumps(runs))
    dist.destroy_process_group()


def test_two_fsdp2_ranks_fed_the_same_rows_train_as_one_process(tmp_path: Path) -> None:
    model = tiny_llama()
    scales = convert(model, delayed_keys())
    one = {"losses": _train(model, slice(None)), "history": scales.history.tolist()}
    assert scales.calibrated and bool(scales.history.count_nonzero())  # the histories were written
    mp.start_processes(_rank, args=(str(tmp_path),), nprocs=2, start_method="spawn")
    (same0, own0), (same1, own1) = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert same0 == same1 == one
    assert own0["history"] != own1["history"]  # each rank's own rows: its own maxima
