"""One launch description per kernel call, run through jax-triton, Triton's interpreter, or compiled only.

A `Launch` names a ``@triton.jit`` kernel, its grid, its array arguments in the kernel's order
(inputs, then outputs), which outputs alias which inputs (in place, `input_output_aliases`), its
``tl.constexpr`` arguments and the launch parameters. Three consumers:

- `run` on a GPU: `jax_triton.triton_call`, whose output buffers are appended to the inputs
  exactly as the kernels' signatures list them. jax-triton imports only where JAX has a GPU,
  so it is imported here on first use.
- `run` under Triton's interpreter (``TRITON_INTERPRET=1`` set before `triton` is imported:
  ``triton.jit`` then builds interpreted functions): a `jax.pure_callback` that runs the
  kernel over host copies of the arrays (CPU, for tests; fresh outputs are filled with NaN,
  so whatever a kernel fails to write shows).
- `compile_sm90` on any machine: Triton's own compile for an H200 (sm_90) with the
  specialisation jax-triton uses (every array 16-byte aligned), and `resource_usage` from
  the cubin it built (the cuobjdump bundled with the triton wheel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import triton

from replayssm_jax.kernels.triton.tile import INTERPRET

# Triton's pointer types by JAX dtype name.
_TRITON_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int32": "i32",
                 "int64": "i64", "int8": "i8", "bool": "i1"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Launch:
  """A kernel call.

  Attributes:
    kernel: the ``@triton.jit`` function; its array parameters are ``inputs`` then ``outputs``.
    name: the custom call's name (kernel, T and tuning, e.g. ``triton_fold_L16_bv32_w2_kc8``).
    grid: programs along x, y, z.
    inputs: the array arguments, in the kernel's order: arrays, or `jax.ShapeDtypeStruct`s to
      compile only.
    outputs: output name -> the input name it aliases (updated in place) or the
      `jax.ShapeDtypeStruct` of a fresh output.
    constexprs: the kernel's ``tl.constexpr`` arguments.
    num_warps, num_stages: Triton launch parameters.
    fp_fusion: Triton's ``enable_fp_fusion`` (contract multiplies into adds); off for the
      kernels of the bitwise tie (`tile.FP_FUSION`).
  """

  kernel: Any
  name: str
  grid: tuple[int, ...]
  inputs: dict[str, Any]
  outputs: dict[str, str | jax.ShapeDtypeStruct]
  constexprs: dict[str, Any]
  num_warps: int
  num_stages: int
  fp_fusion: bool = True

  def out_shapes(self) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(self.inputs[o].shape, self.inputs[o].dtype) if isinstance(o, str)
            else o for o in self.outputs.values()]

  def aliases(self) -> dict[int, int]:
    """``input_output_aliases``: input position -> output position, from the names."""
    names = list(self.inputs)
    return {names.index(o): i for i, o in enumerate(self.outputs.values()) if isinstance(o, str)}


def run(launch: Launch) -> tuple[jax.Array, ...]:
  """Run the kernel: jax-triton on a GPU, or Triton's interpreter under ``TRITON_INTERPRET=1``."""
  if INTERPRET:
    return _run_interpreted(launch)
  import jax_triton  # needs a GPU build of jaxlib

  return tuple(jax_triton.triton_call(
      *launch.inputs.values(), kernel=launch.kernel, out_shape=launch.out_shapes(),
      grid=launch.grid, name=launch.name, num_warps=launch.num_warps,
      num_stages=launch.num_stages, enable_fp_fusion=launch.fp_fusion,
      input_output_aliases=launch.aliases(), **launch.constexprs))


# ----------------------------------------------------------------------------- interpreter


class _HostArray:
  """Just enough of a torch tensor for Triton's interpreter: a numpy buffer by address."""

  def __init__(self, array: np.ndarray):
    self.array = array

  def data_ptr(self) -> int:
    return self.array.ctypes.data

  @property
  def dtype(self) -> str:
    return f"torch.{self.array.dtype.name}"


