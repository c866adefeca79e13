"""Exact fold: replay committed raw records into the fp32 checkpoint (DESIGN sections 3-4).

For each row with ``count[b] > 0`` the program owning the checkpoint tile
``S = ssm[slot, h, j*BV:(j+1)*BV, :]`` replays records ``i = 0 .. count-1``, read
at ring index ``(cache_base + i) & (L - 1)``, through the recurrent update:

    k_hat = l2_normalize(rawk_i);  S <- exp(g_i) S + beta_i (v_i - exp(g_i) S k_hat) k_hat^T

It is the loop of `recurrent.py` with the inputs read from the ring instead of
the window, through the same `tile` arithmetic and `KernelTuning`, so the folded
checkpoint is bitwise the state the recurrent path commits (g and beta are the
bits that `recurrent.token_inputs` produced when the records were written).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from replayssm_jax import reference
from replayssm_jax.kernels import prefetch as cache
from replayssm_jax.kernels import tile
from replayssm_jax.kernels.backend import KernelTuning, row_grid, row_ids, row_ids_ahead
from replayssm_jax.kernels.recurrent import scatter_rows

# The fold's own launch, beyond the shared tuning (none changes its bits): how many tiles a
# program folds (`FOLD_V_BLOCKS`, or as many as divide the head's), one after the other or in
# one record loop (`FOLD_INTERLEAVE`: each record's k loaded and normalised once for both, their
# updates two independent chains for the same warps); whether record i + 1 is loaded while
# record i is applied (`FOLD_PREFETCH`), where in its update the loads are issued
# (`FOLD_PREFETCH_AT`), and whether its k is normalised when loaded (`FOLD_NORMALIZE_AHEAD`).
# H200, 12 records (benchmarks/NOTES.md run 18): one tile a program, the next record loaded and
# normalised after record i's update, B=256 471 -> 443 us, B=512 907 -> 863, against run 15's
# two tiles in one loop with the loads issued before the update ("start"). The profile of that
# launch: a third of its stalls on a long scoreboard, most at one add of the update's K-sum,
# most likely waiting for the next record's loads issued just before it (ptxas shares its few
# scoreboards); loads issued after the update ("end") leave the K-sum alone. Same bits.
FOLD_V_BLOCKS = 1
FOLD_PREFETCH = True
FOLD_INTERLEAVE = False
FOLD_NORMALIZE_AHEAD = True
PREFETCH_ATS = ("start", "end")
FOLD_PREFETCH_AT = "end"
# The order in which a record's loads are issued (`RECORD_LOADS`: "norm" is where k is
# normalised ahead). H200, B=256, 12 records (NOTES.md run 23, `bench.sweep --only
# fold-orders`): every order with the norm before v took 441-443 us, every order with v loaded
# before the norm 460-461 (B=512: 862-865 against 898-900); v kept in the ring's dtype until
# the update moved none (runs 22-23; removed). All the same bits; the shipped order stays.
RECORD_LOADS = ("k", "norm", "v", "g", "beta")
FOLD_RECORD_ORDER = RECORD_LOADS
# Cache prefetches (`prefetch`; none changes a bit): a program asks the cache level
# `FOLD_PREFETCH_RECORDS_TO` ("L1", "L2" or "off") for the lines of all its records when it
# starts, so the record loop's loads, issued one update ahead, find them cached; and it asks
# L2 for the checkpoint tile of the program `FOLD_PREFETCH_TILE_AHEAD` launches after it (0:
# none), so that program's first load finds it there. H200, 12 records (benchmarks/NOTES.md
# run 24, `bench.sweep --only fold-prefetch`): the records to L1 or L2, B=256 441.2 -> 408.9 us,
# B=512 860.8 -> 798.3, B=64 125.0 -> 114.2; with the tile 132 programs ahead (one an SM)
# 397.6 / 774.9 / 111.8 (264: 398.4; 528: 400.8; 792: 408.9; the tile alone: no gain).
PREFETCH_RECORDS_TO = ("off", *cache.LEVELS)
FOLD_PREFETCH_RECORDS_TO = "L1"
FOLD_PREFETCH_TILE_AHEAD = 132
# The cache rings `fold` reads, in the order of its arguments.
RING_NAMES = ("ring_rawk", "ring_rawv", "ring_g", "ring_beta")


class FoldLoop(NamedTuple):
  """How a program replays records into its checkpoint rows (`fold_tiles`).

  In ``[block_v, K]`` tiles held as K-chunks of ``k_chunk``, laid out as the recurrent kernels'
  tiles (the bitwise tie); the rest is the record loop, which changes no bit: a program's tiles
  one after the other or in one loop (``interleave``), record i + 1 loaded while record i is
  applied (``prefetch``), before or after its update (``prefetch_at``, `PREFETCH_ATS`), its k
  normalised when loaded (``normalize_ahead``) or where used, and the order of a record's
  loads (``record_order``, a permutation of `RECORD_LOADS` with the norm after k), and the
  cache level a program prefetches its records to when it starts (``prefetch_records_to``,
  `prefetch.LEVELS` or None; compiled only). With a checkpoint copy, the folded tile is read
  back for it in halves, both loaded before the first store (``copy_halves_first``: one L2
  round trip, not two) or each stored before the next loads (fewer registers). The fold
  kernel, the split form's stream and the one-kernel verify forms each hold one.
  """

  block_v: int
  k_chunk: int
  prefetch: bool = True
  interleave: bool = False
  normalize_ahead: bool = False
  prefetch_at: str = "start"
  record_order: tuple[str, ...] = RECORD_LOADS
  prefetch_records_to: str | None = None
  copy_halves_first: bool = True


def records_level(prefetch_records_to: str | None, default: str) -> str | None:
  """`FoldLoop.prefetch_records_to` of an argument: one of `PREFETCH_RECORDS_TO` ("off":
  None), or None for ``default``."""
  level = default if prefetch_records_to is None else prefetch_records_to
  if level not in PREFETCH_RECORDS_TO:
    raise ValueError(f"prefetch_records_to={level!r}; expected one of {PREFETCH_RECORDS_TO}.")
  return None if level == "off" else level


def check_record_order(order: tuple[str, ...]) -> None:
  """Raise unless ``order`` lists each of `RECORD_LOADS` once, with the norm after k."""
  if sorted(order) != sorted(RECORD_LOADS) or order.index("norm") < order.index("k"):
    raise ValueError(f"fold: record_order={order!r} must order {RECORD_LOADS}, each once, with "
                     f"'norm' after 'k'.")


def fold_rows(ssm_ref, ring_rawk_ref, ring_rawv_ref, ring_g_ref, ring_beta_ref, *, slot, h, kh,
              rows: pl.Slice | tuple[pl.Slice, ...], count, base, ring_len: int, k_chunk: int,
              prefetch: bool, compiled: bool, normalize_ahead: bool = False,
              prefetch_at: str = "start", record_order: tuple[str, ...] = RECORD_LOADS,
              prefetch_records_to: str | None = None, copy_ref=None,
              copy_halves_first: bool = True) -> None:
  """Replay ``count`` records of (slot, value head h) into ``ssm_ref[slot, h, rows, :]`` in place.

  The canonical fold of one ``[BV, K]`` checkpoint tile (``BV`` = the length of ``rows``),
  shared by `fold` and the replay verify kernels that fold first (the split form's stream,
  `replay_split`, and the one-kernel forms, `replay_verify`), so all fold to the same bits;
  ``rows`` may also be a tuple of tiles, folded in one record loop, each as alone.
  Record i is read at ring index ``(base + i) & (ring_len - 1)``; raw k is normalised as the
  recurrent kernels normalise it, where it is used or, with ``prefetch`` and
  ``normalize_ahead``, when it is loaded. ``prefetch_at`` (`PREFETCH_ATS`): whether record
  i + 1 is loaded before record i's update ("start") or after it ("end"). ``record_order``
  and ``prefetch_records_to``: as `FoldLoop`'s. ``copy_ref``: the checkpoint copy
  (`SpecConfig.checkpoint_copy`), given the folded tile rounded to its dtype, read back as
  ``copy_halves_first`` (`FoldLoop`) says.
  """
  K = ssm_ref.shape[-1]
  tiles = rows if isinstance(rows, tuple) else (rows,)
  normalize = functools.partial(tile.l2_normalize, compiled=compiled)

  check_record_order(record_order)

  def record(i):  # the inputs of record i, loaded in `record_order`
    p = (base + i) & (ring_len - 1)
    loads = {
        "k": lambda x: tile.load(ring_rawk_ref, (slot, kh, p), K, k_chunk),
        "norm": lambda x: normalize(x["k"]) if normalize_ahead else x["k"],
        "v": lambda x: tuple(ring_rawv_ref[slot, h, p, r].astype(jnp.float32) for r in tiles),
        "g": lambda x: ring_g_ref[slot, h, p],
        "beta": lambda x: ring_beta_ref[slot, h, p]}
    x = {}
    for name in record_order:
      x["k" if name == "norm" else name] = loads[name](x)
    return x["k"], x["v"], x["g"], x["beta"]

  def update(S, rec):
    k, v, g, beta = rec
    k_hat = k if normalize_ahead else normalize(k)
    return tuple(tile.delta_rule_step(S_t, k_hat, v_t, g, beta, compiled=compiled)[0]
                 for S_t, v_t in zip(S, v))

  S = tuple(tile.load(ssm_ref, (slot, h, r), K, k_chunk) for r in tiles)
  if prefetch_records_to is not None and compiled:
    # Every record's lines while the tile loads: raw k (a row of K), this program's columns of
    # raw v, and the rows of g and beta; records past `count` repeat the last.
    p = (base + jnp.minimum(jnp.arange(ring_len, dtype=jnp.int32), count - 1)) & (ring_len - 1)
    lines = functools.partial(cache.prefetch_lines, level=prefetch_records_to)
    lines(ring_rawk_ref, (slot, kh), p, 0, K)
    for r in tiles:
      lines(ring_rawv_ref, (slot, h), p, r.start, r.size)
    for ring in (ring_g_ref, ring_beta_ref):  # [slots, HV, L]: the row of head h
      lines(ring, (slot,), jnp.full((1,), h, jnp.int32), 0, ring_len)
  if prefetch:
    # Record i + 1 is loaded (and normalised ahead) while record i is applied, so its memory
    # latency (and the norm's reductions) hide behind an update; the last load reads a ring
    # entry it never uses (in bounds: index mod L).
    if prefetch_at not in PREFETCH_ATS:
      raise ValueError(f"fold: prefetch_at={prefetch_at!r}; expected one of {PREFETCH_ATS}.")

    def step(i, carry):
      S, rec = carry
      if prefetch_at == "start":
        nxt = record(i + 1)
        return update(S, rec), nxt
      S = update(S, rec)
      return S, record(i + 1)

    S, _ = jax.lax.fori_loop(0, count, step, (S, record(0)))
  else:
    S = jax.lax.fori_loop(0, count, lambda i, S: update(S, record(i)), S)
  for r, S_t in zip(tiles, S):
    tile.store(ssm_ref, (slot, h, r), S_t)
  if copy_ref is not None:
    # Rounded from the stored tile read back (from L2: just written), half its rows at a time:
    # a bf16 store of the loop's tile, or of a block of the loop's chunk shape, made Triton
    # lay the loop out anew (sm_90: K=128 364 -> 381 loop instructions; K=16, V=64: 8 -> 5
    # shuffles, and on an H100 the folded state 1 ulp off the recurrent one), which the
    # bitwise tie with the recurrent kernels' layout cannot take.
    # With `copy_halves_first` every half is loaded before the first store: the compiler
    # cannot tell the copy from the checkpoint, so a load after a store waits for it (sm_90:
    # two L2 round trips, not one). It holds the whole tile in registers at once, which the
    # verify forms that fold, whose programs stream after it, cannot spare (sm_90, the decode
    # stream with the copy: 128 -> 163 registers, 4 -> 3 programs an SM).
    if compiled:  # the program's threads read what its other threads stored
      pltriton.debug_barrier()
    halves = [pl.ds(r.start + i * (r.size // 2), r.size // 2) for r in tiles for i in (0, 1)]
    if copy_halves_first:
      stored = [ssm_ref[slot, h, rows, :] for rows in halves]
      for rows, x in zip(halves, stored):
        copy_ref[slot, h, rows, :] = x.astype(copy_ref.dtype)
    else:
      for rows in halves:
        copy_ref[slot, h, rows, :] = ssm_ref[slot, h, rows, :].astype(copy_ref.dtype)


def fold_tiles(ssm_ref, *rings, loop: FoldLoop, first_row, tiles: int, **kw) -> None:
  """`fold_rows` of the ``tiles`` ``[loop.block_v, K]`` tiles from row ``first_row`` on, in
  ``loop``'s record loop. ``rings``: rawk, rawv, g, beta; ``kw``: the rest of `fold_rows`'s
  arguments (slot, h, kh, count, base, ring_len, compiled)."""
  kw.update(k_chunk=loop.k_chunk, prefetch=loop.prefetch, normalize_ahead=loop.normalize_ahead,
            prefetch_at=loop.prefetch_at, record_order=loop.record_order,
            prefetch_records_to=loop.prefetch_records_to,
            copy_halves_first=loop.copy_halves_first)
  tile_rows = lambda t: pl.ds(first_row + t * loop.block_v, loop.block_v)
  if loop.interleave:
    fold_rows(ssm_ref, *rings, rows=tuple(tile_rows(t) for t in range(tiles)), **kw)
    return

  def one_tile(t, carry):
    fold_rows(ssm_ref, *rings, rows=tile_rows(t), **kw)
    return carry

  jax.lax.fori_loop(0, tiles, one_tile, 0)


def fold_before_read(ssm_ref, *rings, loop: FoldLoop, count, rows: int, compiled: bool,
                     **kw) -> None:
  """`fold_tiles` of a verify program's ``rows`` checkpoint rows when ``count > 0``, before the
  program reads them: a flush row's checkpoint is read and written once, not read again by a
  verify after a fold kernel. ``kw``: the rest of `fold_tiles`'s arguments but ``tiles``."""

  @pl.when(count > 0)
  def _fold():
    fold_tiles(ssm_ref, *rings, loop=loop, tiles=rows // loop.block_v, count=count,
               compiled=compiled, **kw)
    if compiled:  # the program's threads read what its other threads stored
      pltriton.debug_barrier()


