"""pytest: the doctest collection skips this package where the optional triton is not installed."""

try:
  import triton  # noqa: F401
except ImportError:
  collect_ignore_glob = ["*.py"]
