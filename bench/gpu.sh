#!/usr/bin/env bash
# The GPU plan in one call of at most 6 minutes: the steps of bench/plan.txt, each capped beside its estimate
# (a preflight, the small reference setup, GPT-2 124M on a short ladder, a run that reaches every CUDA-only rung,
# the width sweep on time left), then everything packed into three files for the device's limits:
#
#   $OUT/runs.tgz         every step's folder (results.json, report.html, waterfall.png, its log), no trace.json
#   $OUT/summary.txt      each run's notes and table in full
#   $OUT/environment.txt  nvidia-smi, versions, the preflight, and the plan's step table (estimate, cap, wall, status)
#
# and the short tables printed last. A capped step is sent SIGINT, which speedladder turns into "interrupted,
# results kept", and SIGKILL GRACE seconds later; the seconds a step leaves unused go to the next. A preflight
# that fails stops the plan (the packing still runs). Wheels in .whl/ (bench/wheels.sh) are installed first
# into a temporary target on PYTHONPATH.
#
#   bash bench/gpu.sh           on a CUDA machine, from the source tree
#   bash bench/gpu.sh --smoke   the same script, steps and packing on tiny shapes, on any device
#
# OUT (default bench/out), WORK (the step folders; default a fresh temporary folder), WHEELS (default .whl),
# PLAN (default bench/plan.txt), PYTHON (default python3) and GRACE (default 4) can be set.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=gpu
if [[ "${1:-}" == "--smoke" ]]; then MODE=smoke; elif [[ -n "${1:-}" ]]; then
  echo "usage: bash bench/gpu.sh [--smoke]" >&2; exit 2
fi
OUT=${OUT:-bench/out}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
PLAN=${PLAN:-bench/plan.txt}
GRACE=${GRACE:-4}  # seconds from SIGINT to SIGKILL: speedladder saves after every rung, so the stop is quick
mkdir -p "$OUT"
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/speedladder-gpu.XXXXXX")}
mkdir -p "$WORK"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
START=$(date +%s)
STEPS="$WORK/steps.tsv"
printf 'step\test_s\tcap_s\tgranted_s\twall_s\tstatus\n' > "$STEPS"
FAILED=0

capped() {  # capped SECONDS LOG CMD...: CMD with SIGINT at SECONDS - GRACE and SIGKILL at SECONDS, logged
  local limit=$1 log=$2
  shift 2
  local grace=$(( GRACE < limit / 4 ? GRACE : limit / 4 ))
  local soft=$(( limit - grace > 0 ? limit - grace : 1 ))
  timeout --signal=INT --kill-after="$(( grace > 0 ? grace : 1 ))" "$soft" "$@" 2>&1 | tee "$log"
}

install_wheels() {  # into a temporary target, appended to PYTHONPATH (src stays first)
  shopt -s nullglob
  local wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  if (( ${#wheels[@]} == 0 )); then
    echo "no wheels in $WHEELS/ (bench/wheels.sh downloads them): without torchao the fp8 rung is skipped"
    return 0
  fi
  local site
  site=$(mktemp -d "${TMPDIR:-/tmp}/speedladder-site.XXXXXX")
  timeout "$1" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${wheels[@]}" || return 1
  export PYTHONPATH="$PYTHONPATH:$site"
  echo "installed into $site: ${wheels[*]##*/}"
}

status_of() {  # the exit status of a step, in a word
  case $1 in
    0) echo ok ;;
    124|130|137) echo capped ;;
    *) echo "exit $1" ;;
  esac
}

granted=0  # the caps of the steps so far: a step may run until they are spent
stop=""
while read -r -u 3 mode step est cap cmd args; do  # fd 3: the steps' commands keep their own stdin
  [[ -z "${mode:-}" || "$mode" == \#* || "$mode" != "$MODE" ]] && continue
  granted=$(( granted + cap ))
  left=$(( granted - ($(date +%s) - START) ))
  if [[ "$cmd" == pack ]]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$step" "$est" "$cap" "-" "-" "below" >> "$STEPS"
    break
  fi
  if [[ -n "$stop" ]] || (( left < 1 )) || (( cap == 0 && left < est )); then
    why=${stop:-"no time left (${left} s)"}
    echo "== $step: skipped: $why"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$step" "$est" "$cap" "$left" "0" "skipped: $why" >> "$STEPS"
    continue
  fi
  echo "== $step: $cmd $args (est ${est} s, cap ${cap} s, ${left} s granted)"
  t0=$(date +%s)
  mkdir -p "$WORK/$step"
  # shellcheck disable=SC2086  # the plan's flags are words
  case $cmd in
    # Not piped: the PYTHONPATH that install_wheels exports must stay in this shell.
    wheels) install_wheels "$left" > "$WORK/$step/log.txt" 2>&1; rc=$?; cat "$WORK/$step/log.txt" ;;
    preflight) capped "$left" "$WORK/$step/log.txt" "$PY" bench/preflight.py $args; rc=$? ;;
    run|sweep) capped "$left" "$WORK/$step/log.txt" "$PY" -m speedladder "$cmd" --out "$WORK/$step" $args; rc=$? ;;
    *) echo "unknown command $cmd in $PLAN"; rc=2 ;;
  esac
  wall=$(( $(date +%s) - t0 ))
  echo "== $step: $(status_of "$rc") after ${wall} s"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$step" "$est" "$cap" "$left" "$wall" "$(status_of "$rc")" >> "$STEPS"
  if [[ "$cmd" == preflight && "$rc" != 0 ]]; then stop="the preflight failed"; FAILED=1; fi
  if [[ "$rc" != 0 && "$(status_of "$rc")" != capped ]]; then FAILED=1; fi
done 3< "$PLAN"

# -- pack: three files under $OUT, nothing deeper --------------------------------------------------------------
{
  echo "speedladder GPU plan ($MODE), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git describe --always --dirty 2>/dev/null || echo "no git checkout")"
  echo
  if command -v nvidia-smi > /dev/null; then nvidia-smi 2>&1; else echo "nvidia-smi: not on this machine"; fi
  echo
  echo "-- preflight"
  cat "$WORK/preflight/log.txt" 2>/dev/null || echo "(no preflight)"
  echo
  echo "-- packages"
  "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|triton|torchao|numpy|scipy|tiktoken|matplotlib|rich|pyyaml|typer) ' || true
  echo
  echo "-- steps (est and cap from bench/plan.txt; granted: the cap plus what earlier steps left)"
  column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"
} > "$OUT/environment.txt"
LIMIT=$(( 16 * 1024 * 1024 ))  # the device returns files of at most 16 MiB
tar -czf "$OUT/runs.tgz" --exclude=trace.json -C "$WORK" .
if (( $(stat -c %s "$OUT/runs.tgz") > LIMIT )); then
  echo "runs.tgz over 16 MiB: packed again without report.html and the plots (results.json has every number)"
  tar -czf "$OUT/runs.tgz" --exclude=trace.json --exclude=report.html --exclude='*.png' -C "$WORK" .
fi
echo "== packed into $OUT: runs.tgz ($(stat -c %s "$OUT/runs.tgz") bytes), environment.txt, summary.txt (step folders in $WORK)"
"$PY" bench/summary.py --steps "$STEPS" --full "$OUT/summary.txt" "$WORK" || FAILED=1
exit "$FAILED"
