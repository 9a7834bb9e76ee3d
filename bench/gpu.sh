#!/usr/bin/env bash
# The GPU plan in one call of about 8 minutes: the steps of bench/plan.txt, each capped beside its estimate, in
# the order of the value of their figures (a preflight; d2l-512's R0-R4; GPT-2 124M compiled; the CUDA-only rungs;
# a short race; on the time left, the width sweep, fp8's tensorwise recipe and max-autotune), with the packed files
# refreshed in $OUT after every step, so that a call cut at any moment still returns the steps it finished:
#
#   $OUT/runs.tgz         every finished step's folder (results.json, report.html, waterfall.png, its log), no trace
#   $OUT/summary.txt      each run's notes and table in full (one line until a run has finished)
#   $OUT/environment.txt  nvidia-smi, versions, the preflight's phases, and the step table so far (estimate, cap,
#                         seconds granted, wall time, status), the steps not reached yet marked pending
#
# Each file is written beside its final name and renamed into place (a kill leaves the last complete one, and at
# most its .part beside it: 6 files at most of the 8 the device returns). The short tables are printed last.
# A capped step is sent SIGINT, which speedladder turns into "interrupted, results kept", and SIGKILL GRACE
# seconds later; the seconds a step leaves unused go to the next. A capped preflight is slow, not broken: the
# plan goes on. Only a preflight that fails (no torch, no CUDA, a failing step or compile) stops it. Wheels in
# .whl/ (bench/wheels.sh) are installed first into a temporary target on PYTHONPATH. The steps share one
# inductor cache, empty at the start of the call (TORCHINDUCTOR_CACHE_DIR, unless set): the estimates are cold.
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
COMMANDS=" wheels preflight run sweep race pack "

