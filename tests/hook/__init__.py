"""Tests of the OCI hook: pure decisions, in-root file work, and real runc and crun runs."""
