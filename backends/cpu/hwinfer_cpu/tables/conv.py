"""CPU impls for the conv family (being written)."""
IMPLS: list = []
