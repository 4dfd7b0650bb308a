"""vcuda test suites."""
