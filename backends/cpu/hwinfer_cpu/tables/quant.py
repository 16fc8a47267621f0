"""CPU impls for the quant family (being written)."""
IMPLS: list = []
