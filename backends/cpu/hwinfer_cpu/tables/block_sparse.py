"""CPU impls for the block_sparse family (being written)."""
IMPLS: list = []
