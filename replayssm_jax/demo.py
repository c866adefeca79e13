"""``replayssm-jax demo``: the three decoding modes side by side on the embedded model.

`run_demo` loads a model (by default the embedded byte-level model trained on Python
standard-library source), generates a continuation of a few built-in Python prompts with
spec off, recurrent verify and ReplaySSM verify (`engine.Engine`, n-gram drafter), and
returns a `DemoReport`: whether the three modes emitted the same tokens (the success
criterion), the drafter's acceptance, the tokens/s of each mode, the spec scratch of each
mode for this model, and the GDN cache memory of Qwen3.5-35B-A3B at serving size
(`memory.memory_report`).

Timing: each mode first runs a short warm-up generation on an engine of the same shapes,
which compiles its jitted rounds (one prefill and one decode or verify round, one batch
bucket); the timed generation then reuses them, so its tokens/s is the steady state and
the warm-up seconds are reported apart as the compile cost.

>>> settings = DemoSettings(model="tiny-random", num_prompts=1, max_new_tokens=4)
>>> settings.backend in ("xla", "pallas")
True
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import jax
import numpy as np
from flax import nnx

from replayssm_jax import memory
from replayssm_jax.config import GDNConfig, SpecConfig, gpu_available
from replayssm_jax.engine import Engine, Metrics, NgramDrafter, load_model
from replayssm_jax.engine.loading import DEFAULT_MODEL

__all__ = ["DEMO_PROMPTS", "MODES", "DemoReport", "DemoSettings", "ModeRun", "ModelLoadError",
           "ProgressBar", "default_backend", "format_report", "report_json", "run_demo"]

MODES = ("off", "recurrent", "replayssm")
# The serving-size memory table: `replayssm-jax memory --preset qwen3.5-35b-a3b --slots 49
# --draft-tokens 4 --ring-len 16` (48 spec slots + the padding slot, SGLang's setting).
SERVING_PRESET, SERVING_SLOTS, SERVING_T, SERVING_L = "qwen3.5-35b-a3b", 49, 4, 16

# Python-source prompts (the embedded model learnt the standard library's source).
DEMO_PROMPTS: tuple[str, ...] = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    ',
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n        ",
    'class Stack:\n    """A last-in, first-out container."""\n\n    def __init__(self):\n        ',
    "    def __repr__(self):\n        return '%s(%r)' % (",
    "try:\n    import _thread\nexcept ImportError:\n    ",
    "for i, line in enumerate(lines):\n    if line.startswith('#'):\n        ",
)


class ModelLoadError(RuntimeError):
  """The demo's model could not be loaded (its message says why and what to do)."""


def default_backend() -> str:
  """``"pallas"`` on a GPU; ``"xla"`` on a CPU, where Pallas would run in slow interpret mode."""
  return "pallas" if gpu_available() else "xla"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoSettings:
  """What the demo runs; validated on construction (ValueError names the field and the fix).

  Attributes:
    model: a `engine.load_model` name or HF folder; the embedded model by default.
    num_prompts: how many of `DEMO_PROMPTS` to generate from (one batch).
    max_new_tokens: tokens per prompt.
    draft_tokens: T, the verify window including the root token.
    ring_len: L of ReplaySSM, a power of two >= 2T.
    backend: kernels of the GDN layers; None picks `default_backend`.
    temperature: 0 for greedy; sampled runs are seeded and identical across modes too.
    seed: sampling seed; prompt i uses ``seed + i`` (no effect when greedy).
  """

  model: str = DEFAULT_MODEL
  num_prompts: int = 4
  max_new_tokens: int = 128
  draft_tokens: int = 4
  ring_len: int = 16
  backend: str | None = None
  temperature: float = 0.0
  seed: int = 0

  def __post_init__(self):
    if self.backend is None:
      object.__setattr__(self, "backend", default_backend())
    for name, high in (("num_prompts", len(DEMO_PROMPTS)), ("max_new_tokens", None),
                       ("draft_tokens", None)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"demo: {name}={value!r} must be a positive integer.")
      if high is not None and value > high:
        raise ValueError(f"demo: {name}={value} is more than the {high} built-in prompts.")
    if self.draft_tokens < 2:
      raise ValueError(f"demo: draft_tokens={self.draft_tokens} leaves no draft token; use T >= 2.")
    if not (np.isfinite(self.temperature) and self.temperature >= 0):
      raise ValueError(f"demo: temperature={self.temperature!r} must be >= 0 (0 = greedy).")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**31:
      raise ValueError(f"demo: seed={self.seed!r} must be an integer in [0, 2**31).")
    # SpecConfig checks L (power of two, >= 2T) and the backend, with its own messages.
    SpecConfig(draft_tokens=self.draft_tokens, ring_len=self.ring_len, verify_mode="replayssm",
               backend=self.backend)

  @property
  def prompts(self) -> tuple[str, ...]:
    return DEMO_PROMPTS[:self.num_prompts]