# -- the plan, read and checked before anything runs -----------------------------------------------------------
if [[ ! -r "$PLAN" ]]; then echo "bench/gpu.sh: no plan file $PLAN" >&2; exit 2; fi
PLANNED=()  # "step<TAB>est<TAB>cap" of this mode's steps, in order
n=0
while read -r mode step est cap cmd _; do
  n=$(( n + 1 ))
  [[ -z "${mode:-}" || "$mode" == \#* || "$mode" != "$MODE" ]] && continue
  if [[ -z "${cmd:-}" || ! "$est" =~ ^[0-9]+$ || ! "$cap" =~ ^[0-9]+$ || "$COMMANDS" != *" $cmd "* ]]; then
    echo "bench/gpu.sh: $PLAN line $n: want MODE STEP EST CAP COMMAND (whole seconds; a command of$COMMANDS)" >&2
    exit 2
  fi
  PLANNED+=("$step"$'\t'"$est"$'\t'"$cap")
done < "$PLAN"
if (( ${#PLANNED[@]} == 0 )); then echo "bench/gpu.sh: $PLAN has no $MODE steps" >&2; exit 2; fi

mkdir -p "$OUT" || exit 2
rm -f "$OUT"/{runs.tgz,summary.txt,environment.txt}{,.part}  # nothing of an earlier call is taken for this one's
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/speedladder-gpu.XXXXXX")}
mkdir -p "$WORK" || exit 2
if [[ -z "${TORCHINDUCTOR_CACHE_DIR:-}" ]]; then
  TORCHINDUCTOR_CACHE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/speedladder-inductor.XXXXXX")
  OWN_CACHE=$TORCHINDUCTOR_CACHE_DIR
fi
export TORCHINDUCTOR_CACHE_DIR
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
START=$(date +%s)
META=$(mktemp -d "${TMPDIR:-/tmp}/speedladder-meta.XXXXXX")  # the packing's own files, never packed
trap 'rm -rf "$META" ${OWN_CACHE:+"$OWN_CACHE"}' EXIT
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

# -- the packed files, refreshed after every step ----------------------------------------------------------------
{  # what does not change during the call, read once
  echo "speedladder GPU plan ($MODE), started $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git describe --always --dirty 2>/dev/null || echo "no git checkout")"
  echo
  if command -v nvidia-smi > /dev/null; then nvidia-smi 2>&1; else echo "nvidia-smi: not on this machine"; fi
} > "$META/head.txt" 2>&1

step_table() {  # the steps so far, then the planned ones not reached yet
  local row done_steps
  done_steps=$(cut -f1 "$STEPS" | tail -n +2)
  cat "$STEPS"
  for row in "${PLANNED[@]}"; do
    grep -qxF "${row%%$'\t'*}" <<< "$done_steps" || printf '%s\t-\t-\tpending\n' "$row"
  done
}

publish() {  # publish NAME: $OUT/NAME.part renamed into place, so a reader never sees a half-written file
  mv -f "$OUT/$1.part" "$OUT/$1"
}

pack() {  # pack [final]: the three files under $OUT from what $WORK holds now
  local when=${1:-so far}
  if [[ ! -e "$META/packages.txt" ]]; then  # once, after the first step (the wheels' torchao on PYTHONPATH)
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|triton|torchao|numpy|scipy|tiktoken|matplotlib|rich) ' \
      > "$META/packages.txt"
  fi
  {
    cat "$META/head.txt"
    echo
    echo "-- packages"
    cat "$META/packages.txt"
    echo
    echo "-- preflight"
    cat "$WORK/preflight/log.txt" 2>/dev/null || echo "(no preflight)"
    echo
    echo "-- steps $when, $(( $(date +%s) - START )) s into the call (est and cap from bench/plan.txt; granted: the cap plus what earlier steps left)"
    step_table | column -t -s $'\t' 2>/dev/null || step_table
  } > "$OUT/environment.txt.part" && publish environment.txt
  local limit=$(( 16 * 1024 * 1024 ))  # the device returns files of at most 16 MiB
  tar -czf "$OUT/runs.tgz.part" --exclude=trace.json -C "$WORK" . 2>/dev/null
  if (( $(stat -c %s "$OUT/runs.tgz.part") > limit )); then
    echo "runs.tgz over 16 MiB: packed again without report.html and the plots (results.json has every number)"
    tar -czf "$OUT/runs.tgz.part" --exclude=trace.json --exclude=report.html --exclude='*.png' -C "$WORK" . \
      2>/dev/null
  fi
  publish runs.tgz
  if [[ "$when" != final && ! -e "$META/ran" ]]; then  # no run to render yet: a line, without Python's start
    echo "no run has finished yet: the step table is in environment.txt" > "$OUT/summary.txt.part"
    publish summary.txt
    return 0
  fi
  # The summary's stdout (the short tables) is printed once, at the end.
  "$PY" bench/summary.py --steps "$STEPS" --full "$OUT/summary.txt.part" "$WORK" > "$META/summary-out.txt" 2>&1 \
    && publish summary.txt || { cat "$META/summary-out.txt"; return 1; }
}

# -- the steps ---------------------------------------------------------------------------------------------------
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
    preflight) capped "$left" "$WORK/$step/log.txt" "$PY" bench/preflight.py --estimate "$est" $args; rc=$? ;;
    run|sweep|race) capped "$left" "$WORK/$step/log.txt" "$PY" -m speedladder "$cmd" --out "$WORK/$step" $args
                    rc=$? ;;
  esac
  wall=$(( $(date +%s) - t0 ))
  [[ "$cmd" == run || "$cmd" == sweep || "$cmd" == race ]] && touch "$META/ran"  # a summary to render from now on
  status=$(status_of "$rc")
  if [[ "$cmd" == preflight && "$status" == capped ]]; then
    status="capped (slow, not failed: the plan goes on)"
  elif [[ "$cmd" == preflight && "$rc" != 0 ]]; then
    stop="the preflight failed"; FAILED=1
  elif [[ "$rc" != 0 && "$status" != capped ]]; then
    FAILED=1
  fi
  echo "== $step: $status after ${wall} s"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$step" "$est" "$cap" "$left" "$wall" "$status" >> "$STEPS"
  pack || FAILED=1
done 3< "$PLAN"

pack final || FAILED=1
echo "== packed into $OUT: runs.tgz ($(stat -c %s "$OUT/runs.tgz") bytes), environment.txt, summary.txt (step folders in $WORK)"
cat "$META/summary-out.txt"  # the last packing's summary: the step table, then each run's short table
exit "$FAILED"
