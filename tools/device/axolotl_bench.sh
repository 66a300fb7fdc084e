#!/usr/bin/env bash
# ktrain beside Axolotl on the H200 (device tool): `ktrain bench --peer axolotl` runs Axolotl 0.19 itself on the
# same YAML, then ktrain (fast by default): the 1.5B Llama shape, the same with activation checkpointing, and QLoRA
# on the 8B shape. Random weights are written once per shape on the GPU (tools/device/random_weights.py) and both
# sides load them from disk. Reports land in $OUT/b; docs/performance.md ("Beside Axolotl") quotes them.
#   run: bash tools/device/axolotl_bench.sh   (carry .device/axolotl_whl, which `bash tools/device/carried_wheels.sh axolotl` makes: ktrain's wheels (pluggy, attrs, cattrs,
#   ruamel.yaml, liger-kernel, torchao 0.17.0, bitsandbytes) and Axolotl's, made here with `pip download --no-deps`:
#   axolotl 0.19.0, axolotl-contribs-mit 0.0.6 and -lgpl 0.0.7 (source archives: `pip wheel --no-deps` them),
#   trl 1.9.0 (Axolotl imports trl.experimental.prm, gone in later trl), addict, fire, termcolor, colorama, fastcore, evaluate, posthog, backoff, distro, and for a device without
#   them datasets, dill, multiprocess, xxhash, fsspec, pydantic, pydantic-core and the like
#   (`--only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64`); installed only where missing.
#   numba (only imported on this path: its @njit packs samples, and no run here packs) and wandb (imported by
#   Axolotl's callbacks, unused without wandb_project) and Pillow (Axolotl's config imports PIL.Image.Resampling for its
#   image settings) are replaced by stand-ins where missing: their wheels (llvmlite alone 60 MB) do not fit in
#   what a device call carries.)
# The wheels go to /tmp/site_axolotl, apart from the /tmp/site of the other device scripts: on a machine still warm
# from this script, Axolotl's trl 1.9.0 would otherwise stand before the trl another script installs.
# WHEELS, CONFIGS ("NAME:WEIGHTS[:KEY=VALUE]" items: beside Axolotl; blank: no Axolotl run, and ktrain's wheels
# alone will do), ALONE (items of ktrain alone, after them),
# PROFILE (one item: 3 steps of ktrain's side profiled, to $OUT/b/profile_NAME.txt), EXTRA_PATH (folders after
# the wheels' on PYTHONPATH: flash-attn-4 as tools/device/flash_attention_bench.sh INSTALL_ONLY=1 puts it), BENCH_ARGS, BENCH_TIMEOUT
# (s; each run's, cut to what is left of DEADLINE, the seconds from the start for all of them) choose what runs.
set -u
W=${WHEELS:-.device/axolotl_whl}
ALWAYS="pluggy attrs cattrs ruamel_yaml liger_kernel torchao bitsandbytes axolotl axolotl_contribs_mit axolotl_contribs_lgpl
  trl addict fire termcolor colorama fastcore evaluate posthog backoff distro"
