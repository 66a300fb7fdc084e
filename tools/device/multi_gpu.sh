#!/usr/bin/env bash
# The multi-GPU measures in one device call on a machine of several GPUs (nvidia-h200-x2/-x4/-x8): loss parity of every
# parallel layout against one GPU, then tokens/s per GPU as the ranks grow, with tools/device/multi_gpu.py.
# Results land in $OUT (at most 8 files come back: parity.txt, seeds.txt, scaling.txt, and the JSON of
# parity and scaling kept in parity.jsonl / scaling.jsonl). Carry .whl (pluggy, attrs, cattrs, liger-kernel, deepspeed and its
# dependencies, bitsandbytes). NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the device README says.
#   run: bash tools/device/multi_gpu.sh      (PARITY=0, SEEDS=0 or SCALING=0 skips a part; STEPS, WARMUP)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > "$OUT/pip.txt" 2>&1 || tail -5 "$OUT/pip.txt"
GPUS=$(nvidia-smi -L | wc -l)
echo "$(date +%T) $GPUS GPUs"
TINY=/tmp/tiny.yaml  # the quickstart's tiny Llama, random weights, fp32: parity to 1e-4
printf 'base_model: configs/quickstart/model\nrandom_init_weights: true\nsequence_len: 256\nmicro_batch_size: 2\nseed: 0\n' > $TINY
BIG="configs/bench/llama_1p5b.yaml --set micro_batch_size=1"  # the 1.5B Llama shape, bf16 autocast: parity to 1e-2
# name|keys of the layout (N ranks only)|GPUs it needs (default 2)|keys of both runs (the adapter: the one-rank
# reference trains the same adapter)
LAYOUTS=(
  "fsdp2|fsdp_version=2"
  "hsdp|fsdp_version=2 dp_replicate_size=2|4"
  "tp|fsdp_version=2 tensor_parallel_size=2"
  "cp|fsdp_version=2 context_parallel_size=2"
  "ulysses|fsdp_version=2 sequence_parallel_degree=2"
  "zero1|deepspeed=zero1"
  "zero2|deepspeed=zero2"
  "zero3|deepspeed=zero3"
  "fsdp2_qlora|fsdp_version=2||adapter=qlora lora_r=16 lora_alpha=32 lora_target_linear=true"
)
p() { python tools/device/multi_gpu.py "$@"; }
if [ "${PARITY:-1}" = 1 ]; then
  for entry in "${LAYOUTS[@]}"; do
    IFS='|' read -r name keys least both <<< "$entry"
    [ "$GPUS" -lt "${least:-2}" ] && { echo "skip $name: needs ${least} GPUs"; continue; }
    layout=(); for k in $keys; do layout+=(--layout "$k"); done
    for k in ${both:-}; do layout+=(--set "$k"); done
    for model in tiny big; do
      if [ $model = tiny ]; then cfg=($TINY); tol=1e-4; else cfg=($BIG); tol=1e-2; fi
      timeout 600 p parity "${cfg[@]}" --nproc "$GPUS" "${layout[@]}" --rtol $tol --steps ${STEPS:-4} \
        --warmup ${WARMUP:-1} --json /tmp/r.json >> "$OUT/parity.txt" 2>&1
      echo "$(date +%T) parity $name $model rc=$?"; cat /tmp/r.json >> "$OUT/parity.jsonl" 2>/dev/null
    done
  done
fi
if [ "${SEEDS:-1}" = 1 ] && [ "$GPUS" -ge 8 ]; then  # the Axolotl-style configs written for 8 GPUs: parity (tiny), then the 8B shapes train
  python -c "from pathlib import Path; from ktrain.testing.assets import write_model_dir as w; w(Path('/tmp/qwen3'), model_type='qwen3', architectures=['Qwen3ForCausalLM'])"
  timeout 600 p parity configs/hsdp_tp.yaml --nproc 8 --set base_model=configs/quickstart/model --set random_init_weights=true \
    --layout dp_shard_size=2 --reference dp_shard_size=1 --reference dp_replicate_size=1 --reference tensor_parallel_size=1 \
    --rtol 1e-2 --json /tmp/r.json >> "$OUT/seeds.txt" 2>&1; echo "$(date +%T) seed hsdp_tp parity rc=$?"
  timeout 600 p parity configs/qwen3_fsdp_tp_cp.yaml --nproc 8 --set base_model=/tmp/qwen3 --set random_init_weights=true \
    --reference dp_shard_size=1 --reference context_parallel_size=1 --reference tensor_parallel_size=1 \
    --rtol 1e-2 --json /tmp/r.json >> "$OUT/seeds.txt" 2>&1; echo "$(date +%T) seed qwen3 parity rc=$?"
  timeout 900 ktrain bench configs/hsdp_tp.yaml --nproc-per-node 8 --synthetic --set base_model=configs/bench/llama_8b \
    --set random_init_weights=true --set dp_shard_size=2 --steps 5 --warmup 2 >> "$OUT/seeds.txt" 2>&1; echo "$(date +%T) seed hsdp_tp 8B rc=$?"
  timeout 900 ktrain bench configs/qwen3_fsdp_tp_cp.yaml --nproc-per-node 8 --synthetic --set base_model=configs/bench/qwen3_8b \
    --set random_init_weights=true --steps 5 --warmup 2 >> "$OUT/seeds.txt" 2>&1; echo "$(date +%T) seed qwen3 8B rc=$?"
fi
if [ "${SCALING:-1}" = 1 ]; then
  counts=$(python -c "print(','.join(str(n) for n in (1, 2, 4, 8) if n <= $GPUS))")
  big_counts=$(python -c "print(','.join(str(n) for n in (2, 4, 8) if n <= $GPUS))")  # 8B: 128 GB of state, not on one
  for run in "fsdp2 1p5b|configs/bench/llama_1p5b_fsdp2_liger.yaml|$counts" \
             "zero3 1p5b|configs/bench/llama_1p5b.yaml --set deepspeed=zero3_bf16 --set bf16=true|$counts" \
             "fsdp2 8b|configs/bench/llama_1p5b_fsdp2_liger.yaml --set base_model=configs/bench/llama_8b --set sequence_len=2048|$big_counts" \
             "zero3 8b|configs/bench/llama_1p5b.yaml --set deepspeed=zero3_bf16 --set base_model=configs/bench/llama_8b --set sequence_len=2048|$big_counts"; do
    IFS='|' read -r name cfg ns <<< "$run"
    timeout 900 p scaling $cfg --nproc "$ns" --steps ${STEPS:-8} --warmup ${WARMUP:-3} --json /tmp/s.json >> "$OUT/scaling.txt" 2>&1
    echo "$(date +%T) scaling $name rc=$?"; cat /tmp/s.json >> "$OUT/scaling.jsonl" 2>/dev/null
  done
fi
tail -40 "$OUT/parity.txt" "$OUT/seeds.txt" "$OUT/scaling.txt" 2>/dev/null
