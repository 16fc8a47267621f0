"""Portable kernels as plain functions, registered by no one: backends list them in their tables.

``kernels.triton``: Triton kernels (NVIDIA, AMD, Intel through its Triton backend).
``kernels.torch``: vectorised torch implementations that run on any device.
"""