@dataclasses.dataclass(frozen=True)
class ModeRun:
  """One mode's generation.

  Attributes:
    mode: ``"off"``, ``"recurrent"`` or ``"replayssm"``.
    outputs: generated token ids per prompt.
    warmup_s: seconds of the warm-up run (the jit compiles, plus a few tokens).
    metrics: the timed run's `engine.Metrics` (compiled already: steady state).
  """

  mode: str
  outputs: list[list[int]]
  warmup_s: float
  metrics: Metrics


@dataclasses.dataclass(frozen=True)
class DemoReport:
  """Everything the demo measured; `format_report` and `report_json` render it.

  Attributes:
    settings: what ran.
    model_info: name, parameters and layer counts of the model.
    device: the JAX device kind the demo ran on.
    prompts: the prompts.
    texts: the decoded continuation of each prompt (ReplaySSM run).
    runs: one `ModeRun` per mode, in `MODES` order.
    serving: the GDN cache memory of `SERVING_PRESET` at serving size.
    total_s: wall seconds of the whole demo (model load, compiles, runs).
  """

  settings: DemoSettings
  model_info: dict[str, Any]
  device: str
  prompts: tuple[str, ...]
  texts: list[str]
  runs: dict[str, ModeRun]
  serving: memory.MemoryReport
  total_s: float

  @property
  def identical(self) -> bool:
    """True when every mode emitted the same tokens for every prompt."""
    return self.first_difference() is None

  def first_difference(self) -> dict[str, Any] | None:
    """The first prompt and token index where the modes disagree, else None."""
    outs = [self.runs[m].outputs for m in MODES]
    for i, per_mode in enumerate(zip(*outs)):
      if all(o == per_mode[0] for o in per_mode):
        continue
      j = next((j for j in range(max(map(len, per_mode)))
                if len({o[j] if j < len(o) else None for o in per_mode}) > 1))
      return {"prompt": i, "token": j,
              **{m: (o[j] if j < len(o) else None) for m, o in zip(MODES, per_mode)}}
    return None

  @property
  def spec_scratch_bytes(self) -> dict[str, int]:
    """Spec scratch of each mode for this model at the demo's slots, T and L."""
    return dict(self.runs["replayssm"].metrics.spec_scratch_bytes)


# ----------------------------------------------------------------------------- progress


class ProgressBar:
  """A one-line progress bar on a terminal; prints nothing when the stream is no TTY.

  Args:
    total: units of work (here: tokens of the timed runs).
    stream: where to draw (default ``sys.stderr``).
    enabled: force on or off; None: on when ``stream`` is a TTY.
    width: characters of the bar.
  """

  def __init__(self, total: int, *, stream: TextIO | None = None, enabled: bool | None = None,
               width: int = 28):
    self.stream = sys.stderr if stream is None else stream
    self.enabled = (bool(getattr(self.stream, "isatty", lambda: False)())
                    if enabled is None else enabled)
    self.total, self.width = max(1, total), width
    self.count, self.description = 0, ""
    self._start = time.perf_counter()
    self._drawn = 0.0

  def set_description(self, text: str) -> None:
    self.description = text
    self._draw(force=True)

  def update(self, n: int) -> None:
    self.count = min(self.total, self.count + n)
    self._draw(force=self.count == self.total)

  def _draw(self, force: bool = False) -> None:
    now = time.perf_counter()
    if not self.enabled or (not force and now - self._drawn < 0.1):
      return
    self._drawn = now
    filled = self.width * self.count // self.total
    bar = "#" * filled + "." * (self.width - filled)
    self.stream.write(f"\r{self.description:<22} [{bar}] {self.count}/{self.total} tokens "
                      f"{now - self._start:6.1f} s\x1b[K")
    self.stream.flush()

  def close(self) -> None:
    """Erase the bar (the report follows on a clean line)."""
    if self.enabled:
      self.stream.write("\r\x1b[K")
      self.stream.flush()


# ----------------------------------------------------------------------------- running


