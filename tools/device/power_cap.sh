#!/usr/bin/env bash
# The device's clock, power and temperature (nvidia-smi, every 250 ms, to $OUT/smi.csv) while the 1.5B
# benchmark and the step's matrix multiplies and attention run alone; what docs/performance.md's section
# "The power limit" reads. Each output line is stamped with the time, to place it in smi.csv.
#   run: PARTS="bench long gemm sdpa" bash tools/device/power_cap.sh   (carry .whl)
# bench: `ktrain bench llama_1p5b_fused_loss_master --peer hf` (5 + 20 steps); long: the same with 40 + 40;
# gemm: tests/benchmarks/gemm_shapes.py --sustain 20, with cuBLAS and cuBLASLt; sdpa: tests/benchmarks/sdpa_backends.py.
set -u
Q="timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active"
nvidia-smi --query-gpu=$Q --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
stamp() { while IFS= read -r l; do printf '%s %s\n' "$(date +%T.%3N)" "$l"; done; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
CONFIG=configs/bench/llama_1p5b_fused_loss_master.yaml
run() {  # NAME COMMAND...: the command's output, \r-split and stamped, to $OUT/NAME.txt
  local name=$1; shift
  echo "$(date +%T.%3N) $name: $*" > "$OUT/$name.txt"
  "$@" 2>&1 | stdbuf -oL tr '\r' '\n' | grep --line-buffered -v "Loading weights" | stamp >> "$OUT/$name.txt"
  echo "$(date +%T.%3N) end" >> "$OUT/$name.txt"
}
for part in ${PARTS:-bench long gemm sdpa}; do
  case $part in
    bench) run bench ktrain bench $CONFIG --peer hf --json "$OUT/bench.json" ;;
    long) run long ktrain bench $CONFIG --peer hf --warmup 40 --steps 40 --json "$OUT/long.json" ;;
    gemm) run gemm bash -c "python tests/benchmarks/gemm_shapes.py --sustain 20; python tests/benchmarks/gemm_shapes.py --blas cublaslt --sustain 20" ;;
    sdpa) run sdpa python tests/benchmarks/sdpa_backends.py --layout bshd ;;
  esac
  tail -4 "$OUT/$part.txt"
done
kill $SMI