for w in "$W"/*.whl; do  # a wheel of ALWAYS, or one whose distribution the device lacks
  name=$(basename "$w" | cut -d- -f1)
  if [[ " $(echo $ALWAYS) " == *" $name "* ]] || ! python3 -m pip show -q "$name" > /dev/null 2>&1; then echo "$w"; fi
done > /tmp/wheels.txt
echo "installing: $(xargs -n1 basename < /tmp/wheels.txt | cut -d- -f1 | tr '\n' ' ')"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_axolotl $(cat /tmp/wheels.txt) 2>&1 | tail -3
mkdir -p /tmp/stubs
python3 -c "import numba" 2>/dev/null || { mkdir -p /tmp/stubs/numba; printf '%s\n' \
  '"""A stand-in for numba: njit returns the function itself (pure Python)."""' \
  'def njit(*args, **kwargs):' \
  '    if len(args) == 1 and callable(args[0]) and not kwargs:' \
  '        return args[0]' \
  '    return lambda f: f' > /tmp/stubs/numba/__init__.py; echo "numba: stand-in"; }
python3 -c "import wandb" 2>/dev/null || { mkdir -p /tmp/stubs/wandb; printf '%s\n' \
  '"""A stand-in for wandb, which is not installed: importing works, using it does not."""' \
  'run = None' \
  'def __getattr__(name):' \
  '    raise AttributeError(f"wandb is not installed (wandb.{name})")' > /tmp/stubs/wandb/__init__.py; echo "wandb: stand-in"; }
python3 -c "import PIL" 2>/dev/null || { mkdir -p /tmp/stubs/PIL; printf '%s\n' \
  '"""A stand-in for Pillow: the names Axolotl imports for its image settings, unused in text training."""' \
  'import enum' 'class Resampling(enum.IntEnum):' \
  '    NEAREST = 0' '    LANCZOS = 1' '    BILINEAR = 2' '    BICUBIC = 3' '    BOX = 4' '    HAMMING = 5' \
  > /tmp/stubs/PIL/Image.py; printf '"""A stand-in for Pillow."""\n' > /tmp/stubs/PIL/__init__.py; echo "PIL: stand-in"; }
export PYTHONPATH=/tmp/site_axolotl:/tmp/stubs${EXTRA_PATH:+:$EXTRA_PATH} PYTHONUNBUFFERED=1 AXOLOTL_DO_NOT_TRACK=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/pip.txt 2>&1 || tail -5 /tmp/pip.txt
mkdir -p "$OUT/b"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch, transformers, peft, accelerate, trl, datasets, axolotl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__, 'trl', trl.__version__, 'datasets', datasets.__version__, 'axolotl', axolotl.__version__)" 2>&1 | tail -1
PEERED=$(echo ${CONFIGS-llama_1p5b:llama_1p5b llama_8b_qlora:llama_8b llama_1p5b:llama_1p5b:gradient_checkpointing=true})
if [ -n "$PEERED" ] && ! python -c "import axolotl.cli.train, axolotl.core.builders, axolotl.utils.callbacks" > /tmp/import.txt 2>&1; then
  echo "axolotl does not import:"; grep -v Warning /tmp/import.txt | tail -6; exit 3
fi
bench() {  # ITEM [ARGS...]: one `ktrain bench` of configs/bench/NAME.yaml on the weights of WEIGHTS, to $OUT/b/TAG.*
  IFS=: read -r c weights extra <<< "$1"; shift
  tag=$c  # global: the caller reads the run's files by it
  [ -z "$extra" ] || { [ "$extra" = gradient_checkpointing=true ] && tag=${c}_ckpt || tag=${c}_${extra//[=.]/_}; }
  [[ " $* " == *" --profile "* ]] && tag=profile_$tag
  local limit=$(( ${DEADLINE:-100000} - SECONDS )); [ "$limit" -gt "${BENCH_TIMEOUT:-240}" ] && limit=${BENCH_TIMEOUT:-240}
  [ "$limit" -gt 10 ] || { echo "$tag: no time left"; return; }
  if [ ! -d "/tmp/w_$weights" ]; then
    timeout 200 python tools/device/random_weights.py "configs/bench/$weights" "/tmp/w_$weights" 2>&1 | tail -1
  fi
  timeout "$limit" ktrain bench "configs/bench/$c.yaml" "${@//TAG/$tag}" --set base_model=/tmp/w_$weights \
    --set random_init_weights=false ${extra:+--set $extra} > "$OUT/b/$tag.txt" 2>&1
  rc=$?; echo "$(date +%T) $tag rc=$rc"
  tr '\r' '\n' < "$OUT/b/$tag.txt" | grep -E "^(ktrain|peer|Axolotl's YAML|device while)" | grep -v "^ktrain bench" | cut -c1-220
  [ $rc -eq 0 ] || tr '\r' '\n' < "$OUT/b/$tag.txt" | grep -v -i "warn" | tail -8 | cut -c1-300
}
for item in $PEERED; do
  bench "$item" --peer axolotl ${BENCH_ARGS:---warmup 3 --steps 10} --json "$OUT/b/TAG.json"
done
for item in ${ALONE:-}; do
  bench "$item" ${BENCH_ARGS:---warmup 3 --steps 10} --json "$OUT/b/TAG.json"
done
if [ -n "${PROFILE:-}" ]; then  # where ktrain's step goes: the top operators and kernels of 3 profiled steps
  bench "$PROFILE" --warmup 2 --steps 3 --profile "$OUT/b/TAG.out.txt"
  head -40 "$OUT/b/$tag.out.txt" 2>/dev/null | cut -c1-200
fi
