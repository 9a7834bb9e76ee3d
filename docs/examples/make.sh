#!/usr/bin/env bash
# Regenerate the example output shown in README.md and docs/ from the saved results files in docs/,
# so that no example is pasted by hand and none can drift from the code that prints it.
#
#   bash docs/examples/make.sh           write docs/examples/*.txt
#   bash docs/examples/make.sh --check   regenerate into a temporary folder; exit 1 if a file differs
#
# Run it from anywhere inside the repository; it uses the source tree (src/) unless speedladder is
# installed, and ${PYTHON:-python3}. For each docs/NAME-results.json it writes:
#   docs/examples/NAME.txt          `speedladder report` of that file: the table and the notes under it
#   docs/examples/NAME-profile.txt  the baseline profile saved inside it, printed by `speedladder report`
#                                   as `speedladder profile` prints it (only if the run was profiled)
# and docs/examples/flags.md, every command's flags generated from the configuration dataclasses. The *.py files
# there are not generated: the docs show them whole (docs/rungs.md), and tests/test_docs.py checks that they do.
# `speedladder report` redraws waterfall.png beside the file it reads, so every file is copied to a
# temporary folder first: the PNGs in docs/ are never touched. Any failure exits non-zero.
#
# A fenced block in README.md or docs/*.md that follows the line
#   <!-- excerpt: docs/examples/NAME.txt -->
# must be an excerpt of that file: each of its lines (but a lone "…", which marks a cut) must be a line
# of the file, in the file's order. Both modes check this and exit 1 if an excerpt has drifted.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export COLUMNS=160  # rich draws the tables 160 characters wide, as when the output goes to a file

check=0
if [[ "${1:-}" == "--check" ]]; then
  check=1
elif [[ $# -gt 0 ]]; then
  echo "usage: bash docs/examples/make.sh [--check]" >&2
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=docs/examples
[[ $check == 1 ]] && out="$tmp/out"
mkdir -p "$out"

report() {  # report FOLDER SHOWN [FILE]: print `speedladder report FOLDER`, with FOLDER/ written as SHOWN and
            # FOLDER itself (the conclusion's commands name the run) as FILE
  local text
  text=$("$PY" -m speedladder report "$1")
  [[ -n "$text" ]] || { echo "make.sh: speedladder report $1 printed nothing" >&2; return 1; }
  # The temporary folder is written as the folder the command names; rich pads lines with spaces.
  printf '%s\n' "$text" | sed -e "s#$1/#$2#g" -e "s#$1\b#${3:-$1}#g" -e 's/[[:space:]]*$//'
}

found=0
for results in docs/*-results.json; do
  [[ -e "$results" ]] || continue
  found=1
  name=$(basename "$results" -results.json)
  run="$tmp/$name"
  mkdir -p "$run"
  cp "$results" "$run/results.json"
  {
    echo "\$ speedladder report $results"
    report "$run" "docs/" "$results"
  } > "$out/$name.txt"
  echo "wrote $out/$name.txt"

  # The profile saved inside the results file, as a profile folder of its own (what `speedladder profile`
  # writes), so that `speedladder report` prints it in full.
  if "$PY" - "$run/results.json" "$run/profile" <<'PYEOF'
import json, pathlib, sys

saved = json.loads(pathlib.Path(sys.argv[1]).read_text())
b = saved.get("profile")
if not b or b.get("error"):
    sys.exit(3)  # not profiled: nothing to print
folder = pathlib.Path(sys.argv[2])
folder.mkdir()
keep = ("schema", "status", "created", "command", "config", "environment")
profile = {**{k: saved[k] for k in keep}, "kind": "profile",
           "model": {"preset": saved["model"]["preset"], "params": saved["model"]["params"]},
           "profile": b, "predictions": saved.get("predictions") or []}
(folder / "profile.json").write_text(json.dumps(profile, indent=1))
PYEOF
  then
    {
      echo "# the baseline profile saved in $results, printed by \`speedladder report\`"
      report "$run/profile" ""
    } > "$out/$name-profile.txt"
    echo "wrote $out/$name-profile.txt"
  else
    rc=$?
    [[ $rc == 3 ]] || exit "$rc"
  fi
done
[[ $found == 1 ]] || { echo "make.sh: no docs/*-results.json found" >&2; exit 1; }

# Every command's flags, from the configuration dataclasses.
"$PY" -m speedladder.cli.flags_doc > "$out/flags.md"
echo "wrote $out/flags.md"

# The excerpts quoted in the pages, against the files just written.
"$PY" - "$out" README.md docs/*.md <<'PYEOF'
import pathlib, re, sys

out, pages = pathlib.Path(sys.argv[1]), sys.argv[2:]
marker = re.compile(r"<!-- excerpt: docs/examples/(\S+) -->")
bad = 0
for page in pages:
    lines = pathlib.Path(page).read_text().splitlines()
    for i, line in enumerate(lines):
        m = marker.fullmatch(line.strip())
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            print(f"make.sh: {page}:{i + 1}: no fenced block after the excerpt marker", file=sys.stderr)
            bad += 1
            continue
        source = (out / m.group(1)).read_text().splitlines()
        at = 0
        for j in range(i + 2, len(lines)):
            quoted = lines[j]
            if quoted.startswith("```"):
                break
            if quoted == "…":
                continue
            try:
                at = source.index(quoted, at) + 1
            except ValueError:
                print(f"make.sh: {page}:{j + 1}: not in docs/examples/{m.group(1)} (or out of order): {quoted[:80]}",
                      file=sys.stderr)
                bad += 1
sys.exit(1 if bad else 0)
PYEOF
echo "the excerpts in README.md and docs/ match docs/examples"

if [[ $check == 1 ]]; then
  if ! diff -r "$out" docs/examples --exclude=make.sh --exclude="*.py"; then
    echo "make.sh: docs/examples is out of date: run bash docs/examples/make.sh" >&2
    exit 1
  fi
  echo "docs/examples is up to date"
fi
