"""Benchmarks run from the command line (``hwinfer bench ...``)."""
