"""CPU impls for the sparse_mla family (being written)."""
IMPLS: list = []