def _load(name: str):
  """``(model, tokenizer, stops)``; `ModelLoadError` with a hint when it fails."""
  try:
    return load_model(name)
  except (ValueError, OSError) as e:
    hint = ""
    if name == DEFAULT_MODEL and isinstance(e, OSError):  # the embedded weights are missing
      hint = " Meanwhile the demo runs on a random model: replayssm-jax demo --model tiny-random"
    raise ModelLoadError(f"could not load model {name!r}: {e}{hint}") from e


def _engine(model, mode: str, settings: DemoSettings, max_len: int) -> Engine:
  """An engine with one slot per prompt and a single batch bucket (one compile per round)."""
  n = settings.num_prompts
  return Engine(model, spec_mode=mode, drafter=None if mode == "off" else NgramDrafter(),
                num_slots=n, max_len=max_len, draft_tokens=settings.draft_tokens,
                ring_len=settings.ring_len, batch_buckets=(n,), backend=settings.backend)


def _generate(engine: Engine, encoded: Sequence[list[int]], settings: DemoSettings,
              stops: Sequence[int], max_new_tokens: int,
              progress: ProgressBar | None) -> list[list[int]]:
  """Run every prompt to completion on ``engine``; outputs in prompt order."""
  ids = [engine.add_request(tokens, max_new_tokens=max_new_tokens, stop_tokens=stops,
                            temperature=settings.temperature, seed=settings.seed + i)
         for i, tokens in enumerate(encoded)]
  while engine.has_work:
    events = engine.step()
    if progress is not None:
      progress.update(sum(map(len, events.values())))
  return [engine.request(i).output for i in ids]


def _run_mode(model, mode: str, encoded: Sequence[list[int]], stops: Sequence[int],
              settings: DemoSettings, max_len: int, progress: ProgressBar) -> ModeRun:
  """Warm up (compile) then time one mode."""
  progress.set_description(f"{mode}: compiling")
  start = time.perf_counter()
  _generate(_engine(model, mode, settings, max_len), encoded, settings, stops,
            min(2, settings.max_new_tokens), None)  # a prefill and one decode/verify round
  warmup_s = time.perf_counter() - start
  progress.set_description(f"{mode}: generating")
  engine = _engine(model, mode, settings, max_len)
  before = progress.count
  outputs = _generate(engine, encoded, settings, stops, settings.max_new_tokens, progress)
  # A request that stopped early leaves its share of the bar unfilled: fill it.
  progress.update(before + len(encoded) * settings.max_new_tokens - progress.count)
  return ModeRun(mode=mode, outputs=outputs, warmup_s=warmup_s, metrics=engine.metrics)


def _model_info(name: str, model) -> dict[str, Any]:
  c = model.config
  params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return {"name": name, "params": params, "hidden_size": c.hidden_size,
          "num_layers": c.num_layers, "num_gdn_layers": c.num_gdn_layers,
          "num_attention_layers": c.num_attention_layers, "vocab_size": c.vocab_size,
          "dtype": model.dtype.name}


def run_demo(settings: DemoSettings, *, progress: ProgressBar | None = None) -> DemoReport:
  """Generate from the built-in prompts in every mode and measure; see the module docstring.

  Args:
    settings: what to run.
    progress: a bar over the timed runs' tokens; None draws one on a terminal's stderr.

  Raises:
    ModelLoadError: the model cannot be loaded.
    ValueError: a prompt the model's tokenizer cannot encode.
  """
  start = time.perf_counter()
  model, tokenizer, stops = _load(settings.model)
  encoded = [tokenizer.encode(p) for p in settings.prompts]
  max_len = max(map(len, encoded)) + settings.max_new_tokens + settings.draft_tokens
  if progress is None:
    progress = ProgressBar(len(MODES) * len(encoded) * settings.max_new_tokens)
  try:
    runs = {m: _run_mode(model, m, encoded, stops, settings, max_len, progress) for m in MODES}
  finally:
    progress.close()
  serving = memory.memory_report(GDNConfig.preset(SERVING_PRESET), num_slots=SERVING_SLOTS,
                                 draft_tokens=SERVING_T, ring_len=SERVING_L)
  return DemoReport(settings=settings, model_info=_model_info(settings.model, model),
                    device=jax.devices()[0].device_kind, prompts=settings.prompts,
                    texts=[tokenizer.decode(o) for o in runs["replayssm"].outputs], runs=runs,
                    serving=serving, total_s=time.perf_counter() - start)


# ----------------------------------------------------------------------------- reports


def _mode_json(run: ModeRun) -> dict[str, Any]:
  m = run.metrics
  return {"generated_tokens": m.generated_tokens, "steps": m.steps, "warmup_s": run.warmup_s,
          "steady_s": m.wall_s, "tokens_per_s": m.tokens_per_s,
          "acceptance_rate": m.acceptance_rate, "mean_accepted_length": m.mean_accepted_length,
          "spec_scratch_bytes": m.spec_scratch_bytes[run.mode], "cache_bytes": m.cache_bytes}


