"""Data-parallel RL training: several processes, each holding the whole policy, share every
step's rollouts and gradient.

Launch `seekrl train` with `torchrun --nproc_per_node N` (or `accelerate launch`, which sets
the same variables); `Dist.from_env` reads RANK / WORLD_SIZE / LOCAL_RANK and joins the
process group: gloo on CPU, NCCL on CUDA, each process on `cuda:LOCAL_RANK`. Several nodes
are the same launch with `--nnodes` and a rendezvous address; the run folder must be on a
filesystem every node sees (rank 0 writes it, the others read its checkpoints on resume).

What is split across the ranks and what is not:
- the step's questions: each rank plays a contiguous share (whole groups) and scores it; the
  episodes are then gathered in rank order, so every rank holds the whole batch in the
  order one process would have it, and the advantages (normalised over groups, strata or
  the batch) are one process's;
- the old / reference log-probs: each rank computes a share, gathered;
- the update: each mini-batch's micro-batches go to the ranks in turn; before every
  optimizer step the gradients are summed across ranks (one all-reduce per bucket), so
  every rank takes the same step from the same weights: the step one process takes after
  accumulating the same micro-batches;
- writes (config, metrics, rollouts, checkpoints, the final policy) and evaluations are
  rank 0's; the step's record and the decision to stop are broadcast from rank 0, so every
  rank stops at the same step.

The weights are replicated (DDP's memory model), not sharded: a model trains data-parallel
here when one GPU holds it with its optimizer state (LoRA, or full fine-tuning up to a few
billion parameters on 80 GB). Sharded training (FSDP / ZeRO) is not part of seekrl.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch

from seekrl.errors import DeviceError

T = TypeVar("T")

_BUCKET = 1 << 24   # gradient elements per all-reduce (64 MB of float32)


@dataclass(frozen=True)
class Dist:
    """This process's place among the training processes; `Dist()` is a single process,
    for which every method is the identity."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls, device: str) -> tuple["Dist", str]:
        """(this process's Dist, the device it trains on). One process when WORLD_SIZE is
        unset or 1; otherwise joins (or finds) the process group."""
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world <= 1:
            return cls(), device
        import torch.distributed as dist

        if "RANK" not in os.environ:
            raise DeviceError(f"WORLD_SIZE={world} but no RANK: launch several training "
                              "processes with torchrun (or accelerate launch)")
        rank = int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        kind, _, index = device.partition(":")
        if kind == "cuda":
            if index:
                raise DeviceError(f"device {device!r}: with {world} training processes give "
                                  "device cuda; each process takes cuda:LOCAL_RANK")
            device = f"cuda:{local}"
            torch.cuda.set_device(local)
            backend = "nccl"
        elif kind == "cpu":
            backend = "gloo"
        else:
            raise DeviceError(f"device {device!r}: data-parallel training runs on cpu (gloo) "
                              "or cuda (NCCL)")
        if not dist.is_initialized():
            # rank 0 evaluates and writes checkpoints while the others wait at the next
            # collective: a long evaluation must not time the group out
            dist.init_process_group(backend, timeout=timedelta(hours=3))
        if dist.get_world_size() != world or dist.get_rank() != rank:
            raise DeviceError(f"process group of {dist.get_world_size()} (rank "
                              f"{dist.get_rank()}) does not match WORLD_SIZE={world} RANK={rank}")
        return cls(rank, world, local), device

    # ---- splitting and gathering
    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share of `items` (the shares tile it in rank order)."""
        n = len(items)
        return list(items[self.rank * n // self.world:(self.rank + 1) * n // self.world])

    def gather(self, items: Sequence[T]) -> list[T]:
        """Every rank's list, concatenated in rank order, on every rank."""
        if not self.active:
            return list(items)
        import torch.distributed as dist

        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, list(items))
        return [x for part in parts for x in part]

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum_values(self, values: dict[str, float]) -> dict[str, float]:
        """Key-wise sums over the ranks (a key a rank lacks counts 0 there)."""
        if not self.active:
            return dict(values)
        total: dict[str, float] = {}
        for part in self.gather([dict(values)]):
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist
            dist.barrier()

    # ---- weights and gradients
    @torch.no_grad()
    def broadcast_parameters(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Rank 0's values of `params` on every rank (the start of training)."""
        if not self.active:
            return
        import torch.distributed as dist

        for p in params:
            dist.broadcast(p.data, src=0)

    @torch.no_grad()
    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over the ranks, in float32 buckets.
        A parameter that got no gradient on a rank counts zero there, and has the summed
        gradient afterwards; one that got none on any rank keeps none (as in one process,
        where the optimizer then leaves it alone: no weight decay, no momentum)."""
        if not self.active:
            return
        bucket: list[torch.nn.Parameter] = []
        size = 0
        for p in params:
            bucket.append(p)
            size += p.numel()
            if size >= _BUCKET:
                _all_reduce(bucket)
                bucket, size = [], 0
        if bucket:
            _all_reduce(bucket)


def _all_reduce(params: list[torch.nn.Parameter]) -> None:
    import torch.distributed as dist

    # the gradients, then one has-a-gradient flag per parameter, in one buffer
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                      .reshape(-1).to(torch.float32) for p in params]
                     + [torch.tensor([float(p.grad is not None) for p in params],
                                     device=params[0].device)])
    dist.all_reduce(flat)
    has_grad = flat[-len(params):].tolist()
    offset = 0
    for p, flag in zip(params, has_grad):
        g = flat[offset:offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
        if not flag:
            p.grad = None
        elif p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
