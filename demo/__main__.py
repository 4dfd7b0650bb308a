"""Runs the demo: ``python -m demo --help`` explains."""

import sys

from demo.main import main

sys.exit(main())
