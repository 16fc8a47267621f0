"""Several devices of one host through torch.distributed (issue 8).

* :mod:`hwinfer.parallel.launch`: run a function on N local processes, one per device, with
  the process group the device's backend names (``Backend.dist_backend``: nccl, xccl, hccl;
  gloo on the CPU), and get rank 0's result back, or a clear error naming the failing rank.
* :mod:`hwinfer.parallel.tensor`: tensor-parallel sharding of a loaded model in place
  (Qwen3.5 dense so far).
"""
from hwinfer.parallel.launch import RankContext, RankFailed, dist_backend_for, run_parallel
from hwinfer.parallel.tensor import shard_model

__all__ = ["RankContext", "RankFailed", "dist_backend_for", "run_parallel", "shard_model"]
