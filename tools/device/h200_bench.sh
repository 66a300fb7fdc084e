#!/usr/bin/env bash
# The H200 benchmark run (device tool): `ktrain bench` on the 1.5B Llama shape beside plain HF,
# then the GPU-marked tests. Results land in $OUT/b; docs/performance.md quotes them.
#   run: bash tools/device/h200_bench.sh   (carry .whl: the wheels of pluggy, attrs, cattrs, liger-kernel, and for
# DeepSpeed its wheel built here with `pip wheel deepspeed --no-deps` and hjson, pydantic, pydantic-core,
# annotated-types, typing-inspection; for QLoRA the bitsandbytes wheel)
# WHEELS (the folder of wheels, default .whl), CONFIGS (names under configs/bench/), PEER ("" for none), BENCH_ARGS, BENCH_TIMEOUT (s), QLORA_PEER (a
# bench config name for plugins/lora/benchmarks/qlora_peer.py; it takes BENCH_ARGS too), RANDOM_WEIGHTS (a model
# folder under configs/bench/ whose random weights every side then loads from disk: tools/device/random_weights.py)
# TAG (a suffix of the report names, to keep variants of one config apart) and GPU_TESTS=1 choose what runs.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > "$OUT/pip.txt" 2>&1 || tail -5 "$OUT/pip.txt"
mkdir -p "$OUT/b"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} > "$OUT/b/env.txt" 2>&1
SIDE_ARGS=() PEER_WEIGHTS=()
if [ -n "${RANDOM_WEIGHTS:-}" ]; then  # random weights of configs/bench/$RANDOM_WEIGHTS made on the GPU, loaded from disk
  timeout 200 python tools/device/random_weights.py "configs/bench/$RANDOM_WEIGHTS" /tmp/weights > "$OUT/b/weights.txt" 2>&1
  rc=$?; echo "$(date +%T) weights rc=$rc"; tail -1 "$OUT/b/weights.txt"
  SIDE_ARGS=(--set base_model=/tmp/weights --set random_init_weights=false) PEER_WEIGHTS=(--weights /tmp/weights)
fi
if [ -n "${QLORA_PEER:-}" ]; then  # the QLoRA peer (HF + peft + bitsandbytes) on a bench config, same call
  timeout ${BENCH_TIMEOUT:-200} python plugins/lora/benchmarks/qlora_peer.py "configs/bench/$QLORA_PEER.yaml" \
    ${BENCH_ARGS:-} "${PEER_WEIGHTS[@]}" --json "$OUT/b/qlora_peer.json" > "$OUT/b/qlora_peer.txt" 2>&1; rc=$?; echo "$(date +%T) qlora peer rc=$rc"; tr "\r" "\n" < "$OUT/b/qlora_peer.txt" | grep -v "Loading weights" | tail -3
fi
for c in ${CONFIGS:-llama_1p5b llama_1p5b_fsdp2_liger llama_1p5b_fsdp2_liger_ac}; do
  timeout ${BENCH_TIMEOUT:-200} ktrain bench "configs/bench/$c.yaml" ${PEER---peer hf} ${BENCH_ARGS:-} "${SIDE_ARGS[@]}" --json "$OUT/b/$c${TAG:-}.json" > "$OUT/b/$c${TAG:-}.txt" 2>&1
  rc=$?; echo "$(date +%T) $c${TAG:-} rc=$rc"; tr '\r' '\n' < "$OUT/b/$c${TAG:-}.txt" | grep -v "Loading weights" | tail -12
done
if [ -n "${GPU_TESTS:-}" ]; then
  timeout ${TESTS_TIMEOUT:-150} python -m pytest -q -rs -p no:cacheprovider --continue-on-collection-errors -m gpu tests plugins > "$OUT/b/gpu_tests.txt" 2>&1; tail -15 "$OUT/b/gpu_tests.txt"
fi
