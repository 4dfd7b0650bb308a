"""``python -m runtime_hook.node``: the ``vcuda-node`` command."""

import sys

from runtime_hook.node.cli import main

sys.exit(main())