def report_json(report: DemoReport) -> dict[str, Any]:
  """`report` as a JSON-ready dict (``identical`` is the success criterion)."""
  s, spec = report.settings, report.runs["replayssm"].metrics
  return {
      "identical": report.identical,
      "first_difference": report.first_difference(),
      "model": report.model_info,
      "device": report.device,
      "backend": s.backend,
      "num_prompts": s.num_prompts,
      "max_new_tokens": s.max_new_tokens,
      "draft_tokens": s.draft_tokens,
      "ring_len": s.ring_len,
      "temperature": s.temperature,
      "seed": s.seed,
      "drafter": "ngram",
      "acceptance_rate": spec.acceptance_rate,
      "mean_accepted_length": spec.mean_accepted_length,
      "spec_scratch_bytes": report.spec_scratch_bytes,
      "modes": {m: _mode_json(run) for m, run in report.runs.items()},
      "serving_memory": memory.to_json(report.serving),
      "outputs": [{"prompt": p, "text": t, "tokens": o} for p, t, o in
                  zip(report.prompts, report.texts, report.runs["replayssm"].outputs)],
      "total_s": report.total_s,
  }


def _printable(text: str) -> str:
  """``text`` with control characters escaped (a random model emits any byte)."""
  return "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in text)


def _mode_table(report: DemoReport) -> list[str]:
  lines = [f"{'mode':<10} {'compile s':>9} {'run s':>7} {'tokens/s':>9} {'steps':>6} "
           f"{'accepted':>8} {'spec scratch':>13}"]
  for mode, run in report.runs.items():
    m = run.metrics
    accepted = "-" if mode == "off" else f"{m.acceptance_rate:.2f}"
    lines.append(f"{mode:<10} {run.warmup_s:>9.1f} {m.wall_s:>7.2f} {m.tokens_per_s:>9.1f} "
                 f"{m.steps:>6} {accepted:>8} "
                 f"{memory.format_bytes(m.spec_scratch_bytes[mode]):>13}")
  return lines


def format_report(report: DemoReport) -> str:
  """The human-readable report: verdict, speed, memory, and one generated sample."""
  s, info, spec = report.settings, report.model_info, report.runs["replayssm"].metrics
  diff = report.first_difference()
  verdict = ("yes" if diff is None else
             f"NO: prompt {diff['prompt']} differs at token {diff['token']} "
             f"(off {diff['off']}, recurrent {diff['recurrent']}, replayssm {diff['replayssm']})")
  scratch = report.spec_scratch_bytes
  lines = [
      f"replayssm-jax demo: model {info['name']} ({info['params'] / 1e6:.1f}M params, "
      f"{info['num_gdn_layers']} GDN + {info['num_attention_layers']} attention layers), "
      f"{s.num_prompts} prompts x {s.max_new_tokens} new tokens, "
      f"{'greedy' if s.temperature == 0 else f'temperature {s.temperature:g}'}, "
      f"T={s.draft_tokens}, L={s.ring_len}, backend {s.backend} on {report.device}",
      "",
      f"identical outputs (off / recurrent / replayssm): {verdict}",
      f"n-gram drafter: acceptance rate {spec.acceptance_rate:.2f}, mean accepted length "
      f"{spec.mean_accepted_length:.2f} tokens per verify (of T={s.draft_tokens})",
      f"spec scratch at {s.num_prompts} slots: recurrent "
      f"{memory.format_bytes(scratch['recurrent'])}, replayssm "
      f"{memory.format_bytes(scratch['replayssm'])} "
      f"({scratch['recurrent'] / scratch['replayssm']:.1f}x smaller)",
      "",
      *_mode_table(report),
      "(compile s: the warm-up run that compiles the jitted rounds; run s and tokens/s: the "
      "timed run after it)",
      "",
      f"Serving size: {SERVING_PRESET} at {SERVING_SLOTS} slots "
      f"(replayssm-jax memory --preset {SERVING_PRESET} --slots {SERVING_SLOTS} "
      f"--draft-tokens {SERVING_T} --ring-len {SERVING_L})",
      memory.format_table(report.serving),
      "",
      "Sample (prompt 0, replayssm):",
      _printable(report.prompts[0] + report.texts[0]),
      "",
      f"total {report.total_s:.1f} s",
  ]
  return "\n".join(lines)
