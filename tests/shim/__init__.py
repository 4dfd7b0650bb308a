"""Tests of libvcuda.so: against the test-double driver in CI, against a real GPU where marked."""
