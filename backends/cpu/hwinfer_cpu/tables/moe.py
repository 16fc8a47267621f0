"""CPU impls for the moe family (being written)."""
IMPLS: list = []
