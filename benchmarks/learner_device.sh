#!/usr/bin/env bash
# The learner on a GPU against the same learner on the CPU, on one machine, one run after the
# other: zrl APPO on Pong (benchmarks/atari.py, sections a and b, zrl only) with
# learner.device=cuda, then with learner.device=cpu, everything else equal (CPU actors, the
# same envs, batch and torch threads). Then the encoders' forward+backward on each device.
#
#   bash benchmarks/learner_device.sh   # SECONDS_EACH=90 ACTORS=8 ENVS_PER_CORE=8 DEVICES="cuda cpu" ENCODERS=1
#
# Needs a CUDA build of torch and a GPU; prints what it measured, the ratio cuda/cpu, and the
# machine (nproc, GPU name, torch version).
set -u
SECONDS_EACH=${SECONDS_EACH:-90}
ACTORS=${ACTORS:-8}
ENVS_PER_CORE=${ENVS_PER_CORE:-8}
LEARNER_THREADS=${LEARNER_THREADS:-2}
PY=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
cfg=$(mktemp --suffix=.yaml)
trap 'rm -f "$cfg"' EXIT
sed -e "s/^  actors: [0-9]*/  actors: ${ACTORS}/" "$here/configs/pong_appo.yaml" >"$cfg"

"$PY" - <<'EOF'
import os, torch
print(f"cores {len(os.sched_getaffinity(0))}, torch {torch.__version__}, "
      f"GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
EOF

for dev in ${DEVICES:-cuda cpu}; do
  echo "== learner.device=$dev, $ACTORS actors"
  "$PY" "$here/benchmarks/atari.py" --sections a,b --skip-sf --seconds "$SECONDS_EACH" \
    --warmup 20 --envs-per-core "$ENVS_PER_CORE" --zrl-config "$cfg" \
    --zrl-set "learner.device=$dev" --zrl-set "learner.torch_threads=$LEARNER_THREADS"
done

[ "${ENCODERS:-1}" = 1 ] || exit 0
for dev in cuda cpu; do
  echo "== encoders on $dev"
  "$PY" "$here/benchmarks/encoders.py" --device "$dev" --large 512 --reps 5 --threads "$LEARNER_THREADS"
done
