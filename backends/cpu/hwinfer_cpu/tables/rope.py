"""CPU impls for the rope family (being written)."""
IMPLS: list = []
