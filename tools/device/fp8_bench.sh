#!/usr/bin/env bash
# FP8 training on the H200 (device tool): `ktrain bench` of the 1.5B Llama shape in bf16 and with
# ktrain-plugin-fp8's two recipes, the packed config without and with fp8, and the fp8 loss-curve test.
# Reports land in $OUT/b; docs/performance.md ("FP8 training") quotes them.
#   run: PARTS="shape curve" bash tools/device/fp8_bench.sh   (carry .device/fp8_whl: the wheels of pluggy, attrs,
#   cattrs, liger-kernel, ruamel.yaml (the fsdp plugin's, for the packed config) and torchao 0.17.0, the torchao
#   release built against torch 2.11; the device returns about 8 files from $OUT, so the install log and env are
#   printed, not kept)
# WHEELS (the folder of wheels), EXTRA_PATH (':'-separated folders put after /tmp/site on PYTHONPATH:
# FlashAttention-4's, which tools/device/flash_attention_bench.sh with INSTALL_ONLY=1 installs in an earlier call
# on the same machine), PARTS (shape, tensorwise (shape without rowwise), bf16 (its first run alone), head (tensorwise with the output layer's
# products in float8 inside the fused loss), delayed (tensorwise's layers under fp8_recipe: delayed, each apart), delayed_head
# (both), fused (delayed_head with the SwiGLU MLPs fused, delayed's default), fastest (fp8: true alone, its GPU defaults: fused with fp8_fast_accumulation), pass (plugins/fp8/benchmarks/swiglu_pass.py:
# the fused MLP's backward pass at several tiles), loss (the fused loss's GPU tests and its output-layer benchmark with
# float8), packed, curve (the loss-curve test; KTRAIN_FP8_RUNS=fp8_delayed,... picks its runs beside bf16), profile, levers),
# BENCH_ARGS, BENCH_TIMEOUT (s), PROFILE_ARGS (the profiled run's own, e.g. --set fp8_recipe=tensorwise), LEVERS_ARGS, LEVERS_TIMEOUT (s) choose what runs; levers:
# plugins/fp8/benchmarks/levers.py (what each float8 lever is worth).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.device/fp8_whl}"/*.whl
export PYTHONPATH=/tmp/site${EXTRA_PATH:+:$EXTRA_PATH} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/pip.txt 2>&1 || tail -5 /tmp/pip.txt
mkdir -p "$OUT/b"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
python -c "import torch, transformers, torchao; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'torchao', torchao.__version__)" 2>&1 | tail -1
bench() {  # NAME CONFIG ARGS...: one `ktrain bench`, its report in $OUT/b/NAME.{txt,json}
  local name=$1 config=$2; shift 2
  timeout ${BENCH_TIMEOUT:-240} ktrain bench "configs/bench/$config.yaml" ${BENCH_ARGS:-} "$@" --json "$OUT/b/$name.json" > "$OUT/b/$name.txt" 2>&1
  local rc=$?; echo "$(date +%T) $name rc=$rc"; tr '\r' '\n' < "$OUT/b/$name.txt" | grep -E "^(ktrain |fp8|device while)" | grep -v "ktrain bench"
}
# llama_1p5b_fp8_master writes fp8: true alone, so a GPU run takes the float8 GPU defaults (delayed scaling, the MLPs
# fused, fast accumulation, the output layer in float8); every other run names its keys
TW="--set fp8_recipe=tensorwise --set fp8_fast_accumulation=false --set fused_linear_cross_entropy_fp8=false"
DELAYED="--set fp8_recipe=delayed --set fp8_fast_accumulation=false --set fused_linear_cross_entropy_fp8=false"
for part in ${PARTS:-shape packed}; do
  case $part in
    shape|tensorwise) bench bf16 llama_1p5b_fused_loss_master; bench fp8_tensorwise llama_1p5b_fp8_master $TW
           [ "$part" = tensorwise ] || bench fp8_rowwise llama_1p5b_fp8_master $TW --set fp8_recipe=rowwise ;;
    bf16)  bench bf16 llama_1p5b_fused_loss_master ;;
    head)  bench fp8_head llama_1p5b_fp8_master $TW --set fused_linear_cross_entropy_fp8=true ;;
    delayed) bench fp8_delayed llama_1p5b_fp8_master $DELAYED --set fp8_fused_mlp=false ;;
    delayed_head) bench fp8_delayed_head llama_1p5b_fp8_master $DELAYED --set fused_linear_cross_entropy_fp8=true \
                    --set fp8_fused_mlp=false ;;
    fused) timeout 120 python -m pytest -q -rs -p no:cacheprovider -m gpu plugins/fp8/tests/test_fp8_swiglu.py > "$OUT/b/fused_mlp_gpu_test.txt" 2>&1
           echo "$(date +%T) fused mlp gpu test rc=$?"; tail -2 "$OUT/b/fused_mlp_gpu_test.txt"
           bench fp8_fused llama_1p5b_fp8_master $DELAYED --set fused_linear_cross_entropy_fp8=true ;;
    pass)  timeout 200 python plugins/fp8/benchmarks/swiglu_pass.py > "$OUT/b/swiglu_pass.txt" 2>&1; echo "$(date +%T) swiglu pass rc=$?"
           grep -E "^(torch|[0-9]|tile|inductor|forward)" "$OUT/b/swiglu_pass.txt" ;;
    fastest) bench fp8_fastest llama_1p5b_fp8_master ;;
    loss)  timeout ${LOSS_TIMEOUT:-120} python -m pytest -q -rs -p no:cacheprovider -m gpu plugins/fused_loss/tests/test_fused_loss_gpu.py \
             > "$OUT/b/fused_loss_gpu_tests.txt" 2>&1; echo "$(date +%T) fused loss gpu tests rc=$?"; tail -3 "$OUT/b/fused_loss_gpu_tests.txt"
           timeout 120 python plugins/fused_loss/benchmarks/output_loss.py --chunks 1 --liger-consts '' --float8 > "$OUT/b/output_loss.txt" 2>&1
           echo "$(date +%T) output loss rc=$?"; grep -E "^(ktrain|liger)" "$OUT/b/output_loss.txt" ;;
    packed) bench packed_bf16 llama_1p5b_packed --lengths 256:2048; bench packed_fp8 llama_1p5b_packed_fp8 --lengths 256:2048 ;;
    profile) bench profile_fp8 llama_1p5b_fp8_master ${PROFILE_ARGS:-} --profile "$OUT/b/profile_fp8.json.gz"
             python tools/device/trace_summary.py "$OUT/b/profile_fp8.json.gz" > "$OUT/b/profile_fp8.txt" 2>&1; head -30 "$OUT/b/profile_fp8.txt" ;;
    levers) timeout ${LEVERS_TIMEOUT:-300} python plugins/fp8/benchmarks/levers.py ${LEVERS_ARGS:-} > "$OUT/b/levers.txt" 2>&1
            echo "$(date +%T) levers rc=$?"; grep -E "^(torch|output|blocks|fp8|bf16|tensorwise|\+)" "$OUT/b/levers.txt" ;;
    curve) KTRAIN_FP8_CURVES="$OUT/b/fp8_curves.json" timeout ${CURVE_TIMEOUT:-420} python -m pytest -q -s -rs -p no:cacheprovider -m gpu \
             plugins/fp8/tests/test_fp8_gpu.py > "$OUT/b/fp8_curve_test.txt" 2>&1; rc=$?; echo "$(date +%T) curve rc=$rc"; tail -5 "$OUT/b/fp8_curve_test.txt" ;;
  esac
done
