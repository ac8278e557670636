"""``python -m cwsa_jax.cli``: the ``cwsa-jax`` command."""

import sys

from cwsa_jax.cli import main

sys.exit(main())
