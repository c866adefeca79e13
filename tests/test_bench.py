"""The kernel benchmark runs every path end to end (tiny geometry; the numbers mean nothing on CPU)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replayssm_jax import SpecConfig, ssm
from replayssm_jax.bench import kernels
from replayssm_jax.bench import timing
from replayssm_jax.bench.timing import time_calls
from replayssm_jax.kernels import backend, fold, replay_split


def test_bench_smoke(tmp_path):
  """Every path end to end; the decode cycle at one ring length (the three default ones took
  71 of the test's 140 s on CI's CPU)."""
  out = tmp_path / "results.json"
  assert kernels.main(["--tiny", "--batch", "2", "--reps", "2", "--copy-gib", "0.004",
                       "--decode-rings", "8", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  names = {row["kernel"] for row in result["rows"]}
  assert names == {"rec_verify", "rec_commit", "rec_decode", "rssm_verify", "copy_verify_bytes",
                   "exact_fold", "rssm_step_nf", "rssm_step_f", "rssm_step_mixed", "rssm_traffic",
                   "rssm_decode_cycle", "rssm_decode_spread"}
  rows = {row["kernel"]: row for row in result["rows"]}
  assert abs(rows["copy_verify_bytes"]["min_bytes"] - rows["rssm_verify"]["min_bytes"]) <= 8
  for row in result["rows"]:
    assert row["median_us"] > 0 and row["min_bytes"] > 0 and row["wall_us"] > 0
    assert row["span_us"] is None  # the CPU's host clock has no device span
  assert {"date", "device", "jax", "copy_tbps"} <= result.keys()


def test_time_calls_threads_state_and_passes_args():
  """`timing.time_calls` threads the state through every call (warm-up included) and hands
  each call the same extra ``args``, as inputs of the one traced call."""
  seen = []

  def step(state, ids, scale):
    seen.append(None)  # traced once
    return state + ids * scale

  t, state = time_calls(jax.jit(step), jnp.zeros(3, jnp.int32),
                        args=(jnp.arange(3, dtype=jnp.int32), 2), reps=4, warmup=1)
  np.testing.assert_array_equal(np.asarray(state), 2 * 5 * np.arange(3))
  assert t.median_us > 0 and len(seen) == 1


def test_device_timing_sums_kernels_and_spans_each_call():
  """`timing._device_timing` drops the L2 flush's kernels by name, sums each call's kernels,
  and spans first start to last end: above the sum across a launch gap, below it where two
  kernels overlap (another stream, or a concurrent command buffer)."""
  us, flush = 1000, "l2_flush_write"  # ns; the flush kernel's name
  serial = [(0, 5 * us, flush), (10 * us, 4 * us, "a"), (16 * us, 6 * us, "b")]  # 2 us gap
  overlapped = [(100 * us, 5 * us, flush), (110 * us, 4 * us, "a"), (111 * us, 6 * us, "b")]
  t = timing._device_timing(serial + overlapped, 2, [50.0, 70.0], flushed=True)
  assert t.method == "device-events" and t.kernels == ("a", "b")
  assert t.median_us == 10.0 and t.kernel_us == (4.0, 6.0) and t.wall_us == 60.0
  assert t.span_us == (12.0 + 7.0) / 2  # the median of a gapped 12 and an overlapped 7
  assert timing._device_timing(serial[:1], 1, []) is None  # no kernel of the call
  assert timing._device_timing(serial + [(30 * us, 1 * us, "c")], 2, []) is None  # 3 for 2 calls


def test_device_timing_drops_flushes_between_steps():
  """A call of two steps with a flush between them (`timing.flush_between_steps`): the flush
  is dropped from the sum, and the call's span is its steps' spans summed, each step's own
  launch gap in, the flush and the gaps beside it out; a flushed timing whose trace lacks the
  flush's kernels is refused, not mis-summed."""
  us = 1000
  call = lambda t0: [(t0, 5 * us, "l2_flush_read"), (t0 + 10 * us, 4 * us, "step"),
                     (t0 + 15 * us, 1 * us, "cursors"),  # 1 us after the step: a launch gap
                     (t0 + 20 * us, 5 * us, "l2_flush_read"), (t0 + 40 * us, 3 * us, "step")]
  t = timing._device_timing(call(0) + call(100 * us), 2, [80.0, 90.0], flushed=True)
  assert t.kernels == ("step", "cursors", "step") and t.median_us == 8.0
  assert t.span_us == 6.0 + 3.0  # 10..16 and 40..43 us: the flush at 20..25 and its gaps out
  renamed = [(t0, d, "loop_add_fusion" if n.startswith("l2_flush") else n)
             for t0, d, n in call(0) + call(100 * us)]
  with pytest.raises(RuntimeError, match="0 kernels named l2_flush"):
    timing._device_timing(renamed, 2, [], flushed=True)


