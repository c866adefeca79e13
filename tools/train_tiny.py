"""Train the embedded default model (``tiny-stdlib``) on the Python standard library's source.

The model is a small dense `HybridLM` (GDN + gated attention, Qwen3.5 layout) over the
258-token byte vocabulary (`replayssm_jax.engine.tokenizer`). Its data is on every
machine that runs Python: the ``*.py`` files under ``sysconfig.get_paths()["stdlib"]``,
test suites included, minus installed packages, generated tables and build data
(`EXCLUDED_DIRS`, `EXCLUDED_PREFIXES`). Files are sorted by relative path and concatenated
as bytes, each followed by ``EOS``; every file whose relative path hashes to 0 mod
`HELDOUT_EVERY` is held out (`is_heldout`), so the split does not depend on which other
files exist.

Training: AdamW (betas 0.9 / 0.95, weight decay on matrices only, gradient clip 1.0),
linear warmup then cosine decay to 10% of the peak rate, batches of random windows drawn
by a numpy RNG seeded with ``--seed`` (which also seeds the parameters), fp32 parameters
and activations. ``--time-budget`` bounds the whole run (data, compiles, training, the
held-out evaluation and the writes): after a few timed steps the run shortens its
schedule to fit, and it stops at the budget in any case, still writing every file.

Outputs in ``--out``: ``config.json`` and ``model.safetensors`` (`hf.save_hf_model`; the
weights in bf16 unless ``--save-dtype float32``; `hf.load_hf_model` and ``load_model``
read them), ``train_log.json`` (steps, losses, held-out bits per byte, timings, device,
seed, Python version, data summary).

Usage (from the repository root)::

    PYTHONPATH=$PWD python tools/train_tiny.py --preset small --out runs/tiny_stdlib \\
        --time-budget 420
    PYTHONPATH=$PWD python tools/train_tiny.py --preset smoke --out /tmp/tiny_smoke  # CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import sysconfig
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax  # a dependency of flax
from flax import nnx

from replayssm_jax import hf
from replayssm_jax.config import GDNConfig
from replayssm_jax.engine.tokenizer import BOS, EOS, VOCAB_SIZE
from replayssm_jax.models import HybridConfig, HybridLM

# ----------------------------------------------------------------------------- corpus

# Directories skipped at any depth: installed packages (not the stdlib, and different on
# every machine), generated codec tables and pydoc's topic dump (large literals, not code).
# The test suites stay: they are ordinary Python, and they more than double the data
# (8.5 MB without them on 3.12), which an 8 M-parameter model would see ~8 times over in
# one training run otherwise.
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "encodings", "pydoc_data",
                           "__pycache__"})
# Names (file or directory) skipped by prefix: platform-specific build data.
EXCLUDED_PREFIXES = ("config-", "_sysconfigdata")
HELDOUT_EVERY = 20
SEPARATOR = EOS  # follows every file, so the model learns where a file ends


def is_heldout(relpath: str) -> bool:
  """Whether the file at ``relpath`` (relative, ``/``-separated) is in the held-out split."""
  digest = hashlib.sha256(relpath.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") % HELDOUT_EVERY == 0


def stdlib_root() -> str:
  """The standard library folder of the running Python."""
  return sysconfig.get_paths()["stdlib"]


def list_sources(root: str) -> list[str]:
  """Relative ``/``-separated paths of the ``*.py`` files under ``root``, sorted."""
  out = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith(EXCLUDED_PREFIXES)]
    rel = os.path.relpath(folder, root)
    for name in files:
      if name.endswith(".py") and not name.startswith(EXCLUDED_PREFIXES):
        out.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
  return sorted(out)


def encode_files(root: str, relpaths: Sequence[str]) -> np.ndarray:
  """``uint16[N]``: the bytes of each file followed by `SEPARATOR`, in the given order."""
  parts = []
  for rel in relpaths:
    with open(os.path.join(root, rel), "rb") as f:
      parts.append(np.frombuffer(f.read(), np.uint8).astype(np.uint16))
    parts.append(np.array([SEPARATOR], np.uint16))
  return np.concatenate(parts) if parts else np.zeros((0,), np.uint16)


def _source_label(root: str) -> str:
  """Where the corpus came from, without this machine's paths (logs and model cards ship)."""
  if os.path.realpath(root) == os.path.realpath(sysconfig.get_paths()["stdlib"]):
    return "stdlib"
  return os.path.basename(os.path.normpath(root))


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Token streams of the two splits and where they came from."""

  root: str
  train_files: tuple[str, ...]
  heldout_files: tuple[str, ...]
  train: np.ndarray  # uint16[N_train]: bytes 0..255 and SEPARATOR
  heldout: np.ndarray  # uint16[N_heldout]

  def summary(self) -> dict[str, Any]:
    """File and byte counts, exclusions and a SHA-256 of both streams (JSON-ready)."""
    digest = hashlib.sha256()
    for stream in (self.train, self.heldout):
      digest.update(stream.astype("<u2").tobytes())
    return {
        "source": _source_label(self.root), "python": platform.python_version(),
        "files": len(self.train_files) + len(self.heldout_files),
        "bytes": int(self.train.size + self.heldout.size) - len(self.train_files)
                 - len(self.heldout_files),
        "train_files": len(self.train_files), "train_tokens": int(self.train.size),
        "heldout_files": len(self.heldout_files), "heldout_tokens": int(self.heldout.size),
        "heldout_rule": f"sha256(relative path) % {HELDOUT_EVERY} == 0",
        "excluded_dirs": sorted(EXCLUDED_DIRS), "excluded_prefixes": list(EXCLUDED_PREFIXES),
        "separator_token": SEPARATOR, "sha256": digest.hexdigest(),
    }


def build_corpus(root: str | None = None) -> Corpus:
  """The corpus of the ``*.py`` files under ``root`` (default: this Python's stdlib).

  Raises:
    ValueError: no source file under ``root``, or an empty split.
  """
  root = stdlib_root() if root is None else root
  files = list_sources(root)
  train = tuple(f for f in files if not is_heldout(f))
  heldout = tuple(f for f in files if is_heldout(f))
  if not train or not heldout:
    raise ValueError(f"build_corpus: {root!r} has {len(train)} training and {len(heldout)} "
                     "held-out *.py files; both splits need at least one.")
  return Corpus(root=root, train_files=train, heldout_files=heldout,
                train=encode_files(root, train), heldout=encode_files(root, heldout))


def random_windows(stream: np.ndarray, rng: np.random.Generator, batch: int,
                   length: int) -> np.ndarray:
  """``int32[batch, length]`` windows at uniform random offsets of ``stream``."""
  starts = rng.integers(0, stream.size - length + 1, size=batch)
  return stream[starts[:, None] + np.arange(length)[None, :]].astype(np.int32)


def eval_windows(stream: np.ndarray, count: int, length: int) -> np.ndarray:
  """``int32[count, length]`` evenly spaced windows of ``stream`` (deterministic)."""
  if stream.size < length:
    raise ValueError(f"eval_windows: the stream has {stream.size} tokens, fewer than one "
                     f"window of {length}.")
  starts = np.linspace(0, stream.size - length, count).astype(np.int64)
  return stream[starts[:, None] + np.arange(length)[None, :]].astype(np.int32)


# ----------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preset:
  """A model geometry and the training defaults that go with it."""

  model: HybridConfig
  steps: int
  batch: int
  seq_len: int
  lr: float
  warmup: int
  eval_windows: int  # held-out windows of seq_len + 1 tokens for the bits-per-byte figure
  log_every: int


def _hybrid(*, hidden: int, layers: int, interval: int, intermediate: int, gdn_heads: tuple,
            gdn_dims: tuple, attn_heads: tuple, head_dim: int, seq_len: int) -> HybridConfig:
  n_attn = layers // interval
  gdn = GDNConfig(num_k_heads=gdn_heads[0], num_v_heads=gdn_heads[1], head_k_dim=gdn_dims[0],
                  head_v_dim=gdn_dims[1], conv_kernel=4, hidden_size=hidden, num_layers=layers,
                  num_gdn_layers=layers - n_attn, layout="qwen3_5")
  return HybridConfig(vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=intermediate,
                      num_layers=layers, full_attention_interval=interval,
                      num_attention_heads=attn_heads[0], num_key_value_heads=attn_heads[1],
                      head_dim=head_dim, partial_rotary_factor=0.25,
                      max_position_embeddings=seq_len, tie_word_embeddings=True, gdn=gdn)


PRESETS: dict[str, Preset] = {
    # 8.1 M parameters: 6 GDN (H 4, HV 8, K = V = 64) + 2 attention layers (4 heads of 64,
    # 2 KV heads), D 256, MLP 704, tied embeddings; 16 K tokens per step (~63 MFLOP per
    # token for forward + backward, ~1 TFLOP per step). 6000 steps are ~3.6 passes over the
    # 27.5 M training tokens of CPython 3.12; --time-budget trims them to what fits.
    "small": Preset(
        model=_hybrid(hidden=256, layers=8, interval=4, intermediate=704, gdn_heads=(4, 8),
                      gdn_dims=(64, 64), attn_heads=(4, 2), head_dim=64, seq_len=1024),
        steps=6000, batch=16, seq_len=1024, lr=2e-3, warmup=200, eval_windows=128,
        log_every=50),
    # A CPU check of the whole pipeline (tests/test_train_tiny.py): 3 GDN + 1 attention.
    "smoke": Preset(
        model=_hybrid(hidden=64, layers=4, interval=4, intermediate=128, gdn_heads=(2, 4),
                      gdn_dims=(16, 16), attn_heads=(4, 2), head_dim=16, seq_len=64),
        steps=20, batch=8, seq_len=64, lr=3e-3, warmup=2, eval_windows=8, log_every=5),
}


def param_count(model: nnx.Module) -> int:
  """Number of parameters of ``model``."""
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


# ----------------------------------------------------------------------------- training

_NO_DECAY = ("norm", "input_layernorm", "post_attention_layernorm", "q_norm", "k_norm",
             "A_log", "dt_bias", "conv1d")


def decay_mask(params) -> Any:
  """True for the leaves AdamW decays: projections and embeddings, not norms or gates."""
  def decays(path, _):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    return not any(name in _NO_DECAY for name in names)
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(params, weight_decay: float = 0.1,
                   clip: float = 1.0) -> optax.GradientTransformation:
  """AdamW without its learning rate: the step multiplies the update by ``-lr``."""
  return optax.chain(optax.clip_by_global_norm(clip), optax.scale_by_adam(b1=0.9, b2=0.95),
                     optax.add_decayed_weights(weight_decay, mask=decay_mask(params)))


def learning_rate(step: int, total: int, peak: float, warmup: int,
                  final_fraction: float = 0.1) -> float:
  """Linear warmup over ``warmup`` steps, then cosine from ``peak`` to ``final_fraction * peak``."""
  if step < warmup:
    return peak * (step + 1) / warmup
  progress = min(1.0, (step - warmup) / max(1, total - warmup))
  return peak * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def sequence_loss(model: HybridLM, windows: jax.Array) -> jax.Array:
  """Mean next-token cross entropy (nats) of ``windows int32[B, T + 1]``."""
  logits = model.forward(windows[:, :-1]).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]).mean()


def make_train_step(graphdef, optimizer: optax.GradientTransformation) -> Callable:
  """``(params, opt_state, windows, lr) -> (params, opt_state, loss)``, jitted, donating."""

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, windows, lr):
    loss, grads = jax.value_and_grad(
        lambda p: sequence_loss(nnx.merge(graphdef, p), windows))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p - lr * u, params, updates)
    return params, opt_state, loss

  return train_step


@functools.partial(jax.jit, static_argnames="graphdef")
def _eval_loss(graphdef, params, windows):
  return sequence_loss(nnx.merge(graphdef, params), windows)


def heldout_bits_per_byte(model: HybridLM, windows: np.ndarray, batch: int) -> float:
  """Mean cross entropy in bits per token (= per byte) over ``windows [N, T + 1]``.

  Every window contributes ``T`` predictions, scored in batches of ``batch`` windows (one
  compiled shape), so ``N`` must be a multiple of ``batch``.
  """
  if windows.shape[0] % batch:
    raise ValueError(f"heldout_bits_per_byte: {windows.shape[0]} windows are not a multiple "
                     f"of batch={batch}.")
  graphdef, params = nnx.split(model)
  losses = [_eval_loss(graphdef, params, jnp.asarray(windows[i:i + batch]))
            for i in range(0, windows.shape[0], batch)]
  return float(np.mean(jax.device_get(losses))) / math.log(2)


def device_name() -> str:
  """The platform and kind of the first JAX device, e.g. ``gpu: NVIDIA H200``."""
  d = jax.devices()[0]
  return f"{d.platform}: {getattr(d, 'device_kind', '?')}"


@dataclasses.dataclass
class Budget:
  """The wall-clock limit of a run: the schedule shrinks to fit it, the loop stops at it.

  Attributes:
    start: ``time.perf_counter()`` when the run began.
    seconds: the limit for the whole run; None for none.
    reserve: seconds kept for the final evaluation and the writes.
  """

  start: float
  seconds: float | None
  reserve: float = 0.0

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def exhausted(self) -> bool:
    """Whether training must stop now to leave ``reserve`` seconds."""
    return self.seconds is not None and self.elapsed() > self.seconds - self.reserve

  def fit(self, step: int, total: int, step_s: float) -> int:
    """The planned total steps, lowered so that the rest at ``step_s`` each fits (>= step)."""
    if self.seconds is None:
      return total
    left = self.seconds - self.reserve - self.elapsed()
    return min(total, max(step, step + int(left / step_s)))


@dataclasses.dataclass
class Progress:
  """What the training loop reports: losses, the schedule it ran, its timings."""

  steps: int = 0
  scheduled_steps: int = 0
  stop_reason: str = "steps"
  losses: list = dataclasses.field(default_factory=list)  # device scalars, one per step
  history: list = dataclasses.field(default_factory=list)  # logged means
  compile_s: float = 0.0
  train_s: float = 0.0

  def mean_loss(self, last: int) -> float:
    """Mean loss (nats) of the last ``last`` steps."""
    return float(np.mean(jax.device_get(self.losses[-last:])))


def train_loop(model: HybridLM, corpus: Corpus, *, steps: int, batch: int, seq_len: int, lr: float,
               warmup: int, seed: int, budget: Budget, log_every: int,
               print_fn: Callable[[str], None]) -> tuple[HybridLM, Progress]:
  """Run the optimizer on ``model`` (random windows of ``corpus.train``); returns the result.

  After the first step (the compile) and a few more, the step time is measured and the
  schedule shortened to fit ``budget``; the loop also stops when the budget runs out.
  """
  graphdef, params = nnx.split(model)
  optimizer = make_optimizer(params)
  opt_state = optimizer.init(params)
  step_fn = make_train_step(graphdef, optimizer)
  rng = np.random.default_rng(seed)
  run = Progress(scheduled_steps=steps)
  calibrate_at = min(steps, 1 + max(5, log_every // 2))
  t_start = t_calib = time.perf_counter()
  while run.steps < run.scheduled_steps:
    lr_now = learning_rate(run.steps, run.scheduled_steps, lr, warmup)
    windows = jnp.asarray(random_windows(corpus.train, rng, batch, seq_len + 1))
    params, opt_state, loss = step_fn(params, opt_state, windows, jnp.float32(lr_now))
    run.losses.append(loss)
    run.steps += 1
    if run.steps == 1:
      loss.block_until_ready()
      run.compile_s = time.perf_counter() - t_start
      t_calib = time.perf_counter()
    elif run.steps == calibrate_at:
      loss.block_until_ready()
      step_s = (time.perf_counter() - t_calib) / (run.steps - 1)
      fit = budget.fit(run.steps, run.scheduled_steps, step_s)
      if fit < run.scheduled_steps:
        print_fn(f"time budget: {step_s * 1e3:.0f} ms/step; {run.scheduled_steps} steps -> {fit}")
        run.scheduled_steps = fit
    if run.steps % log_every == 0 or run.steps == run.scheduled_steps:
      mean = run.mean_loss(log_every)
      run.history.append({"step": run.steps, "loss": mean, "lr": lr_now,
                          "elapsed_s": budget.elapsed()})
      rate = (run.steps - 1) * batch * seq_len / max(time.perf_counter() - t_calib, 1e-9)
      print_fn(f"step {run.steps:5d}/{run.scheduled_steps}  loss {mean:.4f} "
               f"({mean / math.log(2):.3f} bits/byte)  lr {lr_now:.2e}  "
               f"{rate / 1e3:.1f} K tok/s  {budget.elapsed():.0f} s")
    if run.steps < run.scheduled_steps and budget.exhausted():
      run.stop_reason = "time budget"
      print_fn(f"time budget reached at step {run.steps} ({budget.elapsed():.0f} s); stopping")
      break
  jax.block_until_ready(params)
  run.train_s = time.perf_counter() - t_start
  return nnx.merge(graphdef, params), run


def train(preset: Preset, corpus: Corpus, out: str, *, steps: int, batch: int, seq_len: int,
          lr: float, seed: int, time_budget: float | None = None, log_every: int | None = None,
          start_time: float | None = None, save_dtype=jnp.bfloat16,
          print_fn: Callable[[str], None] = print) -> tuple[HybridLM, dict[str, Any]]:
  """Train a fresh model of ``preset.model`` on ``corpus``; write the model and the log.

  Args:
    preset: the model geometry and defaults (warmup, evaluation windows, log interval).
    corpus: the data (`build_corpus`).
    out: the output folder (created).
    steps: planned optimizer steps (fewer when the time budget says so).
    batch, seq_len: windows per step and tokens each window predicts.
    lr: peak learning rate.
    seed: seeds the parameters and the window sampler.
    time_budget: seconds for the whole run from ``start_time``; None for no limit.
    log_every: steps between progress lines (default: the preset's).
    start_time: ``time.perf_counter()`` at the start of the run (default: now).
    save_dtype: dtype of the written parameters (`save_model`).
    print_fn: where the progress lines go.

  Returns:
    ``(model, log)``: the trained model (fp32) and the training log (``out/train_log.json``).
  """
  budget = Budget(start=time.perf_counter() if start_time is None else start_time,
                  seconds=time_budget)
  log_every = log_every or preset.log_every
  config = dataclasses.replace(preset.model, max_position_embeddings=seq_len)
  model = HybridLM(config, rngs=nnx.Rngs(seed))
  n_params = param_count(model)
  print_fn(f"model: {n_params / 1e6:.2f} M parameters ({config.num_gdn_layers} GDN + "
           f"{config.num_attention_layers} attention layers, D {config.hidden_size}); "
           f"device {device_name()}")
  n_windows = max(1, preset.eval_windows // batch) * batch
  windows = eval_windows(corpus.heldout, n_windows, seq_len + 1)
  t0 = time.perf_counter()
  initial_bpb = heldout_bits_per_byte(model, windows, batch)  # also compiles the evaluation
  eval_s = time.perf_counter() - t0
  print_fn(f"held-out at init: {initial_bpb:.3f} bits/byte ({eval_s:.1f} s with compile)")
  budget.reserve = 10.0 + 2 * eval_s
  warmup = min(preset.warmup, max(1, steps // 10))
  model, run = train_loop(model, corpus, steps=steps, batch=batch, seq_len=seq_len, lr=lr,
                          warmup=warmup, seed=seed, budget=budget, log_every=log_every,
                          print_fn=print_fn)
  final_loss = run.mean_loss(log_every)
  final_bpb = heldout_bits_per_byte(model, windows, batch)
  saved_bpb = heldout_bits_per_byte(round_params(model, save_dtype), windows, batch)
  print_fn(f"held-out: {final_bpb:.3f} bits/byte after {run.steps} steps "
           f"({saved_bpb:.3f} with {jnp.dtype(save_dtype).name} weights)")
  save_model(model, out, save_dtype)
  log = {
      "steps": run.steps, "planned_steps": steps, "scheduled_steps": run.scheduled_steps,
      "stop_reason": run.stop_reason, "batch": batch, "seq_len": seq_len,
      "tokens_seen": run.steps * batch * seq_len, "lr": lr, "warmup": warmup, "seed": seed,
      "parameters": n_params, "final_train_loss_nats": final_loss,
      "final_train_bits_per_byte": final_loss / math.log(2),
      "heldout_bits_per_byte": final_bpb, "initial_heldout_bits_per_byte": initial_bpb,
      "saved_dtype": jnp.dtype(save_dtype).name, "saved_heldout_bits_per_byte": saved_bpb,
      "heldout_eval_tokens": n_windows * seq_len, "wall_s": budget.elapsed(),
      "train_s": run.train_s, "compile_s": run.compile_s,
      "step_ms": 1e3 * (run.train_s - run.compile_s) / max(run.steps - 1, 1),
      "device": device_name(), "jax": jax.__version__, "python": platform.python_version(),
      "data": corpus.summary(), "history": run.history,
  }
  with open(os.path.join(out, "train_log.json"), "w") as f:
    json.dump(log, f, indent=2)
  return model, log


def with_param_dtype(model: HybridLM, dtype) -> HybridLM:
  """A copy of ``model`` with its parameters stored in ``dtype`` (rounded; activations as is)."""
  abstract = nnx.eval_shape(lambda: HybridLM(model.config, rngs=nnx.Rngs(0), dtype=model.dtype,
                                             param_dtype=dtype))
  state = jax.tree.map(lambda x: x.astype(dtype), nnx.state(model))
  return nnx.merge(nnx.graphdef(abstract), state)


def round_params(model: HybridLM, dtype) -> HybridLM:
  """``model`` with every parameter rounded through ``dtype`` (what `save_model` writes and
  loading casts back), in the original parameter dtype (the same graphdef: no recompile)."""
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.tree.map(lambda x: x.astype(dtype).astype(x.dtype), state))


def save_model(model: HybridLM, out: str, dtype=jnp.bfloat16) -> None:
  """`hf.save_hf_model` of the parameters in ``dtype``, plus the byte tokenizer's special ids
  in ``config.json``.

  bf16 halves the file (16 MB for the small preset) at a cost of about 0.01 bits/byte; the
  training log records the held-out loss of the saved weights as well.
  """
  model = with_param_dtype(model, dtype)
  hf.save_hf_model(model, model.config, out)
  path = os.path.join(out, "config.json")
  with open(path) as f:
    config = json.load(f)
  config.update(bos_token_id=BOS, eos_token_id=EOS)
  with open(path, "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--preset", choices=sorted(PRESETS), default="small",
                 help="model geometry and defaults (default: small)")
  p.add_argument("--out", required=True, help="output folder")
  p.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
  p.add_argument("--batch", type=int, help="windows per step (default: the preset's)")
  p.add_argument("--seq-len", type=int, help="tokens per window (default: the preset's)")
  p.add_argument("--lr", type=float, help="peak learning rate (default: the preset's)")
  p.add_argument("--seed", type=int, default=0, help="parameter and data seed (default: 0)")
  p.add_argument("--time-budget", type=float,
                 help="seconds for the whole run, writes included; the schedule shrinks to fit")
  p.add_argument("--log-every", type=int, help="steps between progress lines")
  p.add_argument("--source", help="folder of *.py files (default: this Python's stdlib)")
  p.add_argument("--save-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                 help="dtype of the written weights (default bfloat16: half the size)")
  args = p.parse_args(argv)
  for name in ("steps", "batch", "seq_len", "log_every"):
    value = getattr(args, name)
    if value is not None and value < 1:
      p.error(f"--{name.replace('_', '-')} must be a positive integer; given {value}.")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Run the command line; returns the training log."""
  start = time.perf_counter()
  args = parse_args(argv)
  preset = PRESETS[args.preset]
  corpus = build_corpus(args.source)
  s = corpus.summary()
  print(f"data: {s['files']} files, {s['bytes']} bytes from {s['source']} (Python "
        f"{s['python']}); train {s['train_files']} files / {s['train_tokens']} tokens, held out "
        f"{s['heldout_files']} / {s['heldout_tokens']}", flush=True)
  _, log = train(preset, corpus, args.out, steps=args.steps or preset.steps,
              batch=args.batch or preset.batch, seq_len=args.seq_len or preset.seq_len,
              lr=args.lr or preset.lr, seed=args.seed, time_budget=args.time_budget,
              log_every=args.log_every, start_time=start,
              save_dtype=jnp.dtype(args.save_dtype),
              print_fn=lambda line: print(line, flush=True))
  print(f"wrote {args.out}: config.json, model.safetensors, train_log.json "
        f"({log['wall_s']:.0f} s)", flush=True)
  return log


if __name__ == "__main__":
  main()
