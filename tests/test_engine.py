"""`replayssm_jax.engine.Engine`: spec off, recurrent and ReplaySSM give the same tokens.

One tiny random target (`tiny_random_model(0)`, fp32, byte vocabulary), one draft model
(the target with 1% noise on every parameter: about 40% of its drafts are accepted, so
windows end at every position), 8 slots, ``max_len`` 320, T = 4, and a single batch bucket
of 8 rows, so every engine of this file reuses the same compiled rounds. ReplaySSM runs with
L = 16 (not the smallest L = 2T = 8, which folds before every verify), so verify windows also
read ring history.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from replayssm_jax import memory
from replayssm_jax.engine import (Engine, ModelDrafter, NgramDrafter, ScriptedDrafter,
                                  tiny_random_model)
from replayssm_jax.engine import engine as engine_module

SLOTS, MAX_LEN, T, BUCKETS = 8, 320, 4, (8,)
RING = 16  # L = 4T: ReplaySSM verifies read up to 8 committed records before each fold
NEW = 256  # greedy tokens per prompt in the main test
SAMPLED_NEW = 64
PROMPT_LENGTHS = (3, 6, 9, 14, 20, 27, 33, 40)
PROMPTS = [np.random.default_rng(n).integers(0, 256, n).tolist() for n in PROMPT_LENGTHS]
SPEC_MODES = ("recurrent", "replayssm")
# Sampled requests: mixed temperatures (one greedy row) and nuclei, one seed each.
SAMPLING = [dict(temperature=t, top_p=p, seed=100 + i) for i, (t, p) in enumerate(
    [(0.8, 0.95), (1.0, 1.0), (0.0, 1.0), (1.3, 0.9), (0.7, 0.5), (1.0, 0.95), (0.9, 1.0),
     (1.1, 0.8)])]


def noisy_copy(model, scale: float, seed: int):
  """``model`` with ``scale * std(p) * N(0, 1)`` added to every parameter array ``p``."""
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  leaves = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype) if x.size > 1 else x
            for x, k in zip(leaves, keys)]
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


@pytest.fixture(scope="module")
def target():
  return tiny_random_model(0)


@pytest.fixture(scope="module")
def draft_model(target):
  return noisy_copy(target, 0.01, seed=1)


def run(model, prompts, *, spec_mode="off", drafter=None, requests=None, max_new_tokens=NEW,
        **engine_kwargs):
  """Generate for every prompt in one engine; returns (outputs in prompt order, engine)."""
  engine = Engine(model, spec_mode=spec_mode, drafter=drafter, num_slots=SLOTS, max_len=MAX_LEN,
                  draft_tokens=T, ring_len=RING, batch_buckets=BUCKETS, **engine_kwargs)
  requests = requests or [{}] * len(prompts)
  ids = [engine.add_request(p, max_new_tokens=max_new_tokens, **kw)
         for p, kw in zip(prompts, requests)]
  out = engine.run_until_done()
  return [out[i] for i in ids], engine


@pytest.fixture(scope="module")
def greedy_reference(target):
  outputs, engine = run(target, PROMPTS)
  assert [len(o) for o in outputs] == [NEW] * len(PROMPTS)
  assert len({tuple(o[:8]) for o in outputs}) == len(PROMPTS)  # no degenerate output
  assert engine.metrics.steps == NEW - 1  # the first token comes from the prefill
  return outputs


def make_drafter(kind: str, draft_model, reference=None):
  if kind == "ngram":
    return NgramDrafter(max_n=3)
  if kind == "model":
    return ModelDrafter(draft_model)
  # scripted: 0..T-1 correct drafts, drawn afresh for every sequence length
  return ScriptedDrafter([p + o for p, o in zip(PROMPTS, reference)], vocab_size=258,
                         num_correct=lambda n, k: int(np.random.default_rng(n).integers(k + 1)))


# ----------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("spec_mode", SPEC_MODES)
@pytest.mark.parametrize("kind", ["ngram", "scripted", "model"])
def test_greedy_tokens_identical_across_modes(target, draft_model, greedy_reference, kind,
                                              spec_mode):
  """256 greedy tokens for 8 prompts of different lengths: the spec-off tokens, exactly."""
  drafter = make_drafter(kind, draft_model, greedy_reference)
  outputs, engine = run(target, PROMPTS, spec_mode=spec_mode, drafter=drafter)
  for b, (got, want) in enumerate(zip(outputs, greedy_reference)):
    assert got == want, (b, next(i for i, (g, w) in enumerate(zip(got, want)) if g != w))
  m = engine.metrics
  assert m.generated_tokens == NEW * len(PROMPTS)
  assert m.verify_rows > 0 and m.proposed_drafts == (T - 1) * m.verify_rows
  if kind == "scripted":  # every accepted length, equally often
    assert 0.4 < m.acceptance_rate < 0.6
  if kind == "model":
    assert 0.2 < m.acceptance_rate < 0.8, m.acceptance_rate
    assert m.drafter_bytes > 0
  assert m.steps < NEW if kind != "ngram" else m.steps <= NEW


@pytest.mark.parametrize("num_correct, rate, steps", [(T, 1.0, 16), (0, 0.0, 63)],
                         ids=["accept-all", "accept-none"])
def test_scripted_extremes(target, greedy_reference, num_correct, rate, steps):
  """Accept-all commits T tokens per round, accept-none one; both give the reference tokens."""
  drafter = ScriptedDrafter([p + o for p, o in zip(PROMPTS, greedy_reference)], vocab_size=258,
                            num_correct=num_correct)
  outputs, engine = run(target, PROMPTS, spec_mode="replayssm", drafter=drafter,
                        max_new_tokens=64)
  assert outputs == [o[:64] for o in greedy_reference]
  m = engine.metrics
  assert (m.acceptance_rate, m.mean_accepted_length, m.steps) == (rate, 1 + 3 * rate, steps)


def test_checkpoint_copy(target, greedy_reference):
  """`checkpoint_copy=jnp.bfloat16`: after a generation every layer's copy is exactly its
  committed checkpoint rounded (reset and fold write both), and the metrics count the copy.
  The tokens are the spec-off ones here; this model's greedy margins outlast the rounding
  (measured, not promised: the copy changes the logits within the bf16 floor)."""
  outputs, engine = run(target, PROMPTS, spec_mode="replayssm", drafter=NgramDrafter(max_n=3),
                        max_new_tokens=64, checkpoint_copy=jnp.bfloat16)
  assert outputs == [o[:64] for o in greedy_reference]
  cache = engine.cache.gdn.ssm
  assert cache.ssm_copy.dtype == jnp.bfloat16 and cache.ssm_copy.shape == cache.ssm.shape
  assert float(jnp.abs(cache.ssm).max()) > 0
  np.testing.assert_array_equal(np.asarray(cache.ssm_copy),
                                np.asarray(cache.ssm.astype(jnp.bfloat16)))
  report = memory.memory_report(target.config.gdn, num_slots=SLOTS, draft_tokens=T,
                                ring_len=RING, activation_dtype=jnp.float32,
                                checkpoint_copy=jnp.bfloat16)
  assert report.copy_bytes == cache.ssm_copy.nbytes > 0
  assert engine.metrics.spec_scratch_bytes["replayssm"] == (
      cache.ring_nbytes + cache.ssm_copy.nbytes + report.cursor_bytes)


# ----------------------------------------------------------------------------- sampled


@pytest.fixture(scope="module")
def sampled_reference(target):
  outputs, _ = run(target, PROMPTS, requests=SAMPLING, max_new_tokens=SAMPLED_NEW)
  return outputs


def test_sampling_is_seeded(target, greedy_reference, sampled_reference):
  again, _ = run(target, PROMPTS, requests=SAMPLING, max_new_tokens=SAMPLED_NEW)
  assert again == sampled_reference
  assert sampled_reference[2] == greedy_reference[2][:SAMPLED_NEW]  # the temperature-0 row
  differs = sum(s != g[:SAMPLED_NEW] for s, g in zip(sampled_reference, greedy_reference))
  assert differs == len(PROMPTS) - 1
  reseeded = [dict(kw, seed=kw["seed"] + 1) for kw in SAMPLING]
  other, _ = run(target, PROMPTS, requests=reseeded, max_new_tokens=SAMPLED_NEW)
  assert sum(a != b for a, b in zip(other, sampled_reference)) == len(PROMPTS) - 1


@pytest.mark.parametrize("spec_mode", SPEC_MODES)
@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_sampled_tokens_identical_across_modes(target, draft_model, sampled_reference, kind,
                                               spec_mode):
  """Deterministic drafters: verification draws the tokens plain sampling draws."""
  outputs, engine = run(target, PROMPTS, spec_mode=spec_mode,
                        drafter=make_drafter(kind, draft_model), requests=SAMPLING,
                        max_new_tokens=SAMPLED_NEW)
  assert outputs == sampled_reference
  if kind == "model":
    assert engine.metrics.accepted_drafts > 0  # q one-hot: accepted with probability p(draft)


def test_sampling_drafter_uses_speculative_sampling(target, draft_model, sampled_reference):
  """A drafter that samples (q returned) goes through `speculative_accept`: recurrent and
  ReplaySSM still agree with each other for a fixed seed; the greedy row stays exact."""
  outs = []
  for spec_mode in SPEC_MODES:
    drafter = ModelDrafter(draft_model, temperature=1.0, seed=5)
    outputs, engine = run(target, PROMPTS, spec_mode=spec_mode, drafter=drafter,
                          requests=SAMPLING, max_new_tokens=SAMPLED_NEW)
    assert engine.metrics.accepted_drafts > 0
    outs.append(outputs)
  assert outs[0] == outs[1]
  assert outs[0][2] == sampled_reference[2]


# ----------------------------------------------------------------------------- batching


def staggered(engine: Engine, arrivals: dict[int, list[tuple[list[int], dict]]],
              bad_requests: dict[int, dict]) -> dict[int, list[int]]:
  """Add requests at their arrival steps (bad ones must raise); returns outputs by order."""
  ids, step = {}, 0
  while step <= max(arrivals) or engine.has_work:
    for prompt, kw in arrivals.get(step, []):
      ids[len(ids)] = engine.add_request(prompt, **kw)
    if step in bad_requests:
      with pytest.raises(ValueError, match=bad_requests[step].pop("match")):
        engine.add_request(**bad_requests[step])
    engine.step()
    step += 1
  return {n: engine.request(rid).output for n, rid in ids.items()}


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_continuous_batching_equals_each_request_alone(target, draft_model, kind):
  """11 requests over 8 slots arrive at steps 0..9 and finish at different steps (lengths,
  stop tokens); bad requests in between raise and change nothing. Each output equals the
  request run alone; slots are reused; each round compiled once."""
  rng = np.random.default_rng(7)
  arrivals: dict[int, list] = {}
  for n in range(11):
    prompt = rng.integers(0, 256, int(rng.integers(1, 15))).tolist()
    kw = dict(max_new_tokens=int(rng.integers(5, 40)))
    if n % 3 == 1:
      kw["stop_tokens"] = rng.choice(256, 24, replace=False).tolist()
    if n % 4 == 2:
      kw.update(temperature=0.9, top_p=0.9, seed=n)
    arrivals.setdefault([0, 0, 0, 0, 0, 0, 1, 3, 3, 6, 9][n], []).append((prompt, kw))
  bad = {1: dict(prompt_tokens=[], match="empty"),
         2: dict(prompt_tokens=[1] * 300, max_new_tokens=30, match="max_len=320"),
         4: dict(prompt_tokens=[1, 258], match="outside the vocabulary"),
         5: dict(prompt_tokens=[1], temperature=-1.0, match="temperature"),
         7: dict(prompt_tokens=[1], top_p=0.0, match="top_p")}

  def engine():
    return Engine(target, spec_mode="replayssm",
                  drafter=make_drafter(kind, draft_model), num_slots=SLOTS, max_len=MAX_LEN,
                  draft_tokens=T, ring_len=RING, batch_buckets=BUCKETS)

  batched_engine = engine()
  batched = staggered(batched_engine, arrivals, bad)
  compiled = {name: getattr(engine_module, name)._cache_size()
              for name in ("_verify_round", "_decode_round")}
  requests = [r for step in sorted(arrivals) for r in arrivals[step]]
  reasons = set()
  for n, (prompt, kw) in enumerate(requests):
    alone = engine()
    rid = alone.add_request(prompt, **kw)
    alone.run_until_done()
    assert batched[n] == alone.request(rid).output, n
    reasons.add(alone.request(rid).finish_reason)
  assert reasons == {"stop", "length"}
  assert batched_engine.metrics.prefill_calls > 1  # queued requests entered freed slots
  assert batched_engine.num_running == batched_engine.num_waiting == 0
  assert {name: getattr(engine_module, name)._cache_size() for name in compiled} == compiled


# ----------------------------------------------------------------------------- errors, metrics


def test_configuration_errors(target):
  with pytest.raises(ValueError, match="spec_mode='fast' is unknown"):
    Engine(target, spec_mode="fast", num_slots=2, max_len=32)
  with pytest.raises(ValueError, match="drafter was given with spec_mode='off'"):
    Engine(target, drafter=NgramDrafter(), num_slots=2, max_len=32)
  with pytest.raises(ValueError, match="needs a Drafter"):
    Engine(target, spec_mode="replayssm", num_slots=2, max_len=32)
  with pytest.raises(ValueError, match="has 258"):
    Engine(target, spec_mode="recurrent", drafter=ScriptedDrafter([], vocab_size=100),
           num_slots=2, max_len=32)
  with pytest.raises(ValueError, match="ring_len=12 must be a power of two"):
    Engine(target, spec_mode="replayssm", drafter=NgramDrafter(), num_slots=2, max_len=32,
           ring_len=12)
  with pytest.raises(ValueError, match="num_slots=0"):
    Engine(target, num_slots=0, max_len=32)
  with pytest.raises(ValueError, match="checkpoint_copy=.*needs spec_mode='replayssm'"):
    Engine(target, spec_mode="recurrent", drafter=NgramDrafter(), num_slots=2, max_len=32,
           checkpoint_copy=jnp.bfloat16)
  with pytest.raises(ValueError, match="checkpoint_copy=float16 is not supported"):
    Engine(target, spec_mode="replayssm", drafter=NgramDrafter(), num_slots=2, max_len=32,
           checkpoint_copy=jnp.float16)


def test_queue_limit_and_request_errors(target):
  engine = Engine(target, num_slots=2, max_len=32, max_waiting=1)
  engine.add_request([1, 2], max_new_tokens=2)
  with pytest.raises(ValueError, match="max_waiting=1"):
    engine.add_request([3], max_new_tokens=2)
  for kwargs, match in [(dict(max_new_tokens=0), "max_new_tokens=0"),
                        (dict(max_new_tokens=40), "need 41 positions"),
                        (dict(seed=-1), "seed=-1"), (dict(stop_tokens=[999]), "stop_tokens")]:
    with pytest.raises(ValueError, match=match):
      engine.add_request([1], **{"max_new_tokens": 2, **kwargs})
  assert engine.num_waiting == 1


def test_spec_scratch_bytes(target):
  """Metrics report each mode's spec scratch (`memory.memory_report`); the engine's own
  cache holds exactly its mode's scratch: `intermediate` or the rings."""
  gdn = target.config.gdn
  report = memory.memory_report(gdn, num_slots=SLOTS, draft_tokens=T, ring_len=RING,
                                activation_dtype=jnp.float32)
  want = {"off": 0, "recurrent": report.intermediate_bytes,
          "replayssm": report.ring_bytes + report.cursor_bytes}
  caches = {}
  for mode in ("off",) + SPEC_MODES:
    engine = Engine(target, spec_mode=mode, drafter=None if mode == "off" else NgramDrafter(),
                    num_slots=SLOTS, max_len=MAX_LEN, draft_tokens=T, ring_len=RING)
    assert engine.metrics.spec_scratch_bytes == want
    caches[mode] = engine.cache
  assert want["replayssm"] < want["recurrent"]
  assert caches["recurrent"].gdn.ssm.intermediate.nbytes == want["recurrent"]
  assert caches["replayssm"].gdn.ssm.ring_nbytes == report.ring_bytes
