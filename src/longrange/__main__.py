"""``python -m longrange`` (used with ``torchrun -m longrange ...`` for data parallelism)."""

import sys

from longrange.cli import main

sys.exit(main())
