#!/usr/bin/env bash
# The next device session's plan (benchmarks/NOTES.md, "Next device session") as named items,
# so that one device call runs as many of them as fit and returns whole items:
#   ITEMS="k_streams_read t_fold_copy t_fold_together" bash benchmarks/plan_h200.sh  # first call
#   (an H200), then "a_triton s_pallas", "s_triton", "v c h" (runs 52-55 ran a_pallas, k_copy,
#   k_step, k_streams, h_read, h_ab, k_copy_triton, t_fold, k_streams_triton and t_stages on an
#   H200; t_together: run 47)
# An item starts only while its estimate (seconds, from runs 36-41) fits before DEADLINE_S
# (seconds from this script's start; the device stops a command at 600 s, and what is under
# $OUT by then still comes back). Each item writes its JSON files and log under $OUT; the
# plan's own log (plan.log) says which items ran, how long each took, and which were left; at the
# end every file goes into $OUT/plan.tgz, since a device call returns at most 8 files.
# DRY=1 prints the items' commands instead of running them; BENCH_EXTRA is added to every
# benchmark's arguments (a CPU smoke run: PY=.venv/bin/python BENCH_EXTRA="--tiny --batch 2
# --reps 2 --copy-gib 0.01" ITEMS="s_pallas a_pallas"). Needs the jax-triton wheel in .whl/
# for the triton items.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd); export OUT
DEADLINE_S=${DEADLINE_S:-560}
ITEMS=${ITEMS:-"k_streams_read t_fold_copy t_fold_together a_triton s_pallas s_triton v c h"}
KNOWN="k_copy k_step k_streams k_streams_read k_streams_triton k_copy_triton t_stages t_fold
t_fold_copy t_fold_together t_together h h_ab h_read h_triton s_pallas s_triton a_pallas a_triton
b c v"
RUN=${RUN:-run58}  # the files' tag
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# Item c's triton sweep needs jax-triton (ab_h200.sh installs it for its own arms too).
if [ "${DRY:-0}" != 1 ] && compgen -G ".whl/jax_triton-*.whl" > /dev/null; then
  pip install -q --no-index --no-deps --target /tmp/site .whl/jax_triton-*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
PY=${PY:-python3}; export PY
START=$(date +%s)
AB="bash benchmarks/ab_h200.sh"
SPLIT8="--set kernels.backend.SPLIT_MIN_BATCH={'window':16,'decode':8}"
# Item h's knobs, set both ways in the arms (whatever the defaults): knob NAME VALUE.
knob() { echo "--set kernels.$1=$2"; }
SCAN=$(knob replay_split.COEFFICIENT_HISTORY_SCAN True)
RECIP=$(knob replay_split.COEFFICIENT_NORM_RECIPROCAL True)
WMMA=$(knob replay_split.COEFFICIENT_WINDOW_MMA True)
NONE="${SCAN%True}False ${RECIP%True}False ${WMMA%True}False"  # each knob set False
# The triton decode as shipped until run 41: the vector form in [128, 16] tiles below 64 rows.
BEFORE41="before=.|--set kernels.triton.VEC_BLOCK_V=128 --set kernels.triton.VEC_K_CHUNK=16 --triton-split-min-batch 16 64"

# ssm.TRITON_FUSE_FOLD_BELOW's two extremes: the triton fold kernel always, never.
APART="{'window':0,'decode':0,'decode-together':0}"
FUSED="{'window':None,'decode':None,'decode-together':None}"
BELOW128="{'window':128,'decode':None,'decode-together':None}"  # run 51's first build
COPY_DECODE="{'window':False,'decode':True,'decode-together':True}"

