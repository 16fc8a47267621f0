"""Op contracts: one module per op family, each op with a plain-PyTorch reference.

Conventions shared by every op (the docstring of each reference gives its own details):

* Shapes are written ``[T, H, D]`` (tokens, heads, channels) for packed token-major inputs and
  ``[B, T, H, D]`` for batched ones; several sequences in one packed tensor are delimited by
  ``cu_seqlens`` [N+1] int32 (cumulative lengths starting at 0).
* References accumulate in fp32, return the input dtype unless stated, and never raise for
  valid inputs; invalid inputs raise ValueError naming the problem.
* Index outputs are int32; -1 marks an invalid (padding) entry.
* State goes in and comes out explicitly: linear-attention and compressor state in fp32, the
  short-conv state (raw past inputs) in the input dtype.

``hwinfer.ops.all_ops()`` lists every contract; ``hwinfer.ops.reference.<name>`` is the
reference function of op ``<name>``.
"""
from hwinfer.ops import (  # noqa: F401  (importing a family module declares its ops)
    activation,
    attention,
    block_sparse,
    compressor,
    conv,
    dense,
    hyper_connection,
    indexer,
    kv_pack,
    linear_attention,
    moe,
    norm,
    paging,
    quant,
    rope,
    sampling,
    sparse_mla,
)
from hwinfer.ops.contract import OpSpec, Tol, all_ops, get_op


class _References:
    """``reference.rms_norm(...)``: the reference of any op by name."""

    def __getattr__(self, name: str):
        return get_op(name).reference

    def __dir__(self):
        return list(all_ops())


reference = _References()

__all__ = ["OpSpec", "Tol", "all_ops", "get_op", "reference"]
