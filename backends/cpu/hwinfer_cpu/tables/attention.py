"""CPU impls for the attention family (being written)."""
IMPLS: list = []
