"""Token choice and draft verification: pure jnp, jit-friendly, batched over rows.

Logits processing (temperature, top-p; ``temperature == 0`` is greedy), per-request
PRNG keys, and the three ways a verify window's target logits turn into emitted tokens:

- `greedy_accept`: accept drafts while the target's argmax equals them; the bonus
  (correction) token is the argmax at the first mismatch or after the last draft.
- `coupled_accept`: for deterministic drafters (q one-hot). Position ``j`` of the window
  samples ``y_j ~ p_j`` with the key of the token it would emit
  (`position_keys`); drafts are accepted while ``y_j`` equals them and ``y`` at the
  first mismatch is the correction. With one-hot q this *is* standard speculative
  sampling (accept x with probability ``p(x)``; on rejection ``y ~ p(. | y != x) =
  normalize(max(p - q, 0))``), and it draws exactly the tokens plain decoding draws
  with the same keys, so spec off / recurrent / replayssm agree token for token under a
  fixed seed. With ``temperature == 0`` it is `greedy_accept`.
- `speculative_accept`: standard speculative sampling for drafters that sample from a
  distribution q (Leviathan et al. 2023, Chen et al. 2023): accept ``x`` with
  probability ``min(1, p(x) / q(x))``; at the first rejection resample from
  ``normalize(max(p - q, 0))``; after all drafts sample the bonus from p. The emitted
  tokens follow p exactly, but they depend on the drafts, so they are not those of
  plain decoding.

Shapes: ``B`` rows, a window of ``T`` positions (``T - 1`` drafts), vocabulary ``V``.
Per-row knobs (``temperature``, ``top_p``: ``f32[B]``) broadcast over positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "coupled_accept",
    "greedy_accept",
    "position_keys",
    "process_logits",
    "sample",
    "speculative_accept",
    "target_probs",
]


def _per_row(x: jax.Array, like: jax.Array) -> jax.Array:
  """``x [B]`` reshaped to broadcast against ``like [B, ..., V]``."""
  x = jnp.asarray(x, jnp.float32)
  return x.reshape(x.shape + (1,) * (like.ndim - x.ndim))


def process_logits(logits: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
  """Scale by the temperature and mask tokens outside the top-p nucleus.

  Rows with ``temperature == 0`` are scaled by 1 (their choice is the argmax, see
  `sample` and `target_probs`). The nucleus keeps the most likely tokens until their
  probability reaches ``top_p`` (at least one token; ties with the last kept token are
  kept too); ``top_p >= 1`` keeps every token.

  Args:
    logits: ``f32[B, ..., V]``.
    temperature: ``f32[B]``, ``>= 0``.
    top_p: ``f32[B]`` in ``(0, 1]``.

  Returns:
    ``f32[B, ..., V]`` logits; masked tokens are ``-inf``.
  """
  logits = logits.astype(jnp.float32)
  t = _per_row(temperature, logits)
  p = _per_row(top_p, logits)
  scaled = logits / jnp.where(t > 0, t, 1.0)
  probs = jax.nn.softmax(scaled, axis=-1)
  ranked = -jnp.sort(-probs, axis=-1)  # descending
  before = jnp.cumsum(ranked, axis=-1) - ranked  # mass of the strictly more likely tokens
  kept = jnp.sum(before < p, axis=-1, keepdims=True)  # >= 1, since before[0] = 0 < p
  threshold = jnp.take_along_axis(ranked, kept - 1, axis=-1)
  keep = (probs >= threshold) | (p >= 1.0)
  return jnp.where(keep, scaled, -jnp.inf)


def target_probs(logits: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
  """The distribution tokens are drawn from: ``softmax(process_logits(...))``.

  Rows with ``temperature == 0`` get the one-hot of the argmax, so that
  `speculative_accept` reduces to greedy acceptance for them.

  Args:
    logits: ``f32[B, ..., V]``.
    temperature: ``f32[B]``.
    top_p: ``f32[B]``.

  Returns:
    ``f32[B, ..., V]``, each row summing to 1.
  """
  probs = jax.nn.softmax(process_logits(logits, temperature, top_p), axis=-1)
  greedy = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
  return jnp.where(_per_row(temperature, logits) > 0, probs, greedy)


def position_keys(seeds: jax.Array, positions: jax.Array) -> jax.Array:
  """PRNG keys of output tokens: ``fold_in(key(seed), position)``.

  The key of a request's ``n``-th generated token depends only on its seed and ``n``,
  so the same token gets the same key whatever step, batch row or verify mode
  produces it.

  Args:
    seeds: ``int32[B]`` per-request seeds.
    positions: ``int32[B, ...]`` indices of generated tokens (0 = the first).

  Returns:
    Typed keys of shape ``positions.shape``.
  """
  base = jax.vmap(jax.random.key)(seeds.astype(jnp.uint32))
  flat = positions.reshape(positions.shape[0], -1)
  keys = jax.vmap(lambda k, ns: jax.vmap(lambda n: jax.random.fold_in(k, n))(ns))(base, flat)
  return keys.reshape(positions.shape)


def sample(logits: jax.Array, temperature: jax.Array, top_p: jax.Array,
           keys: jax.Array) -> jax.Array:
  """Draw one token per position: argmax where ``temperature == 0``, else categorical.

  Args:
    logits: ``f32[B, ..., V]``.
    temperature: ``f32[B]``.
    top_p: ``f32[B]``.
    keys: typed PRNG keys of shape ``logits.shape[:-1]`` (`position_keys`).

  Returns:
    ``int32[B, ...]``.
  """
  processed = process_logits(logits, temperature, top_p)
  lead = logits.shape[:-1]
  flat_keys = keys.reshape(-1)
  drawn = jax.vmap(jax.random.categorical)(flat_keys, processed.reshape(-1, logits.shape[-1]))
  drawn = drawn.reshape(lead)
  greedy = jnp.argmax(logits, axis=-1)
  t = _per_row(temperature, greedy)
  return jnp.where(t > 0, drawn, greedy).astype(jnp.int32)


def _leading_matches(match: jax.Array) -> jax.Array:
  """``int32[B]``: how many leading entries of ``match [B, n]`` are True."""
  return jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def greedy_accept(target_logits: jax.Array, draft_tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Greedy verification of a window ``[root, d_1 .. d_{T-1}]``.

  Args:
    target_logits: ``[B, T, V]``; position ``j`` predicts the token after window token ``j``.
    draft_tokens: ``int32[B, T - 1]``, the drafts ``d_1 .. d_{T-1}``.

  Returns:
    ``(accepted int32[B], next_tokens int32[B, T])``: ``accepted`` in ``1..T`` counts the
    matching drafts plus the bonus token; ``next_tokens`` is the target's argmax at every
    position, so ``next_tokens[b, :accepted[b]]`` are the emitted tokens (accepted drafts,
    then the bonus).

  >>> logits = jax.nn.one_hot(jnp.array([[5, 6, 7]]), 8)
  >>> accepted, tokens = greedy_accept(logits, jnp.array([[5, 0]]))
  >>> int(accepted[0]), tokens[0, :2].tolist()
  (2, [5, 6])
  """
  next_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
  T = target_logits.shape[1]
  match = next_tokens[:, :T - 1] == draft_tokens
  return _leading_matches(match) + 1, next_tokens


