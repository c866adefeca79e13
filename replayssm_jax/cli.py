"""The ``replayssm-jax`` command line: one function per subcommand.

Subcommands:

- ``memory``: GDN cache memory of a preset model, recurrent verify against
  ReplaySSM (`replayssm_jax.memory`); ``--measure`` adds XLA's memory analysis
  of the compiled per-layer steps.
- ``generate``: generate text with speculative decoding (`replayssm_jax.engine`).
- ``demo``: the three decoding modes side by side on the embedded model
  (`replayssm_jax.demo`).

Every invalid argument ends in an argparse error (usage, message, exit code 2),
never a traceback; the messages of `config` validation pass through unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from replayssm_jax import __version__, memory
from replayssm_jax.config import PRESETS, GDNConfig
from replayssm_jax.kernels.backend import round_cpu_products_apart

_DTYPES = ("bfloat16", "float16", "float32")

Handler = Callable[[argparse.Namespace, argparse.ArgumentParser], int]


def _cmd_memory(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
  """Print the memory table (or JSON) of ``args.preset``; ``--measure`` adds XLA's figures."""
  if not args.measure:
    for flag, value in (("--batch", args.batch), ("--backend", args.backend),
                        ("--allocate", args.allocate or None)):
      if value is not None:
        parser.error(f"{flag} needs --measure")
  measured = None
  try:
    gdn = GDNConfig.preset(args.preset, tp=args.tp)
    report = memory.memory_report(gdn, num_slots=args.slots, draft_tokens=args.draft_tokens,
                                  ring_len=args.ring_len, activation_dtype=args.activation_dtype,
                                  ring_dtype=args.ring_dtype, checkpoint_copy=args.checkpoint_copy)
    if args.measure:
      measured = memory.measure_step_bytes(
          gdn, args.slots, args.draft_tokens, args.ring_len, batch=args.batch,
          activation_dtype=args.activation_dtype, ring_dtype=args.ring_dtype,
          backend=args.backend, allocate=args.allocate, checkpoint_copy=args.checkpoint_copy)
  except ValueError as e:
    parser.error(str(e))  # exits with code 2
  if args.json:
    print(json.dumps(memory.to_json(report, measured), indent=2))
  else:
    print(memory.format_table(report, measured))
  return 0


def _add_memory(subparsers) -> None:
  p = subparsers.add_parser(
      "memory", help="GDN cache memory: recurrent verify vs ReplaySSM",
      description="Bytes of the GDN caches of a preset model over all its GDN layers: the fp32 "
                  "checkpoint, the conv inputs, and the spec scratch of each verify mode "
                  "(recurrent `intermediate` vs the six ReplaySSM rings). Binary units.")
  p.add_argument("--preset", required=True, choices=sorted(PRESETS), metavar="NAME",
                 help=f"model geometry, one of: {', '.join(sorted(PRESETS))}")
  p.add_argument("--slots", type=int, required=True, metavar="N",
                 help="cache slots (spec slots + 1 padding slot)")
  p.add_argument("--draft-tokens", type=int, required=True, metavar="T",
                 help="verify window T, including the root/bonus token")
  p.add_argument("--ring-len", type=int, required=True, metavar="L",
                 help="ring records per slot, a power of two >= 2T")
  p.add_argument("--tp", type=int, default=1, metavar="N",
                 help="tensor-parallel degree; the report is per rank (default 1)")
  p.add_argument("--activation-dtype", choices=_DTYPES, default="bfloat16",
                 help="conv inputs and raw rings (default bfloat16)")
  p.add_argument("--ring-dtype", choices=_DTYPES, default=None,
                 help="d and normalised-k rings (default: the activation dtype)")
  p.add_argument("--checkpoint-copy", choices=("bfloat16",), default=None,
                 help="ReplaySSM keeps a bf16 copy of each checkpoint for verify to read "
                      "(SpecConfig.checkpoint_copy; default: none)")
  p.add_argument("--json", action="store_true", help="print JSON instead of the table")
  p.add_argument("--measure", action="store_true",
                 help="add measured bytes: compile one layer's verify and commit of each mode "
                      "ahead of time on shapes (nothing allocated) and read XLA's memory "
                      "analysis (per layer; a few seconds)")
  p.add_argument("--batch", type=int, default=None, metavar="B",
                 help="with --measure: rows per step (default: slots - 1)")
  p.add_argument("--backend", choices=("xla", "pallas"), default=None,
                 help="with --measure: kernels to compile (default: pallas on a GPU, xla on a "
                      "CPU, where Pallas compiles its interpreter)")
  p.add_argument("--allocate", action="store_true",
                 help="with --measure, on a GPU: also allocate one layer's caches for real, "
                      "run each step once and report the device's memory_stats()")
  p.set_defaults(handler=_cmd_memory, subparser=p)


