"""Layer geometry (`GDNConfig`) and speculative-decoding settings (`SpecConfig`).

Both are frozen, hashable dataclasses, so they can be static arguments of
jitted functions. Every invalid combination raises `ValueError` at construction
with the field, the value and a fix (DESIGN section 4, "Validation").
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Literal

import jax
import jax.numpy as jnp

ProjectionLayout = Literal["qwen3_next", "qwen3_5"]
VerifyMode = Literal["recurrent", "replayssm"]
Backend = Literal["xla", "pallas", "triton"]
DotPrecision = Literal["default", "tf32", "bf16", "ieee"]

_LAYOUTS = ("qwen3_next", "qwen3_5")
_VERIFY_MODES = ("recurrent", "replayssm")
_BACKENDS = ("xla", "pallas", "triton")
DOT_PRECISIONS = ("default", "tf32", "bf16", "ieee")


def _is_power_of_two(n: int) -> bool:
  return n >= 1 and (n & (n - 1)) == 0


def next_power_of_two(n: int) -> int:
  """The smallest power of two >= n (1 for n <= 1)."""
  return 1 << max(0, (n - 1).bit_length())


@dataclasses.dataclass(frozen=True, kw_only=True)
class GDNConfig:
  """Geometry of the Gated DeltaNet layers of one model (at one TP rank).

  Attributes:
    num_k_heads: H, key heads (of this TP rank).
    num_v_heads: HV, value heads; a multiple of H (GQA ratio HV // H).
    head_k_dim: K.
    head_v_dim: V.
    conv_kernel: width of the depthwise causal conv.
    hidden_size: model width D.
    num_layers: all decoder layers.
    num_gdn_layers: the GDN (linear attention) layers among them.
    rms_norm_eps: epsilon of the gated RMSNorm.
    layout: projection layout, ``"qwen3_next"`` (grouped qkvz, ba) or
      ``"qwen3_5"`` (plain qkv, z, b, a).
  """

  num_k_heads: int
  num_v_heads: int
  head_k_dim: int
  head_v_dim: int
  conv_kernel: int = 4
  hidden_size: int
  num_layers: int
  num_gdn_layers: int
  rms_norm_eps: float = 1e-6
  layout: ProjectionLayout = "qwen3_5"

  def __post_init__(self):
    for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel",
                 "hidden_size", "num_layers", "num_gdn_layers"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"GDNConfig.{name}={value!r} must be a positive integer.")
    if self.num_v_heads % self.num_k_heads:
      raise ValueError(
          f"GDNConfig.num_v_heads={self.num_v_heads} must be a multiple of "
          f"num_k_heads={self.num_k_heads} (GQA: value head h reads key head h // ratio).")
    if self.num_gdn_layers > self.num_layers:
      raise ValueError(
          f"GDNConfig.num_gdn_layers={self.num_gdn_layers} exceeds num_layers={self.num_layers}.")
    if self.layout not in _LAYOUTS:
      raise ValueError(f"GDNConfig.layout={self.layout!r} is unknown; use one of {_LAYOUTS}.")

  @property
  def gqa_ratio(self) -> int:
    """HV // H: how many value heads share one key head."""
    return self.num_v_heads // self.num_k_heads

  @property
  def conv_dim(self) -> int:
    """Channels of the causal conv: [q | k | v] = 2 H K + HV V."""
    return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

  @property
  def state_shape(self) -> tuple[int, int, int]:
    """Per-slot recurrent state ``(HV, V, K)``."""
    return (self.num_v_heads, self.head_v_dim, self.head_k_dim)

  @classmethod
  def preset(cls, name: str, tp: int = 1) -> GDNConfig:
    """A named model geometry at tensor-parallel degree ``tp``.

    Values: `research/replayssm-algorithm.md` section 7 (HF config.json values).
    ``tp`` shards the key and value heads, so it must divide both.

    >>> GDNConfig.preset("qwen3.5-35b-a3b").num_gdn_layers
    30
    >>> GDNConfig.preset("qwen3.5-35b-a3b", tp=4).num_v_heads
    8
    """
    if name not in PRESETS:
      raise ValueError(f"GDNConfig.preset: unknown preset {name!r}; known presets: "
                       f"{', '.join(sorted(PRESETS))}.")
    base = PRESETS[name]
    if not isinstance(tp, int) or tp < 1:
      raise ValueError(f"GDNConfig.preset: tp={tp!r} must be a positive integer.")
    for field in ("num_k_heads", "num_v_heads"):
      heads = getattr(base, field)
      if heads % tp:
        divisors = [d for d in range(1, base.num_k_heads + 1)
                    if base.num_k_heads % d == 0 and base.num_v_heads % d == 0]
        raise ValueError(
            f"GDNConfig.preset({name!r}): tp={tp} does not divide {field}={heads}; "
            f"use a tp in {divisors}.")
    return dataclasses.replace(base, num_k_heads=base.num_k_heads // tp,
                               num_v_heads=base.num_v_heads // tp)


def _qwen(*, layers: int, hv: int, hidden: int, h: int = 16, layout: ProjectionLayout = "qwen3_5",
          interval: int = 4) -> GDNConfig:
  # Every `interval`-th layer is full attention; the rest are GDN layers.
  return GDNConfig(num_k_heads=h, num_v_heads=hv, head_k_dim=128, head_v_dim=128, conv_kernel=4,
                   hidden_size=hidden, num_layers=layers,
                   num_gdn_layers=layers - layers // interval, layout=layout)


PRESETS: dict[str, GDNConfig] = {
    "qwen3-next-80b-a3b": _qwen(layers=48, hv=32, hidden=2048, layout="qwen3_next"),
    "qwen3.5-4b": _qwen(layers=32, hv=32, hidden=2560),
    "qwen3.5-9b": _qwen(layers=32, hv=32, hidden=4096),
    "qwen3.5-27b": _qwen(layers=64, hv=48, hidden=5120),
    "qwen3.5-35b-a3b": _qwen(layers=40, hv=32, hidden=2048),
    "qwen3.5-122b-a10b": _qwen(layers=48, hv=64, hidden=3072),
    "qwen3.5-397b-a17b": _qwen(layers=60, hv=64, hidden=4096),
}


def jax_triton_available() -> bool:
  """True when the optional `jax_triton` package can be imported."""
  return importlib.util.find_spec("jax_triton") is not None


def gpu_available() -> bool:
  """True when JAX sees a CUDA GPU."""
  try:
    return any(d.platform in ("gpu", "cuda", "rocm") for d in jax.devices())
  except RuntimeError:
    return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecConfig:
  """How verify, commit and decode run.

  Attributes:
    draft_tokens: T, the verify window (draft tokens including the root/bonus).
    ring_len: L, ring records per slot (replayssm); a power of two >= 2 T.
    topk: draft tree width; ReplaySSM needs a linear chain (topk 1).
    verify_mode: ``"recurrent"`` (per-draft states in ``intermediate``) or
      ``"replayssm"`` (checkpoint + ring, DESIGN section 3).
    backend: ``"xla"`` (pure jnp), ``"pallas"`` (Pallas, Triton lowering on GPU,
      interpret mode on CPU) or ``"triton"`` (jax-triton kernels, GPU only).
    ring_dtype: dtype of the d and normalised-k rings; ``None`` means the
      activation dtype. g and beta rings are always fp32.
    ssm_dtype: dtype of the committed state (checkpoint).
    dot_precision: dots of the replay verify: ``"default"`` (tensor cores: tf32
      or bf16 on GPU), ``"tf32"``, ``"bf16"``, or ``"ieee"`` (exact fp32, for
      ablations). The state update itself is always exact fp32.
    checkpoint_copy: replayssm: ``None``, or ``jnp.bfloat16`` to keep a bf16 copy of each
      checkpoint beside it (`state.ReplayCache.ssm_copy`), written by every reset and fold
      and read by verify and decode in place of the fp32 checkpoint: their checkpoint stream
      moves half the bytes, for half a checkpoint more memory. The outputs are those of
      bf16 dots of the checkpoint (``dot_precision="bf16"``: the same rounding of S0, done
      once at the fold; DESIGN section 4 allows it for outputs); the committed state, the
      fp32 checkpoint, stays bitwise that of the recurrent path. Every backend; the fold
      runs in its own kernel except in the Pallas split form's decode, whose stream folds
      the flush rows and rewrites their copy rows (`ssm.FUSE_FOLD_WITH_COPY`), and the
      triton one's with ``fold_together`` (`ssm.TRITON_FUSE_FOLD_WITH_COPY`).
    fold_together: replayssm: when a step folds any row (one marked ``is_flush``), also
      fold the step's rows with at least this many committed records, so that rows fold
      in step with each other; ``None``: only the flush rows fold (DESIGN section 3).
      A fold is exact whenever it runs. The fold replays records one after the other, so a
      step that folds waits for its longest fold: rows out of phase make many steps do that.
      H200, L=16, ``fold_together=8`` (benchmarks/NOTES.md runs 10, 11): decode with rows
      out of phase 39.0 -> 24.0 us a step at B=16, 79.0 -> 67.5 at B=64, 222.7 -> 217.9 at
      B=256; verify traffic within 2% either way (B=256 330.6 -> 336.5). Measured before
      the fold-first launch (runs 12, 13), which alone takes decode out of phase to 59.9 us
      at B=64 and 204.8 at B=256, and the fold inside the vector decode form below B=64
      (run 16), which takes B=16 to 24.4 us, and to 19.2 with ``fold_together=8``. Worth
      setting (to about ``ring_len // 2``) where decode steps dominate at small B. The
      Pallas decode from 64 rows then folds in the fold kernel, not in its stream
      (`ssm.FUSE_FOLD_BELOW`; run 25, B=256 out of phase 214.3 -> 205.3 us, B=64 64.0 ->
      61.5).
    check_values: check the values the shapes cannot show (off by default): before any
      kernel reads them, a host callback of `ssm.reset`, `verify`, `decode`, `commit` and
      `materialize` fails the call (``jax.errors.JaxRuntimeError`` carrying a ``ValueError``'s
      message) for slot ids outside ``-1..num_slots - 1`` or repeated in a batch, and for an
      ``accepted`` count outside ``0..draft_tokens``. Unchecked, a bad slot id makes a GPU
      kernel read and write outside the cache. A failed call has consumed the cache it was
      given (donated, as in every call), so start again from a new one. Each call waits for
      the host once: for notebooks and tests, not for serving.
  """

  draft_tokens: int = 4
  ring_len: int = 16
  topk: int = 1
  verify_mode: VerifyMode = "replayssm"
  backend: Backend = "xla"
  ring_dtype: jnp.dtype | None = None
  ssm_dtype: jnp.dtype = jnp.float32
  dot_precision: DotPrecision = "default"
  checkpoint_copy: jnp.dtype | None = None
  fold_together: int | None = None
  check_values: bool = False

  def __post_init__(self):
    T, L = self.draft_tokens, self.ring_len
    if not isinstance(T, int) or T < 1:
      raise ValueError(f"SpecConfig.draft_tokens={T!r} must be an integer >= 1 "
                       "(the verify window counts the root/bonus token).")
    if self.verify_mode not in _VERIFY_MODES:
      raise ValueError(f"SpecConfig.verify_mode={self.verify_mode!r} is unknown; "
                       f"use one of {_VERIFY_MODES}.")
    if self.backend not in _BACKENDS:
      raise ValueError(f"SpecConfig.backend={self.backend!r} is unknown; use one of {_BACKENDS}.")
    if self.dot_precision not in DOT_PRECISIONS:
      raise ValueError(f"SpecConfig.dot_precision={self.dot_precision!r} is unknown; "
                       f"use one of {DOT_PRECISIONS}.")
    if not isinstance(self.topk, int) or self.topk < 1:
      raise ValueError(f"SpecConfig.topk={self.topk!r} must be an integer >= 1.")
    if not isinstance(L, int) or not _is_power_of_two(L):
      fix = next_power_of_two(L) if isinstance(L, int) and L > 0 else max(2, next_power_of_two(2 * T))
      if self.verify_mode == "replayssm":
        fix = max(fix, next_power_of_two(2 * T))  # the fix must also pass the L >= 2T check
      raise ValueError(f"SpecConfig.ring_len={L!r} must be a power of two; try ring_len={fix}.")
    if not isinstance(self.check_values, bool):
      raise ValueError(f"SpecConfig.check_values={self.check_values!r} must be True or False.")
    n = self.fold_together
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= L):
      raise ValueError(f"SpecConfig.fold_together={n!r} must be None or a record count in "
                       f"1..ring_len={L} (rows with at least that many records fold along).")
    # Dtypes are normalised so that configs compare and hash by value.
    object.__setattr__(self, "ssm_dtype", jnp.dtype(self.ssm_dtype))
    if self.ring_dtype is not None:
      object.__setattr__(self, "ring_dtype", jnp.dtype(self.ring_dtype))
    if self.checkpoint_copy is not None:
      object.__setattr__(self, "checkpoint_copy", jnp.dtype(self.checkpoint_copy))
      self._check_checkpoint_copy()
    if self.verify_mode == "replayssm":
      if L < 2 * T:
        raise ValueError(
            f"SpecConfig.ring_len={L} must be >= 2 * draft_tokens = {2 * T} with replayssm "
            f"(a verify window must fit after the longest committed history); "
            f"try ring_len={next_power_of_two(2 * T)}.")
      if self.topk > 1:
        raise ValueError(
            f"SpecConfig.topk={self.topk} is not supported with verify_mode='replayssm' "
            "(its triangular solve assumes a linear draft chain); use topk=1 or "
            "verify_mode='recurrent'.")
      if self.ssm_dtype != jnp.float32:
        raise ValueError(
            f"SpecConfig.ssm_dtype={self.ssm_dtype.name} must be float32 with "
            "verify_mode='replayssm' (the exact fold is bitwise only on an fp32 "
            "checkpoint); use ssm_dtype=jnp.float32.")
    if self.backend == "triton":
      if not jax_triton_available():
        raise ValueError("SpecConfig.backend='triton' needs the jax-triton package; "
                         "`pip install replayssm-jax[triton]` or use backend='pallas'.")
      if not gpu_available():
        raise ValueError("SpecConfig.backend='triton' needs a CUDA GPU (none is visible to JAX); "
                         "use backend='pallas' (interpret mode on CPU) or 'xla'.")

  def _check_checkpoint_copy(self) -> None:
    copy = self.checkpoint_copy.name
    if self.verify_mode != "replayssm":
      raise ValueError(f"SpecConfig.checkpoint_copy={copy} needs verify_mode='replayssm' (the "
                       "recurrent verify reads and writes the state itself); use None.")
    if self.checkpoint_copy != jnp.bfloat16:
      raise ValueError(f"SpecConfig.checkpoint_copy={copy} is not supported; use None or "
                       "jnp.bfloat16.")
    if self.dot_precision not in ("default", "bf16"):
      raise ValueError(f"SpecConfig.dot_precision={self.dot_precision!r} asks for more than a "
                       f"{copy} checkpoint copy holds; use 'default' or 'bf16', or "
                       "checkpoint_copy=None.")

  @property
  def flush_on_reset(self) -> bool:
    """`is_flush` of a freshly reset slot: 2 T > L (never true once validated)."""
    return 2 * self.draft_tokens > self.ring_len

  def ring_dtype_for(self, activation_dtype) -> jnp.dtype:
    """The d / normalised-k ring dtype for activations of ``activation_dtype``."""
    return jnp.dtype(activation_dtype if self.ring_dtype is None else self.ring_dtype)
