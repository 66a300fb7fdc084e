"""Greedy answers from a chat model: ``ktrain generate`` and the exact-match evaluation share this."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch


@torch.no_grad()
def greedy_answers(
    model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, batch_size: int = 32
) -> list[str]:
    """Answer each user message by greedy decoding after the chat template's generation prompt.

    Works on any wrapping of the model (DDP, FSDP: every rank must call it with the same prompts),
    since it only calls forward: no KV cache, positions from the attention mask of left-padded rows.
    """
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    answers: list[str] = []
    was_training = model.training
    model.eval()
    for start in range(0, len(prompts), batch_size):
        encoded = [
            list(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=True
                )["input_ids"]
            )
            for p in prompts[start : start + batch_size]
        ]
        width = max(len(e) for e in encoded)
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=device)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
        done = torch.zeros(len(encoded), dtype=torch.bool, device=device)
        out: list[list[int]] = [[] for _ in encoded]
        for _ in range(max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
            token = logits.argmax(-1)
            for i, t in enumerate(token.tolist()):
                if not done[i]:
                    if t == eos:
                        done[i] = True
                    else:
                        out[i].append(t)
            if bool(done.all()):
                break
            ids = torch.cat([ids, token[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(token)[:, None]], dim=1)
        answers += [tokenizer.decode(o, skip_special_tokens=True).strip() for o in out]
    model.train(was_training)
    return answers


def adapter_model(run_dir: Path, adapter: Path) -> Any:
    """The base of the run in ``run_dir`` rebuilt as the run built it, with the peft adapter of ``adapter`` on it.

    The base comes from the run's own config through its plugins: their model arguments (a quantized
    base is quantized again the same way) and its ``model_loader``, seeded as the run was (so that
    ``random_init_weights`` gives the same weights).
    """
    import peft

    from ktrain.config.plan import prepare
    from ktrain.run.context import Run

    plan = prepare(run_dir / "config.yaml", with_defaults=True)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    run = Run.one_process(plan, run_dir, device)
    run.tokenizer = run.hook.ktrain_load_tokenizer(run=run)
    torch.manual_seed(plan.config.seed)
    model_kwargs = run.plan.plugins.collect("ktrain_collect_model_kwargs", "model argument", run=run)
    base = run.hook.ktrain_load_model(run=run, model_kwargs=model_kwargs)
    return peft.PeftModel.from_pretrained(base.to(device), adapter).eval()


def generate_cli(run_dir: str, prompt: str, max_new_tokens: int) -> int:
    """``ktrain generate RUN_DIR PROMPT``: load ``RUN_DIR/final`` (or a model folder) and answer.

    An adapter run's ``final/`` holds the adapter alone: the run's base is rebuilt and the adapter put on it.
    """
    import transformers

    folder = Path(run_dir)
    if (folder / "final").is_dir():
        folder = folder / "final"
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").exists():
        config = folder.parent / "config.yaml"
        if not config.is_file():
            print(
                f"ktrain: {folder} holds an adapter without the run that trained it (no {config}); "
                "merge it into its base in the run folder with `ktrain merge-lora RUN_DIR`",
                file=sys.stderr,
            )
            return 2
        model = adapter_model(folder.parent, folder)
    elif (folder / "config.json").exists():
        model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    else:
        print(f"ktrain: {run_dir} holds no trained model (no final/config.json); train it first", file=sys.stderr)
        return 2
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    print(greedy_answers(model, tokenizer, [prompt], max_new_tokens)[0])
    return 0