def _fold_kernel(
    # inputs
    slot_ids_ref,  # [B] int32
    count_ref,  # [B] int32: records to fold (0: leave the row alone)
    cache_base_ref,  # [B] int32
    ring_rawk_ref,  # [slots, H, L, K] activation dtype
    ring_rawv_ref,  # [slots, HV, L, V] activation dtype
    ring_g_ref,  # [slots, HV, L] f32
    ring_beta_ref,  # [slots, HV, L] f32
    ssm_in_ref,  # [slots, HV, V, K] f32, aliased with ssm_ref
    *refs,  # with `copy`: the copy's input (aliased); outputs: ssm_ref, then the copy's
    ring_len: int,
    gqa_ratio: int,
    loop: FoldLoop,
    v_blocks: int,
    tile_ahead: int,
    compiled: bool,
    copy: bool,
):
  # outputs: ssm_ref [slots, HV, V, K] f32; with `copy`, copy_ref [slots, HV, V, K] bf16
  del ssm_in_ref  # the same buffer as ssm_ref (and the copy's input as copy_ref)
  ssm_ref, copy_ref = (refs[1], refs[2]) if copy else (refs[0], None)
  row, h, j = row_ids()
  slot, count, base = slot_ids_ref[row], count_ref[row], cache_base_ref[row]
  rows = v_blocks * loop.block_v
  if tile_ahead and compiled:
    # The checkpoint tile of the program launched `tile_ahead` after this one, into L2, if it
    # folds: programs start in launch order as others end, so it starts about when this one
    # is done with its tile and records.
    valid, row_n, h_n, j_n = row_ids_ahead(tile_ahead)
    row_n = jnp.minimum(row_n, slot_ids_ref.shape[0] - 1)
    slot_n = slot_ids_ref[row_n]

    @pl.when(valid & (slot_n >= 0) & (count_ref[row_n] > 0))
    def _tile_ahead():
      K = ssm_ref.shape[-1]
      first = j_n * rows + jnp.arange(rows, dtype=jnp.int32)
      cache.prefetch_lines(ssm_ref, (slot_n, h_n), first, 0, K, level="L2")

  @pl.when((slot >= 0) & (count > 0))
  def _fold():
    fold_tiles(ssm_ref, ring_rawk_ref, ring_rawv_ref, ring_g_ref, ring_beta_ref, loop=loop,
               first_row=j * rows, tiles=v_blocks, slot=slot, h=h,
               kh=h // gqa_ratio, count=count, base=base, ring_len=ring_len, compiled=compiled,
               copy_ref=copy_ref)


