"""``python -m mklscale``: the ``mklscale`` command (see :mod:`mklscale.cli`)."""

import sys

from mklscale.cli import main

sys.exit(main())
