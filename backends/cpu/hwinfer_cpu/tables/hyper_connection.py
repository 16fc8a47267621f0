"""CPU impls for the hyper_connection family (being written)."""
IMPLS: list = []
