#!/usr/bin/env bash
# Downloads, on this machine, the wheels the GPU machine lacks (bench/wheels.txt) into .whl/, for CPython 3.12
# on manylinux x86_64 (the machine reaches no package registry). bench/gpu.sh installs whatever .whl/ holds into
# a temporary target at the start of its call; the device call carries the folder (carry: [".whl"]), which git
# ignores. Old wheels in the folder are removed first: two versions of one package stop pip's install.
#
#   bash bench/wheels.sh        WHEELS (default .whl) and PYTHON (default python3) can be set
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${WHEELS:-.whl}
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
# pip matches a manylinux tag exactly: the glibc versions the image's platform accepts, newest first.
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
grep -vE '^[[:space:]]*(#|$)' bench/wheels.txt | while read -r requirement; do
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" --dest "$DEST" "$requirement"
done
ls -l "$DEST"/*.whl
