"""``replayssm-jax demo``: the report of a small run on ``tiny-random``, the CLI text, errors.

One small setting (2 prompts x 16 tokens, T = 4, L = 16, xla) for every run of this file,
so the JSON run and the CLI text run share their compiled rounds (about 35 s of compiles
on a CPU, the rest is fast).
"""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from replayssm_jax import demo
from replayssm_jax.cli import build_parser, main

SMALL = dict(model="tiny-random", num_prompts=2, max_new_tokens=16, draft_tokens=4, ring_len=16,
             backend="xla")
SMALL_ARGS = ["--model", "tiny-random", "--prompts", "2", "--max-new-tokens", "16",
              "--draft-tokens", "4", "--ring-len", "16", "--backend", "xla"]


@pytest.fixture(scope="module")
def report() -> demo.DemoReport:
  return demo.run_demo(demo.DemoSettings(**SMALL),
                       progress=demo.ProgressBar(1, enabled=False))


def test_json_report(report):
  out = json.loads(json.dumps(demo.report_json(report)))  # JSON-serialisable
  assert out["identical"] is True and out["first_difference"] is None
  assert (out["num_prompts"], out["max_new_tokens"], out["draft_tokens"], out["ring_len"],
          out["backend"], out["drafter"]) == (2, 16, 4, 16, "xla", "ngram")
  assert out["model"]["name"] == "tiny-random" and out["model"]["params"] > 0
  assert 0 <= out["acceptance_rate"] <= 1 and 1 <= out["mean_accepted_length"] <= 4
  scratch = out["spec_scratch_bytes"]
  assert 0 < scratch["replayssm"] < scratch["recurrent"] and scratch["off"] == 0
  assert set(out["modes"]) == set(demo.MODES)
  for mode, m in out["modes"].items():
    assert m["generated_tokens"] == sum(len(o["tokens"]) for o in out["outputs"])
    assert m["tokens_per_s"] > 0 and m["steady_s"] > 0 and m["warmup_s"] > 0
    assert m["spec_scratch_bytes"] == scratch[mode]
    assert 0 <= m["acceptance_rate"] <= 1
  serving = out["serving_memory"]
  assert (serving["preset"], serving["num_slots"], serving["draft_tokens"],
          serving["ring_len"]) == ("qwen3.5-35b-a3b", 49, 4, 16)
  assert serving["intermediate_bytes"] == 30 * 49 * 4 * 32 * 128 * 128 * 4
  assert [o["prompt"] for o in out["outputs"]] == list(demo.DEMO_PROMPTS[:2])
  assert all(1 <= len(o["tokens"]) <= 16 for o in out["outputs"])


def test_cli_text_report(capsys):
  assert main(["demo", *SMALL_ARGS]) == 0
  text = capsys.readouterr().out
  for line in ("identical outputs (off / recurrent / replayssm): yes", "n-gram drafter: "
               "acceptance rate", "spec scratch at 2 slots: recurrent", "tokens/s",
               "Serving size: qwen3.5-35b-a3b at 49 slots", "11.48 GiB",
               "Sample (prompt 0, replayssm):", demo.DEMO_PROMPTS[0].splitlines()[0]):
    assert line in text
  for mode in demo.MODES:
    assert any(row.startswith(mode) for row in text.splitlines())


def test_cli_json(capsys):
  assert main(["demo", *SMALL_ARGS, "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["identical"] is True


def test_different_outputs_fail(report, capsys, monkeypatch):
  """A mode that emits another token is reported, and the command exits with 1."""
  run = report.runs["recurrent"]
  outputs = [list(o) for o in run.outputs]
  outputs[1][3] = (outputs[1][3] + 1) % 256
  bad = dataclasses.replace(report, runs={**report.runs,
                                          "recurrent": dataclasses.replace(run, outputs=outputs)})
  assert not bad.identical
  assert bad.first_difference() == {
      "prompt": 1, "token": 3, "off": report.runs["off"].outputs[1][3],
      "recurrent": outputs[1][3], "replayssm": report.runs["replayssm"].outputs[1][3]}
  assert "identical outputs (off / recurrent / replayssm): NO: prompt 1 differs at token 3" in (
      demo.format_report(bad))
  monkeypatch.setattr(demo, "run_demo", lambda settings, **_: bad)
  assert main(["demo", *SMALL_ARGS, "--json"]) == 1
  captured = capsys.readouterr()
  assert json.loads(captured.out)["identical"] is False
  assert "different tokens" in captured.err


@pytest.mark.parametrize("args, message", [
    (["--ring-len", "6"], "ring_len=6 must be a power of two"),
    (["--ring-len", "4"], "ring_len"),
    (["--prompts", "7"], "more than the 6 built-in prompts"),
    (["--prompts", "0"], "not a positive integer"),
    (["--draft-tokens", "1"], "leaves no draft token"),
    (["--backend", "cuda"], "invalid choice"),
    (["--temperature", "-1"], "temperature=-1.0"),
    (["--max-new-tokens", "x"], "invalid _positive_int value"),
    (["--model", "no-such-model"], "could not load model 'no-such-model'"),
], ids=["ring-not-pow2", "ring-too-short", "too-many-prompts", "zero-prompts", "t1", "backend",
        "temperature", "max-new-tokens", "unknown-model"])
def test_bad_args_are_argparse_errors(capsys, args, message):
  with pytest.raises(SystemExit) as e:
    main(["demo", *args])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err


def test_missing_default_weights_are_a_clear_error(capsys, monkeypatch):
  def missing(name):
    raise FileNotFoundError(f"model {name!r}: model.safetensors missing")

  monkeypatch.setattr(demo, "load_model", missing)
  with pytest.raises(SystemExit) as e:
    main(["demo"])
  assert e.value.code == 1
  err = capsys.readouterr().err
  assert f"could not load model '{demo.DEFAULT_MODEL}'" in err
  assert "replayssm-jax demo --model tiny-random" in err


def test_cli_defaults_match_settings():
  """The parser's defaults (kept in cli.py so that it imports no JAX) are DemoSettings'."""
  args = build_parser().parse_args(["demo"])
  settings = demo.DemoSettings(model=demo.DEFAULT_MODEL)
  assert (args.prompts, args.max_new_tokens, args.draft_tokens, args.ring_len, args.temperature,
          args.seed) == (settings.num_prompts, settings.max_new_tokens, settings.draft_tokens,
                         settings.ring_len, settings.temperature, settings.seed)
  assert args.model is None and args.backend is None and settings.backend == demo.default_backend()


def test_progress_bar_draws_on_a_terminal_only():
  stream = io.StringIO()
  bar = demo.ProgressBar(10, stream=stream)  # StringIO is no TTY
  bar.set_description("off: generating")
  bar.update(5)
  bar.close()
  assert stream.getvalue() == ""
  bar = demo.ProgressBar(10, stream=stream, enabled=True)
  bar.set_description("off: generating")
  bar.update(15)
  assert "off: generating" in stream.getvalue() and "10/10 tokens" in stream.getvalue()
  bar.close()
  assert stream.getvalue().endswith("\r\x1b[K")
