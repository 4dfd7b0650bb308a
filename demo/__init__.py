"""The demo of vcuda's whole path on one machine: ``bash scripts/demo`` (``python -m demo``)."""
