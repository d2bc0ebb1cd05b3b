"""``python -m gridbench.cli``: the same as ``gridbench``."""

import sys

from gridbench.cli import main

sys.exit(main())