def coupled_accept(target_logits: jax.Array, draft_tokens: jax.Array, temperature: jax.Array,
                   top_p: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Verification for deterministic drafters: sample every position, accept while equal.

  ``y_j = sample(p_j, key_j)``; drafts are accepted while ``y_j == d_{j+1}``. For a
  one-hot q this is speculative sampling (see the module docstring), and with the keys
  of `position_keys` it emits exactly the tokens plain decoding would. Rows with
  ``temperature == 0`` are `greedy_accept`.

  Args:
    target_logits: ``[B, T, V]``.
    draft_tokens: ``int32[B, T - 1]``.
    temperature: ``f32[B]``.
    top_p: ``f32[B]``.
    keys: typed keys ``[B, T]``, one per window position.

  Returns:
    ``(accepted int32[B], next_tokens int32[B, T])`` as in `greedy_accept`
    (``next_tokens`` holds ``y`` at every position).
  """
  next_tokens = sample(target_logits, temperature, top_p, keys)
  T = target_logits.shape[1]
  match = next_tokens[:, :T - 1] == draft_tokens
  return _leading_matches(match) + 1, next_tokens


def speculative_accept(target_probs: jax.Array, draft_probs: jax.Array, draft_tokens: jax.Array,
                       key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Standard speculative sampling of a window ``[root, d_1 .. d_{T-1}]``.

  Draft ``d_{j+1} ~ q_j`` is accepted with probability ``min(1, p_j(d) / q_j(d))``
  (``u q < p`` with ``u ~ U[0, 1)``); at the first rejection ``j`` the token is drawn
  from ``normalize(max(p_j - q_j, 0))`` (from ``p_j`` if that is all zero, which has
  probability 0 of being needed); after ``T - 1`` acceptances the bonus is drawn from
  ``p_{T-1}``. A one-hot q accepts with probability ``p(d)``.

  Args:
    target_probs: ``f32[B, T, V]``, p at each window position (`target_probs`).
    draft_probs: ``f32[B, T - 1, V]``, q the drafts were drawn from.
    draft_tokens: ``int32[B, T - 1]``.
    key: typed keys ``[B]``, one per row and step.

  Returns:
    ``(accepted int32[B], tokens int32[B, T])``: ``tokens[b, :accepted[b]]`` are the
    emitted tokens (accepted drafts, then the resampled or bonus token); later
    entries are -1.
  """
  p = target_probs.astype(jnp.float32)
  q = draft_probs.astype(jnp.float32)
  B, T, V = p.shape
  split = jax.vmap(lambda k: jax.random.split(k, 2))(key)  # [B, 2]
  u = jax.vmap(lambda k: jax.random.uniform(k, (T - 1,)))(split[:, 0])
  x = draft_tokens.astype(jnp.int32)
  px = jnp.take_along_axis(p[:, :T - 1], x[..., None], axis=-1)[..., 0]
  qx = jnp.take_along_axis(q, x[..., None], axis=-1)[..., 0]
  n = _leading_matches(u * qx < px)  # accepted drafts, 0..T-1
  rows = jnp.arange(B)
  p_n = p[rows, n]
  q_n = jnp.where((n < T - 1)[:, None], q[rows, jnp.minimum(n, T - 2)] if T > 1 else 0.0, 0.0)
  residual = jnp.maximum(p_n - q_n, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_n)
  y = jax.vmap(jax.random.categorical)(split[:, 1], jnp.log(residual)).astype(jnp.int32)
  pos = jnp.arange(T)[None, :]
  drafts = jnp.pad(x, ((0, 0), (0, 1)), constant_values=-1)
  tokens = jnp.where(pos < n[:, None], drafts, jnp.where(pos == n[:, None], y[:, None], -1))
  return n + 1, tokens
