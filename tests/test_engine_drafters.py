"""`replayssm_jax.engine.drafters`: n-gram lookup, scripted drafts, the draft model's rollback."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from replayssm_jax import SpecConfig
from replayssm_jax.engine import ModelDrafter, NgramDrafter, ScriptedDrafter, tiny_random_model

# ----------------------------------------------------------------------------- n-gram


@pytest.mark.parametrize("history, max_n, k, want", [
    # the longest suffix wins: [1, 2, 3] occurred at 0 (followed by 9 5 2) ...
    ([1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3], 3, 3, [9, 5, 2]),
    # ... with max_n = 2 only [2, 3] is tried: its latest earlier occurrence is followed by 7.
    ([1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3], 2, 3, [7, 1, 2]),
    ([4, 1, 8, 4, 1, 9, 4, 1], 2, 3, [9, 4, 1]),  # the most recent occurrence
    ([1, 2, 3, 1, 2, 3], 3, 5, [1, 2, 3, 1, 2]),  # a loop is continued with its period
    ([7, 7], 3, 3, [7, 7, 7]),  # the copy may run into the suffix itself
    ([5, 6, 8], 3, 2, [8, 8]),  # no match: repeat the last token
    ([5], 3, 2, [5, 5]),
], ids=["longest", "max-n", "most-recent", "loop", "overlap", "no-match", "one-token"])
def test_ngram_proposals(history, max_n, k, want):
  draft = NgramDrafter(max_n=max_n).propose([history], k)
  assert draft.tokens.tolist() == [want] and draft.probs is None
  assert draft.tokens.dtype == np.int32


def test_ngram_batch_and_min_n():
  draft = NgramDrafter(max_n=3, min_n=2).propose([[1, 2, 9, 1], [3, 4, 3, 4]], 2)
  assert draft.tokens.tolist() == [[1, 1], [3, 4]]  # [1] alone is below min_n: fallback
  assert NgramDrafter().propose([[1, 2]], 0).tokens.shape == (1, 0)
  with pytest.raises(ValueError, match="min_n"):
    NgramDrafter(max_n=1, min_n=2)


# ----------------------------------------------------------------------------- scripted


@pytest.mark.parametrize("num_correct, want", [
    (10, [4, 5, 6]), (0, [5, 6, 7]), (2, [4, 5, 7]),
], ids=["accept-all", "accept-none", "prefix-2"])
def test_scripted_drafts(num_correct, want):
  drafter = ScriptedDrafter([[1, 2, 3, 4, 5, 6, 7]], vocab_size=10, num_correct=num_correct)
  assert drafter.propose([[1, 2, 3]], 3).tokens.tolist() == [want]


def test_scripted_every_prefix_and_unknown_history():
  drafter = ScriptedDrafter([[1, 2, 3, 4, 5, 6, 7, 8, 9]], vocab_size=10,
                            num_correct=lambda n, k: n % (k + 1))
  ref = [1, 2, 3, 4, 5, 6, 7, 8, 9]
  for n in range(1, 6):
    got = drafter.propose([ref[:n]], 3).tokens[0].tolist()
    correct = n % 4
    assert got[:correct] == ref[n:n + correct]
    assert all(g != r for g, r in zip(got[correct:], ref[n + correct:]))
  assert drafter.propose([[9, 9]], 2).tokens.tolist() == [[9, 9]]  # not a reference prefix
  past_end = ScriptedDrafter([ref], vocab_size=10).propose([ref[:8]], 3)
  assert past_end.tokens.tolist() == [[9, 9, 9]]  # the reference's last token repeated


# ----------------------------------------------------------------------------- draft model

T = 4  # the engine's window: 3 drafts
SLOTS, MAX_LEN = 4, 96


@pytest.fixture(scope="module")
def draft_model():
  return tiny_random_model(1)


def greedy_continuation(model, history: list[int], k: int) -> list[int]:
  """The draft model's own greedy continuation: plain prefill + decode steps (recurrent)."""
  spec = SpecConfig(draft_tokens=1, ring_len=2, verify_mode="recurrent")
  cache = model.init_cache(spec, 1, MAX_LEN)
  slot = jnp.array([0], jnp.int32)
  tokens = np.zeros((1, 64), np.int32)
  tokens[0, :len(history)] = history
  logits, cache = model.prefill(cache, jnp.asarray(tokens), jnp.array([len(history)], jnp.int32),
                                slot, spec)
  out = [int(jnp.argmax(logits[0, len(history) - 1]))]
  while len(out) < k:
    logits, cache = model.decode(cache, jnp.array([[out[-1]]], jnp.int32), slot, spec)
    out.append(int(jnp.argmax(logits[0, 0])))
  return out


