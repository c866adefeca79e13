"""``python -m replayssm_jax``: the ``replayssm-jax`` command line."""

import sys

from replayssm_jax.cli import main

sys.exit(main())