def _interpret(launch: Launch, *arrays: np.ndarray) -> list[np.ndarray]:
  from triton.runtime import interpreter

  buffers = [np.array(a) for a in arrays]  # writable copies; aliased outputs write into them
  by_name = dict(zip(launch.inputs, buffers))
  outputs = [by_name[o] if isinstance(o, str) else np.full(o.shape, np.nan, o.dtype)
             if jnp.issubdtype(o.dtype, jnp.floating) else np.zeros(o.shape, o.dtype)
             for o in launch.outputs.values()]
  executor = interpreter.GridExecutor(launch.kernel.rewrite(), launch.kernel.arg_names, launch.grid)
  # The executor copies torch tensors to and from the host around the run; these are host memory.
  executor._init_args_hst = lambda args, kwargs: (args, kwargs)
  executor._restore_args_dev = lambda *_: None
  with _interpreter_fixes():
    executor(*(_HostArray(x) for x in buffers + outputs), **launch.constexprs)
  return outputs


@contextlib.contextmanager
def _interpreter_fixes():
  """Three differences of Triton 3.6's interpreter from the GPU, mended for the run.

  - fp32 -> bf16 casts: the GPU rounds to nearest even (``cvt.rn.bf16.f32``); the interpreter
    truncates (its default rounding reaches it as None).
  - ``tl.dot`` of bf16 operands: the interpreter keeps bf16 as its bits in uint16 and multiplies
    those; the GPU multiplies the values (exactly, into an fp32 accumulator), as fp32 does here.
  - A loop bound loaded from memory (``range(count)``) is a 1-element array, which NumPy >= 2.5
    no longer converts with ``int()``.
  """
  import triton.language as tl
  from triton.runtime import interpreter

  builder, fp_trunc = interpreter.interpreter_builder, interpreter.interpreter_builder.create_fp_trunc
  create_dot = builder.create_dot
  patch_lang_tensor = interpreter._patch_lang_tensor

  def fp_trunc_rtne(src, dst_type):
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
      data = src.data.astype(np.float32).astype(jnp.bfloat16).view(np.uint16)
      return interpreter.TensorHandle(data, dst_type.scalar)
    return fp_trunc(src, dst_type)

  def create_dot_of_values(a, b, d, *args):
    a, b = (builder.create_fp_ext(x, tl.float32) if x.dtype.scalar == tl.bfloat16 else x
            for x in (a, b))
    return create_dot(a, b, d, *args)

  def patch_lang_tensor_with_index(tensor, scope):
    patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

  builder.create_fp_trunc = fp_trunc_rtne
  builder.create_dot = create_dot_of_values
  interpreter._patch_lang_tensor = patch_lang_tensor_with_index
  try:
    yield
  finally:
    del builder.create_fp_trunc, builder.create_dot
    interpreter._patch_lang_tensor = patch_lang_tensor


def _run_interpreted(launch: Launch) -> tuple[jax.Array, ...]:
  out = jax.pure_callback(lambda *a: _interpret(launch, *a), launch.out_shapes(),
                          *launch.inputs.values())
  return tuple(out)


# ----------------------------------------------------------------------------- compile only


def signature(launch: Launch) -> dict[str, str]:
  """Triton's signature of the launch: pointer types of the arrays, then the constexprs."""
  names = launch.kernel.arg_names
  arrays = list(launch.inputs.values()) + launch.out_shapes()
  if (len(arrays) + len(launch.constexprs) != len(names)
      or set(names[len(arrays):]) != set(launch.constexprs)):
    raise ValueError(f"{launch.name}: the kernel's parameters {names} do not match "
                     f"{len(arrays)} arrays and constexprs {sorted(launch.constexprs)}.")
  types = [f"*{_TRITON_TYPES[jnp.dtype(x.dtype).name]}" for x in arrays]
  return {name: types[i] if i < len(arrays) else "constexpr" for i, name in enumerate(names)}


def compile_sm90(launch: Launch, capability: int = 90):
  """Compile the launch for an sm_90 GPU (no GPU needed); returns Triton's compiled kernel."""
  from triton.backends.compiler import GPUTarget

  sig = signature(launch)
  attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
  source = triton.compiler.ASTSource(fn=launch.kernel, signature=sig,
                                     constexprs=launch.constexprs, attrs=attrs)
  with _triton_cache_dir():
    return triton.compile(source, target=GPUTarget("cuda", capability, 32),
                          options=dict(num_warps=launch.num_warps, num_stages=launch.num_stages,
                                       enable_fp_fusion=launch.fp_fusion))


