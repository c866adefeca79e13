"""``replayssm-jax generate``: the CLI examples run on a CPU and their JSON is checked.

In-process runs use ``--slots 8 --max-len 320 --ring-len 16`` (tests/test_engine.py's), so
they reuse its compiled rounds; one subprocess run checks the installed entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from replayssm_jax.cli import main
from replayssm_jax.engine import ByteTokenizer

PROMPTS = ["Hello, world", "Bye"]
HF_TINY = os.path.join(os.path.dirname(__file__), "data", "tiny_qwen3_5")  # vocab 128, no tokenizer
SHAPES = ["--slots", "8", "--max-len", "320", "--ring-len", "16"]


def generate(capsys, *args: str) -> dict:
  argv = ["generate", "--model", "tiny-random", "--max-new-tokens", "24", "--json", *SHAPES]
  for p in PROMPTS:
    argv += ["--prompt", p]
  assert main(argv + list(args)) == 0
  return json.loads(capsys.readouterr().out)


def check_json(out: dict, spec_mode: str, drafter: str) -> None:
  assert (out["spec_mode"], out["drafter"], out["tokenizer"]) == (spec_mode, drafter, "bytes")
  assert out["draft_tokens"] == (1 if spec_mode == "off" else 4)
  assert out["ring_len"] == 16
  tokenizer = ByteTokenizer()
  assert [o["prompt"] for o in out["outputs"]] == PROMPTS
  for o in out["outputs"]:
    assert o["prompt_tokens"] == list(o["prompt"].encode())
    assert o["text"] == tokenizer.decode(o["tokens"])
    assert all(0 <= t < 258 for t in o["tokens"])
    if o["finish_reason"] == "length":
      assert len(o["tokens"]) == 24
    else:
      assert o["finish_reason"] == "stop" and o["tokens"][-1] == 257  # EOS
  m = out["metrics"]
  assert m["generated_tokens"] == sum(len(o["tokens"]) for o in out["outputs"])
  assert m["prefill_calls"] == 1 and m["steps"] >= 1 and m["tokens_per_s"] > 0
  assert set(m["spec_scratch_bytes"]) == {"off", "recurrent", "replayssm"}
  assert m["spec_scratch_bytes"]["replayssm"] < m["spec_scratch_bytes"]["recurrent"]
  if spec_mode == "off":
    assert m["verify_rows"] == 0 and m["acceptance_rate"] == 0
  else:
    assert m["verify_rows"] > 0 and 1 <= m["mean_accepted_length"] <= 4


SAMPLED = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "3"]


@pytest.mark.parametrize("sampling", [[], SAMPLED], ids=["greedy", "sampled"])
def test_generate_json_same_tokens_in_every_mode(capsys, sampling):
  off = generate(capsys, *sampling)
  check_json(off, "off", "none")
  for spec_mode, drafter in [("replayssm", "ngram"), ("recurrent", "model:tiny-random:1")]:
    out = generate(capsys, "--spec-mode", spec_mode, "--drafter", drafter, *sampling)
    check_json(out, spec_mode, drafter)
    assert [o["tokens"] for o in out["outputs"]] == [o["tokens"] for o in off["outputs"]]


def test_generate_checkpoint_copy_and_backend(capsys):
  """``--checkpoint-copy bfloat16 --backend xla`` reach the engine and the JSON."""
  out = generate(capsys, "--spec-mode", "replayssm", "--drafter", "ngram", "--backend", "xla",
                 "--checkpoint-copy", "bfloat16")
  check_json(out, "replayssm", "ngram")
  assert (out["backend"], out["checkpoint_copy"]) == ("xla", "bfloat16")
  plain = generate(capsys, "--spec-mode", "replayssm", "--drafter", "ngram")
  assert (plain["backend"], plain["checkpoint_copy"]) == ("xla", None)  # a CPU's default
  copy = out["metrics"]["spec_scratch_bytes"]["replayssm"]
  assert copy > plain["metrics"]["spec_scratch_bytes"]["replayssm"]


@pytest.mark.parametrize("args, message", [
    (["--spec-mode", "replayssm", "--drafter", "eagle"], "--drafter 'eagle' is unknown"),
    (["--drafter", "ngram"], "needs --spec-mode recurrent or replayssm"),
    (["--spec-mode", "recurrent", "--drafter", "none"], "needs a drafter"),
    (["--prompt", ""], "prompt is empty"),
    (["--temperature", "-1"], "temperature=-1.0"),
    (["--spec-mode", "replayssm", "--ring-len", "6"], "ring_len=6 must be a power of two"),
    (["--max-len", "20"], "max_len=20"),
    (["--prompt", "caf\u00e9", "--model", HF_TINY], "outside the model's vocabulary"),
    (["--checkpoint-copy", "bfloat16"], "--checkpoint-copy needs --spec-mode replayssm"),
], ids=["unknown-drafter", "drafter-without-spec", "spec-without-drafter", "empty-prompt",
        "temperature", "ring-len", "too-long", "byte-outside-vocab", "copy-without-replayssm"])
def test_generate_errors(capsys, args, message):
  argv = ["generate", "--model", "tiny-random", "--prompt", "hi", *args]
  with pytest.raises(SystemExit) as e:
    main(argv)
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_memory_subcommand_still_works(capsys):
  assert main(["memory", "--preset", "qwen3.5-4b", "--slots", "9", "--draft-tokens", "4",
               "--ring-len", "16", "--json"]) == 0
  assert "intermediate_bytes" in capsys.readouterr().out


def test_generate_entry_point_subprocess():
  """``python -m replayssm_jax generate ... --json`` in a fresh process (4 tokens)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-m", "replayssm_jax", "generate", "--model", "tiny-random:2",
       "--prompt", "Hi", "--max-new-tokens", "4", "--spec-mode", "replayssm", "--json"],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr
  out = json.loads(result.stdout)
  assert out["model"] == "tiny-random:2" and len(out["outputs"][0]["tokens"]) <= 4
