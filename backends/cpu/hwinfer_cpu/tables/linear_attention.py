"""CPU impls for the linear_attention family (being written)."""
IMPLS: list = []
