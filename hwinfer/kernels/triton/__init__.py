"""Triton kernels; each module names the op contract it implements."""
