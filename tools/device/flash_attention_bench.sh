#!/usr/bin/env bash
# FlashAttention-4 behind SDPA on the device (device tool): flash-attn-4 installed from carried wheels, its
# attention beside cuDNN's (tools/device/fa4_attention.py), then `ktrain bench` of each config with the GPU
# default flash_attention_4 and with it switched off, in the order OFF_FIRST=1 reverses.
#   (`bash tools/device/carried_wheels.sh fa4` makes them: .device/fa4_b, the wheels and the second piece; .device/fa4_a, the first)
#   FA4_WHEELS: a folder with the wheels of flash-attn-4 4.0.0b40, nvidia-cutlass-dsl, nvidia-cutlass-dsl-libs-base
#     and -core 4.8.1, quack-kernels, apache-tvm-ffi, torch-c-dlpack-ext, cuda-bindings, cuda-pathfinder, protobuf,
#     einops, pluggy, attrs, cattrs, ruamel.yaml, liger-kernel;
#   CUTLASS_LIBS: the files whose concatenation is a tar.xz of the unpacked nvidia-cutlass-dsl-libs-cu12 4.8.1 wheel
#     (92 MB as a wheel, 63 MB so: more than one call carries, so it may come in pieces over calls on one machine);
#   CONFIGS (names under configs/bench/, default llama_1p5b; blank: the attention alone), BENCH_ARGS, BENCH_TIMEOUT (s); INSTALL_ONLY=1 installs and
#   stops (for tools/device/axolotl_bench.sh EXTRA_PATH="/tmp/fa4site /tmp/fa4site/nvidia_cutlass_dsl/dsl_packages" in a
#   later call on the same machine, with ':' between the two).
set -u
S=/tmp/fa4site
mkdir -p "$S" "$OUT/b"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$S" "$FA4_WHEELS"/*.whl 2>&1 | grep -v "already exists" | tail -2
cat $CUTLASS_LIBS | xz -d | tar -x -C "$S" || { echo "the CuTe DSL's libraries did not unpack"; exit 3; }
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/pip.txt 2>&1 || tail -3 /tmp/pip.txt
[ -n "${INSTALL_ONLY:-}" ] && { ls "$S"; exit 0; }
export PYTHONPATH=$S:$S/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
timeout 150 python tools/device/fa4_attention.py 2>&1 | grep -v -i "warn\|generate_mlir" | tee "$OUT/b/fa4_attention.txt"
ORDER="default false"; [ -n "${OFF_FIRST:-}" ] && ORDER="false default"
for c in ${CONFIGS-llama_1p5b}; do
  for fa4 in $ORDER; do
    SET=(); [ "$fa4" = false ] && SET=(--set flash_attention_4=false)
    timeout ${BENCH_TIMEOUT:-200} ktrain bench "configs/bench/$c.yaml" ${BENCH_ARGS:---warmup 5 --steps 15} "${SET[@]}" \
      --json "$OUT/b/${c}_fa4_$fa4.json" > "$OUT/b/${c}_fa4_$fa4.txt" 2>&1
    echo "$c flash_attention_4=$fa4 rc=$?"; grep "^ktrain  \|device while" "$OUT/b/${c}_fa4_$fa4.txt" | tail -2
  done
done