@pytest.mark.parametrize("mode", ["write", "read"])
def test_l2_flusher_passes_over_its_buffer(mode):
  """`timing._l2_flusher`'s pass is one Pallas kernel a call: "write" adds 1 to its buffer
  in place (do_bench's dirty L2), "read" adds the buffer's row sums to its sums (a clean L2);
  "none" and zero bytes give no pass, and an unknown mode is refused by name."""
  nbytes = 3 * 32 * 1024 + 100  # three 32 KB tiles of 8 rows, the rest rounded off
  timing._l2_flusher.cache_clear()  # a fresh buffer
  flush = timing._l2_flusher(nbytes, mode)
  assert timing._l2_flusher(nbytes, mode) is flush  # one buffer per size and mode
  out = flush()  # the second pass: one ran when it was made
  if mode == "write":
    np.testing.assert_array_equal(np.asarray(out), np.full((24, 1024), 2.0, np.float32))
  else:
    buf, sums = (np.asarray(x) for x in out)
    np.testing.assert_array_equal(buf, np.zeros((24, 1024), np.float32))
    np.testing.assert_array_equal(sums, np.zeros(24, np.float32))  # row sums of zeros
  assert timing._l2_flusher(nbytes, "none") is None
  assert timing._l2_flusher(0, mode) is None
  with pytest.raises(ValueError, match="'dirty'.*'write', 'read', 'none'"):
    timing._l2_flusher(nbytes, "dirty")


@pytest.mark.parametrize("mode", ["write", "read", "none"])
def test_steps_restoring_flushes_between_steps_and_restores_the_cursors(monkeypatch, mode):
  """`kernels._steps_restoring`: each step with its own arguments, in order, the L2 pass
  between two steps (none before the first: `time_calls` passes before the call), the first
  step's cursors back at the end, and the state donated. Every pass is live code in the
  jitted call: "write" adds 1 to the buffer each time; "read" adds its row sums (ones here,
  1024 a row) to the sums."""
  monkeypatch.setattr(timing, "L2_FLUSH", mode)
  flush = timing.steps_flush_state(32 * 1024)  # one 32 KB tile
  assert (flush is None) == (mode == "none")
  if mode == "read":
    flush = (jnp.ones_like(flush[0]), flush[1])
  spec = SpecConfig(draft_tokens=1, ring_len=4, verify_mode="replayssm")
  cache = dataclasses.replace(ssm.init(kernels.TINY, spec, 2),
                              write_pos=jnp.asarray([1, 2], jnp.int32))

  def step(c, add):  # order-sensitive: 0 -> 1 -> 4 -> 11 -> 26
    return dataclasses.replace(c, ssm=2 * c.ssm + add, write_pos=c.write_pos + 1)

  run = kernels._steps_restoring(step, [(1.0,), (2.0,), (3.0,), (4.0,)], kernels._cursors)
  before = cache.ssm
  out, flush_out = run((cache, flush))
  assert before.is_deleted()
  np.testing.assert_array_equal(np.asarray(out.write_pos), [1, 2])
  np.testing.assert_array_equal(np.asarray(out.ssm), np.full(out.ssm.shape, 26.0, np.float32))
  if mode == "write":
    np.testing.assert_array_equal(np.asarray(flush_out), 3.0)
  elif mode == "read":
    np.testing.assert_array_equal(np.asarray(flush_out[1]), 3 * 1024.0)
  monkeypatch.setattr(timing, "FLUSH_BETWEEN_STEPS", False)
  assert timing.steps_flush_state(32 * 1024) is None


@pytest.mark.parametrize("argv, message", [
    (["--triton-split-min-batch", "16", "none"], "applies to --backend triton only"),
    (["--backend", "triton", "--triton-split-min-batch", "0", "16"], "no batch size"),
])
def test_triton_split_min_batch_is_checked(argv, message, capsys):
  """``--triton-split-min-batch`` takes rows or 'none', with the triton backend only; either
  mistake stops the run before anything is timed."""
  with pytest.raises(SystemExit):
    kernels.main(["--tiny", *argv])
  assert message in capsys.readouterr().err


@pytest.mark.parametrize("knob, message", [
    ("kernels.fold.FOLD_PREFETCH_TILE_AHEAD", "expected MODULE.NAME=VALUE"),
    ("kernels.nowhere.X=1", "no module replayssm_jax.kernels.nowhere"),
    ("kernels.fold.NO_SUCH_KNOB=1", "has no NO_SUCH_KNOB"),
    ("kernels.fold.FOLD_PREFETCH_TILE_AHEAD=seven", "is not a Python literal"),
])
def test_set_is_checked(knob, message, capsys):
  """``--set`` takes MODULE.NAME=VALUE of an existing constant and a literal, else the run
  stops before anything is timed, saying which part is wrong."""
  with pytest.raises(SystemExit):
    kernels.main(["--tiny", "--set", knob])
  assert message in capsys.readouterr().err


