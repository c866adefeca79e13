#!/usr/bin/env bash
# One device call: the same benchmark on two builds (or more arms), alternated, so all see the
# same machine. The old build is a tree of replayssm_jax/ under $OLD (e.g. `mkdir -p ab_old &&
# git archive HEAD replayssm_jax | tar -x -C ab_old`, made before the edit); the new one is the
# working tree.
#   OLD=ab_old ROUNDS=2 TAG=run27_x BENCH_ARGS="--paths kernels --batch 256 64 --reps 20" \
#     bash benchmarks/ab_h200.sh
# ARMS, if set, replaces the two arms: `;`-separated NAME=ROOT|EXTRA_ARGS, the EXTRA_ARGS added
# to BENCH_ARGS for that arm (a knob of `bench.kernels`), e.g.
#   ARMS="old=ab_old|;loads=.|--stream-early loads;products=.|--stream-early products"
# Results: $OUT/ab_${TAG}_${NAME}_${round}.json, each arm's whole log beside it (.log), the
# tables (and any error) on stdout, then every arm and round side by side (`bench.report --ab`).
set -uo pipefail
PY=${PY:-python3}; OUT=${OUT:-out}; OLD=${OLD:-ab_old}; TAG=${TAG:-ab}; ROUNDS=${ROUNDS:-2}
ARMS=${ARMS:-"new=.|;old=$OLD|"}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# The triton backend needs jax-triton, which the device lacks: carry its wheel in .whl/.
if compgen -G ".whl/jax_triton-*.whl" > /dev/null; then
  pip install -q --no-index --no-deps --target /tmp/site .whl/jax_triton-*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader || true
bench() {  # bench ROOT NAME ROUND EXTRA: `python -m` puts the cwd first, so run from the root
  [ -d "$1/replayssm_jax" ] || { echo "no build at $1/replayssm_jax" >&2; return 2; }
  (cd "$1" && export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} \
     && "$PY" -c "import replayssm_jax as r; print('build:', r.__file__)" \
     && "$PY" -m replayssm_jax.bench.kernels \
     --out "$OUT/ab_${TAG}_$2_$3.json" ${BENCH_ARGS:-} $4 2>&1 | tee "$OUT/ab_${TAG}_$2_$3.log" \
     | grep -E "^(B=|copy|build|Traceback|[A-Za-z]*Error)" )
}
IFS=';' read -ra arms <<< "$ARMS"
for r in $(seq 1 "$ROUNDS"); do
  for arm in "${arms[@]}"; do
    name=${arm%%=*}; rest=${arm#*=}; root=${rest%%|*}; extra=${rest#*|}
    echo "== round $r: $name ($root $extra)"; bench "$root" "$name" "$r" "$extra"
  done
done
# Every arm and round side by side (`bench.report --ab`), from the working tree's report.
files=()
for r in $(seq 1 "$ROUNDS"); do
  for arm in "${arms[@]}"; do
    f="$OUT/ab_${TAG}_${arm%%=*}_$r.json"; [ -f "$f" ] && files+=("$f")
  done
done
if [ ${#files[@]} -gt 1 ]; then
  echo "== side by side"
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} "$PY" -m replayssm_jax.bench.report --ab "${files[@]}" \
    || echo "(no side-by-side table: bench.report failed)"
fi
