#!/usr/bin/env bash
# Measured peaks of every config in configs/bench on the H200 (device tool), for the memory model's table
# (tools/plan_vs_measured.py, docs/performance.md "Predicted against measured peak memory"): a short
# `ktrain bench` of each config as written (the GPU defaults resolved), its report in $OUT/p/NAME.{json,txt}.
# Only the peak is wanted, not the speed: the configs run in three lanes at once on the one GPU (each process's
# torch.cuda.max_memory_allocated is its own), a lane's configs one after another, each under BENCH_TIMEOUT;
# every config loads random weights of its shape written first by tools/device/random_weights.py (the GPU
# makes them in seconds; a CPU initialization takes most of a minute for the 1.5B shape).
#   run: bash tools/device/plan_measure.sh   (carry .device/plan_all: the wheels of pluggy, attrs, cattrs,
#   ruamel.yaml, liger-kernel, bitsandbytes, torchao 0.17.0 (built against torch 2.11), deepspeed 0.19.8 and its
#   dependencies hjson, py-cpuinfo, msgpack, nvidia-ml-py, einops; pydantic is the device's own)
# WHEELS, STEPS (timed steps, default 2), WARMUP (default 2), BENCH_TIMEOUT (s, default 150) choose how it runs.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "${WHEELS:-.device/plan_all}"/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/pip.txt 2>&1 || tail -5 /tmp/pip.txt
mkdir -p "$OUT/p"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} > "$OUT/p/env.txt" 2>&1
cat "$OUT/p/env.txt"
run() {  # CONFIG ARGS...: one short `ktrain bench`, its report in $OUT/p/CONFIG.{json,txt}
  local c=$1; shift
  timeout "${BENCH_TIMEOUT:-150}" ktrain bench "configs/bench/$c.yaml" --warmup "${WARMUP:-2}" --steps "${STEPS:-2}" "$@" \
    --json "$OUT/p/$c.json" > "$OUT/p/$c.txt" 2>&1
  local rc=$?; echo "$(date +%T) $c rc=$rc $(tr '\r' '\n' < "$OUT/p/$c.txt" | grep -E '^ktrain +[0-9]' | tail -1 | cut -c1-160)"
  [ $rc -eq 0 ] || tail -3 "$OUT/p/$c.txt" | cut -c1-300
}
timeout 100 python tools/device/random_weights.py configs/bench/llama_1p5b /tmp/llama_1p5b > "$OUT/p/weights_1p5b.txt" 2>&1
echo "$(date +%T) 1.5B weights rc=$?"
W1=(--set base_model=/tmp/llama_1p5b --set random_init_weights=false)
W8=(--set base_model=/tmp/llama_8b --set random_init_weights=false)
bench() {  # CONFIG ARGS...: as run() with the 1.5B configs' random weights from disk
  run "$@" "${W1[@]}"
}
{ bench llama_1p5b; bench llama_1p5b_zero2; bench llama_1p5b_fsdp2_liger; bench llama_1p5b_dpo --pairs 512:512
  bench llama_1p5b_compile_master; } &
{ bench llama_1p5b_fused_loss_master; bench llama_1p5b_liger_master; bench llama_1p5b_fp8_master
  bench llama_1p5b_packed --lengths 256:2048; bench llama_1p5b_packed_fp8 --lengths 256:2048; } &
{ timeout 150 python tools/device/random_weights.py configs/bench/llama_8b /tmp/llama_8b > "$OUT/p/weights.txt" 2>&1
  echo "$(date +%T) weights rc=$?"
  run llama_8b_qlora "${W8[@]}"; run llama_8b_qlora_liger "${W8[@]}"; bench llama_1p5b_dpo_lora --pairs 512:512
  bench llama_1p5b_fsdp2_liger_ac; } &
wait
