#!/usr/bin/env bash
# Both reference setups (the small d2l-style GPT and GPT-2 124M) climb the full ladder (--ladder full: R0 -> compile -> bf16 -> sdpa ->
# fused-adamw -> pad-vocab -> batch-up -> max-autotune -> fp8, checkpointing beside the top) on one CUDA GPU,
# then a width sweep (256, 512) of bf16 against eager, capped to fit 9 minutes with their clean-up (caps are estimates until a GPU run; a capped ladder keeps what
# it measured, and max-autotune's compile may well take the rest of a cap):
#   small GPT  (d2l-512, The Time Machine, T=128, B=64, batch-up to 512)
#   GPT-2 124M (gpt2-124m, Tiny Shakespeare, B=16, T=1024, batch-up x4)
# Results land in ${OUT:-bench/out}/<ladder>/<timestamp>/ (results.json, waterfall.png, log).
# Each ladder is capped with SIGINT, which speedladder turns into "interrupted, results kept".
#
#   bash bench/gpu.sh           on a CUDA machine, from the source tree, installing nothing
#   bash bench/gpu.sh --smoke   the same script on tiny shapes, on any device, in a few minutes
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
PY=${PYTHON:-python3}
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

ladder() {  # ladder NAME SECONDS ARGS...: one speedladder run, its log kept beside its results
  local name=$1 limit=$2
  shift 2
  mkdir -p "$OUT/$name"
  echo "== $name: speedladder run $*"
  local rc=0
  timeout --signal=INT --kill-after=30 "$limit" "$PY" -m speedladder run --out "$OUT/$name" "$@" \
    2>&1 | tee "$OUT/$name/log.txt" || rc=$?
  echo "== $name: exit $rc"
}

if [[ "${1:-}" == "--smoke" ]]; then
  # The script's plumbing on tiny shapes: no compile (a cold compile costs ~20 s a configuration on 2 CPU cores),
  # no resident-peak children, short gates, no learns-check, no miss explained; the GPU run climbs the full ladder.
  ladder small 240 --preset tiny --rungs eager,bf16,ckpt --steps 2 --windows 3 --loss-steps 3 \
    --learns-steps 0 --profile-steps 3 --explain-miss 0 --no-process-peak
  ladder gpt2 240 --preset tiny --data tinyshakespeare --tokenizer gpt2 --rungs eager,bf16 \
    --steps 1 --windows 3 --loss-steps 2 --learns-steps 0 --no-profile --no-process-peak
else
  { nvidia-smi || true; "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } \
    > "$OUT/environment.txt" 2>&1
  ladder small 200 --preset d2l-512 --ladder full
  ladder gpt2 240 --preset gpt2-124m --data tinyshakespeare --batch-size 16 --seq-len 1024 --ladder full \
    --loss-steps 10 --learns-steps 150
  # The source's width-256 finding: bf16 against eager at widths 256 and 512 (the d2l-512 workload).
  mkdir -p "$OUT/sweep"
  timeout --signal=INT --kill-after=30 60 "$PY" -m speedladder sweep --preset d2l-512 --widths 256,512 \
    --rungs eager,bf16 --budget-minutes 1 --out "$OUT/sweep" 2>&1 | tee "$OUT/sweep/log.txt" || true
fi

"$PY" bench/summary.py "$OUT"/small/*/results.json "$OUT"/gpt2/*/results.json
