"""``python -m mklscale ...``: the same as the ``mklscale`` command (see ``mklscale.cli``)."""

import sys

from mklscale.cli import main

sys.exit(main())
