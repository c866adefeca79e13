"""`replayssm_jax.engine.sampling`: greedy, coupled and speculative acceptance; top-p.

The statistical tests draw 20k vectorised speculative-sampling trials on a 4-token
vocabulary and compare the empirical distribution of the emitted tokens with the target
by a chi-square test. Threshold: the chi-square quantile with 3 degrees of freedom at
significance 1e-4 (``scipy.stats.chi2.isf(1e-4, 3) = 21.11``), so a correct sampler
fails one comparison with probability 1e-4; the seeds are fixed, so the tests are
deterministic. A negative control (the unverified draft tokens) must fail the same test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replayssm_jax.engine import sampling

CHI2_CRITICAL_DF3 = 21.11  # chi2.isf(1e-4, df=3)
V = 4
TRIALS = 20_000


def one_hot_logits(tokens) -> jax.Array:
  """Logits whose argmax at each position is ``tokens`` (margin 5)."""
  return 5.0 * jax.nn.one_hot(jnp.asarray(tokens), 16)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
  """Pearson's statistic of observed ``counts`` against expected ``probs``."""
  n = counts.sum()
  expected = n * probs
  assert expected.min() >= 5, "too few trials for the chi-square approximation"
  return float(((counts - expected) ** 2 / expected).sum())


def dirichlet(rng: np.random.Generator, *shape: int) -> np.ndarray:
  """Random distributions over V tokens; concentration 3 keeps every cell >= 5 expected counts."""
  return rng.dirichlet(np.full(V, 3.0), size=shape).astype(np.float32)


# ----------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("correct", range(4), ids=lambda c: f"first-mismatch-{c}")
def test_greedy_accept_every_prefix(correct):
  """T = 4: drafts matching the target's argmax on their first ``correct`` positions
  accept ``correct`` drafts plus the bonus (3 correct = accept all, 0 = accept none)."""
  target = np.array([[3, 7, 1, 9]])
  drafts = target[:, :3].copy()
  if correct < 3:
    drafts[0, correct] = (drafts[0, correct] + 1) % 16
  accepted, tokens = sampling.greedy_accept(one_hot_logits(target), jnp.asarray(drafts))
  assert int(accepted[0]) == correct + 1
  np.testing.assert_array_equal(tokens, target)  # the argmax at every position


def test_greedy_accept_rows_are_independent():
  target = np.array([[3, 7, 1, 9], [2, 2, 2, 2], [5, 4, 3, 2]])
  drafts = np.array([[3, 7, 1], [0, 2, 2], [5, 4, 0]])
  accepted, _ = sampling.greedy_accept(one_hot_logits(target), jnp.asarray(drafts))
  assert accepted.tolist() == [4, 1, 3]


def test_window_without_drafts():
  """T = 1 (nothing drafted): every row emits one token."""
  no_drafts = jnp.zeros((2, 0), jnp.int32)
  accepted, tokens = sampling.greedy_accept(one_hot_logits([[4], [6]]), no_drafts)
  assert accepted.tolist() == [1, 1] and tokens[:, 0].tolist() == [4, 6]


# ----------------------------------------------------------------------------- processing


@pytest.mark.parametrize("top_p, kept", [(0.3, 1), (0.7, 2), (0.8, 2), (0.81, 3), (0.99, 4),
                                         (1.0, 4)])
def test_top_p_nucleus(top_p, kept):
  """Probabilities 0.5, 0.3, 0.15, 0.05: the nucleus is the shortest prefix reaching top_p."""
  logits = jnp.log(jnp.array([[0.15, 0.5, 0.05, 0.3]]))
  out = sampling.process_logits(logits, jnp.array([1.0]), jnp.array([top_p]))
  order = [1, 3, 0, 2]
  finite = np.isfinite(np.asarray(out[0]))
  assert finite[order].tolist() == [True] * kept + [False] * (4 - kept)


def test_temperature_scales_and_zero_is_greedy():
  logits = jnp.array([[1.0, 2.0, 0.5]])
  out = sampling.process_logits(logits, jnp.array([0.5]), jnp.array([1.0]))
  np.testing.assert_allclose(out, logits / 0.5)
  probs = sampling.target_probs(logits, jnp.array([0.0]), jnp.array([1.0]))
  np.testing.assert_array_equal(probs, [[0.0, 1.0, 0.0]])
  keys = sampling.position_keys(jnp.array([7]), jnp.array([0]))
  assert sampling.sample(logits, jnp.array([0.0]), jnp.array([1.0]), keys).tolist() == [1]


def test_position_keys_depend_on_seed_and_position_only():
  a = sampling.position_keys(jnp.array([1, 2]), jnp.array([[0, 1, 2], [5, 6, 7]]))
  b = sampling.position_keys(jnp.array([2]), jnp.array([[6]]))
  np.testing.assert_array_equal(jax.random.key_data(a[1, 1]), jax.random.key_data(b[0, 0]))
  assert not np.array_equal(jax.random.key_data(a[0, 0]), jax.random.key_data(a[1, 0]))


def test_coupled_accept_draws_the_tokens_of_plain_sampling():
  """`coupled_accept` samples each position with its own key: accepting the drafts that
  plain decoding would have sampled, then its token at the first mismatch."""
  rng = np.random.default_rng(0)
  B, T = 6, 4
  logits = jnp.asarray(rng.standard_normal((B, T, 16)), jnp.float32)
  temperature = jnp.array([0.0, 0.7, 1.0, 1.3, 1.0, 0.0])
  top_p = jnp.array([1.0, 0.9, 1.0, 0.5, 1.0, 1.0])
  keys = sampling.position_keys(jnp.arange(B), jnp.arange(B * T).reshape(B, T))
  plain = np.asarray(sampling.sample(logits, temperature, top_p, keys))
  for correct in range(T):
    drafts = plain[:, :T - 1].copy()
    drafts[:, correct:] = (drafts[:, correct:] + 1) % 16
    accepted, tokens = sampling.coupled_accept(logits, jnp.asarray(drafts), temperature, top_p,
                                               keys)
    assert accepted.tolist() == [correct + 1] * B
    np.testing.assert_array_equal(tokens, plain)
  _, greedy_tokens = sampling.greedy_accept(logits, jnp.asarray(plain[:, :T - 1]))
  np.testing.assert_array_equal(np.asarray(greedy_tokens)[[0, 5]], plain[[0, 5]])


