"""CI support: the results CSV schema, the conformance-to-CSV pytest plugin, the benchmark
output parser and the support-matrix generator. Used by ``ci/lane.sh`` and ``ci/matrix.py``;
nothing here is imported by the runtime."""
