#!/usr/bin/env bash
# The GPU machine's torch on this machine: a virtual environment with torch 2.11.0 (the version of the device's
# image) and torchao at bench/wheels.txt's pin, the package and its test tools in it, then the test suite's fast
# part and `bash bench/gpu.sh --smoke`.
#
#   bash bench/compat.sh               the fast part (FAST below), then the smoke plan
#   bash bench/compat.sh tests/X.py    these pytest arguments instead of the fast part, then the smoke plan
#
# PyPI's Linux wheel of torch 2.11.0 is the CUDA build (CUDA 13.0, ~530 MB, and ~2.7 GB of NVIDIA libraries it
# depends on); the CPU build lives on PyTorch's own index, which this machine may not reach. The CUDA build runs
# on a CPU: without a GPU, torch.cuda.is_available() is False and every command falls back to the CPU.
# VENV (default .venv-compat, which git ignores), TORCH (default 2.11.0), PYTHON (default python3) can be set;
# an existing VENV is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-compat}
TORCH=${TORCH:-2.11.0}
PY=${PYTHON:-python3}
# The fast part: every test file but the whole ladders of the Hugging Face and user models (transformers is not
# on the GPU plan's path, nor are user models), the data-parallel launches and the browser test. One test is
# left out for what this machine is, not for what torch 2.11 does: the CUDA build without a GPU, with an nvcc on
# the PATH, logs "No CUDA runtime is found" when torch.utils.benchmark is imported, and that test wants stderr
# to be the error's one line (the GPU machine has its CUDA runtime).
FAST=(--ignore=tests/models/test_hf.py --ignore=tests/models/test_models.py --ignore=tests/parallel/test_parallel.py
      --ignore=tests/report/test_html_report.py
      --deselect=tests/e2e/test_cli.py::test_the_installed_command_fails_without_a_traceback)

if [[ ! -x "$VENV/bin/python" ]]; then "$PY" -m venv "$VENV"; fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
t0=$(date +%s)
python -m pip install -q "torch==$TORCH"
# The test extra of pyproject.toml, with torchao at the device's pin (bench/wheels.txt: the release built
# against torch 2.11) in place of the one the extra pins for the development machine's torch.
mapfile -t TEST_DEPS < <(python - <<'EOF'
import re, tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]
pin = next(l.strip() for l in open("bench/wheels.txt") if l.startswith("torchao=="))
for req in extra:
    print(pin if re.match(r"torchao\b", req) else req)
EOF
)
python -m pip install -q -e . "${TEST_DEPS[@]}"
echo "== installed in $(( $(date +%s) - t0 )) s into $VENV ($(du -sh "$VENV" | cut -f1)):" \
  "$(python -c 'import torch; print("torch", torch.__version__, "(CUDA", torch.version.cuda, "build)")')," \
  "$(python -m pip list 2>/dev/null | grep -E '^torchao ' | tr -s ' ')"

status=0
if (( $# )); then python -m pytest -p no:cacheprovider "$@" || status=$?
else python -m pytest -p no:cacheprovider "${FAST[@]}" || status=$?; fi
OUT=$(mktemp -d "${TMPDIR:-/tmp}/speedladder-compat-out.XXXXXX") WHEELS=/nonexistent PYTHON=python \
  bash bench/gpu.sh --smoke || status=$?
echo "== torch $TORCH: $([[ $status == 0 ]] && echo passed || echo "FAILED (exit $status)")"
exit "$status"