# `generate` imports the engine (and with it the models and Flax) only when it runs, so
# that `memory` starts fast.


def _load_drafter(spec: str):
  """``"ngram"`` or ``"model:PATH_OR_NAME"`` -> a drafter; ValueError otherwise."""
  from replayssm_jax.engine import ModelDrafter, NgramDrafter, load_model

  if spec == "ngram":
    return NgramDrafter()
  if spec.startswith("model:") and len(spec) > len("model:"):
    draft_model, _, _ = load_model(spec[len("model:"):])
    return ModelDrafter(draft_model)
  raise ValueError(f"--drafter {spec!r} is unknown; use ngram, model:PATH (an HF folder or "
                   "tiny-random[:SEED]) or none.")


def _read_prompts(args: argparse.Namespace) -> list[str]:
  prompts = list(args.prompt or [])
  if args.prompt_file:
    with open(args.prompt_file, encoding="utf-8") as f:
      prompts.append(f.read().rstrip("\n"))
  return prompts


def _cmd_generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
  """Generate a continuation of every prompt; print the texts (or JSON) and the metrics."""
  from replayssm_jax.demo import default_backend
  from replayssm_jax.engine import Engine, load_model

  try:
    prompts = _read_prompts(args)
  except OSError as e:
    parser.error(f"--prompt-file: {e}")
  if not prompts:
    parser.error("give at least one --prompt or a --prompt-file")
  drafter_name = args.drafter or ("none" if args.spec_mode == "off" else "ngram")
  if args.spec_mode == "off" and drafter_name != "none":
    parser.error(f"--drafter {drafter_name} needs --spec-mode recurrent or replayssm")
  if args.spec_mode != "off" and drafter_name == "none":
    parser.error(f"--spec-mode {args.spec_mode} needs a drafter (ngram or model:PATH)")
  if args.checkpoint_copy is not None and args.spec_mode != "replayssm":
    parser.error(f"--checkpoint-copy needs --spec-mode replayssm (given {args.spec_mode})")
  try:
    model, tokenizer, stops = load_model(args.model)
    drafter = None if drafter_name == "none" else _load_drafter(drafter_name)
    encoded = [tokenizer.encode(p) for p in prompts]
    T = 1 if args.spec_mode == "off" else args.draft_tokens
    max_len = args.max_len or max(map(len, encoded)) + args.max_new_tokens + T
    engine = Engine(model, spec_mode=args.spec_mode, drafter=drafter,
                    num_slots=args.slots or len(prompts), max_len=max_len,
                    draft_tokens=args.draft_tokens, ring_len=args.ring_len,
                    batch_buckets=(args.slots or len(prompts),),
                    backend=args.backend or default_backend(),
                    checkpoint_copy=args.checkpoint_copy)
    stop_tokens = stops if args.stop_token is None else args.stop_token
    ids = [engine.add_request(tokens, max_new_tokens=args.max_new_tokens, stop_tokens=stop_tokens,
                              temperature=args.temperature, top_p=args.top_p, seed=args.seed + i)
           for i, tokens in enumerate(encoded)]
  except (ValueError, OSError) as e:
    parser.error(str(e))
  engine.run_until_done()
  outputs = []
  for prompt, tokens, rid in zip(prompts, encoded, ids):
    request = engine.request(rid)
    outputs.append({"prompt": prompt, "prompt_tokens": tokens, "tokens": request.output,
                    "text": tokenizer.decode(request.output),
                    "finish_reason": request.finish_reason})
  metrics = engine.metrics.to_json()
  if args.json:
    print(json.dumps({
        "model": args.model, "spec_mode": args.spec_mode, "drafter": drafter_name,
        "draft_tokens": engine.draft_tokens, "ring_len": engine.ring_len,
        "backend": engine.spec.backend, "checkpoint_copy": args.checkpoint_copy,
        "temperature": args.temperature, "top_p": args.top_p, "seed": args.seed,
        "tokenizer": getattr(tokenizer, "name", type(tokenizer).__name__),
        "outputs": outputs, "metrics": metrics}, indent=2))
  else:
    for out in outputs:
      print(f"{out['prompt']}{out['text']}")
    print(f"[{metrics['generated_tokens']} tokens, {metrics['steps']} steps, "
          f"{metrics['tokens_per_s']:.1f} tokens/s, acceptance {metrics['acceptance_rate']:.2f}, "
          f"mean accepted {metrics['mean_accepted_length']:.2f}]", file=sys.stderr)
  return 0


