"""The ``replayssm-jax`` command line: one function per subcommand.

Subcommands:

- ``memory``: GDN cache memory of a preset model, recurrent verify against
  ReplaySSM (`replayssm_jax.memory`).

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

_DTYPES = ("bfloat16", "float16", "float32")

Handler = Callable[[argparse.Namespace, argparse.ArgumentParser], int]


def _cmd_memory(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
  """Print the memory table (or JSON) of ``args.preset``."""
  try:
    gdn = GDNConfig.preset(args.preset, tp=args.tp)
    report = memory.memory_report(gdn, num_slots=args.slots, draft_tokens=args.draft_tokens,
                                  ring_len=args.ring_len, activation_dtype=args.activation_dtype,
                                  ring_dtype=args.ring_dtype)
  except ValueError as e:
    parser.error(str(e))  # exits with code 2
  if args.json:
    print(json.dumps(memory.to_json(report), indent=2))
  else:
    print(memory.format_table(report))
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
  p.add_argument("--json", action="store_true", help="print JSON instead of the table")
  p.set_defaults(handler=_cmd_memory, subparser=p)


def build_parser() -> argparse.ArgumentParser:
  """The top-level parser with every subcommand."""
  parser = argparse.ArgumentParser(
      prog="replayssm-jax",
      description="ReplaySSM speculative decoding for Gated DeltaNet models in JAX.")
  parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  _add_memory(subparsers)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Run the command line; returns the exit code (argparse errors exit with 2).

  Args:
    argv: arguments without the program name; None reads ``sys.argv[1:]``.
  """
  parser = build_parser()
  args = parser.parse_args(argv)
  handler: Handler = args.handler
  return handler(args, args.subparser)


if __name__ == "__main__":
  sys.exit(main())
