"""`Engine`: speculative generation over a fixed pool of slots (continuous batching).

A request occupies one slot of the target model's cache from its prefill until it
finishes; then the slot is freed and the next waiting request is prefilled into it.
Every `Engine.step`:

1. admits waiting requests into free slots: one jitted prefill per batch of new
   requests, which also samples each one's first token from the prompt's last logits;
2. runs one jitted round for all running rows, padded to a batch-size bucket with
   padding rows (slot -1):

   - ``spec_mode="off"``: decode the last token, sample the next one;
   - ``"recurrent"`` / ``"replayssm"``: the drafter proposes ``T - 1`` tokens; the
     window ``[last token, d_1 .. d_{T-1}]`` is verified, the drafts accepted
     (`sampling.coupled_accept` for deterministic drafters, which is greedy at
     temperature 0, or `sampling.speculative_accept` for drafters that return q), and
     the model commits ``accepted`` tokens (accepted drafts plus the bonus);
3. retires finished requests (``max_new_tokens`` reached or a stop token emitted; the
   stop token is kept in the output).

Exactness: token ``n`` of a request is always chosen with the key
``fold_in(key(seed), n)`` (`sampling.position_keys`), and verification with a
deterministic drafter emits the tokens plain sampling would, so greedy and seeded
sampled runs give the same tokens in all three modes, whatever the batch composition,
up to fp32 rounding of the logits (a near-tie that rounding flips is possible in
principle; tests use fp32 on a CPU).

Queueing: `Engine.add_request` validates the request completely before it touches any
state (a bad request raises `ValueError` and the running batch goes on untouched), then
queues it FIFO; more requests than slots simply wait for a free slot. ``max_waiting``
bounds the queue (`ValueError` when full).

Step functions donate the caches (`jax.jit(donate_argnames=("cache",))`) and compile once
per (batch bucket, prompt-length bucket, spec).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from replayssm_jax import memory
from replayssm_jax.config import SpecConfig
from replayssm_jax.engine import sampling
from replayssm_jax.engine.drafters import Drafter

SpecMode = Literal["off", "recurrent", "replayssm"]
SPEC_MODES = ("off", "recurrent", "replayssm")
_SPECULATIVE_STREAM = 0x5bec  # folds a request's step key away from its token keys

__all__ = ["SPEC_MODES", "Engine", "Metrics", "Request", "SpecMode"]


# ----------------------------------------------------------------------------- records


@dataclasses.dataclass
class Request:
  """One generation request and its progress (host side).

  Attributes:
    id: the id `Engine.add_request` returned.
    prompt: prompt token ids.
    max_new_tokens: generated tokens at most.
    stop_tokens: tokens that end the request (kept in the output).
    temperature: 0 for greedy.
    top_p: nucleus of sampled tokens.
    seed: the request's PRNG seed.
    output: generated token ids so far.
    slot: the cache slot while running, else None.
    finish_reason: ``"length"``, ``"stop"`` or None while unfinished.
  """

  id: int
  prompt: list[int]
  max_new_tokens: int
  stop_tokens: frozenset[int]
  temperature: float
  top_p: float
  seed: int
  output: list[int] = dataclasses.field(default_factory=list)
  slot: int | None = None
  finish_reason: str | None = None

  @property
  def done(self) -> bool:
    return self.finish_reason is not None

  @property
  def history(self) -> list[int]:
    """Prompt + generated tokens."""
    return self.prompt + self.output

  def emit(self, tokens: Sequence[int]) -> list[int]:
    """Append ``tokens`` until the request finishes; returns those appended."""
    taken = []
    for t in tokens:
      if self.done:
        break
      t = int(t)
      self.output.append(t)
      taken.append(t)
      if t in self.stop_tokens:
        self.finish_reason = "stop"
      elif len(self.output) >= self.max_new_tokens:
        self.finish_reason = "length"
    return taken


@dataclasses.dataclass
class Metrics:
  """Counters of an engine run.

  Attributes:
    steps: decode / verify rounds (one jitted call each).
    prefill_calls: jitted prefill calls.
    prompt_tokens: prompt tokens prefilled.
    generated_tokens: tokens emitted (after stop / length truncation).
    verify_rows: row-rounds of verification (spec modes).
    proposed_drafts: drafts proposed to those rows, ``(T - 1)`` each.
    accepted_drafts: drafts accepted (bonus tokens not counted).
    wall_s: seconds spent in `Engine.step` (first-use compiles included).
    spec_scratch_bytes: speculative scratch of the target's GDN caches in each mode at
      this engine's slots, T and L (`replayssm_jax.memory`): ``recurrent`` the
      per-draft states ``intermediate``, ``replayssm`` the rings and cursors (and the
      checkpoints' bf16 copy when this engine keeps one), ``off`` 0.
    cache_bytes: bytes of the target cache this engine holds (with ``spec_mode="off"`` it
      includes a one-state ``intermediate`` per slot that plain decode never writes:
      `HybridLM.init_cache` builds a recurrent cache with T = 1).
    drafter_bytes: bytes of the drafter's own caches (a draft model), else 0.
  """

  steps: int = 0
  prefill_calls: int = 0
  prompt_tokens: int = 0
  generated_tokens: int = 0
  verify_rows: int = 0
  proposed_drafts: int = 0
  accepted_drafts: int = 0
  wall_s: float = 0.0
  spec_scratch_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
  cache_bytes: int = 0
  drafter_bytes: int = 0

  @property
  def acceptance_rate(self) -> float:
    """Accepted drafts / proposed drafts (0 without drafts)."""
    return self.accepted_drafts / self.proposed_drafts if self.proposed_drafts else 0.0

  @property
  def mean_accepted_length(self) -> float:
    """Tokens committed per verified row-round, bonus included (1 = no draft accepted)."""
    return (self.accepted_drafts + self.verify_rows) / self.verify_rows if self.verify_rows else 0.0

  @property
  def tokens_per_s(self) -> float:
    return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0

  def to_json(self) -> dict[str, Any]:
    """Every counter and derived rate, JSON-ready."""
    out = dataclasses.asdict(self)
    out.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
               tokens_per_s=self.tokens_per_s)
    return out


# ----------------------------------------------------------------------------- jitted rounds

_round_jit = functools.partial(jax.jit, static_argnames=("graphdef", "spec"),
                               donate_argnames=("cache",))


@_round_jit
def _prefill_round(graphdef, params, cache, tokens, lengths, slot_ids, seeds, temperature, top_p,
                   *, spec):
  """Prefill new requests and sample each one's first token (key position 0)."""
  logits, cache = nnx.merge(graphdef, params).prefill(cache, tokens, lengths, slot_ids, spec)
  last = jnp.take_along_axis(logits, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)[:, 0]
  keys = sampling.position_keys(seeds, jnp.zeros_like(lengths))
  return sampling.sample(last, temperature, top_p, keys), cache


@_round_jit
def _decode_round(graphdef, params, cache, tokens, slot_ids, seeds, positions, temperature, top_p,
                  *, spec):
  """Decode each row's last token; sample token ``positions[b]`` of the request."""
  logits, cache = nnx.merge(graphdef, params).decode(cache, tokens[:, None], slot_ids, spec)
  keys = sampling.position_keys(seeds, positions)
  return sampling.sample(logits[:, 0], temperature, top_p, keys), cache


@_round_jit
def _verify_round(graphdef, params, cache, window, slot_ids, seeds, positions, temperature, top_p,
                  draft_probs, *, spec):
  """Verify ``window [B, T]``, accept, and commit; returns ``(accepted, tokens, cache)``.

  Window position ``j`` predicts token ``positions[b] + j`` of the request.
  """
  model = nnx.merge(graphdef, params)
  logits, cache = model.verify(cache, window, slot_ids, spec)
  T = window.shape[1]
  if draft_probs is None:
    keys = sampling.position_keys(seeds, positions[:, None] + jnp.arange(T, dtype=jnp.int32))
    accepted, tokens = sampling.coupled_accept(logits, window[:, 1:], temperature, top_p, keys)
  else:
    keys = sampling.position_keys(seeds, positions)
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, _SPECULATIVE_STREAM)
    p = sampling.target_probs(logits, temperature, top_p)
    accepted, tokens = sampling.speculative_accept(p, draft_probs, window[:, 1:], keys)
  accepted = jnp.where(slot_ids >= 0, accepted, 0)
  return accepted, tokens, model.commit(cache, slot_ids, accepted, spec)


