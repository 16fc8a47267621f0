"""Several devices of one host through torch.distributed (issue 8).

* :mod:`hwinfer.parallel.launch`: run a function on N local processes, one per device, with
  the process group the device's backend names (``Backend.dist_backend``: nccl, xccl, hccl;
  gloo on the CPU), and get rank 0's result back, or a clear error naming the failing rank.
* :mod:`hwinfer.parallel.tensor`: ``shard_model``, tensor-parallel sharding of a loaded model in
  place (Qwen3.5 dense there; Qwen3.5-MoE, Kimi-Linear and Kimi-K3 in ``models_kimi_qwen``,
  DeepSeek-V4 in ``deepseek_v4``).
* :mod:`hwinfer.parallel.expert`: expert parallelism, all-to-all dispatch / combine of MoE rows.
* :mod:`hwinfer.parallel.driver` (with ``handle`` and ``follower``): what
  ``load_model(..., tensor_parallel=N, expert_parallel=M)`` and ``hwinfer serve --tp N --ep M``
  run: this process is rank 0, the others mirror its model calls (docs/parallel.md).
"""
from hwinfer.parallel.launch import RankContext, RankFailed, dist_backend_for, run_parallel
from hwinfer.parallel.tensor import shard_model
from hwinfer.parallel.expert import Dispatch, expert_parallel_moe, token_slice
from hwinfer.parallel.deepseek_v4 import shard_deepseek_v4

__all__ = ["Dispatch", "RankContext", "RankFailed", "dist_backend_for", "expert_parallel_moe",
           "run_parallel", "shard_deepseek_v4", "shard_model", "token_slice"]
