#!/usr/bin/env bash
# Measured peaks of every config in configs/bench on the H200 (device tool), for the memory model's table
# (tools/plan_vs_measured.py, docs/performance.md "Predicted against measured peak memory"): a short
# `ktrain bench` of each config as written (the GPU defaults resolved; one warm-up and one timed step: the peak is
# the second step's), the reports in $OUT/peaks.jsonl (one JSON line each, its "name" the config's).
# Only the peak is wanted, not the speed: the configs run in three lanes at once on the one GPU (each process's
# torch.cuda.max_memory_allocated is its own), a lane's configs one after another, each under BENCH_TIMEOUT;
# with EIGHT_B=1 the 8B QLoRA configs too, on random weights written first by tools/device/random_weights.py.
#   run: bash tools/device/plan_measure.sh   (carry .device/plan_all: the wheels of pluggy, attrs, cattrs,
#   ruamel.yaml, liger-kernel, bitsandbytes, torchao 0.17.0 (built against torch 2.11), deepspeed 0.19.8 and its
#   dependencies hjson, py-cpuinfo, msgpack, nvidia-ml-py, einops; DeepSpeed's pydantic is missing there, and
#   its compiled core is not in the package index here: llama_1p5b_zero2 stops with the plugin's one line)
# WHEELS, STEPS (timed steps, default 1), WARMUP (default 1), EIGHT_B, BENCH_TIMEOUT (s, default 150) choose how it runs;
# ONLY="CONFIG[@KEY=VALUE...] ..." runs just those, one after another (the 8B ones once the weights are written, each
# @KEY=VALUE a --set, the report named CONFIG@KEY=VALUE), instead of the lanes; INSTALLED=1 skips the installs (a
# second ONLY lane started beside the first, once the first has installed).
set -u
[ -n "${INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "${WHEELS:-.device/plan_all}"/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
[ -n "${INSTALLED:-}" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/pip.txt 2>&1 || tail -5 /tmp/pip.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
run() {  # CONFIG[@KEY=VALUE...] ARGS...: one short `ktrain bench`; its JSON report appended to $OUT/peaks.jsonl, its
  # log's tail to $OUT/log.txt (the device returns few files)
  local c=$1 sets=(); shift
  IFS=@ read -r -a parts <<< "$c"
  for kv in "${parts[@]:1}"; do sets+=(--set "$kv"); done
  timeout "${BENCH_TIMEOUT:-150}" ktrain bench "configs/bench/${parts[0]}.yaml" --warmup "${WARMUP:-1}" --steps "${STEPS:-1}" "${sets[@]}" "$@" \
    --json "/tmp/p/$c.json" > "/tmp/p/$c.txt" 2>&1
  local rc=$?
  { echo "== $(date +%T) $c rc=$rc"; tr '\r' '\n' < "/tmp/p/$c.txt" | grep -v "Loading weights" | tail -6 | cut -c1-300; } >> "$OUT/log.txt"
  [ -f "/tmp/p/$c.json" ] && python -c "import json,sys; d=json.load(open(sys.argv[1])); d['name']=sys.argv[2]; print(json.dumps(d))" \
    "/tmp/p/$c.json" "$c" >> "$OUT/peaks.jsonl"
  echo "$(date +%T) $c rc=$rc $(tr '\r' '\n' < "/tmp/p/$c.txt" | grep -E '^ktrain +[0-9]' | tail -1 | cut -c1-120)"
}
mkdir -p /tmp/p
W8=(--set base_model=/tmp/llama_8b --set random_init_weights=false)
if [ -n "${ONLY:-}" ]; then
  for c in $ONLY; do
    case $c in
      llama_8b*) [ -d /tmp/llama_8b ] || timeout 150 python tools/device/random_weights.py configs/bench/llama_8b /tmp/llama_8b > /tmp/p/weights.txt 2>&1
        run "$c" "${W8[@]}" ;;
      llama_1p5b_dpo*) run "$c" --pairs 512:512 ;;
      llama_1p5b_packed*) run "$c" --lengths 256:2048 ;;
      *) run "$c" ;;
    esac
  done
  exit 0
fi
{ run llama_1p5b_zero2; run llama_1p5b_dpo --pairs 512:512; run llama_1p5b_fsdp2_liger_ac; } &
{ run llama_1p5b_fp8_master; run llama_1p5b_packed --lengths 256:2048; run llama_1p5b_liger_master; } &
{ run llama_1p5b_dpo_lora --pairs 512:512; run llama_1p5b_packed_fp8 --lengths 256:2048; run llama_1p5b_fsdp2_liger
  run llama_1p5b_compile_master; run llama_1p5b; } &
if [ -n "${EIGHT_B:-}" ]; then  # the 8B QLoRA configs on random weights written on the GPU
  { timeout 150 python tools/device/random_weights.py configs/bench/llama_8b /tmp/llama_8b > /tmp/p/weights.txt 2>&1
    run llama_8b_qlora "${W8[@]}"; run llama_8b_qlora_liger "${W8[@]}"; } &
fi
wait
