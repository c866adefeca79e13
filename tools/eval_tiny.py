"""Measure the embedded model for its model card: held-out loss and n-gram draft acceptance.

Two numbers on the held-out split of ``tools/train_tiny.py`` (the same files, the same
rule), printed as JSON:

- held-out cross entropy in bits per byte over evenly spaced windows of the held-out
  stream (`train_tiny.eval_windows`);
- speculative decoding with the prompt-lookup `NgramDrafter`: greedy continuations of
  prompts cut from held-out files (a run of whole lines from a third of the way into each
  file), verified ``draft_tokens`` at a time by the `Engine` in ``replayssm`` mode; the
  acceptance rate and the mean accepted length (tokens per verify, bonus included), and,
  unless ``--no-baseline``, whether plain greedy decoding gives the same tokens and how
  many more rounds it needs.

Runs on a CPU in a few minutes for the 8 M-parameter model. Usage (repository root)::

    PYTHONPATH=$PWD python tools/eval_tiny.py                       # the shipped tiny-stdlib
    PYTHONPATH=$PWD python tools/eval_tiny.py --model runs/tiny_stdlib --out eval.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax

from replayssm_jax.engine import Engine, NgramDrafter
from replayssm_jax.engine.loading import DEFAULT_MODEL, load_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_tiny sits beside this file
from train_tiny import (build_corpus, device_name, eval_windows,  # noqa: E402
                        heldout_bits_per_byte)


def cut_prompt(text: bytes, prompt_bytes: int) -> bytes | None:
  """Whole lines of ``text`` from the first line start after a third of it, about
  ``prompt_bytes`` long (the last line completed); None when the file is too short."""
  start = text.find(b"\n", len(text) // 3) + 1
  if start <= 0 or len(text) - start < 2 * prompt_bytes:
    return None
  end = text.find(b"\n", start + prompt_bytes)
  return text[start:end + 1] if end >= 0 else None


def heldout_prompts(root: str, files: Sequence[str], count: int, prompt_bytes: int) -> list[bytes]:
  """``count`` prompts (`cut_prompt`) from held-out ``files``, spread over the sorted list."""
  candidates = []
  for rel in files:
    with open(os.path.join(root, rel), "rb") as f:
      prompt = cut_prompt(f.read(), prompt_bytes)
    if prompt is not None:
      candidates.append(prompt)
  if len(candidates) < count:
    raise ValueError(f"heldout_prompts: only {len(candidates)} held-out files are long enough "
                     f"for prompts of {prompt_bytes} bytes; ask for fewer --prompts.")
  step = len(candidates) / count
  return [candidates[int(i * step)] for i in range(count)]


def generate(model, prompts: list[list[int]], stops: Sequence[int], *, spec_mode: str,
             max_new_tokens: int, draft_tokens: int) -> tuple[list[list[int]], dict[str, Any]]:
  """Greedy outputs of every prompt (one slot each) and the engine's metrics."""
  T = 1 if spec_mode == "off" else draft_tokens
  engine = Engine(model, spec_mode=spec_mode,
                  drafter=None if spec_mode == "off" else NgramDrafter(),
                  num_slots=len(prompts), max_len=max(map(len, prompts)) + max_new_tokens + T,
                  draft_tokens=draft_tokens, batch_buckets=(len(prompts),))
  ids = [engine.add_request(p, max_new_tokens=max_new_tokens, stop_tokens=stops) for p in prompts]
  engine.run_until_done()
  return [engine.request(i).output for i in ids], engine.metrics.to_json()