# An item's estimate in seconds, and its command (run by `bash -c`).
estimate() {
  case $1 in
    s_pallas) echo 400;; s_triton) echo 400;; c) echo 80;; a_pallas|a_triton) echo 130;;
    b) echo 40;; v) echo 80;; t_together) echo 90;; h) echo 140;; h_triton) echo 150;;
    h_ab) echo 100;; h_read) echo 140;; k_copy) echo 330;; k_copy_triton) echo 240;; k_step) echo 150;;
    k_streams|k_streams_triton) echo 240;; k_streams_read) echo 130;;
    t_stages) echo 150;;  # run 50 (H100): 95-129 s
    t_fold) echo 260;; t_fold_copy) echo 180;; t_fold_together) echo 200;;
    *) echo 0;;
  esac
}
command_of() {
  local steps="--paths recurrent decode --decode-rings 16 --reps 10"
  local flush="--paths kernels steps --batch 64 256 --reps 15"
  local extra=${BENCH_EXTRA:-}  # e.g. a CPU smoke run: "--tiny --batch 2 --reps 2 --copy-gib 0.01"
  case $1 in
    # s. The steps of a decode cycle with L2 flushed between them (run 37's harness, in one
    # jitted call). Run 41 (H100): the Pallas split form below 64 rows lost (B=8 21.1 against
    # 18.4 us a step, B=16 32.5 against 29.5, B=32 even); the triton decode in the split form
    # from 32 rows and the vector form in [64, 32] tiles below (shipped from run 41) against
    # the decode before (`before`): B=8 19.4 against 21.5, B=16 32.9 against 33.6, B=32 52.4
    # against 56.7. On the H200 predicted alike: 1-2 us a step at B=8 and 16, ~4 at B=32.
    # Run 42 (H100) repeated both to 0.5 us; s_triton's `nocond` arm moved the triton fold out
    # of its conditional (run 44, H100: launched in every step, its spans shorter at every
    # B but the in-phase cycle at B=256, 295.0 against 294.7). On the H200 the triton steps'
    # `before` is owed.
    s_pallas) echo "ARMS=\"warm=.|--no-l2-flush-steps;flushed=.|;split=.|$SPLIT8\"" \
      "TAG=${RUN}_steps ROUNDS=1 BENCH_ARGS=\"$steps --batch 8 16 32 64 256 $extra\" $AB";;
    s_triton) echo "ARMS=\"warm=.|--no-l2-flush-steps;flushed=.|;$BEFORE41\"" \
      "TAG=${RUN}_steps_triton ROUNDS=1 BENCH_ARGS=\"$steps --backend triton --batch 8 16 32 256 $extra\" $AB";;
    # t_together: Pallas decode with `fold_together` (rows in phase: a cycle folds in 1 step of
    # 16), the only Pallas path that ran its fold behind the conditional for the in-phase case
    # the conditional suits, launched in every step since session 44 (`launch`) against the
    # conditional (`cond`). Run 25 (H200, with it): 197.4 us a step in phase at B=256; run 45:
    # the idle fold costs a step 18 us of kernels at B=256. Predicted: `cond` 5-10 us a step
    # shorter in span at B=256 (the idle fold against ~10 us of idle GPU after
    # `set_case_condition`), even at B=64; if so, SKIP_IDLE_FOLD goes by kind of step.
    t_together) echo "ARMS=\"launch=.|--fold-together 0.5;cond=.|--fold-together 0.5 --set" \
      "ssm.SKIP_IDLE_FOLD={'xla':False,'pallas':True,'triton':False}\" TAG=${RUN}_together" \
      "ROUNDS=1 BENCH_ARGS=\"$steps --batch 64 256 $extra\" $AB";;
    # k_copy: the checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`, session 45): verify and
    # decode stream half the checkpoint bytes, the fold writes the copy too (and runs in its
    # own kernel). Predicted on the H200 (NOTES "Session 45"): B=256 replay verify ~175 ->
    # 115-125 us (its byte model halves the checkpoint: ~67% of copy), B=256 decode cycle
    # ~205 -> 140-155 us a step (1.85-2.05x the recurrent decode of the same call), mixed step
    # B=256 ~325 -> 250-280; B=64 verify ~48 -> 30-34 us. If it holds, #9's decode target is
    # met with the copy on, at half a checkpoint more memory. Runs 46-47 (H100): B=256 verify
    # 235.8 -> 157.0, fold +36%, decode cycle 1.97x the recurrent decode; since 9c6a6f3 the
    # copy's window stream pipelines three K-steps (verify predicted ~150 us on the H100), and
    # the fold's read-back loads both halves before storing (fold 585 -> 545-555 us on it).
    # Arm `apart`: every flush row folded by the fold kernel, as the copy shipped until run 49;
    # the shipped copy folds decode's flush rows in the split form's stream
    # (`ssm.FUSE_FOLD_WITH_COPY`, on for decode since its GPU tests passed in run 49). Run 48
    # (H100): decode cycles 3-5% faster fused, windows slower (off for windows). Predicted on
    # the H200 alike.
    k_copy) echo "ARMS=\"fp32=.|;copy=.|--checkpoint-copy bfloat16;apart=.|--checkpoint-copy" \
      "bfloat16 --set ssm.FUSE_FOLD_WITH_COPY={'window':False,'decode':False,'decode-together':False}\" TAG=${RUN}_copy ROUNDS=1" \
      "BENCH_ARGS=\"--paths recurrent kernels steps decode --batch 64 256 --decode-rings 16" \
      "--reps 10 $extra\" $AB";;
    # k_step: the 30-layer step with the copy (run 45: 9.62 ms span at B=256, peak 18.4 GiB).
    # Predicted: 7.5-8.3 ms, peak ~25.9 GiB (scratch / peak 2.3x).
    k_step) echo "$PY -m replayssm_jax.bench.step --batch 256 512 --checkpoint-copy bfloat16" \
      "--reps 10 --out \$OUT/step_${RUN}_copy.json";;
    # k_streams: the split form's stream over the copy per launch (`sweep.STREAM_TUNINGS` and
    # `COPY_STREAM_TUNINGS`). Run 47 (H100): K-steps of 128 (no loop) slower (T=4 B=256 166.0
    # against 157.1 us), three stages of 64 faster at T=4 (-4.3% at B=64 and 256; shipped as
    # the copy's default, `backend.COPY_STREAM_STAGES`), even at T=1; run 49 (H100) again: T=4
    # 147.9 against 154.1 us at B=256, 45.9 against 48.1 at 64. On the H200 predicted alike:
    # the three stages 3-5% ahead of two at T=4, even at T=1.
    k_streams) echo "$PY -m replayssm_jax.bench.sweep --only streams --checkpoint-copy --T 4 1" \
      "--batch 256 64 --reps 15 --budget-s 230 --out \$OUT/sweep_${RUN}_copy_streams.json $extra";;
    # k_streams_read: the fp32 stream's launches (`sweep.STREAM_TUNINGS`) under the read flush,
    # where #4's B=64 reading is judged: runs 52-53 (H200) left the verify at 48.0-48.8 us
    # (73.5-74.7% of copy; 75% is 47.83), coefficients 7.4 + stream 40.5-41.4. Runs 26 and 28
    # swept these launches under the write flush only (the default fastest); (128, 4, 64, 3),
    # the default's K-step through three stages (96 KB, 2 programs an SM), is new among them.
    # Predicted: the default (128, 4, 64, 2) within 2% of the best at B=64 and 256 (its K-loop
    # reads at the copy rate under this flush, run 36); NOTES "Session 55" sharpens it from runs
    # 26 and 28 ((64, 2, 64, 2) even to 0.7 us ahead at B=64) and says what a win would earn.
    k_streams_read) echo "$PY -m replayssm_jax.bench.sweep --only streams --T 4 --batch 64 256" \
      "--reps 15 --l2-flush read --budget-s 110 --out \$OUT/sweep_${RUN}_streams_read.json $extra";;
    # k_streams_triton: the triton forms' launches over the copy (`sweep.TRITON_REPLAY`, the
    # split form's stream among them). Run 47 (H100): its stream on the copy moved 0.32 GB at
    # ~2.4 TB/s (verify 163.1 us at B=256, Pallas 157.0). Run 49 (H100): a third stage took
    # 3-5% off the 4-warp [64, K] tiles, but the shipped (64, 2, 64, 2) stayed fastest at
    # B=256 (T=4 160.9 us, T=1 142.9); at B=64 (32, 2, 64, 3) 1.5-1.8% ahead of it. Predicted
    # for the shipped tiles through three stages, (64, 2, 64, 3), new: 2-4% ahead of two.
    k_streams_triton) echo "$PY -m replayssm_jax.bench.sweep --backend triton --only replay" \
      "--checkpoint-copy --T 4 1 --batch 256 64 --reps 15 --budget-s 230" \
      "--out \$OUT/sweep_${RUN}_copy_triton.json $extra";;
    # t_stages: the triton split stream over the copy through three stages (shipped since run
    # 50, `COPY_STREAM_STAGES`) against two, at every size the split form runs (windows from 16
    # rows, decode from 32). Run 50's sweep (H100): three 1-2% ahead at B=256, ~5% at 64.
    # Predicted alike in the calls (verify and decode cycle), within 1% at 16 and 32. (The fp32
    # stream keeps two: three were 3-4% slower at B=128 and 256 in run 50, H100.)
    t_stages) echo "ARMS=\"three=.|--checkpoint-copy bfloat16;two=.|--checkpoint-copy bfloat16" \
      "--set kernels.triton.COPY_STREAM_STAGES=2\" TAG=${RUN}_copy_stages_triton ROUNDS=1" \
      "BENCH_ARGS=\"--backend triton --paths kernels decode --batch 16 32 64 128 256" \
      "--decode-rings 16 --reps 10 $extra\" $AB";;
    # t_fold: the triton split stream folding the flush rows itself (session 50,
    # `ssm.TRITON_FUSE_FOLD_BELOW`) as run 51's first build did, windows below 128 rows and
    # decode at every size (`fused`), against the fold kernel launched in every step before it
    # (`apart`, as until then), and windows of 256 rows fused too (`all`); run 51 (H100) shipped
    # decode's alone. Predicted (H100): the decode cycle at B=256 in phase 287 -> ~262 us a step
    # (the idle fold's 35 us gone, the stream's occupancy 8 -> 6 programs an SM, 168 registers,
    # costs some back), B=64 ~90 -> ~80; the B=64 mixed step 125 -> ~114, its plain verify 2-5
    # us slower (the fold's registers); `all` at B=256: a window step without a fold 5-10 us
    # slower, the mixed step even.
    t_fold) echo "ARMS=\"fused=.|--set ssm.TRITON_FUSE_FOLD_BELOW=$BELOW128;apart=.|--set" \
      "ssm.TRITON_FUSE_FOLD_BELOW=$APART;all=.|--set" \
      "ssm.TRITON_FUSE_FOLD_BELOW=$FUSED\" TAG=${RUN}_fold_triton ROUNDS=1 BENCH_ARGS=\"--backend" \
      "triton --paths kernels steps decode --batch 64 256 --decode-rings 16 --reps 10 $extra\" $AB";;
    # t_fold_copy: the same over the checkpoint's bf16 copy, decode folding in the stream
    # (`ssm.TRITON_FUSE_FOLD_WITH_COPY`; since run 51 only with `fold_together`) and windows
    # apart. Predicted: the B=256 cycle 216.5 -> ~195 us.
    t_fold_copy) echo "ARMS=\"fused=.|--checkpoint-copy bfloat16 --set" \
      "ssm.TRITON_FUSE_FOLD_WITH_COPY=$COPY_DECODE;apart=.|--checkpoint-copy" \
      "bfloat16 --set ssm.TRITON_FUSE_FOLD_BELOW=$APART\" TAG=${RUN}_fold_copy_triton ROUNDS=1" \
      "BENCH_ARGS=\"--backend triton --paths kernels decode --batch 64 256 --decode-rings 16" \
      "--reps 10 $extra\" $AB";;
    # t_fold_together: the same with `fold_together` (rows kept in phase), the kind of decode
    # step (`decode-together`) the stream folds for on both checkpoints by the in-phase cycles
    # of t_fold and t_fold_copy. Predicted as those: fp32 B=256 ~262 against ~287 us a step,
    # B=64 ~82 against ~89; the copy B=256 ~203 against ~217.
    t_fold_together) echo "ARMS=\"fused=.|--fold-together 0.5;apart=.|--fold-together 0.5 --set" \
      "ssm.TRITON_FUSE_FOLD_BELOW=$APART;copy_fused=.|--fold-together 0.5 --checkpoint-copy" \
      "bfloat16;copy_apart=.|--fold-together 0.5 --checkpoint-copy bfloat16 --set" \
      "ssm.TRITON_FUSE_FOLD_WITH_COPY={'window':False,'decode':False,'decode-together':False}\"" \
      "TAG=${RUN}_fold_together_triton ROUNDS=1 BENCH_ARGS=\"--backend triton --paths decode" \
      "--batch 64 256 --decode-rings 16 --reps 10 $extra\" $AB";;
    # k_copy_triton: the same in the triton backend (its stream's K-loop a bf16 dot on the copy;
    # run 35: verify 190 us at B=256, decode 198 us a step). Predicted alike: verify ~130,
    # decode cycle 140-160 us a step.
    k_copy_triton) echo "ARMS=\"fp32=.|;copy=.|--checkpoint-copy bfloat16\"" \
      "TAG=${RUN}_copy_triton ROUNDS=1 BENCH_ARGS=\"--backend triton --paths recurrent kernels" \
      "steps decode --batch 64 256 --decode-rings 16 --reps 10 $extra\" $AB";;
    # a. The read flush against the write flush (run 36: Pallas B=64 verify 73.7-74.5% of copy
    # under the read, 65.9-66.5% under the write; runs 40-41, H100: 79.8-80.6% and 72.9-73.3%;
    # the triton backend, run 41: 76.7-77.0% and 69.5-69.6%; run 52, H200, the running sum on:
    # 74.0-74.6% and 66.2-66.9%).
    a_pallas) echo "ARMS=\"write=.|--l2-flush write;read=.|--l2-flush read\" TAG=${RUN}_flush" \
      "ROUNDS=2 BENCH_ARGS=\"$flush $extra\" $AB";;
    a_triton) echo "ARMS=\"write=.|--l2-flush write;read=.|--l2-flush read\" TAG=${RUN}_flush_triton" \
      "ROUNDS=2 BENCH_ARGS=\"$flush --backend triton $extra\" $AB";;
    # b. The coefficients kernel beside the stream's K-loop under clean L2 (run 30 measured it
    # under the write flush only: the pair's span 49.1 us against the loop's 41.9 at B=64;
    # run 40, H100, read flush: 55.2 against 49.1, 1.6 us under the two back to back).
    b) echo "XLA_FLAGS=\"--xla_gpu_command_buffer_scheduling_mode=CONCURRENT" \
      "--xla_gpu_graph_min_graph_size=1\" $PY tools/concurrency_probe.py --batch 64" \
      "--l2-flush read --out \$OUT/probe_run42.json";;
    # c. The triton vector form's launches on HBM, one decode step a call (L2 flushed before
    # each). Predicted at B=16 on the H200: the shipped [128, 16] chunks ~21 us, whole rows in
    # [32, 128] tiles ~11-13, the split form ~16-18. Run 40 (H100): whole rows lost (31.7
    # against 28.1 us), [64, 32] 26.8, the split form 27.7-29.0; at B=32 the split form won
    # (43.6-44.7 against the vector form's best 45.5). On the H200 again, beside item s_triton.
    c) echo "$PY -m replayssm_jax.bench.sweep --backend triton --only replay --T 1" \
      "--batch 8 16 32 64 --reps 15 --out \$OUT/sweep_${RUN}_triton_decode.json";;
    # v. The Pallas vector form's tiles on HBM, one decode step a call (L2 flushed before
    # each): run 41 (H100) had the Pallas decode cycle at B=8 and 16 slower than the
    # recurrent decode (18.4 against 15.2 us a step, 29.5 against 26.6), its vector kernel
    # (with the fold inside) 16.0 and 27.1 us, the cycle at 34-43% of copy. sm_90 compiles
    # (triton 3.6, session 41): the shipped [64, 32] over 4 warps 154 registers, 3 programs an SM (B=8's
    # 512 programs in 1.3 waves); [32, 32] over 4 warps 114 and 4, 1008 instructions against
    # 1296; [64, 32] over 2 warps 255, [128, 32] 247. Predicted: [32, 32] over 4 warps the
    # fastest at B=8 and 16 by 5-15%, the 2-warp [64, 32] and [128, 32] the slowest; if a tile
    # wins by more than 5%, it moves `KernelTuning.replay_default`'s vector tile. Run 42 (H100):
    # [32, 32] x4 the fastest from 16 rows (-5%), 10% slower at B=8, and over cycles (run 43,
    # H200) even: its 32 rows at 4 warps cannot hold the fold's 16-row-a-warp chunks, so the
    # fold left the kernel for a conditional. [32, 32] x2 (-4%, -3.5%) keeps it: its cycles next.
    v) echo "$PY -m replayssm_jax.bench.sweep --only vec-tiles --batch 8 16 32 --reps 15" \
      "--out \$OUT/sweep_${RUN}_vec_tiles.json";;
    # h. The coefficients kernel's three knobs (session 38; the first on since session 39):
    # its history weights by a running sum, its window normalised by a division a row, its
    # window's own products on the tensor cores. sm_90 compile, T=4 B=64: 2304 instructions,
    # 2104 / 2216 / 2056 with each, 1816 with all three (128 registers); T=1 1536 -> 1384
    # and 127 -> 103 registers with the sum. Each knob's kernels, one call a kernel (the
    # sum: T=1 B=256 15.0 -> 12.5-13.5 us, T=4 B=64 8.0-8.3 -> 7.4-7.7; the reciprocals -0.2
    # to -0.4 at B=64; the window dot about as much as the sum at T=4). h_ab: the replay
    # verify and the decode cycle with all three against none (B=64 verify -1 to -1.6 us,
    # the B=256 decode step -1.5 to -2.5: the window dot does not apply at T=1).
    h) echo "$PY -m replayssm_jax.bench.sweep --only coefficients --knobs coefficient_history_scan" \
      "coefficient_reciprocal_norms coefficient_window_mma --T 4 1 --batch 64 256 --reps 20" \
      "--out \$OUT/sweep_${RUN}_coefficients.json";;
    h_ab) echo "ARMS=\"none=.|$NONE;all=.|$SCAN $RECIP $WMMA\" TAG=${RUN}_coefficients ROUNDS=1" \
      "BENCH_ARGS=\"--paths kernels decode --batch 64 256 --decode-rings 16 --reps 15 $extra\" $AB";;
    # h_read: the two knobs that pay on the H100 (the running sum, the window dot) against
    # none under the read flush, where run 36 left the B=64 verify at 48.3-48.6 us (73.7-74.5%
    # of copy): predicted 47.6-47.9 (74.9-75.6%, #4's 75%), B=256 -1.5 to -2.5 us.
    h_read) echo "ARMS=\"none=.|--l2-flush read $NONE;on=.|--l2-flush read $SCAN $WMMA ${RECIP%True}False\" TAG=${RUN}_read" \
      "ROUNDS=2 BENCH_ARGS=\"--paths kernels steps --batch 64 256 --reps 15 $extra\" $AB";;
    # The same in the triton backend (sm_90: T=1 1872 -> 1680 instructions, 126 -> 102
    # registers; T=4 1808 -> 1688): its coefficients kernel ~32 us at B=256, T=4 (run 35).
    h_triton) echo "ARMS=\"mask=.|$(knob triton.replay_split.HISTORY_SCAN False);scan=.|$(knob triton.replay_split.HISTORY_SCAN True)\"" \
      "TAG=${RUN}_history_scan_triton ROUNDS=1 BENCH_ARGS=\"--backend triton --paths kernels" \
      "decode --batch 64 256 --decode-rings 16 --reps 15 $extra\" $AB";;
    *) return 1;;
  esac
}