# ----------------------------------------------------------------------------- speculative


def _trials(rng: np.random.Generator):
  """T = 3 windows: drafts x1 ~ Q1, x2 ~ Q2[x1]; targets p1, P2[x1], P3 (fixed random)."""
  p1, q1 = dirichlet(rng), dirichlet(rng)
  P2, Q2 = dirichlet(rng, V), dirichlet(rng, V)  # [V, V]: conditional on x1
  P3 = dirichlet(rng)
  x1 = rng.choice(V, size=TRIALS, p=q1 / q1.sum())
  u = rng.random(TRIALS)
  cdf = np.cumsum(Q2[x1], axis=-1)
  x2 = np.minimum((u[:, None] > cdf).sum(-1), V - 1)  # inverse-CDF draw from Q2[x1]
  p = np.stack([np.broadcast_to(p1, (TRIALS, V)), P2[x1], np.broadcast_to(P3, (TRIALS, V))], 1)
  q = np.stack([np.broadcast_to(q1, (TRIALS, V)), Q2[x1]], 1)
  drafts = np.stack([x1, x2], 1).astype(np.int32)
  return (p1, P2, P3, q1), jnp.asarray(p), jnp.asarray(q), jnp.asarray(drafts)


def test_speculative_sampling_matches_the_target_distribution():
  rng = np.random.default_rng(2024)
  (p1, P2, P3, q1), p, q, drafts = _trials(rng)
  keys = jax.random.split(jax.random.key(11), TRIALS)
  accepted, tokens = jax.jit(sampling.speculative_accept)(p, q, drafts, keys)
  accepted, tokens = np.asarray(accepted), np.asarray(tokens)
  assert accepted.min() >= 1 and accepted.max() <= 3
  assert (tokens[np.arange(TRIALS), accepted - 1] >= 0).all()

  first = np.bincount(tokens[:, 0], minlength=V)
  assert chi_square(first, p1) < CHI2_CRITICAL_DF3
  # Negative control: the unverified drafts follow q1, which the test must reject.
  assert chi_square(np.bincount(np.asarray(drafts[:, 0]), minlength=V), p1) > 10 * CHI2_CRITICAL_DF3

  # Second token emitted in the same step (the first draft was accepted), given the first.
  two = accepted >= 2
  for a in range(V):
    rows = two & (tokens[:, 0] == a)
    assert chi_square(np.bincount(tokens[rows, 1], minlength=V), P2[a]) < CHI2_CRITICAL_DF3, a
  # The bonus after two accepted drafts follows p at the last position.
  bonus = np.bincount(tokens[accepted == 3, 2], minlength=V)
  assert chi_square(bonus, P3) < CHI2_CRITICAL_DF3

  # Acceptance of the first draft: P = sum_x min(p1(x), q1(x)) = 1 - TV(p1, q1); 5 sigma.
  want = np.minimum(p1, q1).sum()
  sigma = np.sqrt(want * (1 - want) / TRIALS)
  assert abs(two.mean() - want) < 5 * sigma


def test_speculative_sampling_one_hot_draft_accepts_with_probability_p():
  """A deterministic drafter (q one-hot at x) is accepted with probability p(x)."""
  rng = np.random.default_rng(5)
  p1 = dirichlet(rng)
  x = 2
  p = jnp.broadcast_to(jnp.asarray(np.stack([p1, p1])), (TRIALS, 2, V))
  q = jnp.broadcast_to(jax.nn.one_hot(jnp.array([x]), V), (TRIALS, 1, V))
  drafts = jnp.full((TRIALS, 1), x, jnp.int32)
  keys = jax.random.split(jax.random.key(3), TRIALS)
  accepted, tokens = sampling.speculative_accept(p, q, drafts, keys)
  accepted, tokens = np.asarray(accepted), np.asarray(tokens)
  sigma = np.sqrt(p1[x] * (1 - p1[x]) / TRIALS)
  assert abs((accepted == 2).mean() - p1[x]) < 5 * sigma
  assert chi_square(np.bincount(tokens[:, 0], minlength=V), p1) < CHI2_CRITICAL_DF3
  assert (tokens[accepted == 1, 0] != x).all()  # a rejection never re-emits the draft


def test_speculative_sampling_greedy_rows_are_exact():
  """One-hot p (temperature 0) accepts exactly the argmax prefix, whatever q is."""
  rng = np.random.default_rng(6)
  target = np.array([[3, 7, 1, 9], [2, 2, 2, 2]])
  p = sampling.target_probs(one_hot_logits(target), jnp.zeros(2), jnp.ones(2))
  q = jnp.asarray(rng.dirichlet(np.ones(16), size=(2, 3)), jnp.float32)
  drafts = jnp.array([[3, 7, 0], [1, 2, 2]])
  for seed in range(5):
    keys = jax.random.split(jax.random.key(seed), 2)
    accepted, tokens = sampling.speculative_accept(p, q, drafts, keys)
    assert accepted.tolist() == [3, 1]
    assert tokens.tolist() == [[3, 7, 1, -1], [2, -1, -1, -1]]
