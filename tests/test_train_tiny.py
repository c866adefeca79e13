"""The embedded model's pipeline: `HybridLM.forward`, ``tools/train_tiny.py``, the
``tiny-stdlib`` loader and ``tools/eval_tiny.py``'s prompts.

One smoke training (module fixture, ``--preset smoke`` on a small fixed corpus) serves the
training, saving and loading checks; on a CPU the file runs in well under a minute.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from replayssm_jax import SpecConfig, hf
from replayssm_jax.engine import ByteTokenizer, loading
from replayssm_jax.engine.tokenizer import EOS
from replayssm_jax.models import HybridLM

from conftest import TOLERANCE, rel_err

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import eval_tiny  # noqa: E402
import train_tiny  # noqa: E402

SMOKE = train_tiny.PRESETS["smoke"]


def _tokens(seed: int) -> jax.Array:
  """Random byte-vocabulary tokens ``int32[2, 40]`` (one shape: `_forward_jit` compiles once)."""
  return jnp.asarray(np.random.default_rng(seed).integers(0, 258, (2, 40)), jnp.int32)


def _forward(model: HybridLM, tokens: jax.Array) -> jax.Array:
  graphdef, params = nnx.split(model)
  return _forward_jit(graphdef, params, tokens)


@jax.jit(static_argnames="graphdef")
def _forward_jit(graphdef, params, tokens):
  return nnx.merge(graphdef, params).forward(tokens)


# ----------------------------------------------------------------------------- forward


def test_forward_matches_prefill():
  model = HybridLM(SMOKE.model, rngs=nnx.Rngs(3))
  tokens = _tokens(0)
  spec = SpecConfig(draft_tokens=2, ring_len=4)
  cache = model.init_cache(spec, num_slots=3, max_len=48)
  prefill, _ = model.prefill(cache, tokens, jnp.array([40, 40], jnp.int32),
                             jnp.array([2, 0], jnp.int32), spec)
  assert rel_err(_forward(model, tokens), prefill) < TOLERANCE[("float32", "ieee")]


def test_forward_rejects_bad_tokens():
  model = HybridLM(SMOKE.model, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"tokens must be an integer array \[B, T\]"):
    model.forward(jnp.zeros((4,), jnp.int32))


# ----------------------------------------------------------------------------- data


def test_stdlib_split_is_deterministic_and_disjoint():
  root = train_tiny.stdlib_root()
  files = train_tiny.list_sources(root)
  assert files == sorted(files) and files == train_tiny.list_sources(root)
  assert not any(part in train_tiny.EXCLUDED_DIRS for f in files for part in f.split("/")[:-1])
  assert "os.py" in files and "json/decoder.py" in files
  a, b = train_tiny.build_corpus(), train_tiny.build_corpus()
  assert a.summary() == b.summary()
  assert set(a.train_files).isdisjoint(a.heldout_files)
  assert sorted(a.train_files + a.heldout_files) == files
  assert 0.02 < len(a.heldout_files) / len(files) < 0.1
  assert a.train.dtype == np.uint16 and a.train.max() == EOS
  assert int((a.train == EOS).sum()) == len(a.train_files)


def test_heldout_rule_depends_on_the_path_only():
  paths = [f"pkg{i}/mod{j}.py" for i in range(20) for j in range(20)]
  held = [p for p in paths if train_tiny.is_heldout(p)]
  assert held == [p for p in reversed(paths) if train_tiny.is_heldout(p)][::-1]
  assert 5 < len(held) < 40  # about 1 in HELDOUT_EVERY = 20


def test_learning_rate_schedule():
  lrs = [train_tiny.learning_rate(s, 100, 1e-3, 10) for s in range(100)]
  assert lrs[9] == pytest.approx(1e-3) and lrs[0] == pytest.approx(1e-4)
  assert all(x >= y for x, y in zip(lrs[9:], lrs[10:]))
  assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


# ----------------------------------------------------------------------------- smoke training

# A small fixed corpus: Python-like files with a lot of structure to learn quickly.
_LINES = ["def f{i}(x):\n    return x + {i}\n\n", "class C{i}:\n    value = {i}\n\n",
          "for i in range({i}):\n    print(i)\n\n"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  """``(model, log, out)`` of a smoke training on the fixed corpus."""
  source = tmp_path_factory.mktemp("source")
  for i in range(40):
    (source / f"mod{i:02d}.py").write_text("".join(_LINES[(i + j) % 3].format(i=j)
                                                   for j in range(30)))
  corpus = train_tiny.build_corpus(str(source))
  out = tmp_path_factory.mktemp("tiny_smoke")
  model, log = train_tiny.train(SMOKE, corpus, str(out), steps=SMOKE.steps, batch=SMOKE.batch,
                                seq_len=SMOKE.seq_len, lr=SMOKE.lr, seed=0, time_budget=600,
                                print_fn=lambda line: None)
  return model, log, out


def test_smoke_training_reduces_loss(smoke):
  _, log, out = smoke
  assert log["steps"] == SMOKE.steps and log["stop_reason"] == "steps"
  history = log["history"]
  assert history[-1]["loss"] < history[0]["loss"] - 1.0  # nats: about 5.4 -> 3.8
  assert log["heldout_bits_per_byte"] < log["initial_heldout_bits_per_byte"] - 2
  assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                   "train_log.json"]
  written = json.loads((out / "train_log.json").read_text())
  assert written["seed"] == 0 and written["data"]["files"] == 40
  assert written["python"] and written["device"]


def test_budget_shrinks_the_schedule_and_stops():
  now = time.perf_counter()
  budget = train_tiny.Budget(start=now - 50, seconds=100, reserve=10)
  assert not budget.exhausted()
  assert budget.fit(step=10, total=1000, step_s=0.1) in range(405, 411)  # 40 s left: 400 more steps
  assert budget.fit(step=10, total=100, step_s=0.1) == 100
  late = train_tiny.Budget(start=now - 95, seconds=100, reserve=10)
  assert late.exhausted() and late.fit(step=10, total=1000, step_s=0.1) == 10
  assert train_tiny.Budget(start=now - 1e6, seconds=None).fit(3, 7, 1.0) == 7


def test_saved_model_loads_with_the_same_logits(smoke):
  model, log, out = smoke
  assert log["saved_dtype"] == "bfloat16"
  assert abs(log["saved_heldout_bits_per_byte"] - log["heldout_bits_per_byte"]) < 0.05
  # The file holds the weights rounded to bf16; loading casts them back to fp32 exactly.
  rounded = train_tiny.round_params(model, jnp.bfloat16)
  loaded, config = hf.load_hf_model(str(out))
  assert config == model.config
  tokens = _tokens(2)
  np.testing.assert_array_equal(_forward(loaded, tokens), _forward(rounded, tokens))
  via_name, tokenizer, stops = loading.load_model(str(out))
  assert isinstance(tokenizer, ByteTokenizer) and stops == [EOS]
  np.testing.assert_array_equal(_forward(via_name, tokens), _forward(rounded, tokens))
  assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_tiny_stdlib_loads_from_the_package_folder(smoke, monkeypatch):
  model, _, out = smoke
  monkeypatch.setattr(loading, "tiny_stdlib_folder", lambda: out)
  loaded, tokenizer, stops = loading.load_model(loading.DEFAULT_MODEL)
  assert loading.DEFAULT_MODEL == loading.TINY_STDLIB == "tiny-stdlib"
  assert isinstance(tokenizer, ByteTokenizer) and stops == [EOS]
  assert loaded.config == model.config


def test_tiny_stdlib_without_weights_says_so(tmp_path, monkeypatch):
  monkeypatch.setattr(loading, "tiny_stdlib_folder", lambda: tmp_path)
  with pytest.raises(FileNotFoundError, match="'tiny-stdlib': config.json, model.safetensors "
                                              "missing"):
    loading.load_model("tiny-stdlib")


@pytest.mark.skipif(not loading.tiny_stdlib_folder().joinpath("model.safetensors").is_file(),
                    reason="the trained tiny-stdlib weights are not in the package yet")
def test_shipped_tiny_stdlib():
  model, tokenizer, stops = loading.load_model("tiny-stdlib")
  assert model.config.vocab_size == 258 and stops == [EOS]
  tokens = jnp.asarray([tokenizer.encode("import os\n")], jnp.int32)
  logits = _forward(model, tokens)
  assert bool(jnp.isfinite(logits).all())


# ----------------------------------------------------------------------------- eval prompts


def test_prompts_are_whole_lines_from_a_third_in():
  text = b"".join(b"line %d\n" % i for i in range(300))
  prompt = eval_tiny.cut_prompt(text, 64)
  assert prompt.startswith(b"line ") and prompt.endswith(b"\n") and len(prompt) >= 64
  assert text.find(prompt) >= len(text) // 3
  assert eval_tiny.cut_prompt(b"short\n" * 10, 64) is None
