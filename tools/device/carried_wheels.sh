#!/usr/bin/env bash
# The wheels the device scripts carry (device tool, run here, not on the device: the device has no network).
# Each folder goes under .device/ (git-ignored), for the scripts' `carry`; a call carries at most 64 MiB.
#   bash tools/device/carried_wheels.sh axolotl   # .device/axolotl_whl (55 MB): tools/device/axolotl_bench.sh
#   bash tools/device/carried_wheels.sh fa4       # .device/fa4_a (42 MB), .device/fa4_b (41 MB): flash_attention_bench.sh
#   bash tools/device/carried_wheels.sh dpo       # .device/dpo_whl: tools/device/dpo_bench.sh
#   bash tools/device/carried_wheels.sh dpo_full  # .device/dpo_full (4 MB, no bitsandbytes): dpo_bench.sh's full
#                                                 # fine-tuning, carried beside .device/fa4_b in one call
#   bash tools/device/carried_wheels.sh fp8       # .device/fp8_whl: tools/device/fp8_bench.sh
# FlashAttention-4 is two calls on one machine: the first copies fa4_a's piece to the device's /tmp, the second
# carries fa4_b and installs (FA4_WHEELS=.device/fa4_b CUTLASS_LIBS="/tmp/fa4parts/cu12.part.aa
# .device/fa4_b/cu12.part.ab"); the machine must still be warm (about 30 s between calls).
set -euo pipefail
cd "$(dirname "$0")/../.."
TAGS=(--only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any --no-deps -q)
KTRAIN=(pluggy attrs cattrs ruamel.yaml ruamel.yaml.clib liger-kernel)  # what ktrain needs beyond the device's
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
case "${1:-}" in
  axolotl)
    out=.device/axolotl_whl
    mkdir -p "$out"
    pip download "${TAGS[@]}" -d "$out" "${KTRAIN[@]}" torchao==0.17.0 bitsandbytes==0.50.2 trl==1.9.0 addict fire \
      termcolor colorama fastcore evaluate posthog backoff distro datasets==4.8.5 dill multiprocess xxhash \
      fsspec==2026.2.0 pydantic pydantic-core annotated-types typing-inspection
    pip download --no-deps --no-binary=:all: -q -d "$TMP" axolotl==0.19.0 axolotl-contribs-mit==0.0.6 \
      axolotl-contribs-lgpl==0.0.7
    for source in "$TMP"/*.tar.gz; do pip wheel --no-deps -q -w "$out" "$source"; done
    ;;
  fa4)
    mkdir -p .device/fa4_a .device/fa4_b
    pip download "${TAGS[@]}" -d .device/fa4_b "${KTRAIN[@]}" flash-attn-4==4.0.0b40 nvidia-cutlass-dsl==4.8.1 \
      nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 quack-kernels==0.6.5 \
      apache-tvm-ffi torch-c-dlpack-ext cuda-bindings cuda-pathfinder protobuf einops
    # the CuTe DSL's CUDA 12 libraries: 92 MB as a wheel, 63 MB as the tar.xz of its files, in two pieces
    pip download "${TAGS[@]}" -d "$TMP" nvidia-cutlass-dsl-libs-cu12==4.8.1
    mkdir "$TMP/libs" && python3 -m zipfile -e "$TMP"/nvidia_cutlass_dsl_libs_cu12-*.whl "$TMP/libs"
    tar -C "$TMP/libs" -cf - . | xz -T2 -6 | split -b 44000000 - "$TMP/cu12.part."
    mv "$TMP/cu12.part.aa" .device/fa4_a/ && mv "$TMP/cu12.part.ab" .device/fa4_b/
    ;;
  dpo|dpo_full)
    out=.device/dpo_whl; [ "$1" = dpo_full ] && out=.device/dpo_full
    mkdir -p "$out"
    pip download "${TAGS[@]}" -d "$out" "${KTRAIN[@]}" trl==1.16.0 datasets==4.8.5 dill multiprocess xxhash \
      fsspec==2026.2.0
    [ "$1" = dpo_full ] || pip download "${TAGS[@]}" -d "$out" bitsandbytes==0.50.2
    ;;
  fp8)
    out=.device/fp8_whl
    mkdir -p "$out"
    pip download "${TAGS[@]}" -d "$out" "${KTRAIN[@]}" torchao==0.17.0
    ;;
  *)
    echo "usage: bash tools/device/carried_wheels.sh axolotl|fa4|dpo|dpo_full|fp8" >&2
    exit 2
    ;;
esac
du -sh .device/*
