"""CPU impls for the indexer family (being written)."""
IMPLS: list = []
