#!/usr/bin/env bash
# One command for a GPU lease (issue 42): on a bare lent GPU host, from the repo root, in at
# most six minutes (--budget), everything the GPU path needs proven, written to $OUT:
#
#   bash benchmarks/gpu_lease.sh                 # a GPU host; the wheels in build/gpu-wheels
#   bash benchmarks/gpu_lease.sh --dry-run       # any CPU machine: every step it can, shorter
#   bash benchmarks/gpu_lease.sh --out DIR ...   # more: python benchmarks/gpu_host.py --lease -h
#
# The steps (benchmarks/gpu_host.py, class Lease): the wheels of benchmarks/gpu_wheels.sh
# installed offline; the CUDA tests (stops there if one fails); (g3) the learner's intake alone;
# (g1) zrl with the README's GPU line, Sample Factory 2.1.1 with 16 envs per worker and the bare
# AtariVectorEnv, in one run; nvidia-smi and every process's CPU sampled during each; the
# verdicts against the targets. Results: table.md, report.json, lease.log, logs.tar.gz.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 1
PY=${PYTHON:-python3}
budget=360
prev=""
for a in "$@"; do # the hard stop follows --budget, with a minute to write the results
  [ "$prev" = "--budget" ] && budget=${a%.*}
  case $a in --budget=*) budget=${a#--budget=} budget=${budget%.*} ;; esac
  prev=$a
done
export PYTHONUNBUFFERED=1
exec timeout -k 45 $((budget + 60)) "$PY" benchmarks/gpu_host.py --lease "$@"
