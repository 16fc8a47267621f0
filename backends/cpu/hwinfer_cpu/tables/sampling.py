"""CPU impls for the sampling family (being written)."""
IMPLS: list = []
