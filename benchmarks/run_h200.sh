#!/usr/bin/env bash
# One device call: GPU tests (Pallas compiled through Triton), then the kernel benchmark (and, with
# STEP_BENCH=1, the end-to-end step benchmark into $OUT/step.json).
# Run from the repository root on the H200 (device tool):  bash benchmarks/run_h200.sh
# Logs and the results JSON go to $OUT (or ./out when OUT is unset). SKIP_TESTS=1 / SKIP_BENCH=1
# leave out the tests / the kernel benchmark.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# The triton backend needs jax-triton, which the device lacks: carry its wheel in .whl/
# (pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl jax-triton==0.3.1).
if compgen -G ".whl/jax_triton-*.whl" > /dev/null; then
  pip install -q --no-index --no-deps --target /tmp/site .whl/jax_triton-*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
python3 -c "import jax; print(jax.__version__, jax.devices())" 2>&1 | tee "$OUT/env.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv 2>&1 | tee -a "$OUT/env.log"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-540}" python3 -m pytest -q -x -p no:cacheprovider ${TESTS:-tests/test_kernels_recurrent.py tests/test_kernels_replay_verify.py tests/test_launch_order.py tests/test_ssm_recurrent.py tests/test_ssm_replay.py} \
    -k "${TEST_FILTER:-compiled or pallas or exactly_full or idempotent}" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 -m replayssm_jax.bench.kernels --out "$OUT/results.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
# Optional (STEP_BENCH=1): the end-to-end step of all 30 GDN layers, recurrent vs ReplaySSM, time and
# peak memory, one subprocess per mode and batch size (replayssm_jax/bench/step.py).
if [ "${STEP_BENCH:-0}" = 1 ]; then
  python3 -m replayssm_jax.bench.step --out "$OUT/step.json" ${STEP_ARGS:-} 2>&1 | tee "$OUT/step.log"
fi