def _positive_int(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
  return value


def _add_kernel_backend(p: argparse.ArgumentParser) -> None:
  """``--backend`` of the commands that generate (None: `demo.default_backend`)."""
  p.add_argument("--backend", choices=("xla", "pallas", "triton"), default=None,
                 help="GDN kernels (default: pallas on a GPU, xla on a CPU, where Pallas runs "
                      "in slow interpret mode)")


def _add_generate(subparsers) -> None:
  p = subparsers.add_parser(
      "generate", help="generate text with speculative decoding",
      description="Generate a continuation of each prompt with a hybrid GDN model, plain or "
                  "speculative (recurrent or ReplaySSM verify). Greedy and seeded sampled "
                  "generations give the same tokens in every mode.")
  p.add_argument("--model", required=True, metavar="PATH_OR_NAME",
                 help="an HF Qwen3.5 / Qwen3-Next folder, or tiny-random[:SEED] (a small random "
                      "model over UTF-8 bytes)")
  p.add_argument("--prompt", action="append", metavar="TEXT",
                 help="a prompt (repeat for a batch)")
  p.add_argument("--prompt-file", metavar="F", help="a file whose text is one more prompt")
  p.add_argument("--max-new-tokens", type=_positive_int, default=64, metavar="N",
                 help="tokens to generate per prompt (default 64)")
  p.add_argument("--spec-mode", choices=("off", "recurrent", "replayssm"), default="off",
                 help="speculative decoding: off, or the target's verify mode (default off)")
  p.add_argument("--drafter", metavar="ngram|model:PATH|none",
                 help="who drafts: prompt-lookup n-grams, a draft model (HF folder or "
                      "tiny-random[:SEED]), or none (default: ngram with speculation, else none)")
  p.add_argument("--draft-tokens", type=_positive_int, default=4, metavar="T",
                 help="verify window T, including the last committed token (default 4)")
  p.add_argument("--ring-len", type=_positive_int, default=None, metavar="L",
                 help="ReplaySSM ring length, a power of two >= 2T (default: the smallest)")
  p.add_argument("--temperature", type=float, default=0.0, metavar="X",
                 help="0 for greedy (default), else the sampling temperature")
  p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus (default 1)")
  p.add_argument("--seed", type=int, default=0, metavar="S",
                 help="sampling seed; prompt i uses S + i (default 0)")
  p.add_argument("--stop-token", type=int, action="append", metavar="ID",
                 help="a token id that ends a generation (repeatable; default: the model's EOS)")
  p.add_argument("--slots", type=_positive_int, default=None, metavar="N",
                 help="concurrent requests (default: one per prompt)")
  p.add_argument("--max-len", type=_positive_int, default=None, metavar="N",
                 help="positions per slot (default: longest prompt + max-new-tokens + T)")
  _add_kernel_backend(p)
  p.add_argument("--checkpoint-copy", choices=("bfloat16",), default=None,
                 help="replayssm: verify and decode read a bf16 copy of each checkpoint (half "
                      "their bytes; the committed state stays exact, tokens may differ)")
  p.add_argument("--json", action="store_true",
                 help="print JSON: token ids, text and metrics of every prompt")
  p.set_defaults(handler=_cmd_generate, subparser=p)


def _cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
  """Run the demo; print its report (or JSON). Exit 0 only when every mode agreed."""
  from replayssm_jax import demo

  try:
    settings = demo.DemoSettings(
        model=args.model or demo.DEFAULT_MODEL, num_prompts=args.prompts,
        max_new_tokens=args.max_new_tokens, draft_tokens=args.draft_tokens,
        ring_len=args.ring_len, backend=args.backend, temperature=args.temperature,
        seed=args.seed)
  except ValueError as e:
    parser.error(str(e))
  try:
    report = demo.run_demo(settings)
  except demo.ModelLoadError as e:
    if args.model is not None:  # a model the user named: an argument error
      parser.error(str(e))
    parser.exit(1, f"{parser.prog}: error: {e}\n")
  except ValueError as e:
    parser.error(str(e))
  if args.json:
    print(json.dumps(demo.report_json(report), indent=2))
  else:
    print(demo.format_report(report))
  if not report.identical:
    print(f"{parser.prog}: error: the three modes generated different tokens "
          f"({report.first_difference()})", file=sys.stderr)
    return 1
  return 0


def _add_demo(subparsers) -> None:
  p = subparsers.add_parser(
      "demo", help="spec off vs recurrent vs ReplaySSM on the embedded model",
      description="Generate from a few built-in Python prompts with the embedded model (a small "
                  "byte-level GDN hybrid trained on Python standard-library source) three ways: "
                  "plain decoding, speculative decoding with recurrent verify, and with ReplaySSM "
                  "verify (n-gram drafter). Reports whether the outputs are identical (exit code "
                  "1 if not), the drafter's acceptance, tokens/s of each mode after a warm-up "
                  "that compiles, the spec scratch of each mode, and the GDN cache memory of "
                  "Qwen3.5-35B-A3B at serving size.")
  p.add_argument("--model", default=None, metavar="PATH_OR_NAME",
                 help="tiny-random[:SEED], an HF Qwen3.5 / Qwen3-Next folder, or the embedded "
                      "model (default: tiny-stdlib)")
  p.add_argument("--prompts", type=_positive_int, default=4, metavar="N",
                 help="how many of the 6 built-in prompts to run, as one batch (default 4)")
  p.add_argument("--max-new-tokens", type=_positive_int, default=128, metavar="N",
                 help="tokens to generate per prompt (default 128)")
  p.add_argument("--draft-tokens", type=_positive_int, default=4, metavar="T",
                 help="verify window T, including the last committed token (default 4)")
  p.add_argument("--ring-len", type=_positive_int, default=16, metavar="L",
                 help="ReplaySSM ring length, a power of two >= 2T (default 16)")
  _add_kernel_backend(p)
  p.add_argument("--temperature", type=float, default=0.0, metavar="X",
                 help="0 for greedy (default), else seeded sampling")
  p.add_argument("--seed", type=int, default=0, metavar="S",
                 help="sampling seed; prompt i uses S + i (default 0; no effect when greedy)")
  p.add_argument("--json", action="store_true", help="print a JSON report instead of the text")
  p.set_defaults(handler=_cmd_demo, subparser=p)


def build_parser() -> argparse.ArgumentParser:
  """The top-level parser with every subcommand."""
  parser = argparse.ArgumentParser(
      prog="replayssm-jax",
      description="ReplaySSM speculative decoding for Gated DeltaNet models in JAX.")
  parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  _add_memory(subparsers)
  _add_generate(subparsers)
  _add_demo(subparsers)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Run the command line; returns the exit code (argparse errors exit with 2).

  Args:
    argv: arguments without the program name; None reads ``sys.argv[1:]``.
  """
  parser = build_parser()
  args = parser.parse_args(argv)
  round_cpu_products_apart()  # the committed state bitwise on a CPU too (README)
  handler: Handler = args.handler
  return handler(args, args.subparser)


if __name__ == "__main__":
  sys.exit(main())