def _check_inputs(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base,
                  ssm_copy=None):
  slots, HV, V, K = ssm.shape
  H, L = ring_rawk.shape[1], ring_rawk.shape[2]
  B = slot_ids.shape[0]
  expected = {"ring_rawk": (slots, H, L, K), "ring_rawv": (slots, HV, L, V),
              "ring_g": (slots, HV, L), "ring_beta": (slots, HV, L),
              "count": (B,), "cache_base": (B,)}
  given = {"ring_rawk": ring_rawk, "ring_rawv": ring_rawv, "ring_g": ring_g,
           "ring_beta": ring_beta, "count": count, "cache_base": cache_base}
  for name, want in expected.items():
    if given[name].shape != want:
      raise ValueError(f"{name} has shape {given[name].shape}; expected {want} (ssm is {ssm.shape}).")
  if ssm.dtype != jnp.float32:
    raise ValueError(f"the exact fold needs an fp32 checkpoint; ssm is {ssm.dtype}.")
  if ssm_copy is not None:
    check_copy(ssm, ssm_copy)


def check_copy(ssm, ssm_copy) -> None:
  """The fp32 checkpoints and their bf16 copy (`SpecConfig.checkpoint_copy`), of one shape."""
  for name, x, dtype in (("ssm", ssm, jnp.float32), ("ssm_copy", ssm_copy, jnp.bfloat16)):
    if x.dtype != dtype or x.shape != ssm_copy.shape:
      raise ValueError(f"{name} is {jnp.dtype(x.dtype).name}{list(x.shape)}; expected "
                       f"{jnp.dtype(dtype).name}{list(ssm_copy.shape)} (the fp32 checkpoints and "
                       f"their bf16 copy).")


