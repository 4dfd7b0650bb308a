"""The container image: the Dockerfile built and checked."""
