#!/usr/bin/env bash
# One device call: the same benchmark on two builds, alternated, so both see the same machine.
# The old build is a tree of replayssm_jax/ under $OLD (e.g. `mkdir -p ab_old && git archive HEAD
# replayssm_jax | tar -x -C ab_old`, made before the edit); the new one is the working tree.
#   OLD=ab_old ROUNDS=2 TAG=run27_x BENCH_ARGS="--paths kernels --batch 256 64 --reps 20" \
#     bash benchmarks/ab_h200.sh
# Results: $OUT/ab_${TAG}_{new,old}_${round}.json and the logs' tables.
set -uo pipefail
PY=${PY:-python3}; OUT=${OUT:-out}; OLD=${OLD:-ab_old}; TAG=${TAG:-ab}; ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
[ -d "$OLD/replayssm_jax" ] || { echo "no old build at $OLD/replayssm_jax" >&2; exit 2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader || true
bench() {  # bench ROOT ARM ROUND: `python -m` puts the cwd first, so run from the build's root
  (cd "$1" && PYTHONPATH=$PWD "$PY" -c "import replayssm_jax as r; print('build:', r.__file__)" \
     && PYTHONPATH=$PWD "$PY" -m replayssm_jax.bench.kernels \
     --out "$OUT/ab_${TAG}_$2_$3.json" ${BENCH_ARGS:-} 2>&1 | grep -E "^(B=|copy|build)" )
}
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r: new"; bench . new "$r"
  echo "== round $r: old"; bench "$OLD" old "$r"
done
