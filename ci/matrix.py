#!/usr/bin/env python3
"""Merge the lane CSVs into docs/support-matrix.md and PNG plots: see hwinfer/ci/matrix.py."""
import sys

from hwinfer.ci.matrix import main

if __name__ == "__main__":
    sys.exit(main())
