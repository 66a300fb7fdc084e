"""Plain-PyTorch sanity trainer for the quickstart task (used to pick its hyperparameters).

Builds LlamaForCausalLM with random weights from ``configs/quickstart/model``, trains on the chat rows in
``configs/quickstart/data/train.jsonl`` with loss only on the assistant answer and its ``<|im_end|>``,
and reports greedy exact-match accuracy on ``test.jsonl`` before and after training.

Usage: ``python tools/quickstart/tune.py [--steps 1000 --lr 2e-3 ...]`` (see ``--help``).
"""

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[2] / "configs" / "quickstart"


def load_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def encode(tok, msgs: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of the whole chat and labels that keep only the assistant answer + <|im_end|>."""
    prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(msgs, tokenize=False)
    assert full.startswith(prompt)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    ids = tok(full, add_special_tokens=False)["input_ids"]
    assert ids[: len(p_ids)] == p_ids
    n_answer = len(tok(msgs[1]["content"], add_special_tokens=False)["input_ids"]) + 1  # + <|im_end|>
    labels = [-100] * len(p_ids) + ids[len(p_ids) : len(p_ids) + n_answer]
    return ids, labels + [-100] * (len(ids) - len(labels))


def collate(batch: list[tuple[list[int], list[int]]], pad_id: int) -> dict:
    n = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), n), pad_id)
    labels = torch.full((len(batch), n), -100)
    mask = torch.zeros((len(batch), n), dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        ids[i, : len(x)], labels[i, : len(y)], mask[i, : len(x)] = torch.tensor(x), torch.tensor(y), 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


@torch.no_grad()
def accuracy(model, tok, rows: list[dict], max_new: int = 8) -> float:
    """Greedy exact match; prompts of equal length are batched together (no padding needed)."""
    model.eval()
    groups: dict[int, list[tuple[list[int], str]]] = {}
    for r in rows:
        p = tok.apply_chat_template(r["messages"][:1], tokenize=False, add_generation_prompt=True)
        ids = tok(p, add_special_tokens=False)["input_ids"]
        groups.setdefault(len(ids), []).append((ids, r["messages"][1]["content"].strip()))
    correct = 0
    for items in groups.values():
        x = torch.tensor([ids for ids, _ in items], device=model.device)
        out = x[:, :0]
        for _ in range(max_new):
            nxt = model(torch.cat([x, out], 1)).logits[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], 1)
            if (out == tok.eos_token_id).any(1).all():
                break
        for row, (_, answer) in zip(out.tolist(), items, strict=True):
            row = row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row
            correct += tok.decode(row, skip_special_tokens=True).strip() == answer
    model.train()
    return correct / len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--eval-every", type=int, default=0, help="also eval every N steps (0: only at the end)")
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(ROOT / "model")
    cfg = AutoConfig.from_pretrained(ROOT / "model")
    overrides = {
        "num_hidden_layers": args.layers,
        "hidden_size": args.hidden,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "intermediate_size": args.intermediate,
    }
    for k, v in overrides.items():
        if v is not None:
            setattr(cfg, k, v)
    cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
    model = LlamaForCausalLM(cfg).float().to(args.device)
    train = [encode(tok, r["messages"]) for r in load_rows(ROOT / "data" / "train.jsonl")]
    test = load_rows(ROOT / "data" / "test.jsonl")
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"params={n_params:,} layers={cfg.num_hidden_layers} hidden={cfg.hidden_size} "
        f"heads={cfg.num_attention_heads} kv_heads={cfg.num_key_value_heads} "
        f"intermediate={cfg.intermediate_size} max_pos={cfg.max_position_embeddings} "
        f"max_seq_len={max(len(x) for x, _ in train)} train_rows={len(train)} test_rows={len(test)}"
    )
    print(
        f"batch={args.batch} accum={args.accum} lr={args.lr} warmup={args.warmup} steps={args.steps} "
        f"wd={args.wd} sched=cosine(to 0) adamw betas=(0.9,{args.beta2}) clip=1.0 dtype=fp32 seed={args.seed}"
    )

    t0 = time.time()
    print(f"accuracy before: {accuracy(model, tok, test):.3f} (eval {time.time() - t0:.1f}s)")

    matrices = [p for p in model.parameters() if p.dim() >= 2]  # weight decay on matrices only
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": args.wd}, {"params": others, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, args.beta2))
    warm, decay = args.warmup, max(1, args.steps - args.warmup)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / (warm + 1) if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / decay))
    )
    rng = random.Random(args.seed)
    order: list[int] = []
    t0 = time.time()
    for step in range(args.steps):
        total = 0.0
        for _ in range(args.accum):
            if len(order) < args.batch:
                order += rng.sample(range(len(train)), len(train))
            idx, order = order[: args.batch], order[args.batch :]
            batch = collate([train[i] for i in idx], tok.pad_token_id)
            loss = model(**{k: v.to(args.device) for k, v in batch.items()}).loss / args.accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if args.eval_every and step % args.eval_every == 0 and step:
            print(f"step {step:5d} test accuracy {accuracy(model, tok, test):.3f}", flush=True)
        if step % 100 == 0 or step == args.steps - 1:
            print(
                f"step {step:5d} loss {total:.4f} lr {sched.get_last_lr()[0]:.2e} t {time.time() - t0:.0f}s", flush=True
            )
    train_s = time.time() - t0
    t0 = time.time()
    acc = accuracy(model, tok, test)
    print(
        f"accuracy after: {acc:.3f} (eval {time.time() - t0:.1f}s) train_wall={train_s:.1f}s "
        f"epochs={args.steps * args.batch * args.accum / len(train):.2f}"
    )


if __name__ == "__main__":
    main()
