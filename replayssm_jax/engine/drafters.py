"""Drafters: who proposes the ``T - 1`` draft tokens of a verify window (linear chains).

One small interface, `Drafter`:

- ``bind(num_slots=, max_len=, num_drafts=, vocab_size=, batch_buckets=)``: called once by
  the engine; allocates state and rejects a drafter of another vocabulary.
- ``propose(histories, num_tokens, slot_ids) -> Draft``: ``histories[b]`` is row b's
  whole sequence (prompt + generated tokens; its last token is the window's root, not yet
  seen by the target); returns ``num_tokens`` drafts per row and, for drafters that sample,
  the distributions q they were drawn from (`Draft.probs`, for `sampling.speculative_accept`).
  ``probs is None`` means q is one-hot (a deterministic drafter).
- ``reset(slot)``: a new request enters ``slot``; ``rollback(slot, length)``: the slot's
  sequence is now only its first ``length`` tokens. Stateless drafters ignore both.

Drafters:

- `NgramDrafter`: prompt lookup, no model.
- `ScriptedDrafter`: proposes from known continuations with a chosen number of correct
  tokens (tests: accept-all, accept-none, every prefix).
- `ModelDrafter`: any `HybridLM` (usually a smaller one) with its own caches.

Rollback of `ModelDrafter` (the choice): the draft model's cache only ever *commits* tokens
that belong to the sequence, i.e. that the target accepted. Each `propose` first commits
the tokens the target accepted since the last call (one verify window of the draft model
plus `commit`, which is how `HybridLM` keeps a prefix), reads the first draft from the
logits of the last accepted token, and then drafts token ``j`` by a verify of the window
``[d_1 .. d_{j-1}]`` *without* committing it. A `HybridLM` verify never changes the committed
state (ReplaySSM: rejected records are never read again; recurrent: `intermediate` is
overwritten), so rejected drafts leave nothing to roll back, and no snapshot is copied.
The price is ``T - 1`` draft-model windows of ``T`` tokens per step (O(T^2) draft tokens of
work instead of O(T) decode steps), small for a small draft model. A slot whose sequence
no longer extends what the drafter committed (`rollback`, `reset`, a reused slot) is
re-prefilled from its sequence.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from replayssm_jax.config import SpecConfig
from replayssm_jax.engine import sampling

__all__ = ["Draft", "Drafter", "ModelDrafter", "NgramDrafter", "ScriptedDrafter"]


@dataclasses.dataclass(frozen=True)
class Draft:
  """Draft tokens of a batch of rows.

  Attributes:
    tokens: ``int32[B, k]``.
    probs: ``f32[B, k, V]``, the distribution each draft was drawn from; None for a
      deterministic drafter (q one-hot at the draft).
  """

  tokens: np.ndarray
  probs: jax.Array | None = None


class Drafter(abc.ABC):
  """The drafter interface (see the module docstring)."""

  #: Vocabulary the drafter proposes from; None: any (it copies tokens it is given).
  vocab_size: int | None = None

  def bind(self, *, num_slots: int, max_len: int, num_drafts: int, vocab_size: int,
           batch_buckets: Sequence[int] = ()) -> None:
    """Prepare for an engine; raises ValueError on another vocabulary.

    Args:
      num_slots: the engine's slots (slot ids are ``0 .. num_slots - 1``).
      max_len: the longest sequence (prompt + generated + window).
      num_drafts: ``T - 1`` drafts per step.
      vocab_size: the target model's vocabulary.
      batch_buckets: row counts the engine pads batches to.
    """
    del num_slots, max_len, num_drafts, batch_buckets
    if self.vocab_size is not None and self.vocab_size != vocab_size:
      raise ValueError(f"{type(self).__name__}: the drafter's vocabulary has {self.vocab_size} "
                       f"tokens but the target model's has {vocab_size}; draft and target must "
                       "share one tokenizer.")

  @abc.abstractmethod
  def propose(self, histories: Sequence[Sequence[int]], num_tokens: int,
              slot_ids: Sequence[int] | None = None) -> Draft:
    """``num_tokens`` drafts for each row continuing ``histories[b]``."""

  def reset(self, slot: int) -> None:
    """A new request starts in ``slot``."""
    del slot

  def rollback(self, slot: int, length: int) -> None:
    """The sequence of ``slot`` is now its first ``length`` tokens."""
    del slot, length


# ----------------------------------------------------------------------------- n-gram


class NgramDrafter(Drafter):
  """Prompt lookup: continue the most recent earlier occurrence of the sequence's suffix.

  For ``n`` from ``max_n`` down to ``min_n``: find the latest earlier position where the
  last ``n`` tokens occurred, and propose the tokens that followed it (a copy that may run
  into the suffix itself, so a period-``p`` loop is continued with period ``p``). Without
  any match it repeats the last token.

  >>> NgramDrafter(max_n=2).propose([[1, 2, 3, 9, 1, 2]], 3).tokens.tolist()
  [[3, 9, 1]]
  """

  def __init__(self, max_n: int = 3, min_n: int = 1):
    if not isinstance(max_n, int) or not isinstance(min_n, int) or not 1 <= min_n <= max_n:
      raise ValueError(f"NgramDrafter: need 1 <= min_n <= max_n; given min_n={min_n!r}, "
                       f"max_n={max_n!r}.")
    self.max_n, self.min_n = max_n, min_n

  def _match_end(self, h: np.ndarray) -> int | None:
    """Index just after the latest earlier occurrence of the longest matching suffix."""
    for n in range(min(self.max_n, len(h) - 1), self.min_n - 1, -1):
      windows = np.lib.stride_tricks.sliding_window_view(h[:-1], n)  # starts 0 .. len - 1 - n
      hits = np.flatnonzero((windows == h[-n:]).all(axis=1))
      if hits.size:
        return int(hits[-1]) + n
    return None

  def _propose_one(self, history: Sequence[int], k: int) -> list[int]:
    h = np.asarray(history, np.int64)
    end = self._match_end(h) if len(h) > 1 else None
    if end is None:
      return [int(h[-1])] * k
    out = list(h)
    for j in range(k):  # out grows as it is read: copies past the end continue the loop
      out.append(out[end + j])
    return [int(t) for t in out[len(h):]]

  def propose(self, histories: Sequence[Sequence[int]], num_tokens: int,
              slot_ids: Sequence[int] | None = None) -> Draft:
    del slot_ids
    tokens = np.array([self._propose_one(h, num_tokens) for h in histories], np.int32)
    return Draft(tokens.reshape(len(histories), num_tokens))


# ----------------------------------------------------------------------------- scripted


class ScriptedDrafter(Drafter):
  """Proposes from known sequences, with a chosen number of correct tokens (for tests).

  ``references`` are whole sequences (prompt + the continuation the target will emit, e.g.
  from a run without speculation). For a history that is a prefix of a reference, the
  first ``c = num_correct(len(history), num_tokens)`` drafts are the reference's next
  tokens and the rest are wrong (``(reference token + 1) % vocab_size``), so the target
  accepts exactly ``c`` drafts. Other histories get the last token repeated.

  Args:
    references: the known sequences.
    vocab_size: the vocabulary (to build wrong tokens).
    num_correct: an int (``num_tokens`` or more: accept all; 0: accept none) or a function
      ``(history length, num_tokens) -> count``, e.g. ``lambda n, k: n % (k + 1)`` to walk
      through every prefix length.
  """

  def __init__(self, references: Sequence[Sequence[int]], vocab_size: int,
               num_correct: int | Callable[[int, int], int] = 1 << 30):
    self.references = [tuple(int(t) for t in r) for r in references]
    self.vocab_size = vocab_size
    self.num_correct = num_correct

  def _reference_for(self, history: tuple[int, ...]) -> tuple[int, ...] | None:
    for ref in self.references:
      if len(ref) > len(history) and ref[:len(history)] == history:
        return ref
    return None

  def propose(self, histories: Sequence[Sequence[int]], num_tokens: int,
              slot_ids: Sequence[int] | None = None) -> Draft:
    del slot_ids
    rows = []
    for history in histories:
      history = tuple(int(t) for t in history)
      ref = self._reference_for(history)
      if ref is None:
        rows.append([history[-1]] * num_tokens)
        continue
      n = len(history)
      c = self.num_correct(n, num_tokens) if callable(self.num_correct) else self.num_correct
      right = list(ref[n:n + num_tokens]) + [ref[-1]] * max(0, n + num_tokens - len(ref))
      rows.append([t if j < c else (t + 1) % self.vocab_size for j, t in enumerate(right)])
    return Draft(np.array(rows, np.int32).reshape(len(histories), num_tokens))


# ----------------------------------------------------------------------------- draft model


def _next_bucket(n: int, buckets: Sequence[int]) -> int:
  return next(b for b in buckets if b >= n)


def _choose(logits, temperature, top_p, keys, greedy: bool):
  """Draft tokens ``int32[B]`` and (sampling drafters) their distributions ``f32[B, V]``."""
  if greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
  B = logits.shape[0]
  t, p = jnp.full((B,), temperature, jnp.float32), jnp.full((B,), top_p, jnp.float32)
  return sampling.sample(logits, t, p, keys), sampling.target_probs(logits, t, p)


_draft_jit = functools.partial(jax.jit, static_argnames=("graphdef", "spec", "greedy"),
                               donate_argnames=("cache",))


@_draft_jit
def _catch_up_step(graphdef, params, cache, window, counts, slot_ids, temperature, top_p, keys, *,
              spec, greedy):
  """Verify ``window``, commit its first ``counts`` tokens, draft from position ``counts - 1``."""
  model = nnx.merge(graphdef, params)
  logits, cache = model.verify(cache, window, slot_ids, spec)
  cache = model.commit(cache, slot_ids, counts, spec)
  last = jnp.take_along_axis(logits, jnp.maximum(counts - 1, 0)[:, None, None], axis=1)[:, 0]
  return *_choose(last, temperature, top_p, keys, greedy), cache


@_draft_jit
def _look_ahead_step(graphdef, params, cache, window, position, slot_ids, temperature, top_p,
                     keys, *, spec, greedy):
  """Verify ``window`` (uncommitted drafts) and draft from ``position`` (traced: one compile)."""
  logits, cache = nnx.merge(graphdef, params).verify(cache, window, slot_ids, spec)
  at = jax.lax.dynamic_index_in_dim(logits, position, axis=1, keepdims=False)
  return *_choose(at, temperature, top_p, keys, greedy), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("cache",))
def _prefill_cache(graphdef, params, cache, tokens, lengths, slot_ids, *, spec):
  _, cache = nnx.merge(graphdef, params).prefill(cache, tokens, lengths, slot_ids, spec)
  return cache


class ModelDrafter(Drafter):
  """A `HybridLM` draft model with its own caches (see the module docstring for rollback).

  Args:
    model: the draft model (any `HybridLM`; same vocabulary as the target).
    verify_mode: the draft model's own cache mode, ``"recurrent"`` or ``"replayssm"``.
    temperature: 0 drafts greedily (q one-hot, `Draft.probs` None); > 0 samples the
      drafts from the draft model's tempered distribution and returns it.
    top_p: nucleus of the sampled drafts.
    seed: PRNG seed of the sampled drafts.
    backend: `SpecConfig.backend` of the draft model.
  """

  def __init__(self, model, *, verify_mode: str = "recurrent", temperature: float = 0.0,
               top_p: float = 1.0, seed: int = 0, backend: str = "xla"):
    if temperature < 0 or not 0 < top_p <= 1:
      raise ValueError(f"ModelDrafter: temperature={temperature} must be >= 0 and "
                       f"top_p={top_p} in (0, 1].")
    self.model = model
    self.vocab_size = model.config.vocab_size
    self.verify_mode, self.backend = verify_mode, backend
    self.temperature, self.top_p = float(temperature), float(top_p)
    self._key = jax.random.key(seed)
    self._graphdef, self._params = nnx.split(model)
    self.cache = None

  def bind(self, *, num_slots: int, max_len: int, num_drafts: int, vocab_size: int,
           batch_buckets: Sequence[int] = ()) -> None:
    super().bind(num_slots=num_slots, max_len=max_len, num_drafts=num_drafts,
                 vocab_size=vocab_size, batch_buckets=batch_buckets)
    W = num_drafts + 1  # the draft model's window: the root and the drafts before the last
    L = 1 << max(1, (2 * W - 1).bit_length())
    self.spec = SpecConfig(draft_tokens=W, ring_len=L, verify_mode=self.verify_mode,
                           backend=self.backend)
    self.num_drafts, self.max_len = num_drafts, max_len
    self.buckets = tuple(sorted(set(batch_buckets) | {num_slots}))
    self.cache = self.model.init_cache(self.spec, num_slots, max_len + W)
    self.committed: list[list[int] | None] = [None] * num_slots  # tokens in each slot's cache

  @property
  def nbytes(self) -> int:
    """Bytes of the draft model's caches."""
    return 0 if self.cache is None else self.cache.nbytes

  def reset(self, slot: int) -> None:
    self.committed[slot] = None

  def rollback(self, slot: int, length: int) -> None:
    if self.committed[slot] is not None and len(self.committed[slot]) > length:
      self.committed[slot] = None  # committed tokens cannot be dropped: re-prefill

  # --------------------------------------------------------------------------- internals

  def _rows(self, values: list, fill, width: int | None = None) -> np.ndarray:
    """Pad a per-row list to the batch bucket (and each row to ``width``)."""
    B = _next_bucket(len(values), self.buckets)
    if width is None:
      return np.array(list(values) + [fill] * (B - len(values)), np.int32)
    out = np.full((B, width), fill, np.int32)
    for b, row in enumerate(values):
      out[b, :len(row)] = row
    return out

  def _prefill(self, slots: list[int], sequences: list[list[int]]) -> None:
    """Prefill ``sequences`` (may be empty) into ``slots``, in batches of the bucket size."""
    step = max(self.buckets)
    for i in range(0, len(slots), step):
      part, seqs = slots[i:i + step], sequences[i:i + step]
      width = min(self.cache.max_len, 1 << max(4, (max(len(s) for s in seqs) - 1).bit_length()))
      self.cache = _prefill_cache(self._graphdef, self._params, self.cache,
                                  jnp.asarray(self._rows(seqs, 0, width)),
                                  jnp.asarray(self._rows([len(s) for s in seqs], 0)),
                                  jnp.asarray(self._rows(part, -1)), spec=self.spec)
      for slot, s in zip(part, seqs):
        self.committed[slot] = list(s)

  def _knobs(self, rows: int) -> tuple:
    """``((temperature, top_p, keys [rows]), greedy)`` of one draft call."""
    self._key, key = jax.random.split(self._key)
    return (self.temperature, self.top_p, jax.random.split(key, rows)), self.temperature == 0

  def _catch_up(self, slots: list[int], histories: list[list[int]]):
    """Commit each row's tokens past its committed prefix; the first drafts from the last."""
    W = self.spec.draft_tokens
    pending = [h[len(self.committed[s]):] for h, s in zip(histories, slots)]
    token = prob = None
    while any(pending):
      chunk = [p[:W] for p in pending]
      rows = self._rows([s if c else -1 for s, c in zip(slots, chunk)], -1)
      knobs, greedy = self._knobs(len(rows))
      t, q, self.cache = _catch_up_step(
          self._graphdef, self._params, self.cache, jnp.asarray(self._rows(chunk, 0, W)),
          jnp.asarray(self._rows([len(c) for c in chunk], 0)), jnp.asarray(rows), *knobs,
          spec=self.spec, greedy=greedy)
      if token is None:
        token, prob = t, q
      else:  # keep the draft of the round that consumed each row's last pending token
        last = jnp.asarray(self._rows([int(bool(c) and len(p) <= W)
                                       for c, p in zip(chunk, pending)], 0)).astype(bool)
        token = jnp.where(last, t, token)
        prob = None if q is None else jnp.where(last[:, None], q, prob)
      for s, c in zip(slots, chunk):
        self.committed[s].extend(c)
      pending = [p[W:] for p in pending]
    return token, prob

  def propose(self, histories: Sequence[Sequence[int]], num_tokens: int,
              slot_ids: Sequence[int] | None = None) -> Draft:
    if self.cache is None:
      raise ValueError("ModelDrafter.propose: call bind() first (the Engine does).")
    if slot_ids is None:
      raise ValueError("ModelDrafter.propose: slot_ids are required (the drafter keeps caches "
                       "per slot).")
    if num_tokens > self.num_drafts:
      raise ValueError(f"ModelDrafter.propose: num_tokens={num_tokens} exceeds the bound "
                       f"num_drafts={self.num_drafts}.")
    R, W = len(histories), self.spec.draft_tokens
    if not num_tokens:
      return Draft(np.zeros((R, 0), np.int32))
    slots = [int(s) for s in slot_ids]
    histories = [[int(t) for t in h] for h in histories]
    stale = [b for b in range(R) if not self._extends(slots[b], histories[b])]
    if stale:
      self._prefill([slots[b] for b in stale], [histories[b][:-1] for b in stale])
    token, prob = self._catch_up(slots, histories)
    tokens, probs = [token], [prob]
    window = jnp.zeros((token.shape[0], W), jnp.int32)
    padded_slots = jnp.asarray(self._rows(slots, -1))
    for j in range(1, num_tokens):  # d_{j+1} from the window [d_1 .. d_j], not committed
      window = window.at[:, j - 1].set(tokens[-1])
      knobs, greedy = self._knobs(window.shape[0])
      token, prob, self.cache = _look_ahead_step(self._graphdef, self._params, self.cache,
                                                 window, jnp.int32(j - 1), padded_slots, *knobs,
                                                 spec=self.spec, greedy=greedy)
      tokens.append(token)
      probs.append(prob)
    out = np.asarray(jnp.stack(tokens, 1))[:R]
    return Draft(out, None if self.temperature == 0 else jnp.stack(probs, 1)[:R])

  def _extends(self, slot: int, history: list[int]) -> bool:
    committed = self.committed[slot]
    return (committed is not None and len(committed) < len(history)
            and history[:len(committed)] == committed)