@functools.partial(jax.jit, static_argnames=("tuning", "interpret", "v_blocks", "prefetch",
                                             "interleave", "normalize_ahead", "prefetch_at",
                                             "record_order", "prefetch_records_to",
                                             "prefetch_tile_ahead"))
def fold(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
         tuning: KernelTuning, interpret: bool, v_blocks: int | None = None,
         prefetch: bool | None = None, interleave: bool | None = None,
         normalize_ahead: bool | None = None, prefetch_at: str | None = None,
         record_order: tuple[str, ...] | None = None, prefetch_records_to: str | None = None,
         prefetch_tile_ahead: int | None = None, ssm_copy: jax.Array | None = None):
  """Fold ``count[b]`` raw records of each row into ``ssm[slot_ids[b]]`` in place.

  Args:
    ssm: ``f32[slots, HV, V, K]`` checkpoints (aliased: updated in place).
    ssm_copy: ``bf16[slots, HV, V, K]`` or None: the checkpoints' copy
      (`SpecConfig.checkpoint_copy`; aliased), whose folded rows get the folded tiles
      rounded to its dtype.
    ring_rawk, ring_rawv, ring_g, ring_beta: the slot rings (see `state.ReplayCache`).
    slot_ids: ``int32[B]``; -1 marks a padding row.
    count: ``int32[B]``, records to fold per row (``write_pos`` of flush rows, else 0).
    cache_base: ``int32[B]``, ring index of each row's logical record 0.
    tuning: launch parameters; must be the recurrent kernels' for the bitwise tie.
    interpret: run the Pallas interpreter (CPU).
    v_blocks: ``[BV, K]`` tiles one program folds (default `FOLD_V_BLOCKS`, or the most of
      them up to it that divide the head's tiles): fewer, longer programs.
    prefetch: load record ``i + 1`` while applying record ``i`` (default `FOLD_PREFETCH`).
    interleave: fold a program's ``v_blocks`` tiles in one record loop (default
      `FOLD_INTERLEAVE`).
    normalize_ahead: with ``prefetch``, normalise record ``i + 1``'s k before applying record
      ``i`` (default `FOLD_NORMALIZE_AHEAD`).
    prefetch_at: with ``prefetch``, issue those loads before record ``i``'s update ("start")
      or after it ("end"; default `FOLD_PREFETCH_AT`).
    record_order: the order of a record's loads, a permutation of `RECORD_LOADS` with "norm"
      (k normalised ahead) after "k" (default `FOLD_RECORD_ORDER`).
    prefetch_records_to: the cache level ("L1", "L2") a program prefetches its records to
      when it starts, or "off" (`PREFETCH_RECORDS_TO`; default `FOLD_PREFETCH_RECORDS_TO`).
    prefetch_tile_ahead: prefetch into L2 the checkpoint tile of the program this many
      launches later, 0 for none (default `FOLD_PREFETCH_TILE_AHEAD`).
    None changes the arithmetic: every launch folds to the same bits.

  Returns:
    The updated ``ssm``, or ``(ssm, ssm_copy)`` with ``ssm_copy``.
  """
  _check_inputs(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base,
                ssm_copy)
  B, (_, HV, V, K), H, L = slot_ids.shape[0], ssm.shape, ring_rawk.shape[1], ring_rawk.shape[2]
  tuning.check(V, K)
  tiles = V // tuning.block_v
  v_blocks = math.gcd(FOLD_V_BLOCKS, tiles) if v_blocks is None else v_blocks
  loop = FoldLoop(
      block_v=tuning.block_v, k_chunk=tuning.k_chunk,
      prefetch=FOLD_PREFETCH if prefetch is None else prefetch,
      interleave=FOLD_INTERLEAVE if interleave is None else interleave,
      normalize_ahead=FOLD_NORMALIZE_AHEAD if normalize_ahead is None else normalize_ahead,
      prefetch_at=FOLD_PREFETCH_AT if prefetch_at is None else prefetch_at,
      record_order=FOLD_RECORD_ORDER if record_order is None else tuple(record_order),
      prefetch_records_to=records_level(prefetch_records_to, FOLD_PREFETCH_RECORDS_TO))
  tile_ahead = FOLD_PREFETCH_TILE_AHEAD if prefetch_tile_ahead is None else prefetch_tile_ahead
  if tile_ahead < 0:
    raise ValueError(f"fold: prefetch_tile_ahead={tile_ahead} must be >= 0.")
  if v_blocks < 1 or tiles % v_blocks:
    raise ValueError(f"fold: v_blocks={v_blocks} must divide the {tiles} tiles of "
                     f"block_v={tuning.block_v} in head_v_dim={V}.")
  order_tag = "".join(n[0] for n in loop.record_order)  # kernel names take no "-"
  kernel = functools.partial(_fold_kernel, ring_len=L, gqa_ratio=HV // H, loop=loop,
                             v_blocks=v_blocks, tile_ahead=tile_ahead, compiled=not interpret,
                             copy=ssm_copy is not None)
  inputs = dict(slot_ids=slot_ids, count=count, cache_base=cache_base, ring_rawk=ring_rawk,
                ring_rawv=ring_rawv, ring_g=ring_g, ring_beta=ring_beta, ssm=ssm)
  outputs = ["ssm"]
  if ssm_copy is not None:
    inputs["ssm_copy"] = ssm_copy
    outputs.append("ssm_copy")
  out = pl.pallas_call(
      kernel,
      out_shape=[jax.ShapeDtypeStruct(inputs[n].shape, inputs[n].dtype) for n in outputs],
      grid=row_grid(B, HV, V // (tuning.block_v * v_blocks)),
      input_output_aliases={list(inputs).index(n): i for i, n in enumerate(outputs)},
      interpret=interpret,
      compiler_params=tuning.compiler_params(),
      name=f"exact_fold_L{L}_bv{tuning.block_v}_w{tuning.num_warps}_kc{tuning.k_chunk}"
           f"_vb{v_blocks}{'_il' if loop.interleave else ''}{'_pf' if loop.prefetch else ''}"
           f"{'_na' if loop.prefetch and loop.normalize_ahead else ''}"
           f"{'_end' if loop.prefetch and loop.prefetch_at == 'end' else ''}"
           f"{'' if loop.record_order == RECORD_LOADS else '_o' + order_tag}"
           f"{'_c' + loop.prefetch_records_to if loop.prefetch_records_to else ''}"
           f"{f'_t{tile_ahead}' if tile_ahead else ''}{'_copy' if ssm_copy is not None else ''}",
  )(*inputs.values())
  return out[0] if ssm_copy is None else tuple(out)


# ----------------------------------------------------------------------------- references


def replay_rows(S, rawk, rawv, g, beta, count, cache_base):
  """Replay ``count[b]`` records of each row through the exact update (pure jnp).

  Args:
    S: ``f32[B, HV, V, K]`` starting states.
    rawk: ``[B, H, L, K]``; rawv: ``[B, HV, L, V]``; g, beta: ``f32[B, HV, L]`` (the rows' rings).
    count, cache_base: ``int32[B]``.

  Returns:
    ``f32[B, HV, V, K]``: the states after each row's records.
  """
  HV, L = S.shape[1], g.shape[-1]
  r = HV // rawk.shape[1]
  rows = jnp.arange(S.shape[0])

  def step(i, S):
    p = (cache_base + i) & (L - 1)
    k_hat = reference.l2_normalize(jnp.repeat(rawk[rows, :, p], r, axis=1).astype(jnp.float32))
    S_new, _ = reference.delta_rule_step(
        S, k_hat, rawv[rows, :, p].astype(jnp.float32), g[rows, :, p], beta[rows, :, p])
    return jnp.where((i < count)[:, None, None, None], S_new, S)

  return jax.lax.fori_loop(0, jnp.max(count, initial=0), step, S)


def fold_reference(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
                   ssm_copy=None, **_):
  """Pure-jnp `fold` (the ``xla`` backend)."""
  _check_inputs(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base,
                ssm_copy)
  s = jnp.maximum(slot_ids, 0)
  count = jnp.where(slot_ids < 0, 0, count)
  rows = replay_rows(ssm[s], ring_rawk[s], ring_rawv[s], ring_g[s], ring_beta[s], count, cache_base)
  # Rows that fold nothing are not written back (a row with count 0 may share its
  # slot with nothing, but padding rows read slot 0 and must not write it).
  targets = jnp.where(count > 0, slot_ids, -1)
  ssm = scatter_rows(ssm, targets, rows)
  if ssm_copy is None:
    return ssm
  return ssm, scatter_rows(ssm_copy, targets, rows)