@pytest.mark.parametrize("verify_mode", ["recurrent", "replayssm"])
def test_model_drafter_rolls_back_to_the_accepted_prefix(draft_model, verify_mode):
  """Through accept-all, accept-none, partial acceptances, a long jump and a reused slot, every
  proposal equals the draft model's greedy continuation of the current sequence: rejected
  drafts leave nothing behind."""
  drafter = ModelDrafter(draft_model, verify_mode=verify_mode)
  drafter.bind(num_slots=SLOTS, max_len=MAX_LEN, num_drafts=T - 1, vocab_size=258,
               batch_buckets=(2, 4))
  rng = np.random.default_rng(0)
  seqs = {1: list(rng.integers(0, 256, 7)), 3: list(rng.integers(0, 256, 12))}
  # accepted counts per step for the two rows (T = all drafts + bonus; 1 = none)
  schedule = [(4, 1), (1, 2), (3, 4), (2, 3), ("jump", 1), (4, 4), ("reset", 2)]
  for step in schedule:
    slots = list(seqs)
    draft = drafter.propose([seqs[s] for s in slots], T - 1, slots)
    assert draft.probs is None
    for b, s in enumerate(slots):
      want = greedy_continuation(draft_model, seqs[s], T - 1)
      assert draft.tokens[b].tolist() == want, (step, s)
    for b, (s, acc) in enumerate(zip(slots, step)):
      if acc == "jump":  # more new tokens than one window: catch-up in several windows
        seqs[s] += list(rng.integers(0, 256, 2 * T + 1))
      elif acc == "reset":  # a new one-token request in the slot: prefill of 0 tokens
        drafter.reset(s)
        seqs[s] = list(rng.integers(0, 256, 1))
      else:
        bonus = (int(draft.tokens[b, acc - 1]) + 1) % 256 if acc < T else 17
        seqs[s] += draft.tokens[b, :acc - 1].tolist() + [bonus]


def test_model_drafter_sampling_returns_q(draft_model):
  def run():
    drafter = ModelDrafter(draft_model, temperature=1.0, top_p=0.9, seed=3)
    drafter.bind(num_slots=SLOTS, max_len=MAX_LEN, num_drafts=T - 1, vocab_size=258,
                 batch_buckets=(2, 4))
    return drafter.propose([[5, 6, 7], [8, 9]], T - 1, [0, 2])
  a, b = run(), run()
  np.testing.assert_array_equal(a.tokens, b.tokens)  # seeded
  q = np.asarray(a.probs)
  assert q.shape == (2, T - 1, 258)
  np.testing.assert_allclose(q.sum(-1), 1, rtol=1e-5)
  assert (np.take_along_axis(q, a.tokens[..., None], -1) > 0).all()


def test_model_drafter_errors(draft_model):
  drafter = ModelDrafter(draft_model)
  with pytest.raises(ValueError, match="vocabulary has 258 tokens but the target model's has 128"):
    drafter.bind(num_slots=2, max_len=32, num_drafts=3, vocab_size=128)
  with pytest.raises(ValueError, match="bind"):
    drafter.propose([[1]], 1, [0])
  with pytest.raises(ValueError, match="temperature"):
    ModelDrafter(draft_model, temperature=-1.0)
