"""``ktrain bench``: the config's step timed beside the plain Hugging Face step, on CPU with a tiny Llama.

The runs go through the CLI in a fresh process, as a user runs them. ``KTRAIN_PEAK_TFLOPS`` gives the
CPU a peak so that MFU is computed; the FLOPs a token are checked against a count by hand from the
model's shape.
"""

from __future__ import annotations

import gc
import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from ktrain.bench.command import bench_plan
from ktrain.cli import main
from ktrain.run.metrics import flops_per_token, non_embedding_params
from ktrain.testing import dataset, ktrain, model_dir, write_config
from tests.kit import REPO

SHAPE = {  # tests.kit.model_dir's Llama: hidden 64, 2 layers, 4 heads of 16, 2 KV heads, intermediate 128
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "intermediate": 128,
}


def hand_non_embedding_params(vocab: int) -> int:
    """Parameters outside the input embeddings of the tiny Llama, counted from its shape (untied head)."""
    h, d, i = SHAPE["hidden"], SHAPE["head_dim"], SHAPE["intermediate"]
    attention = h * SHAPE["heads"] * d * 2 + h * SHAPE["kv_heads"] * d * 2  # q and o; k and v
    block = attention + 3 * h * i + 2 * h  # gate, up, down; two RMSNorms
    return SHAPE["layers"] * block + h + vocab * h  # the final norm and the output layer


