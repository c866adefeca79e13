"""Compile Pallas kernels for an H200 without a GPU: registers, spills and each loop's SASS.

JAX lowers a Pallas call for an abstract H200 (as `tests/test_lowering.py` does) to a Triton
module; the triton wheel (the ``triton`` extra) compiles that module for sm_90a, and its
cuobjdump reads the registers, the spills and the SASS from the cubin. On the GPU, XLA compiles
the same module with its own Triton and ptxas, so what this prints approximates the device. The
exact fold has 128 registers and 364 instructions a loop iteration here, 127 and 373 in run 22's
Nsight Compute profile (`benchmarks/ncu/run22_fold_b256.txt`); the coefficients kernel (T=4,
B=256) 127 registers and 2592 instructions, 128 and 2869 in run 20's. The pipelined stream
kernels are undercounted: B=64, the stream 63 registers here and 80 on the device, the stream
that folds 128 here and 168 there (run 23, `benchmarks/ncu/run23_launchstats.txt`; XLA's
Triton pipelines their checkpoint loads otherwise). Read it for the fold's and the coefficients'
registers and instruction counts, and for the streams' only as a lower bound; check them on the
GPU; the schedule, and so the speed, needs the GPU.

    PYTHONPATH=$PWD python tools/pallas_sass.py fold [--kw "{'prefetch_at': 'start'}"]
    PYTHONPATH=$PWD python tools/pallas_sass.py replay_verify --T 4 --batch 256 --sass /tmp/sass
    PYTHONPATH=$PWD python tools/pallas_sass.py fold --checkpoint-copy   # writes the bf16 copy
    PYTHONPATH=$PWD python tools/pallas_sass.py --backend triton exact_fold_L16
    PYTHONPATH=$PWD python tools/pallas_sass.py --backend triton replay_split_coefficients_T4 \
        --set kernels.triton.replay_split.HEADS_LOOP=False
    PYTHONPATH=$PWD python tools/pallas_sass.py shipped --save /tmp/before
    # ... a refactor ...
    PYTHONPATH=$PWD python tools/pallas_sass.py shipped --compare /tmp/before

``shipped`` compiles every launch the library ships (`SHIPPED`: the fold, the recurrent kernels,
and the replay verify with and without the fold at T = 1 and 4 and B = 1, 16, 64 and 256; with
``--backend triton`` every launch of `compile_check`) and saves their SASS, or compares it with a
saved set: a refactor's "no compiled change", stronger than `tools/trace_fingerprint.py`'s traces
(which a no-op such as ``x * 1`` changes). It exits 1 and names the kernels whose SASS moved.
About 80 seconds for the Pallas set on a 2-core CPU.

The triton backend's kernels (``--backend triton``) are compiled from their own launches at
`kernels.triton.compile_check`'s anchor geometry; run it with the H200's triton (3.6) for the
device's registers and loops (benchmarks/NOTES.md runs 32 and 34).

Kernels (`KERNELS`): the fold, the recurrent verify and decode, the replay verify (at B >= 16
the split form: its coefficients and stream kernels) and the split form with the fold inside
its stream, each at the anchor geometry with the tuning the benchmarks use. ``--kw`` adds
keyword arguments to the call, as a dict literal; its ``'tuning'``, a dict of `KernelTuning`'s
fields, replaces those of the benchmarks' tuning (``--kw "{'tuning': {'k_chunk': 128}}"``).
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import dataclasses
import functools
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh

from replayssm_jax import SpecConfig, ssm
from replayssm_jax.bench import kernels as bench
from replayssm_jax.kernels import replay_split
from replayssm_jax.kernels.backend import layer_shapes

KERNELS = ("fold", "recurrent_verify", "recurrent_decode", "replay_verify", "fold_replay_verify")
# (kernel, T, B) of every Pallas launch the library ships: the forms and launches by T and B.
SHIPPED = ([(k, 4, 256) for k in KERNELS[:3]]
           + [(k, T, B) for k in KERNELS[3:] for T in (1, 4) for B in (1, 16, 64, 256)])
ACT = jnp.bfloat16


def _shapes(B: int, T: int, L: int, gdn=bench.GEOMETRY) -> dict[str, jax.ShapeDtypeStruct]:
  return layer_shapes(H=gdn.num_k_heads, HV=gdn.num_v_heads, K=gdn.head_k_dim, V=gdn.head_v_dim,
                      T=T, L=L, slots=B, B=B, act=ACT, ring=ACT)


def call(kernel: str, B: int, T: int, L: int, *, copy: bool = False, tuning=None, **kw):
  """``(fn, args)``: the kernel's call with the benchmarks' tuning (``tuning``, a dict,
  replaces some of its fields) and its argument shapes; ``copy``: with the checkpoint's bf16
  copy (`SpecConfig.checkpoint_copy`), which the fold writes and the replay verify reads."""
  kern, x = bench.kernels_for("pallas"), _shapes(B, T, L)
  V = bench.GEOMETRY.head_v_dim
  state_tuning = dataclasses.replace(kern.state_tuning(V), **(tuning or {}))
  spec = SpecConfig(backend="pallas", verify_mode="replayssm",
                    checkpoint_copy=jnp.bfloat16 if copy else None)
  replay_tuning = dataclasses.replace(ssm.default_replay_tuning(spec, V, T, B), **(tuning or {}))
  window = [x[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "slot_ids")]
  ssm_copy = jax.ShapeDtypeStruct(x["ssm"].shape, jnp.bfloat16)
  if kernel == "fold":
    args = [x[n] for n in ("ssm", "ring_rawk", "ring_rawv", "ring_g", "ring_beta", "slot_ids",
                           "count", "cache_base")]
    fold = functools.partial(kern.fold, tuning=state_tuning, **kw)
    if copy:
      return (lambda *a: fold(*a[:-1], ssm_copy=a[-1])), [*args, ssm_copy]
    return fold, args
  if kernel == "recurrent_verify":
    return (functools.partial(kern.recurrent_verify, tuning=state_tuning, **kw),
            [x["ssm"], x["intermediate"], *window])
  if kernel == "recurrent_decode":
    one = _shapes(B, 1, L)
    return (functools.partial(kern.recurrent_decode, tuning=state_tuning, **kw),
            [one[n] for n in ("ssm", "q", "k", "v", "a", "b", "A_log", "dt_bias", "slot_ids")])
  replay = [x[n] for n in ("ssm", "ring_d", "ring_k", "ring_g", "ring_beta", "ring_rawk",
                            "ring_rawv", "q", "k", "v", "a", "b", "A_log", "dt_bias",
                            "slot_ids", "write_pos", "cache_base")]
  if kernel == "replay_verify":
    return (functools.partial(kern.replay_verify, tuning=replay_tuning,
                              dot_precision="default", **kw),
            [ssm_copy, *replay[1:]] if copy else replay)
  if kernel == "fold_replay_verify":  # the split form's stream folding the flush rows first
    fold_verify = functools.partial(replay_split.fold_replay_verify_split,
                                    tuning=replay_tuning, fold_tuning=kern.state_tuning(V),
                                    dot_precision="default", **kw)
    args = [*replay, x["count"], x["cache_base"]]
    if copy:  # it folds into the fp32 checkpoint and streams the copy
      return (lambda *a: fold_verify(*a[:-1], ssm_copy=a[-1])), [*args, ssm_copy]
    return fold_verify, args
  raise ValueError(f"kernel={kernel!r}; expected one of {KERNELS}.")


@contextlib.contextmanager
def _capture_triton_modules():
  """The Triton modules (as text) JAX lowers Pallas calls to, in order, while in the block."""
  from jax._src.pallas.triton import pallas_call_registration as registration

  lower = registration.lowering.lower_jaxpr_to_triton_module
  modules: list[str] = []

  def spy(*args, **kwargs):
    result = lower(*args, **kwargs)
    modules.append(result.module.operation.get_asm(enable_debug_info=False))
    return result

  registration.lowering.lower_jaxpr_to_triton_module = spy
  try:
    yield modules
  finally:
    registration.lowering.lower_jaxpr_to_triton_module = lower


def triton_modules(fn, args) -> list[dict]:
  """``[{name, num_warps, num_stages, ttir}]`` of every Pallas call of ``fn(*args)`` lowered
  for an H200."""
  mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
      device_kind="NVIDIA H200", num_cores=None, platform="cuda"))
  with _capture_triton_modules() as modules, jax.sharding.use_abstract_mesh(mesh):
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  # Launch parameters by kernel name (the custom calls' order need not be the lowering's).
  configs = {n: (int(s), int(w)) for n, s, w in re.findall(
      r'name = "([^"]+)", num_stages = (\d+) : i32, num_warps = (\d+) : i32', text)}
  found = []
  for ttir in modules:
    name = re.match(r"module @(\S+) \{", ttir).group(1)
    if name not in configs:
      raise RuntimeError(f"no launch parameters for the Triton module {name} in the lowered "
                         "program: JAX's Pallas lowering changed")
    stages, warps = configs[name]
    found.append(dict(name=name, num_stages=stages, num_warps=warps, ttir=ttir))
  return found


def compile_sm90(module: dict, workdir: Path) -> dict:
  """Compile one Triton module for sm_90a: registers, spills, SASS and its loops."""
  import triton
  from triton.backends.compiler import GPUTarget

  ttir = workdir / f"{module['name']}.ttir"
  ttir.write_text(module["ttir"])
  compiled = triton.compile(str(ttir), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=module["num_warps"],
                                         num_stages=module["num_stages"]))
  return sass_report(compiled, module["name"], module["num_warps"])


def triton_backend_sm90(kernel: str) -> dict:
  """The triton backend's kernel ``kernel`` (a name of `compile_check.launches`, at its anchor
  geometry and default tunings) compiled for sm_90a, as `compile_sm90` reports it."""
  from replayssm_jax.kernels.triton import compile_check

  launches = compile_check.launches(**compile_check.ANCHOR)
  if kernel not in launches:
    raise ValueError(f"kernel={kernel!r}; the triton backend's are {sorted(launches)}.")
  return _launch_report(launches[kernel])


def _launch_report(launch) -> dict:
  """`sass_report` of a triton backend `Launch` compiled for sm_90a."""
  from replayssm_jax.kernels.triton.launch import compile_sm90 as compile_launch

  return sass_report(compile_launch(launch), launch.name, launch.num_warps)


def sass_report(compiled, name: str, num_warps: int) -> dict:
  """Registers, spills, shared memory, SASS and loops of a kernel Triton compiled for sm_90a."""
  from replayssm_jax.kernels.triton.launch import cubin_listing, resource_usage

  listing = cubin_listing(compiled)
  usage, sass = resource_usage(compiled, listing=listing), listing[1]
  instructions = [m.groups() for m in
                  (re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
                   for line in sass.splitlines()) if m]
  return dict(name=name, num_warps=num_warps, registers=usage["n_regs"], per_sm=usage["per_sm"],
              shared_bytes=usage["shared_bytes"], spill_stores=usage["spill_stores"],
              spill_loads=usage["spill_loads"],
              instructions=len(instructions), loops=loops(instructions), sass=sass)


def shipped_sass(backend: str = "pallas", only=None) -> dict[str, str]:
  """``{"<call>/<kernel name>": SASS}`` of every launch in `SHIPPED` (or, ``triton``, every
  launch of `compile_check`), those whose call starts with one of ``only`` if given."""
  keep = lambda call: only is None or any(call.startswith(o) for o in only)
  jax.clear_caches()  # the module knobs a caller has set are read at trace time
  found = {}
  if backend == "triton":
    from replayssm_jax.kernels.triton import compile_check
    for name, launch in compile_check.launches(**compile_check.ANCHOR).items():
      if keep(name):
        found[f"{name}/{name}"] = _launch_report(launch)["sass"]
    return found
  with tempfile.TemporaryDirectory() as tmp:
    for kernel, T, B in SHIPPED:
      call_name = f"{kernel}_T{T}_B{B}"
      if keep(call_name):
        fn, shapes = call(kernel, B, T, 16, interpret=False)
        for module in triton_modules(fn, shapes):
          found[f"{call_name}/{module['name']}"] = compile_sm90(module, Path(tmp))["sass"]
  return found


def compare_sass(found: dict[str, str], saved: Path) -> list[str]:
  """The keys of ``found`` whose SASS differs from, or is missing in, the folder ``saved``
  (as `main`'s ``--save`` writes it), and the saved ones ``found`` lacks."""
  changed = [key for key, sass in found.items()
             if not (saved / f"{key}.sass").is_file()
             or (saved / f"{key}.sass").read_text() != sass]
  gone = sorted(str(f.relative_to(saved).with_suffix("")) for f in saved.glob("*/*.sass"))
  return changed + [key for key in gone if key not in found]


def _shipped(args) -> int:
  """`main` for the kernel ``shipped``: save or compare the SASS of every shipped launch."""
  found = shipped_sass(args.backend, args.only)
  if args.save:
    for key, sass in found.items():
      (args.save / key).parent.mkdir(parents=True, exist_ok=True)
      (args.save / f"{key}.sass").write_text(sass)
    print(f"saved the SASS of {len(found)} launches in {args.save}")
  if args.compare:
    changed = compare_sass(found, args.compare)
    for key in changed:
      print(f"changed: {key}")
    same = len(set(found) - set(changed))
    print(f"{same} of {len(found)} launches compile to the same SASS")
    return 1 if changed else 0
  return 0


def _opcode(text: str) -> str:
  words = text.split()
  return words[1] if words[0].startswith("@") else words[0]


def loops(instructions: list[tuple[str, str]]) -> list[dict]:
  """The SASS loops (a branch back to an earlier address): start, size and opcode mix."""
  index = {int(address, 16): i for i, (address, _) in enumerate(instructions)}
  found = []
  for i, (address, text) in enumerate(instructions):
    target = re.search(r"BRA\b.*?0x([0-9a-f]+)", text)
    if target and int(target.group(1), 16) < int(address, 16):
      start = index[int(target.group(1), 16)]
      body = [_opcode(t) for _, t in instructions[start:i + 1]]
      found.append(dict(start=start, size=len(body),
                        mix=collections.Counter(body).most_common(12)))
  return found


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("kernel", help=f"Pallas: one of {', '.join(KERNELS)}; triton: a name of "
                 "`kernels.triton.compile_check`'s launches (e.g. exact_fold_L16); either: "
                 "'shipped', every shipped launch, with --save or --compare")
  p.add_argument("--backend", choices=("pallas", "triton"), default="pallas",
                 help="triton: the native kernel at compile_check's anchor geometry (the "
                 "other options but --sass do not apply)")
  p.add_argument("--batch", type=int, default=256,
                 help="rows (the split form's choices depend on it)")
  p.add_argument("--T", type=int, default=4, help="window tokens (replay and recurrent verify)")
  p.add_argument("--ring", type=int, default=16)
  p.add_argument("--kw", default="{}", type=ast.literal_eval,
                 help="extra keyword arguments as a dict literal, e.g. \"{'prefetch': False}\"")
  p.add_argument("--checkpoint-copy", action="store_true",
                 help="the fold writes, the replay verify reads the checkpoint's bf16 copy "
                      "(SpecConfig.checkpoint_copy)")
  p.add_argument("--sass", type=Path, help="write each kernel's SASS into this folder")
  p.add_argument("--save", type=Path, help="shipped: write the SASS into this folder")
  p.add_argument("--compare", type=Path,
                 help="shipped: compare the SASS with a --save folder; exit 1 if any moved")
  p.add_argument("--only", nargs="+", metavar="PREFIX",
                 help="shipped: only the calls (e.g. fold_replay_verify_T4_B64) or triton "
                      "launches whose name starts with one of these")
  p.add_argument("--set", type=bench.parse_knob, action="append", default=[],
                 metavar="MODULE.NAME=VALUE",
                 help="set a knob of replayssm_jax.MODULE first (repeatable), as "
                      "bench.kernels --set, e.g. kernels.triton.replay_split.HEADS_LOOP=False")
  args = p.parse_args(argv)
  for module, name, value in args.set:  # a tool's own process: nothing to restore
    setattr(module, name, value)
  if args.kernel == "shipped":
    if not (args.save or args.compare):
      p.error("shipped needs --save DIR or --compare DIR.")
    return _shipped(args)
  with tempfile.TemporaryDirectory() as tmp:
    if args.backend == "triton":
      reports = [triton_backend_sm90(args.kernel)]
    else:
      fn, shapes = call(args.kernel, args.batch, args.T, args.ring, interpret=False,
                        copy=args.checkpoint_copy, **args.kw)
      reports = [compile_sm90(module, Path(tmp)) for module in triton_modules(fn, shapes)]
    for r in reports:
      print(f"{r['name']}: {r['num_warps']} warps, {r['registers']} registers, spills "
            f"{r['spill_stores']}/{r['spill_loads']} B, {r['shared_bytes']} B shared, "
            f"{r['per_sm']} programs an SM, "
            f"{r['instructions']} SASS instructions")
      for loop in r["loops"]:
        mix = ", ".join(f"{op} {n}" for op, n in loop["mix"])
        print(f"  loop at {loop['start']}: {loop['size']} instructions ({mix})")
      if args.sass:
        args.sass.mkdir(parents=True, exist_ok=True)
        (args.sass / f"{r['name']}.sass").write_text(r["sass"])
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
