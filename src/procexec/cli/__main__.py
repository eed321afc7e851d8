"""``python -m procexec.cli``: the same entry point as the ``procexec`` command."""

import sys

from procexec.cli import main

sys.exit(main())
