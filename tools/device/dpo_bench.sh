#!/usr/bin/env bash
# DPO on the H200 (device tool): `ktrain bench` of the 1.5B Llama shape's DPO configs, full fine-tuning and LoRA,
# beside TRL's DPOTrainer on the same pairs. Reports land in $OUT/b; docs/performance.md ("DPO beside TRL's
# DPOTrainer") quotes them.
#   run: bash tools/device/dpo_bench.sh   (carry .device/dpo_whl, or for full fine-tuning alone .device/dpo_full, without
#   bitsandbytes (`carried_wheels.sh dpo_full`); .device/dpo_whl, which `bash tools/device/carried_wheels.sh dpo` makes: the wheels of pluggy, attrs, cattrs,
#   liger-kernel and ruamel.yaml for ktrain, bitsandbytes for the lora plugin (it requires it even without a
#   quantized base); for the peer trl 1.16.0 and what the device lacks of its pure-Python dependencies:
#   datasets 4.8.5 (the newest release that takes the huggingface-hub 1.x of transformers 5.17), dill,
#   multiprocess, xxhash, fsspec 2026.2.0 and the like (the device has pandas, pyarrow, requests, aiohttp),
#   made here with `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
#   manylinux_2_28_x86_64 -d .device/dpo_whl trl==1.16.0 datasets==4.8.5 fsspec==2026.2.0 ...`; pip installs,
#   offline, only those the device lacks)
# WHEELS (the folder of wheels), CONFIGS (names under configs/bench/), PAIRS (PROMPT:ANSWER), PEER (the peer
# arguments, default --peer trl; empty: ktrain alone), BENCH_ARGS,
# BENCH_TIMEOUT (s; each config's, cut to what is left of DEADLINE, the seconds from the start for all of them),
# EXTRA_PATH (':'-separated folders put after /tmp/site on PYTHONPATH: FlashAttention-4's, which
# tools/device/flash_attention_bench.sh with INSTALL_ONLY=1 installs in an earlier call on the same machine),
# PROFILE (a config name: profile its ktrain side, no peer) and PROFILE_EACH (non-empty: each config's run also
# profiles three steps after its timed ones, to $OUT/b/profile_CONFIG.txt) choose what runs.
set -u
W=${WHEELS:-.device/dpo_whl}
# bitsandbytes (43 MB) only where the folder has it: the LoRA config needs it, full fine-tuning does not, and
# without it the folder fits in one call beside FlashAttention-4's second piece
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $(ls "$W"/{pluggy,attrs,cattrs,ruamel_yaml,liger_kernel,bitsandbytes}-*.whl 2>/dev/null)
export PYTHONPATH=/tmp/site${EXTRA_PATH:+:$EXTRA_PATH} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/pip.txt 2>&1 || tail -5 /tmp/pip.txt
python3 -m pip install --no-index --find-links "$W" --no-cache-dir trl==1.16.0 > /tmp/trl.txt 2>&1; echo "trl install rc=$?"
grep -E "^(Successfully|ERROR)" /tmp/trl.txt | cut -c1-600
if ! python -c "import trl, datasets" 2>/dev/null; then  # the resolver refused (an older package there): no deps
  for w in trl datasets dill multiprocess xxhash fsspec; do
    python -c "import $w" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site "$W"/$w-*.whl
  done
fi
mkdir -p "$OUT/b"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch, transformers, peft, accelerate, datasets, trl; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__, 'datasets', datasets.__version__, 'trl', trl.__version__)" 2>&1 | tail -1
for c in ${CONFIGS:-llama_1p5b_dpo llama_1p5b_dpo_lora}; do
  limit=$(( ${DEADLINE:-100000} - SECONDS )); [ "$limit" -gt "${BENCH_TIMEOUT:-230}" ] && limit=${BENCH_TIMEOUT:-230}
  [ "$limit" -gt 10 ] || { echo "$c: no time left"; continue; }
  timeout "$limit" ktrain bench "configs/bench/$c.yaml" --pairs ${PAIRS:-512:512} ${PEER---peer trl} ${BENCH_ARGS:-} \
    ${PROFILE_EACH:+--profile "$OUT/b/profile_$c.txt"} --json "$OUT/b/$c.json" > "$OUT/b/$c.txt" 2>&1
  rc=$?; echo "$(date +%T) $c rc=$rc"; tr '\r' '\n' < "$OUT/b/$c.txt" | grep -E "^(ktrain|peer|device while|host while|rows)" | cut -c1-300
  [ $rc -eq 0 ] || tail -4 "$OUT/b/$c.txt" | cut -c1-400
  [ -z "${PROFILE_EACH:-}" ] || head -22 "$OUT/b/profile_$c.txt" 2>/dev/null | cut -c1-200
done
if [ -n "${PROFILE:-}" ]; then  # where the ktrain side's time goes: the top kernels of 3 profiled steps of $PROFILE
  timeout ${BENCH_TIMEOUT:-230} ktrain bench "configs/bench/$PROFILE.yaml" --pairs ${PAIRS:-512:512} --warmup 3 --steps 3 \
    --profile "$OUT/b/profile_$PROFILE.txt" > "$OUT/b/profile_$PROFILE.log" 2>&1
  rc=$?; echo "$(date +%T) profile $PROFILE rc=$rc"; head -25 "$OUT/b/profile_$PROFILE.txt" | cut -c1-200
fi