log() { echo "[plan $(( $(date +%s) - START ))s] $*" | tee -a "$OUT/plan.log"; }
for item in $ITEMS; do
  cmd=$(command_of "$item") || { log "unknown item $item (known: $KNOWN)"; exit 2; }
  if [ "${DRY:-0}" = 1 ]; then echo "$item: $cmd"; continue; fi
  left=$(( DEADLINE_S - ($(date +%s) - START) ))
  if [ "$(estimate "$item")" -gt "$left" ]; then log "left $item: ~$(estimate "$item") s, ${left} s left"; continue; fi
  log "start $item: $cmd"
  t0=$(date +%s)
  bash -c "$cmd" > "$OUT/plan_$item.log" 2>&1; rc=$?
  tail -40 "$OUT/plan_$item.log"
  log "end $item: rc $rc, $(( $(date +%s) - t0 )) s"
done
# A device call returns at most 8 files (run 42's first call wrote 11 and lost three): every
# log and JSON goes back in one archive, `tar xzf plan.tgz` here.
if [ "${DRY:-0}" != 1 ] && compgen -G "$OUT/*.*" > /dev/null; then
  (cd "$OUT" && tar czf /tmp/plan.tgz --exclude=plan.tgz . && rm -rf ./* && mv /tmp/plan.tgz .)
fi
