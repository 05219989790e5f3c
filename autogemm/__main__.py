"""`python -m autogemm`: the `autogemm` command."""

import sys

from .cli import main

sys.exit(main())
