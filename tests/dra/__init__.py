"""Tests of vcuda as a DRA driver."""
