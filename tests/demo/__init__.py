"""Tests of the demo (scripts/demo)."""