def bench_json(tmp_path: Path, *args: str, peak_tflops: str = "0.5") -> tuple[dict, str]:
    out = tmp_path / "bench.json"
    done = ktrain("bench", *args, "--json", str(out), env={"KTRAIN_PEAK_TFLOPS": peak_tflops, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def check_side(side: dict, report: dict) -> None:
    """Every figure of a side is there and positive; MFU is tokens/s x FLOPs a token / peak."""
    for key in ("tokens_per_s", "mfu", "step_s", "flops_per_token", "first_loss", "last_loss"):
        assert side[key] > 0, key
    assert set(side["split_s"]) == {"data", "forward_backward", "optimizer"}
    assert all(seconds > 0 for seconds in side["split_s"].values()), side["split_s"]
    # the parts fill the step: within 5%, or 2 ms (steps of 10 ms on a busy 2-core machine left 1.4 ms between the
    # parts, the host switching to other work)
    assert sum(side["split_s"].values()) == pytest.approx(side["step_s"], rel=0.05, abs=2e-3)
    assert side["mfu"] == pytest.approx(side["tokens_per_s"] * side["flops_per_token"] / (report["peak_tflops"] * 1e12))
    assert side["peak_memory_gib"] is None  # n/a on a CPU
    assert side["device_state"] is None  # no NVML reading of a CPU


def test_bench_synthetic_with_the_peer(tmp_path: Path) -> None:
    """A config without datasets runs on random tokens; both sides report their figures; the FLOPs a token
    match the hand count; the same init and rows give both sides the same first loss; nothing is written to
    output_dir."""
    model_dir(tmp_path, vocab_size=100)
    config = tmp_path / "bench.yaml"
    keys = {
        "base_model": str(tmp_path / "model"),
        "random_init_weights": True,
        "sequence_len": 32,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "bf16": True,
        "output_dir": str(tmp_path / "out"),
        "seed": 3,
    }
    config.write_text(yaml.safe_dump(keys))
    report, stdout = bench_json(tmp_path, str(config), "--steps", "3", "--warmup", "1", "--peer", "hf")
    assert report["rows"] == "synthetic random tokens"
    assert report["peak_tflops"] == 0.5
    want = 6 * hand_non_embedding_params(100) + 12 * SHAPE["layers"] * SHAPE["hidden"] * 32
    assert report["formula"]["non_embedding_params"] == hand_non_embedding_params(100)
    for side in (report["ktrain"], report["peer"]):
        check_side(side, report)
        assert side["flops_per_token"] == want
    assert report["peer"]["name"] == "peer hf: fp32 weights + bf16 autocast"
    assert report["ktrain"]["first_loss"] == pytest.approx(report["peer"]["first_loss"], rel=1e-3)
    assert report["ktrain"]["first_loss"] == pytest.approx(math.log(100), rel=0.05)  # random init, random tokens
    assert report["ratio"] == pytest.approx(report["ktrain"]["tokens_per_s"] / report["peer"]["tokens_per_s"])
    tokens = 2 * 32 * 2
    assert f"micro batch 2 x sequence 32 x accumulation 2 = {tokens} tokens a step" in stdout
    assert f"= 6 x {hand_non_embedding_params(100):,} parameters outside the embeddings + 12 x 2 layers" in stdout
    assert "ktrain / peer: " in stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["datasets", "pretraining_dataset"])
def test_bench_on_the_configs_data(kind: str, tmp_path: Path) -> None:
    """With data, both sides train on the config's rows: tokenized in the temporary run directory, or
    streamed and packed (read once for both sides); the same rows give the same first loss."""
    model_dir(tmp_path)
    dataset(tmp_path, 64)
    keys: dict = {"micro_batch_size": 4}
    if kind == "pretraining_dataset":
        text = " ".join(["the stream of text in tokens"] * 30)
        (tmp_path / "raw.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for _ in range(20)))
        keys = {"datasets": [], "pretraining_dataset": [{"path": str(tmp_path / "raw.jsonl")}], "micro_batch_size": 2}
    config = write_config(tmp_path, **keys)
    report, stdout = bench_json(tmp_path, str(config), "--steps", "2", "--warmup", "1", "--peer", "hf")
    assert report["rows"] == "the config's datasets"
    check_side(report["ktrain"], report)
    check_side(report["peer"], report)
    assert report["peer"]["name"] == "peer hf: fp32 weights, no autocast"  # the config computes in fp32
    assert report["ktrain"]["first_loss"] == pytest.approx(report["peer"]["first_loss"], rel=1e-4)
    assert ("pretraining_dataset streamed" in stdout) == (kind == "pretraining_dataset")
    assert not (tmp_path / "out").exists()


def test_bench_packs_variable_lengths_beside_a_padded_peer(tmp_path: Path) -> None:
    """``--lengths``: samples of log-normal lengths, packed on the ktrain side (a block-diagonal mask keeps them
    apart on a CPU), one a row and padded to the longest on the peer's; tokens/s counts the samples' tokens, and
    the report gives each side's share of padding."""
    model_dir(tmp_path, vocab_size=100)
    keys = {"datasets": [], "sequence_len": 64, "micro_batch_size": 2, "sample_packing": True}
    keys["pad_to_sequence_len"] = True  # the ktrain rows only: the peer pads to its longest sample
    config = write_config(tmp_path, **keys)
    args = ("--steps", "3", "--warmup", "1", "--peer", "hf", "--lengths", "8:48", "--peer-micro-batch", "4")
    report, stdout = bench_json(tmp_path, str(config), *args)
    assert report["rows"].startswith("random tokens, samples of log-normal lengths (median 8, sigma 1, at most 48)")
    check_side(report["ktrain"], report)
    check_side(report["peer"], report)
    assert report["ktrain"]["padding"] < 0.2 < report["peer"]["padding"] < 0.6  # (to 64: about 85%)
    for side in (report["ktrain"], report["peer"]):  # random init, random tokens: about log(vocab)
        assert side["first_loss"] == pytest.approx(math.log(100), rel=0.05)
    assert "loss@1 padding" in stdout and "tokens/s counts the samples' tokens" in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--lengths", "300:200"), "--lengths: expected MEDIAN:MAX, two whole numbers with 2 <= MEDIAN <= MAX"),
        (("--lengths", "8:100"), "--lengths: the longest sample (100) exceeds sequence_len (64); lower MAX"),
        (("--peer-micro-batch", "4"), "--peer-micro-batch goes with --lengths"),
    ],
)
def test_bench_refuses_bad_lengths(
    args: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Refused before anything runs: in this process, as the CLI's own answer (exit 2, one line)."""
    model_dir(tmp_path, vocab_size=100)
    config = write_config(tmp_path, datasets=[], sequence_len=64)
    code = main(["bench", str(config), "--steps", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err[-2000:]


def test_bench_reports_the_hosts_collections_and_hands_back_what_the_first_step_froze(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """In this process: each timed side's garbage-collector passes are printed, and the objects the first step
    set aside from the collector (``ktrain.run.host_gc``) are the collector's again once the steps are timed."""
    model_dir(tmp_path, vocab_size=100)
    config = write_config(tmp_path, datasets=[], sequence_len=32)
    code = main(["bench", str(config), "--steps", "2", "--warmup", "1", "--peer", "hf"])
    out = capsys.readouterr().out
    assert code == 0 and gc.get_freeze_count() == 0, out[-2000:]
    for side in ("ktrain", "peer hf"):
        assert f"host while timed, {side}: " in out and " garbage collector passes (" in out, out[-2000:]


def test_bench_peer_with_bf16_weights(tmp_path: Path) -> None:
    """``--peer-variant bf16`` casts the peer's weights to bf16: the same model, rounded."""
    model_dir(tmp_path, vocab_size=100)
    config = write_config(tmp_path, datasets=[], bf16=True, sequence_len=32)
    profile = tmp_path / "profile.txt"
    args = ("--steps", "2", "--warmup", "1", "--peer", "hf", "--peer-variant", "bf16", "--profile", str(profile))
    report, _ = bench_json(tmp_path, str(config), *args)
    check_side(report["peer"], report)
    assert report["peer"]["name"] == "peer hf: bf16 weights, no autocast"
    assert report["ktrain"]["first_loss"] == pytest.approx(report["peer"]["first_loss"], rel=0.02)
    table = profile.read_text()  # --profile: the ktrain side's ops over 3 more steps, most time first
    assert "Self CPU" in table and "aten::mm" in table, table[:2000]


def test_bench_profile_writes_a_chrome_trace(tmp_path: Path) -> None:
    """``--profile FILE.json.gz``: the three profiled steps as a gzipped Chrome trace, with the model's ops."""
    model_dir(tmp_path, vocab_size=100)
    config = write_config(tmp_path, datasets=[], sequence_len=32)
    trace = tmp_path / "steps.json.gz"
    bench_json(tmp_path, str(config), "--steps", "1", "--warmup", "1", "--profile", str(trace))
    names = {e.get("name") for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]}
    assert "aten::mm" in names


def test_bench_counts_zero3_partitions_whole(tmp_path: Path) -> None:
    """Under ZeRO-3 each rank's parameters are empty tensors; MFU still counts the whole model."""
    pytest.importorskip("ktrain_deepspeed")
    model_dir(tmp_path, vocab_size=100)
    zero3 = REPO / "tests" / "fixtures" / "deepspeed" / "zero3.json"
    config = write_config(tmp_path, datasets=[], deepspeed=str(zero3))
    report, stdout = bench_json(tmp_path, str(config), "--steps", "1", "--warmup", "1")
    assert "ZeRO-3 built the model inside zero.Init" in stdout
    assert report["formula"]["non_embedding_params"] == hand_non_embedding_params(100)
    check_side(report["ktrain"], report)


# the DPO configs time synthetic pairs (--pairs): tests/unit/test_bench_pairs.py checks them
SFT_BENCH_CONFIGS = sorted(p.name for p in (REPO / "configs" / "bench").glob("*.yaml") if "dpo" not in p.name)


@pytest.mark.parametrize("name", SFT_BENCH_CONFIGS)
def test_bench_configs_check_on_random_tokens(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each bench config is a valid one-rank run for ``ktrain bench`` (random tokens: it has no datasets)."""
    monkeypatch.chdir(REPO)
    plan, synthetic = bench_plan(f"configs/bench/{name}", [], tmp_path, synthetic=False)
    assert synthetic and plan.mesh.world_size == 1
    sequence = 2048 if name.startswith("llama_8b") else 4096  # the 8B QLoRA shape; the 1.5B Llama shape
    assert (plan.config.sequence_len, plan.config.micro_batch_size, plan.config.bf16) == (sequence, 4, True)
    master = name.endswith("_master.yaml")  # bf16 weights, fp32 masters and Adam states
    assert plan.config.optimizer == ("adamw_fp32_master" if master else "adamw_torch_fused")
    assert plan.config.bfloat16 == master


def test_the_1p5b_shape_gives_its_peers_mfu() -> None:
    """configs/bench/llama_1p5b is the 1.5B Llama shape: 1.5B parameters, and its peer's 43.7k tokens/s on a
    989 TFLOP/s H200 are 39.9% MFU (docs/performance.md), by the formula the bench prints."""
    config = transformers.AutoConfig.from_pretrained(REPO / "configs" / "bench" / "llama_1p5b")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 1_498_482_688
    assert non_embedding_params(model) == 1_235_814_400  # the figures docs/performance.md quotes
    flops = flops_per_token(model, 4096)
    assert flops == 6 * 1_235_814_400 + 12 * 16 * 2048 * 4096 == 9_025_499_136
    assert 43.7e3 * flops / 989e12 == pytest.approx(0.399, abs=0.0005)
    assert 0.6 * 989e12 / flops == pytest.approx(65.7e3, abs=50)  # 60% MFU in tokens/s


@pytest.mark.gpu
def test_bench_on_a_gpu_frees_the_peer_first(tmp_path: Path) -> None:
    """On a GPU: peak memory per side, and the ktrain side starts with the peer's memory given back."""
    model_dir(tmp_path, vocab_size=100)
    config = write_config(tmp_path, datasets=[], bf16=True, sequence_len=64)
    report, _ = bench_json(tmp_path, str(config), "--steps", "3", "--warmup", "2", "--peer", "hf")
    for side in (report["ktrain"], report["peer"]):
        assert side["peak_memory_gib"] > 0 and side["tokens_per_s"] > 0
        assert all(seconds > 0 for seconds in side["split_s"].values())
    assert report["ktrain"]["held_before_gib"] < 0.1  # measured on the H200: 0.0625 (CUDA libraries' workspaces)
    assert report["ktrain"]["first_loss"] == pytest.approx(report["peer"]["first_loss"], rel=1e-2)


@pytest.mark.gpu
def test_bench_reads_the_gpus_clock_and_power_while_timing(tmp_path: Path) -> None:
    """On a GPU with NVML (nvidia-ml-py, a dependency): each side's SM clock, power and temperature over
    its timed steps, within what the device can do, and a line of the report for each."""
    model_dir(tmp_path, vocab_size=100)
    config = write_config(tmp_path, datasets=[], bf16=True, sequence_len=64)
    report, stdout = bench_json(tmp_path, str(config), "--steps", "20", "--warmup", "2", "--peer", "hf")
    assert report["device_state_missing"] is None
    for side in (report["ktrain"], report["peer"]):
        state = side["device_state"]
        assert state["samples"] >= 1
        assert 0 < state["sm_clock_mhz"] <= state["max_sm_clock_mhz"]
        assert 0 < state["power_w"] <= 1.2 * state["power_limit_w"]  # NVML's power is an average: it may lag
        assert 0 <= state["power_capped"] <= 1 and state["temperature_c"] > 0
    assert stdout.count("device while timed, ") == 2


def test_trace_summary_counts_busy_time_kinds_and_idle_gaps(tmp_path: Path) -> None:
    """tools/device/trace_summary.py on a made-up trace: overlapping kernels count once, kinds by name,
    a gap over 0.3 ms is listed with the kernel after it and what the host was in, and host events are left
    out of the device's time."""
    events = [
        {"cat": "kernel", "name": "nvjet_sm90_gemm", "ts": 0, "dur": 1000},
        {"cat": "kernel", "name": "cudnn_generated_sdpa_fprop", "ts": 500, "dur": 1000},  # overlaps the first
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 2000, "dur": 100},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},
        {"cat": "cpu_op", "name": "aten::item", "ts": 1400, "dur": 300},
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 1450, "dur": 200},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1800, "dur": 10},
    ]
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    tool = REPO / "tools" / "device" / "trace_summary.py"
    out = subprocess.run([sys.executable, str(tool), str(trace), "--steps", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "1 steps: span 2.1 ms, device busy 1.6 ms, 3 kernels"
    assert "1.0 ms/step  matrix multiplies" in out.stdout and "1.0 ms/step  attention" in out.stdout
    assert "0.1 ms/step  copies, casts and sets" in out.stdout
    assert "idle gaps over 0.3 ms: 1, 0.5 ms in all (0.5 ms a step)" in out.stdout
    assert "0.50 ms at 1.5 ms, before Memcpy HtoD (Pageable -> Device); host: aten::item (cudaStreamSynchronize)" in (
        out.stdout
    )


@pytest.mark.parametrize(("adapter", "bf16_base"), [(None, False), ("lora", False), ("lora", True)])
def test_bench_pairs_beside_trl_train_alike(adapter: str | None, bf16_base: bool, tmp_path: Path) -> None:
    """``--pairs`` with ``--peer trl`` on a tiny Llama in fp32: both sides start at ln 2 (policy = reference) and,
    trained on the same pairs in the same order, end at the same loss (each side's last step, not a mean); with
    LoRA within 1%, the two sides' adapters starting from different random draws. Under ``bfloat16`` (a GPU's
    default with an adapter) both sides train the adapter over a bf16 base under bf16 autocast."""
    model_dir(tmp_path, vocab_size=100)
    keys = {
        "base_model": str(tmp_path / "model"),
        "random_init_weights": True,
        "rl": "dpo",
        "datasets": [{"path": str(tmp_path / "model"), "type": "chat_template.default"}],
        "sequence_len": 32,
        "micro_batch_size": 2,
        "learning_rate": 1e-3 if adapter else 1e-4,
        "lr_scheduler": "constant",
        "output_dir": str(tmp_path / "out"),
        "seed": 3,
    }
    if adapter:
        keys |= {"adapter": adapter, "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True}
    if bf16_base:
        keys |= {"bf16": True, "bfloat16": True}
    config = tmp_path / "dpo.yaml"
    config.write_text(yaml.safe_dump(keys))
    report, _ = bench_json(tmp_path, str(config), "--pairs", "6:6", "--steps", "3", "--warmup", "1", "--peer", "trl")
    ours, peer = report["ktrain"], report["peer"]
    assert ("a bf16 base, fp32 adapter weights + bf16 autocast" in report["peer_setup"]) == bf16_base
    assert ours["first_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert peer["first_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert ours["last_loss"] < math.log(2) - 0.01  # the updates moved the policy away from its reference
    assert ours["last_loss"] == pytest.approx(peer["last_loss"], rel=1e-2 if adapter else 1e-3)


def test_bench_pairs_times_the_precompute_pass_apart(tmp_path: Path) -> None:
    """``--pairs`` under ``precompute_ref_log_probs``: the pairs become the preprocessing cache that the pass before
    training reads, that pass (ktrain's and TRL's) is reported on a line of its own, outside tokens/s, and both sides
    start at ln 2 (the precomputed reference is the policy as loaded)."""
    model_dir(tmp_path, vocab_size=100)
    keys = {
        "base_model": str(tmp_path / "model"),
        "random_init_weights": True,
        "rl": "dpo",
        "precompute_ref_log_probs": True,
        "datasets": [{"path": str(tmp_path / "model"), "type": "chat_template.default"}],
        "sequence_len": 32,
        "micro_batch_size": 2,
        "output_dir": str(tmp_path / "out"),
        "seed": 3,
    }
    config = tmp_path / "dpo.yaml"
    config.write_text(yaml.safe_dump(keys))
    args = ("--pairs", "6:6", "--steps", "1", "--warmup", "1", "--peer", "trl")
    report, stdout = bench_json(tmp_path, str(config), *args)
    ours, peer = report["ktrain"], report["peer"]
    assert [(p["name"], p["items"], p["unit"]) for p in ours["passes"]] == [("reference log-probabilities", 4, "pairs")]
    assert [p["items"] for p in peer["passes"]] == [4]  # TRL's dataset: the pairs of each step, one step after another
    assert all(p["seconds"] > 0 for p in ours["passes"] + peer["passes"])
    assert "ktrain before training, not in tokens/s: reference log-probabilities of 4 pairs in " in stdout
    assert "peer before training, not in tokens/s: reference log-probabilities of 4 pairs in " in stdout
    assert ours["first_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert peer["first_loss"] == pytest.approx(math.log(2), abs=1e-5)
