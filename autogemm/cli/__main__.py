"""`python -m autogemm.cli`: the `autogemm` command."""

import sys

from . import main

sys.exit(main())
