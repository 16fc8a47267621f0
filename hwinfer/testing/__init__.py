"""Test support shipped with the package: the conformance harness (used by pytest and CI lanes)."""
