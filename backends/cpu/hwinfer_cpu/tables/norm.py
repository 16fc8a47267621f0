"""CPU impls for the norm family (being written)."""
IMPLS: list = []