def evaluate(model_name: str, *, source: str | None, eval_count: int, seq_len: int | None,
             batch: int, num_prompts: int, prompt_bytes: int, max_new_tokens: int,
             draft_tokens: int, baseline: bool) -> dict[str, Any]:
  """Every figure of the model card for ``model_name`` (a `load_model` name or folder)."""
  start = time.perf_counter()
  model, tokenizer, stops = load_model(model_name)
  corpus = build_corpus(source)
  seq_len = seq_len or min(model.config.max_position_embeddings, 1024)
  n_windows = max(1, eval_count // batch) * batch
  windows = eval_windows(corpus.heldout, n_windows, seq_len + 1)
  bpb = heldout_bits_per_byte(model, windows, batch)

  prompts = heldout_prompts(corpus.root, corpus.heldout_files, num_prompts, prompt_bytes)
  encoded = [list(p) for p in prompts]
  outputs, metrics = generate(model, encoded, stops, spec_mode="replayssm",
                              max_new_tokens=max_new_tokens, draft_tokens=draft_tokens)
  generation = {
      "spec_mode": "replayssm", "drafter": "ngram", "draft_tokens": draft_tokens,
      "greedy": True, "prompts": num_prompts, "prompt_bytes": prompt_bytes,
      "max_new_tokens": max_new_tokens,
      "acceptance_rate": metrics["acceptance_rate"],
      "mean_accepted_length": metrics["mean_accepted_length"],
      "verify_rounds": metrics["steps"], "generated_tokens": metrics["generated_tokens"],
      "metrics": metrics,
  }
  if baseline:
    plain, plain_metrics = generate(model, encoded, stops, spec_mode="off",
                                    max_new_tokens=max_new_tokens, draft_tokens=draft_tokens)
    generation.update(identical_to_plain_greedy=plain == outputs,
                      plain_decode_rounds=plain_metrics["steps"])
  samples = [{"prompt": tokenizer.decode(p), "continuation": tokenizer.decode(o)}
             for p, o in zip(encoded[:2], outputs[:2])]
  summary = corpus.summary()
  return {
      "model": model_name, "heldout_bits_per_byte": bpb,
      "heldout_eval": {"windows": n_windows, "seq_len": seq_len, "tokens": n_windows * seq_len},
      "generation": generation, "samples": samples,
      "data": {k: summary[k] for k in ("source", "python", "files", "bytes", "heldout_files",
                                       "heldout_tokens", "heldout_rule", "sha256")},
      "device": device_name(), "jax": jax.__version__, "python": platform.python_version(),
      "wall_s": time.perf_counter() - start,
  }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Run the command line; prints (or writes) the JSON and returns it."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default=DEFAULT_MODEL,
                 help=f"a load_model name or an HF folder (default: {DEFAULT_MODEL})")
  p.add_argument("--source", help="folder of *.py files (default: this Python's stdlib)")
  p.add_argument("--eval-windows", type=int, default=128, help="held-out windows (default 128)")
  p.add_argument("--seq-len", type=int,
                 help="tokens per window (default: the model's max_position_embeddings, <= 1024)")
  p.add_argument("--batch", type=int, default=8, help="windows per forward (default 8)")
  p.add_argument("--prompts", type=int, default=8, help="generation prompts (default 8)")
  p.add_argument("--prompt-bytes", type=int, default=384, help="prompt length (default 384)")
  p.add_argument("--max-new-tokens", type=int, default=128, help="per prompt (default 128)")
  p.add_argument("--draft-tokens", type=int, default=4,
                 help="verify window T, bonus included (default 4)")
  p.add_argument("--no-baseline", dest="baseline", action="store_false",
                 help="skip the plain greedy run that checks the speculative tokens")
  p.add_argument("--out", help="write the JSON here instead of stdout")
  args = p.parse_args(argv)
  result = evaluate(args.model, source=args.source, eval_count=args.eval_windows,
                    seq_len=args.seq_len, batch=args.batch, num_prompts=args.prompts,
                    prompt_bytes=args.prompt_bytes, max_new_tokens=args.max_new_tokens,
                    draft_tokens=args.draft_tokens, baseline=args.baseline)
  text = json.dumps(result, indent=2)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")
  else:
    print(text)
  return result


if __name__ == "__main__":
  main()