# ----------------------------------------------------------------------------- engine


def _power_of_two_at_least(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


class Engine:
  """Continuous-batching generation with optional speculative decoding.

  Args:
    model: the target `HybridLM`.
    spec_mode: ``"off"`` (plain decode), ``"recurrent"`` or ``"replayssm"`` (verify mode
      of the target's GDN caches, `SpecConfig.verify_mode`).
    drafter: proposes the drafts; required unless ``spec_mode="off"``, where it must be None.
    num_slots: concurrent requests (cache slots).
    max_len: positions per slot; each request needs
      ``len(prompt) + max_new_tokens + T - 1 <= max_len``.
    draft_tokens: T, the verify window including the root token (``T - 1`` drafts).
    ring_len: L of ``replayssm`` (a power of two >= 2T); default the smallest.
    batch_buckets: row counts rounds are padded to (compiles once each); default the
      powers of two below ``num_slots`` and ``num_slots``.
    backend: `SpecConfig.backend` of the target's kernels.
    max_waiting: the longest queue of waiting requests; None: unbounded.
    checkpoint_copy: ``spec_mode="replayssm"`` only: `SpecConfig.checkpoint_copy`, None or
      ``jnp.bfloat16`` (verify and decode read a bf16 copy of each checkpoint: half their
      bytes for half a checkpoint more memory). The committed state stays exact, but the
      logits are those of the rounded checkpoint, so tokens may differ from the other modes'.

  Raises:
    ValueError: an unknown mode, a missing or superfluous drafter, a drafter of another
      vocabulary, bad sizes, a checkpoint copy outside ReplaySSM (each message names the
      argument).

  Example (greedy, spec off, a tiny random model):

  >>> from replayssm_jax.engine.loading import tiny_random_model
  >>> engine = Engine(tiny_random_model(0), num_slots=2, max_len=32)
  >>> rid = engine.add_request([72, 105], max_new_tokens=3)
  >>> len(engine.run_until_done()[rid])
  3
  """

  def __init__(self, model, *, spec_mode: SpecMode = "off", drafter: Drafter | None = None,
               num_slots: int = 8, max_len: int = 1024, draft_tokens: int = 4,
               ring_len: int | None = None, batch_buckets: Sequence[int] | None = None,
               backend: str = "xla", max_waiting: int | None = None,
               checkpoint_copy: Any = None):
    if spec_mode not in SPEC_MODES:
      raise ValueError(f"Engine: spec_mode={spec_mode!r} is unknown; use one of {SPEC_MODES}.")
    if checkpoint_copy is not None and spec_mode != "replayssm":
      raise ValueError(f"Engine: checkpoint_copy={checkpoint_copy!r} needs "
                       f"spec_mode='replayssm' (given {spec_mode!r}).")
    if spec_mode == "off" and drafter is not None:
      raise ValueError("Engine: a drafter was given with spec_mode='off'; pass drafter=None "
                       "or choose spec_mode='recurrent' or 'replayssm'.")
    if spec_mode != "off" and not isinstance(drafter, Drafter):
      raise ValueError(f"Engine: spec_mode={spec_mode!r} needs a Drafter (NgramDrafter, "
                       f"ModelDrafter, ScriptedDrafter); given {type(drafter).__name__}.")
    for name, value in (("num_slots", num_slots), ("max_len", max_len),
                        ("draft_tokens", draft_tokens)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Engine: {name}={value!r} must be a positive integer.")
    T = 1 if spec_mode == "off" else draft_tokens
    L = ring_len if ring_len is not None else max(2, _power_of_two_at_least(2 * draft_tokens))
    buckets = (sorted({min(b, num_slots) for b in batch_buckets} | {num_slots})
               if batch_buckets is not None else
               sorted({1 << i for i in range(num_slots.bit_length()) if 1 << i < num_slots}
                      | {num_slots}))
    if buckets[0] < 1:
      raise ValueError(f"Engine: batch_buckets={batch_buckets!r} must be positive row counts.")
    # spec off decodes plain: a recurrent cache with T = 1 (no drafts, no ring).
    self.spec = SpecConfig(draft_tokens=T, ring_len=2 if spec_mode == "off" else L,
                           verify_mode="recurrent" if spec_mode == "off" else spec_mode,
                           backend=backend, checkpoint_copy=checkpoint_copy)
    self.model, self.spec_mode, self.drafter = model, spec_mode, drafter
    self.vocab_size = model.config.vocab_size
    self.num_slots, self.max_len, self.draft_tokens, self.ring_len = num_slots, max_len, T, L
    self.batch_buckets = tuple(buckets)
    self.max_waiting = max_waiting
    if drafter is not None:
      drafter.bind(num_slots=num_slots, max_len=max_len, num_drafts=T - 1,
                   vocab_size=self.vocab_size, batch_buckets=self.batch_buckets)
    self._graphdef, self._params = nnx.split(model)
    self.cache = model.init_cache(self.spec, num_slots, max_len)
    self._slots: list[Request | None] = [None] * num_slots
    self._waiting: collections.deque[Request] = collections.deque()
    self._requests: dict[int, Request] = {}
    self._next_id = 0
    self.metrics = Metrics(spec_scratch_bytes=self._scratch_bytes(draft_tokens, L),
                           cache_bytes=self.cache.nbytes,
                           drafter_bytes=int(getattr(drafter, "nbytes", 0)))

  def _scratch_bytes(self, T: int, L: int) -> dict[str, int]:
    """Spec scratch of each mode at this engine's sizes (`memory.memory_report`)."""
    L = max(L, _power_of_two_at_least(2 * T))
    report = memory.memory_report(self.model.config.gdn, num_slots=self.num_slots, draft_tokens=T,
                                  ring_len=L, activation_dtype=self.model.dtype,
                                  checkpoint_copy=self.spec.checkpoint_copy)
    return {"off": 0, "recurrent": report.intermediate_bytes,
            "replayssm": report.replayssm_scratch_bytes + report.cursor_bytes}

  # --------------------------------------------------------------------------- requests

  def add_request(self, prompt_tokens: Sequence[int], *, max_new_tokens: int = 64,
                  stop_tokens: Sequence[int] = (), temperature: float = 0.0, top_p: float = 1.0,
                  seed: int = 0) -> int:
    """Queue a request; returns its id. Nothing changes when it raises.

    Args:
      prompt_tokens: the prompt's token ids (at least one).
      max_new_tokens: generated tokens at most (>= 1).
      stop_tokens: token ids that end the request (kept in the output).
      temperature: 0 for greedy, else the sampling temperature.
      top_p: nucleus in ``(0, 1]``.
      seed: the request's PRNG seed, ``0 <= seed < 2**32``.

    Raises:
      ValueError: an empty prompt, a token outside the vocabulary, a request that does not
        fit ``max_len``, bad sampling knobs, or a full queue.
    """
    prompt = [int(t) for t in np.asarray(prompt_tokens, np.int64).reshape(-1)]
    if not prompt:
      raise ValueError("Engine.add_request: the prompt is empty; give at least one token.")
    bad = [t for t in prompt if not 0 <= t < self.vocab_size]
    if bad:
      raise ValueError(f"Engine.add_request: prompt token {bad[0]} is outside the vocabulary "
                       f"0..{self.vocab_size - 1}.")
    if (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1):
      raise ValueError(f"Engine.add_request: max_new_tokens={max_new_tokens!r} must be a positive "
                       "integer.")
    need = len(prompt) + max_new_tokens + self.draft_tokens - 1
    if need > self.max_len:
      raise ValueError(
          f"Engine.add_request: a prompt of {len(prompt)} tokens, max_new_tokens={max_new_tokens} "
          f"and a verify window of T={self.draft_tokens} need {need} positions (prompt + "
          f"max_new_tokens + T - 1) > max_len={self.max_len}; shorten the prompt, lower "
          "max_new_tokens or build the engine with a larger max_len.")
    if not (np.isfinite(temperature) and temperature >= 0):
      raise ValueError(f"Engine.add_request: temperature={temperature!r} must be >= 0 "
                       "(0 = greedy).")
    if not (np.isfinite(top_p) and 0 < top_p <= 1):
      raise ValueError(f"Engine.add_request: top_p={top_p!r} must be in (0, 1].")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
      raise ValueError(f"Engine.add_request: seed={seed!r} must be an integer in [0, 2**32).")
    stops = frozenset(int(t) for t in stop_tokens)
    if any(not 0 <= t < self.vocab_size for t in stops):
      raise ValueError(f"Engine.add_request: stop_tokens={sorted(stops)} must lie in the "
                       f"vocabulary 0..{self.vocab_size - 1}.")
    if self.max_waiting is not None and len(self._waiting) >= self.max_waiting:
      raise ValueError(f"Engine.add_request: {len(self._waiting)} requests already wait for a "
                       f"slot (max_waiting={self.max_waiting}); step the engine first.")
    request = Request(id=self._next_id, prompt=prompt, max_new_tokens=max_new_tokens,
                      stop_tokens=stops, temperature=float(temperature), top_p=float(top_p),
                      seed=int(seed))
    self._next_id += 1
    self._requests[request.id] = request
    self._waiting.append(request)
    return request.id

  def request(self, request_id: int) -> Request:
    """The `Request` record of ``request_id``."""
    return self._requests[request_id]

  @property
  def num_waiting(self) -> int:
    return len(self._waiting)

  @property
  def num_running(self) -> int:
    return sum(r is not None for r in self._slots)

  @property
  def has_work(self) -> bool:
    return bool(self._waiting) or self.num_running > 0

  # --------------------------------------------------------------------------- steps

  def _bucket(self, n: int) -> int:
    return next(b for b in self.batch_buckets if b >= n)

  def _pad(self, values: Sequence, fill, dtype, rows: int) -> jax.Array:
    return jnp.asarray(np.array(list(values) + [fill] * (rows - len(values)), dtype))

  def _row_knobs(self, reqs: Sequence[Request], rows: int):
    """``(slot_ids, seeds, temperature, top_p)`` padded to ``rows``."""
    return (self._pad([r.slot for r in reqs], -1, np.int32, rows),
            self._pad([r.seed for r in reqs], 0, np.uint32, rows),
            self._pad([r.temperature for r in reqs], 0.0, np.float32, rows),
            self._pad([r.top_p for r in reqs], 1.0, np.float32, rows))

  def _admit(self, events: dict[int, list[int]]) -> None:
    """Prefill waiting requests into free slots and emit their first tokens."""
    free = [s for s, r in enumerate(self._slots) if r is None]
    admitted = []
    while free and self._waiting:
      request = self._waiting.popleft()
      request.slot = free.pop(0)
      self._slots[request.slot] = request
      if self.drafter is not None:
        self.drafter.reset(request.slot)
      admitted.append(request)
    step = max(self.batch_buckets)
    for i in range(0, len(admitted), step):
      part = admitted[i:i + step]
      rows = self._bucket(len(part))
      width = min(self.max_len, max(16, _power_of_two_at_least(max(len(r.prompt) for r in part))))
      tokens = np.zeros((rows, width), np.int32)
      for b, r in enumerate(part):
        tokens[b, :len(r.prompt)] = r.prompt
      slot_ids, seeds, temperature, top_p = self._row_knobs(part, rows)
      first, self.cache = _prefill_round(
          self._graphdef, self._params, self.cache, jnp.asarray(tokens),
          self._pad([len(r.prompt) for r in part], 0, np.int32, rows), slot_ids, seeds,
          temperature, top_p, spec=self.spec)
      first = np.asarray(first)
      self.metrics.prefill_calls += 1
      for b, r in enumerate(part):
        self.metrics.prompt_tokens += len(r.prompt)
        events.setdefault(r.id, []).extend(r.emit([first[b]]))

  def _decode(self, running: list[Request], events: dict[int, list[int]]) -> None:
    rows = self._bucket(len(running))
    slot_ids, seeds, temperature, top_p = self._row_knobs(running, rows)
    nxt, self.cache = _decode_round(
        self._graphdef, self._params, self.cache,
        self._pad([r.output[-1] for r in running], 0, np.int32, rows), slot_ids, seeds,
        self._pad([len(r.output) for r in running], 0, np.int32, rows), temperature, top_p,
        spec=self.spec)
    nxt = np.asarray(nxt)
    for b, r in enumerate(running):
      events.setdefault(r.id, []).extend(r.emit([nxt[b]]))

  def _verify(self, running: list[Request], events: dict[int, list[int]]) -> None:
    T = self.draft_tokens
    rows = self._bucket(len(running))
    draft = self.drafter.propose([r.history for r in running], T - 1,
                                 [r.slot for r in running])
    drafts = np.asarray(draft.tokens, np.int32).reshape(len(running), T - 1)
    if drafts.size and (drafts.min() < 0 or drafts.max() >= self.vocab_size):
      raise ValueError("Engine.step: the drafter proposed a token outside the vocabulary "
                       f"0..{self.vocab_size - 1}.")
    window = np.zeros((rows, T), np.int32)
    window[:len(running), 0] = [r.output[-1] for r in running]
    window[:len(running), 1:] = drafts
    probs = None
    if draft.probs is not None:
      probs = jnp.zeros((rows, T - 1, self.vocab_size), jnp.float32).at[:len(running)].set(
          jnp.asarray(draft.probs, jnp.float32))
    slot_ids, seeds, temperature, top_p = self._row_knobs(running, rows)
    accepted, tokens, self.cache = _verify_round(
        self._graphdef, self._params, self.cache, jnp.asarray(window), slot_ids, seeds,
        self._pad([len(r.output) for r in running], 0, np.int32, rows), temperature, top_p,
        probs, spec=self.spec)
    accepted, tokens = np.asarray(accepted), np.asarray(tokens)
    for b, r in enumerate(running):
      self.metrics.verify_rows += 1
      self.metrics.proposed_drafts += T - 1
      self.metrics.accepted_drafts += int(accepted[b]) - 1
      events.setdefault(r.id, []).extend(r.emit(tokens[b, :accepted[b]]))

  def step(self) -> dict[int, list[int]]:
    """Admit waiting requests, then run one decode or verify round for all running rows.

    Returns:
      The tokens each request emitted in this step, by request id.
    """
    start = time.perf_counter()
    events: dict[int, list[int]] = {}
    self._admit(events)
    running = [r for r in self._slots if r is not None and not r.done]
    if running:
      (self._decode if self.spec_mode == "off" else self._verify)(running, events)
      self.metrics.steps += 1
    for slot, r in enumerate(self._slots):
      if r is not None and r.done:  # free the slot; the next prefill resets it
        r.slot = None
        self._slots[slot] = None
    self.metrics.generated_tokens += sum(len(v) for v in events.values())
    self.metrics.wall_s += time.perf_counter() - start
    return events

  def run_until_done(self, max_steps: int | None = None) -> dict[int, list[int]]:
    """Step until no request waits or runs; returns every request's output by id.

    Args:
      max_steps: stop after this many steps (None: until done).
    """
    n = 0
    while self.has_work and (max_steps is None or n < max_steps):
      self.step()
      n += 1
    return {rid: list(r.output) for rid, r in self._requests.items()}
