#!/usr/bin/env bash
# The wheels a GPU lease carries: what the lent host (CPython 3.12, torch with CUDA, no network)
# lacks for zrl, ale-py and Sample Factory 2.1.1's Pong path. Run here, where PyPI is reachable;
# `benchmarks/gpu_lease.sh` installs them there offline (pip install --no-index --find-links).
#
#   bash benchmarks/gpu_wheels.sh            # into build/gpu-wheels (git ignores build/)
#   bash benchmarks/gpu_wheels.sh DIR        # elsewhere; PYVER=3.11 for this machine's dry run
#
# Two folders, each with the wheels and a requirements.txt of their pins:
#   zrl/  what zrl imports and the host has not (pyzmq, gymnasium >= 1, pydantic, setproctitle)
#         and ale-py; installed with --no-deps into a target of its own.
#   sf/   Sample Factory 2.1.1 with --no-deps and only what its Pong path imports that the host
#         has not: gymnasium 0.29 and numpy 1.26 (it pins < 1.0 and < 2: numpy 2 breaks its
#         rollouts), signal-slot-mp, faster-fifo, colorlog, tensorboardX. Put before zrl/ on
#         the path (ale-py comes from there).
# Then the size of what a lease sends (the tree: tracked and untracked-not-ignored files, plus
# this folder, carried) against the device tool's 64 MiB; exits 1 if over.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$repo/build/gpu-wheels}
pyver=${PYVER:-3.12}
limit=$((${LIMIT_MIB:-64} * 1024 * 1024))
PY=${PYTHON:-python3}

ZRL=(pyzmq==27.3.0 gymnasium==1.4.0 farama-notifications==0.0.6 pydantic==2.13.4
  pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  typing-extensions==4.15.0 setproctitle==1.3.8 ale-py==0.12.1)
SF=(sample-factory==2.1.1 gymnasium==0.29.1 numpy==1.26.4 signal-slot-mp==1.0.5
  faster-fifo==1.5.2 colorlog==6.12.0 tensorboardx==2.6.5)

platforms=()
for p in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_24_x86_64 \
  manylinux_2_26_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done

fetch() { # fetch SUBDIR REQ...
  local sub=$dir/$1
  shift
  rm -rf "$sub"
  mkdir -p "$sub"
  printf '%s\n' "$@" >"$sub/requirements.txt"
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --implementation cp "${platforms[@]}" -d "$sub" "$@"; then
    echo "gpu_wheels: pip could not download every wheel of $sub (above)" >&2
    exit 2
  fi
}
fetch zrl "${ZRL[@]}"
fetch sf "${SF[@]}"
echo "$pyver" >"$dir/python-version"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
wheels=$(find "$dir" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
tree=$(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
  { xargs -0 -r stat -L -c '%s' -- 2>/dev/null || true; } | awk '{ s += $1 } END { print s + 0 }')
if [ -d "$repo/shared" ]; then
  tree=$((tree + $(du -sb "$repo/shared" | cut -f1)))
fi
total=$((tree + wheels))
for sub in zrl sf; do
  echo "$sub/: $(find "$dir/$sub" -name '*.whl' | wc -l) wheels, $(mib "$(du -sb "$dir/$sub" | cut -f1)")"
done
echo "wheels ($dir, CPython $pyver): $(mib "$wheels")"
echo "the tree (tracked and untracked-not-ignored files): $(mib "$tree")"
echo "together: $(mib "$total") of $(mib "$limit")"
if [ "$total" -gt "$limit" ]; then
  echo "gpu_wheels: over the device tool's limit: carry less" >&2
  exit 1
fi