def test_set_holds_a_knob_for_the_run(tmp_path, monkeypatch):
  """``--set`` holds its value while the paths are timed (over the knob's own flag, here
  ``--fold-prefetch-tile-ahead``), records it in the results, and restores the knob after."""
  seen = []

  def batch(B, **kw):
    seen.append(fold.FOLD_PREFETCH_TILE_AHEAD)
    return iter(())

  monkeypatch.setattr(kernels, "bench_batch", batch)
  before = fold.FOLD_PREFETCH_TILE_AHEAD
  out = tmp_path / "results.json"
  assert kernels.main(["--tiny", "--batch", "2", "--copy-gib", "0.004", "--out", str(out),
                       "--fold-prefetch-tile-ahead", "3",
                       "--set", "kernels.fold.FOLD_PREFETCH_TILE_AHEAD=7"]) == 0
  assert seen == [7] and fold.FOLD_PREFETCH_TILE_AHEAD == before
  assert json.loads(out.read_text())["set"] == {
      "replayssm_jax.kernels.fold.FOLD_PREFETCH_TILE_AHEAD": "7"}


def test_bench_paths(tmp_path):
  """``--paths`` times the named groups and nothing else; an unknown group is refused."""
  out = tmp_path / "results.json"
  assert kernels.main(["--tiny", "--batch", "2", "--reps", "1", "--copy-gib", "0.004",
                       "--decode-rings", "4", "--paths", "recurrent", "decode",
                       "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert [r["kernel"] for r in rows] == [*kernels.PATH_GROUPS["recurrent"],
                                         *kernels.PATH_GROUPS["decode"]]
  with pytest.raises(ValueError, match="unknown path groups"):
    next(kernels.bench_batch(2, gdn=kernels.TINY, paths=("decode", "attention")))


def test_bench_fold_together_smoke(tmp_path):
  """``--fold-together``: every path runs with rows folding along; the file says so, and the
  ``--fold-first``, ``--one-kernel-fold``, ``--stream-fold``, ``--tile-grid`` and
  ``--fold-prefetch-at`` it ran under, which end with the call (B=2: the one-kernel forms)."""
  out = tmp_path / "results.json"
  first = replay_split.STREAM_FOLD_FIRST
  one, below = ssm.FUSE_FOLD_ONE_KERNEL, ssm.FUSE_FOLD_BELOW
  grid = next(x for x in backend.TILE_GRIDS if x != backend.TILE_GRID)
  at = next(x for x in fold.PREFETCH_ATS if x != fold.FOLD_PREFETCH_AT)
  assert kernels.main(["--tiny", "--batch", "2", "--reps", "1", "--copy-gib", "0.004",
                       "--decode-rings", "8", "--fold-together", "0.5",
                       "--no-fold-first" if first else "--fold-first",
                       "--no-one-kernel-fold" if one else "--one-kernel-fold",
                       "--no-stream-fold", "--tile-grid", grid,
                       "--fold-prefetch-at", at, "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["fold_together"] == 0.5
  assert result["fold_first"] is not first and replay_split.STREAM_FOLD_FIRST is first
  assert result["one_kernel_fold"] is not one and ssm.FUSE_FOLD_ONE_KERNEL is one
  assert result["fuse_fold_below"] == dict.fromkeys(below, 0) and ssm.FUSE_FOLD_BELOW is below
  assert result["tile_grid"] == grid and backend.TILE_GRID != grid
  assert result["fold_prefetch_at"] == at and fold.FOLD_PREFETCH_AT != at
  assert {r["kernel"] for r in result["rows"]} >= {"rssm_step_mixed", "rssm_decode_spread"}
  assert [kernels.fold_together_records(x, 16) for x in (None, 0.5, 0.01, 1.0)] == [None, 8, 1, 16]
  with pytest.raises(SystemExit):
    kernels.main(["--tiny", "--fold-together", "0", "--out", str(out)])


@pytest.mark.parametrize("fold_together", [None, 6])
def test_traffic_phases_follow_the_cursor_protocol(fold_together):
  """The traffic path's byte model replays the cursors on the host: the same write_pos and
  folds, step by step, as `ssm.verify` + `ssm.commit` give."""
  import numpy as np

  from replayssm_jax import SpecConfig, ssm

  T, L, B, steps = 4, 16, 6, 12
  rng = np.random.default_rng(0)
  spec = SpecConfig(draft_tokens=T, ring_len=L, fold_together=fold_together)
  cache = kernels._replay_cache(rng, kernels.TINY, spec, B, *kernels.traffic_start(rng, B, T, L))
  accepted = rng.integers(1, T + 1, (steps, B)).astype(np.int32)
  expected = list(kernels.traffic_phases(cache, accepted, spec))
  x = kernels._inputs(rng, B, T, kernels.TINY)
  slot_ids = jnp.arange(B, dtype=jnp.int32)
  got = []
  for acc in accepted:
    wp, flush = np.asarray(cache.write_pos), np.asarray(cache.is_flush)
    cache = ssm.verify(cache, *kernels._window(x), slot_ids, spec)[1]
    folded = (np.asarray(cache.write_pos) == 0) & (wp > 0)  # a fold retires every record
    got += [(int(w), bool(f or d)) for w, f, d in zip(wp, flush, folded)]
    cache = ssm.commit(cache, slot_ids, jnp.asarray(acc), spec)
  assert got == expected
  assert any(f for _, f in got) and not all(f for _, f in got)


def test_byte_models_match_the_anchor():
  """The byte models reproduce anchor-bench.md's per-request constants (HV=32, H=16, K=V=128, T=4)."""
  b = kernels.Bytes(kernels.GEOMETRY, 4)
  assert b.S == 2_097_152
  assert b.tok_in() == 16_512 and b.tok_out() == 8_192 and b.io() == 98_816
  assert b.hist_rec() == 12_416 and b.win_rec() == 24_832 and b.raw_rec() == 12_544
  assert round(b.rec_verify() / 1e6, 2) == 10.58
  assert round(b.rssm_verify(8) / 1e6, 2) == 2.39
  assert round(b.fold(12) / 1e6, 2) == 4.34
  assert round(b.rec_decode() / 1e6, 2) == 4.22


def test_byte_models_with_the_checkpoint_copy():
  """`SpecConfig.checkpoint_copy`: the verify reads half a state, the fold writes half more,
  and a flush row's fused minimum reads the fp32 checkpoint once."""
  plain, copy = kernels.Bytes(kernels.GEOMETRY, 4), kernels.Bytes(kernels.GEOMETRY, 4, copy=True)
  half = plain.S // 2
  assert copy.rssm_verify(8) == plain.rssm_verify(8) - half
  assert copy.fold(12) == plain.fold(12) + half
  assert copy.rssm_step(12, True) == plain.rssm_step(12, True) + half
  assert copy.rssm_step(8, False) == plain.rssm_step(8, False) - half
  assert copy.rec_verify() == plain.rec_verify()


def test_bench_checkpoint_copy_smoke(tmp_path):
  """``--checkpoint-copy``: the ReplaySSM paths run with the copy, and the file says so."""
  out = tmp_path / "results.json"
  assert kernels.main(["--tiny", "--batch", "2", "--reps", "1", "--copy-gib", "0.004",
                       "--decode-rings", "4", "--paths", "kernels", "steps", "decode",
                       "--checkpoint-copy", "bfloat16", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["checkpoint_copy"] == "bfloat16"
  assert [r["kernel"] for r in result["rows"]] == [
      *kernels.PATH_GROUPS["kernels"], *kernels.PATH_GROUPS["steps"],
      *kernels.PATH_GROUPS["decode"]]
  verify = next(r for r in result["rows"] if r["kernel"] == "rssm_verify")
  assert verify["min_bytes"] == 2 * kernels.Bytes(kernels.TINY, 4, copy=True).rssm_verify(8)


def test_summary_table_skips_batch_sizes_cut_short():
  """A run cut short (here B=512 has only its first row) reports the complete batch sizes; the
  paths out of phase show where the file has them."""
  from replayssm_jax.bench import report

  def row(kernel, B, L, us):
    return dict(kernel=kernel, B=B, L=L, wp=0, median_us=us)

  rows = [row("rec_verify", 256, 0, 789.0), row("rec_commit", 256, 0, 257.0),
          row("rssm_step_mixed", 256, 16, 649.0), row("rec_decode", 256, 0, 304.0),
          row("rssm_decode_cycle", 256, 16, 267.0), row("rec_verify", 512, 0, 1569.0)]
  table = report.summary_table({"rows": rows})
  assert "| 256 | 1046.0 | 649.0 | 1.61x | - | - | 304.0 | 267.0 | 1.14x | - | - |" in table
  assert "| 512 |" not in table
  rows += [row("rssm_traffic", 256, 16, 523.0), row("rssm_decode_spread", 256, 16, 320.0)]
  table = report.summary_table({"rows": rows})
  assert ("| 256 | 1046.0 | 649.0 | 1.61x | 523.0 | 2.00x | 304.0 | 267.0 | 1.14x | 320.0 "
          "| 0.95x |") in table


def test_kernel_table_shows_rows_without_quantiles():
  """Rows recovered from a log carry a median only: the table says so instead of failing."""
  from replayssm_jax.bench import report

  row = dict(kernel="rssm_step_mixed", B=512, L=16, wp=-1, median_us=881.4, p20_us=None,
             p80_us=None, min_bytes=1.58e9, tbps=1.8, pct_copy=42.1)
  table = report.kernel_table({"rows": [row, dict(row, B=256, p20_us=456.2, p80_us=458.2)]})
  assert "| 512 | rssm_step_mixed | 881.4 | - |" in table
  assert "| 256 | rssm_step_mixed | 881.4 | 456.2-458.2 |" in table
  assert table.index("| 256 |") < table.index("| 512 |")  # by B, whatever the file's order
  assert "span" not in table  # files from before run 37 keep their columns


def test_ab_table_puts_the_arms_side_by_side():
  """One row per (B, path) of any arm, a column an arm; an arm without the row shows "-"; the
  fastest arm goes by span where every arm has one, else by median."""
  from replayssm_jax.bench import report

  def row(kernel, B, us, span):
    return dict(kernel=kernel, B=B, L=16, wp=-1, median_us=us, span_us=span)

  arms = {"cond": {"rows": [row("rssm_step_mixed", 256, 393.1, 416.2),
                            row("rssm_step_mixed", 128, 210.8, None)]},
          "launch": {"rows": [row("rssm_step_mixed", 256, 390.1, 397.8),
                              row("rssm_step_mixed", 128, 212.0, None),
                              row("rssm_decode_cycle", 64, 77.9, 77.3)]}}
  lines = report.ab_table(arms).splitlines()
  assert lines[0] == "| B | path | cond us | launch us | fastest |"
  assert lines[2] == ("| 64 | rssm_decode_cycle L=16 (per step) | - | 77.9 / 77.3 "
                      "| launch (span) |")
  assert lines[3] == "| 128 | rssm_step_mixed | 210.8 / - | 212.0 / - | cond |"
  assert lines[4] == "| 256 | rssm_step_mixed | 393.1 / 416.2 | 390.1 / 397.8 | launch (span) |"


@pytest.mark.parametrize("names, labels", [
    (["out/ab_x_r1_1.json", "out/ab_x_r4_1.json"], ["r1_1", "r4_1"]),
    (["a/ab_x_on_1.json", "b/ab_x_on_1.json"], ["a/ab_x_on_1", "b/ab_x_on_1"]),
    (["ab_x_write_1.json"], ["ab_x_write_1"])])
def test_arm_labels_drop_the_shared_stem(names, labels):
  from replayssm_jax.bench import report
  assert report.arm_labels(names) == labels


def test_report_ab_cli(tmp_path, capsys):
  """`bench.report --ab` prints each arm's machine, flush and knobs above the table."""
  from replayssm_jax.bench import report

  for arm, us in (("cond", 393.1), ("launch", 390.1)):
    result = dict(device="NVIDIA H200", copy_tbps=4.27, l2_flush="read",
                  set={"replayssm_jax.ssm.SKIP_IDLE_FOLD": "{}"} if arm == "cond" else {},
                  checkpoint_copy="bfloat16" if arm == "cond" else None,
                  rows=[dict(kernel="rssm_step_mixed", B=256, L=16, wp=-1, median_us=us)])
    (tmp_path / f"ab_t_{arm}_1.json").write_text(json.dumps(result))
  assert report.main(["--ab", str(tmp_path / "ab_t_cond_1.json"),
                      str(tmp_path / "ab_t_launch_1.json")]) == 0
  out = capsys.readouterr().out
  assert ("- cond_1: NVIDIA H200, copy 4.27 TB/s, L2 flushed by a read pass; "
          "ssm.SKIP_IDLE_FOLD={}, checkpoint_copy=bfloat16") in out
  assert "- launch_1: NVIDIA H200, copy 4.27 TB/s, L2 flushed by a read pass; defaults" in out
  assert "| 256 | rssm_step_mixed | 393.1 / - | 390.1 / - | launch_1 |" in out
  with pytest.raises(SystemExit):
    report.main([str(tmp_path / "ab_t_cond_1.json"), str(tmp_path / "ab_t_launch_1.json")])


def test_kernel_table_shows_the_span_where_recorded():
  """A row's device span (first kernel's start to last kernel's end) gets a column when any
  row has one; rows without it (the CPU's host clock) say so."""
  from replayssm_jax.bench import report

  row = dict(kernel="rssm_step_mixed", B=256, L=16, wp=-1, median_us=328.7, p20_us=328.1,
             p80_us=329.5, min_bytes=7.9e8, tbps=2.4, pct_copy=56.6, span_us=341.2)
  table = report.kernel_table({"rows": [row, dict(row, B=64, span_us=None)]})
  assert table.splitlines()[0].endswith("| span us |")
  assert "| 256 | rssm_step_mixed | 328.7 | 328.1-329.5 |" in table
  assert table.splitlines()[-1].endswith("| 341.2 |")
  assert table.splitlines()[-2].endswith("| - |")


def test_kernels_for_names_each_backend():
  pallas = kernels.kernels_for("pallas")
  assert pallas.backend == "pallas"
  assert pallas.state_tuning(128) == kernels.KernelTuning.state_default(128)
  assert pallas.replay_tuning(128, 4, 256) == kernels.KernelTuning.replay_default(128, 4, 256)
  with pytest.raises(ValueError, match="backend='cuda' is not benchmarked; use one of"):
    kernels.kernels_for("cuda")


def test_the_stream_on_the_copy_pipelines_deeper():
  """A window's split stream over the bf16 copy takes `COPY_STREAM_STAGES` stages, its other
  fields the fp32 stream's; decode, the other forms and the fp32 checkpoint keep theirs."""
  def default(T, B, copy=None):
    spec = SpecConfig(backend="pallas", verify_mode="replayssm", checkpoint_copy=copy)
    return ssm.default_replay_tuning(spec, 128, T, B)

  for T, B in [(4, 256), (4, 64), (2, 16)]:
    assert default(T, B, jnp.bfloat16) == dataclasses.replace(
        default(T, B), num_stages=backend.COPY_STREAM_STAGES)
  for T, B in [(1, 256), (4, 8), (1, 8)]:
    assert default(T, B, jnp.bfloat16) == default(T, B)
  assert backend.COPY_STREAM_STAGES != default(4, 256).num_stages


def test_sweep_candidates_are_valid_launches():
  """Every candidate tiles the anchor geometry; the triton UT and split forms' dots need 16 on
  each side."""
  from replayssm_jax.bench import sweep
  from replayssm_jax.kernels import replay_verify

  forms = {"pallas": replay_verify.FORMS, "triton": ("ut", "vec", "split")}
  for backend, (replay, state) in sweep.CANDIDATES.items():
    for form, tuning in replay:
      tuning.check(128, 128)
      assert form in forms[backend], (backend, form)
      if backend == "triton" and form != "vec":
        assert min(tuning.block_v, tuning.k_chunk) >= 16, tuning
    for tuning in state:
      tuning.check(128, 128)
  for tuning in sweep.STREAM_TUNINGS + sweep.COPY_STREAM_TUNINGS:
    tuning.check(128, 128)
  for bv, *_ in sweep.FOLD_TUNINGS:
    kernels.KernelTuning(block_v=bv).check(128, 128)
  # The defaults are among the candidates, so a sweep re-measures them.
  assert kernels.KernelTuning.state_default(128) in sweep.STATE


def test_sweep_state_smoke(tmp_path):
  """The state sweep times the Pallas kernels and checks the fold bitwise (tiny geometry, CPU)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "state", "--batch", "2", "--reps", "1",
                     "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["tile_grid"] == backend.TILE_GRID  # the launch order the kernels ran in
  rows = result["rows"]
  assert rows and all(r["backend"] == "pallas" and r["fold_bitwise"] is True for r in rows)
  assert all(r["fold_us"] > 0 and r["rec_verify_us"] > 0 for r in rows)


def test_sweep_replay_smoke(tmp_path):
  """The replay sweep times every form and the split form per coefficients launch, here those
  of ``--knobs coefficient_warps`` (tiny geometry, CPU: the other candidates' tiles are wider
  than its V and are skipped; every variant runs in `test_sweep_coefficients_smoke`)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "replay", "--knobs", "coefficient_warps", "--batch",
                     "2", "--reps", "1", "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert not [r for r in rows if "error" in r]
  warps = {r["coefficient_warps"] for r in rows if "coefficient_warps" in r}
  assert warps == set(sweep.COEFFICIENT_WARPS)
  assert all(r["median_us"] > 0 for r in rows)


def test_sweep_replay_tokens(tmp_path):
  """``--T 1`` sweeps the decode window alone (the vector form's launches on HBM, one step a
  call with L2 flushed before it: NOTES run 37)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "replay", "--T", "1", "--knobs", "coefficient_warps",
                     "--batch", "2", "--reps", "1", "--out", str(out)]) == 0
  kernels_run = {r["kernel"] for r in json.loads(out.read_text())["rows"]}
  assert kernels_run and all(k.endswith("_T1") for k in kernels_run), kernels_run


def test_sweep_streams_over_the_copy(tmp_path):
  """``--only streams --checkpoint-copy`` times the split form's stream over the checkpoint's
  bf16 copy at each ``--T`` (tiny geometry: only the default launch fits its 16 rows of V),
  its bandwidth by the copy's byte model."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "streams", "--checkpoint-copy", "--T", "4", "1",
                     "--batch", "2", "--reps", "1", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["l2_flush"] == "write"  # the default, as bench.kernels'
  rows = result["rows"]
  assert {r["kernel"] for r in rows} == {"replay_verify_split_T4", "replay_verify_split_T1"}
  assert all(r["checkpoint_copy"] is True and r["median_us"] > 0 for r in rows)
  for r in rows:
    T = int(r["kernel"][-1])
    bytes_of = lambda copy: kernels.Bytes(kernels.TINY, T, copy=copy).rssm_verify(8, T) * r["B"]
    assert r["bytes"] == bytes_of(True) < bytes_of(False)


def test_sweep_l2_flush_read(tmp_path, monkeypatch):
  """``--l2-flush read`` times every launch after a read pass (the flush #4's B=64 reading is
  judged under), says so in the file, and leaves the module default as it was."""
  from replayssm_jax.bench import sweep

  seen = []

  def recording(*args, **kwargs):
    seen.append(timing.L2_FLUSH)
    return timing.time_calls(*args, **kwargs)

  monkeypatch.setattr(sweep, "time_calls", recording)
  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "streams", "--T", "4", "--batch", "2", "--reps", "1",
                     "--l2-flush", "read", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["l2_flush"] == "read" and result["rows"]
  assert seen and set(seen) == {"read"}
  assert timing.L2_FLUSH == "write"


def test_sweep_vec_tiles(tmp_path):
  """``--only vec-tiles`` times the vector form alone at T=1, each tile once (capped at the tiny
  geometry's 16 rows of V, so several collapse into one)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "vec-tiles", "--batch", "2", "--reps", "1",
                     "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert rows and not [r for r in rows if "error" in r]
  assert {r["kernel"] for r in rows} == {"replay_verify_vec_T1"}
  launches = [(r["block_v"], r["num_warps"], r["k_chunk"]) for r in rows]
  capped = {(16, t.num_warps, t.k_chunk) for t in sweep.VEC_TILES}  # V=16
  assert sorted(launches) == sorted(capped)
  assert all(r["median_us"] > 0 for r in rows)


def test_sweep_fold_smoke(tmp_path):
  """The fold sweep times each launch with records and without, bitwise checked (tiny, CPU)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "fold", "--batch", "2", "--reps", "1",
                     "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert {(r["v_blocks"], r["prefetch"], r["normalize_ahead"], r["prefetch_at"])
          for r in rows} >= {(1, False, False, "start"), (1, True, False, "start"),
                             (1, True, True, "start"), (1, True, False, "end"),
                             (1, True, True, "end")}
  assert all(r["fold_bitwise"] is True and r["fold_us"] > 0 and r["empty_us"] > 0 for r in rows)
  # The fold's own tile launches too, those that fit the tiny head (16 rows), in the shipped
  # record loop and bitwise equal to the recurrent kernels at their tuning.
  tunings = {(r["block_v"], r["num_warps"], r["num_stages"]) for r in rows
             if r["v_blocks"] is None}
  assert tunings == {t for t in sweep.FOLD_TUNINGS if t[0] <= 16} and tunings


def test_sweep_fold_orders_smoke(tmp_path):
  """The fold-orders sweep times every order of a record's loads, each bitwise equal to the
  recurrent verify (tiny, CPU)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "fold-orders", "--batch", "2", "--reps", "1",
                     "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert [tuple(r["record_order"]) for r in rows] == sweep.FOLD_RECORD_ORDERS
  assert all(r["fold_bitwise"] is True and r["fold_us"] > 0 for r in rows)


def test_sweep_fold_prefetch_smoke(tmp_path):
  """The prefetch sweeps time the fold kernel at each of `FOLD_PREFETCHES` and the stream's
  fold at each record prefetch level, each bitwise equal to the recurrent verify (tiny, CPU:
  the kernels run, the prefetches are GPU-only)."""
  from replayssm_jax.bench import sweep
  from replayssm_jax.kernels import fold

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "fold-prefetch", "stream-fold-prefetch", "--batch",
                     "2", "--reps", "1", "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  kernel = [r for r in rows if r["kernel"] == "exact_fold"]
  stream = [r for r in rows if r["kernel"].startswith("stream_fold")]
  assert [(r["prefetch_records_to"], r["prefetch_tile_ahead"]) for r in kernel] == [
      tuple(x) for x in sweep.FOLD_PREFETCHES]
  assert sorted(r["prefetch_records_to"] for r in stream) == sorted(fold.PREFETCH_RECORDS_TO)
  assert stream[0]["prefetch_records_to"] == "off"  # the baseline first
  assert all(r["fold_bitwise"] is True for r in rows)
  assert sum(r["default"] for r in stream) == 1


def test_sweep_stream_fold_smoke(tmp_path):
  """The stream-fold sweep checks the fold inside the stream bitwise against the recurrent
  state and times it beside the fold kernel + verify (tiny, CPU)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "stream-fold", "--batch", "2", "--reps", "1",
                     "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert rows and all(r["fold_bitwise"] is True and r["fused_us"] > 0 and r["apart_us"] > 0
                      for r in rows)
  loops = {(r["fold_block_v"], r["prefetch"], r["interleave"]) for r in rows}
  tiles = {n for n, *_ in loops}
  assert len(tiles) > 1  # the tiny stream tile holds several fold tiles: interleaved too
  assert loops == {(n, *loop) for n in tiles for loop in sweep.STREAM_FOLD_LOOPS
                   if n < max(tiles) or not loop[1]}
  assert sum(r["default"] for r in rows) == 1


def test_sweep_coefficients_smoke(tmp_path):
  """``--only coefficients``: the split form's defaults and each coefficients variant, at the
  verify's and the decode's window, and no other form (tiny, CPU)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "coefficients", "--batch", "2", "--reps", "1",
                     "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert not [r for r in rows if "error" in r] and all(r["median_us"] > 0 for r in rows)
  assert {r["kernel"] for r in rows} == {"replay_verify_split_T4", "replay_verify_split_T1"}
  knobs = [{n: v for n, v in r.items() if n.startswith("coefficient_")} for r in rows]
  expected = sweep.split_variants() * 2
  assert sorted(map(str, filter(None, knobs))) == sorted(map(str, expected))
  assert knobs.count({}) == 2  # the defaults, once per window


def test_sweep_coefficients_knobs_and_batches(tmp_path):
  """``--knobs`` keeps the variants that set those arguments; ``--batch`` takes several sizes,
  each swept in turn (tiny, CPU)."""
  from replayssm_jax.bench import sweep

  out = tmp_path / "sweep.json"
  assert sweep.main(["--tiny", "--only", "coefficients", "--knobs", "coefficient_key_mma",
                     "--batch", "2", "3", "--reps", "1", "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  mma = [(r["B"], r["kernel"][-1], r.get("coefficient_key_mma")) for r in rows]
  assert sorted(mma, key=str) == sorted(
      [(B, T, s) for B in (2, 3) for T in "14" for s in (None, False, True)], key=str)


def test_profile_runs_each_kernel(capsys):
  """`bench.profile` (the ncu target) launches the replay verify at T=4 and 1, the fold and a
  mixed-phase verify step."""
  from replayssm_jax.bench import profile

  assert profile.main(["--tiny", "--batch", "3", "--calls", "1"]) == 0
  out = capsys.readouterr().out
  for what in ("replay verify T=4", "replay verify T=1", "fold", "mixed-phase verify step"):
    assert f"{what}: 2 calls" in out, out


def test_size_table_sets_the_verify_against_a_copy_of_its_bytes():
  """Per B with both rows, the verify's and the same-size copy's times and % of copy, and
  their ratio; nothing for a file without copy rows."""
  from replayssm_jax.bench import report

  def row(kernel, B, us, pct):
    return dict(kernel=kernel, B=B, L=16, wp=8, median_us=us, pct_copy=pct)

  rows = [row("rssm_verify", 64, 54.7, 65.5), row("copy_verify_bytes", 64, 45.0, 79.6),
          row("rssm_verify", 256, 177.3, 80.9)]
  table = report.size_table({"rows": rows})
  assert "| 64 | 54.7 | 65.5 | 45.0 | 79.6 | 1.22x |" in table
  assert "| 256 |" not in table  # no copy row at B=256
  assert report.size_table({"rows": rows[:1] + rows[2:]}) == ""


def test_fixed_cost_fits_recover_a_line():
  """Rows on ``time = 10 us + bytes / 4 TB/s`` at B=64, 256 and 512 give back 10 us and 4 TB/s;
  rows below B=64 (other forms) and a path at a single batch size are left out."""
  from replayssm_jax.bench import report

  def row(kernel, B, nbytes, us):
    return dict(kernel=kernel, B=B, L=16, wp=0, min_bytes=nbytes, median_us=us)

  line = lambda nbytes: 10.0 + nbytes / 4e12 * 1e6
  rows = [row("rssm_verify", B, B * 2.4e6, line(B * 2.4e6)) for B in (64, 256, 512)]
  rows += [row("rssm_verify", 16, 16 * 2.4e6, 99.0), row("exact_fold", 256, 1e9, 400.0)]
  fits = report.fixed_cost_fits({"rows": rows})
  assert list(fits) == ["rssm_verify"]
  fit = fits["rssm_verify"]
  assert abs(fit.fixed_us - 10.0) < 1e-6 and abs(fit.tbps - 4.0) < 1e-6 and fit.worst_us < 1e-6
  assert fit.batches == (64, 256, 512)
  share = 100 * 10.0 / line(64 * 2.4e6)
  assert f"| rssm_verify | 64, 256, 512 | 10.0 | 4.00 | {share:.0f}% | 0.0 |" in report.fit_table(
      {"rows": rows})
  assert report.fit_table({"rows": rows[3:]}) == ""
