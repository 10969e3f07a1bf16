"""``python -m statequery.cli``."""

import sys

from statequery.cli import main

sys.exit(main())
