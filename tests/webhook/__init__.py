"""Tests of the admission webhook."""
