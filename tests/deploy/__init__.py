"""Tests of the deployment: manifests, and the certificate tool `vcuda-certs`."""