@contextlib.contextmanager
def _triton_cache_dir():
  """A cache directory for ``triton.compile``, which writes every stage there and fails
  ("Could not create or locate cache dir") without one: importing jax-triton sets
  ``TRITON_CACHE_DIR`` to "" for the process, so once a kernel has run, a temporary one."""
  if os.environ.get("TRITON_CACHE_DIR") != "":
    yield
    return
  with tempfile.TemporaryDirectory() as cache:
    os.environ["TRITON_CACHE_DIR"] = cache
    try:
      yield
    finally:
      os.environ["TRITON_CACHE_DIR"] = ""


def cubin_listing(compiled, capability: int = 90) -> tuple[str, str]:
  """``cuobjdump -res-usage`` and ``cuobjdump -sass`` of a compiled kernel's cubin (the
  cuobjdump bundled with the triton wheel)."""
  from triton.backends.nvidia.compiler import get_ptxas

  cuobjdump = os.path.join(os.path.dirname(get_ptxas(capability).path), "cuobjdump")
  with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
    cubin.write(compiled.asm["cubin"])
    cubin.flush()
    usage, sass = (subprocess.run([cuobjdump, flag, cubin.name], capture_output=True, text=True,
                                  check=True).stdout for flag in ("-res-usage", "-sass"))
  return usage, sass


def resource_usage(compiled, capability: int = 90, *,
                   listing: tuple[str, str] | None = None) -> dict[str, int]:
  """Registers, spills and shared memory of a compiled kernel, read from its cubin (what runs),
  and the programs an H200 SM holds of it (`programs_per_sm`).

  A second ``ptxas -v`` over the PTX would not see Triton's own ptxas flags (triton 3.9 adds
  ``--regAllocOptLevel=2``: its UT form then takes 178 registers and no spill, where a plain
  ptxas reported 168 and 8 bytes). Registers: ``cuobjdump -res-usage``; spills: the bytes of
  the SASS's local-memory stores and loads (``STL`` / ``LDL``; the kernels keep no local
  arrays, so each is a spill), as ptxas counts them. ``listing``: the kernel's `cubin_listing`,
  if the caller has it already.
  """
  usage, sass = listing or cubin_listing(compiled, capability)
  n_regs, shared_bytes = int(re.search(r"REG:(\d+)", usage).group(1)), compiled.metadata.shared
  return dict(n_regs=n_regs, spill_stores=local_bytes(sass, "STL"),
              spill_loads=local_bytes(sass, "LDL"), shared_bytes=shared_bytes,
              per_sm=programs_per_sm(n_regs, compiled.metadata.num_warps, shared_bytes))


# An H200's (sm_90) SMs and per-SM limits, for `programs_per_sm`.
SMS = 132
SM_REGISTERS = 65536
SM_WARPS = 64
SM_PROGRAMS = 32
SM_SHARED_BYTES = 228 * 1024
PROGRAM_SHARED_RESERVED = 1024  # bytes the driver reserves in shared memory per program


def programs_per_sm(n_regs: int, num_warps: int, shared_bytes: int) -> int:
  """How many programs (CTAs) of a kernel one H200 SM holds at once: the least that its
  registers (allocated per warp in units of 256, i.e. a thread's rounded up to 8), its warps,
  its shared memory and the 32-program cap allow. With the grid's size this gives the waves:
  e.g. the triton coefficients kernel at 149 registers, 13 one-warp programs an SM, B=256's
  4096 programs in 2.39 waves of 132 SMs (benchmarks/NOTES.md run 36)."""
  warp_registers = -(-n_regs * 32 // 256) * 256
  return min(SM_REGISTERS // (warp_registers * num_warps), SM_WARPS // num_warps,
             SM_SHARED_BYTES // (shared_bytes + PROGRAM_SHARED_RESERVED), SM_PROGRAMS)


_WIDTH_BYTES = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}


def local_bytes(sass: str, opcode: str) -> int:
  """Bytes that the SASS's ``opcode`` instructions (``STL`` or ``LDL``) move, each counted once:
  4 unless a width suffix (``.64``, ``.128``, ``.U8``, ...) says otherwise."""
  total = 0
  for suffixes in re.findall(rf"\b{opcode}((?:\.\w+)*)\s", sass):
    widths = [_WIDTH_BYTES[x] for x in suffixes.split(".")[1:] if x in _WIDTH_BYTES]
    total += widths[0] if widths else 4
  return total
