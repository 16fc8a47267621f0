"""CPU impls for the compressor family (being written)."""
IMPLS: list = []
