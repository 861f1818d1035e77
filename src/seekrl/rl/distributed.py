"""Data-parallel RL training: several processes, each holding the whole policy or a shard
of it, share every step's rollouts and gradient.

Launch `seekrl train` with `torchrun --nproc_per_node N` (or `accelerate launch
--multi_gpu`, which sets the same variables); `Dist.from_env` reads RANK / WORLD_SIZE /
LOCAL_RANK and joins the process group: gloo on CPU, NCCL on CUDA, each process on
`cuda:LOCAL_RANK`. Several nodes are the same launch with `--nnodes` and a rendezvous
address; the run folder must be on a filesystem every node sees (rank 0 writes it, the
others read its checkpoints on resume; sharded, every rank writes its shards there).

What is split across the ranks and what is not:
- the step's questions: each rank plays a contiguous share (whole groups) and scores it; the
  episodes are then gathered in rank order, so every rank holds the whole batch in the
  order one process would have it, and the advantages (normalised over groups, strata or
  the batch) are one process's;
- the old / reference log-probs: each rank computes a share, gathered;
- the update: each mini-batch's micro-batches go to the ranks in turn; before every
  optimizer step the gradients are summed across ranks (one all-reduce per bucket;
  sharded, FSDP's reduce-scatter of each block), so every rank takes the same step from
  the same weights: the step one process takes after accumulating the same micro-batches;
- writes (config, metrics, rollouts, checkpoints, the final policy) and evaluations are
  rank 0's (sharded, every rank writes its shards of a checkpoint); the step's record, the
  evaluations' numbers and the decision to stop are broadcast from rank 0, so every rank's
  monitor agrees and every rank stops at the same step.

By default the weights are replicated (DDP's memory model): each process holds the whole
policy with its gradient and optimizer state. With `shard: fsdp` they are sharded by PyTorch's
FSDP2 (`fully_shard`, what accelerate's FSDP2 plugin calls), ZeRO-3's memory model: each
process keeps 1/N of every trainable weight, its gradient and its optimizer state; the update
all-gathers one transformer block at a time and reduce-scatters its gradient (`Sharded`).
Rollouts, the old / reference log-probs and the evaluations are no-grad work whose number of
forward passes differs from rank to rank (episodes end at different turns), so they run on
the full weights, gathered once for the phase and freed after it (`Sharded.full`): the memory
of one replicated copy of the weights, which generation needs in any case. Checkpoints are
then sharded too (torch.distributed.checkpoint: one file per rank, written in parallel, read
back at any number of ranks); the final policy is gathered to rank 0 and saved as a plain
HF folder.
"""

from __future__ import annotations

import atexit
import copy
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch

from seekrl.errors import DeviceError

T = TypeVar("T")

_BUCKET = 1 << 24   # gradient elements per all-reduce (64 MB of float32)
_EXIT_HOOK: list[bool] = []   # whether `_leave_at_exit` is registered (once per process)


def _leave_at_exit() -> None:
    """At interpreter exit, while Python is still whole: give the GIL away for a moment.

    gloo's worker threads drop a finished collective's last reference after the caller's
    `wait()` has returned, and that drop takes the GIL (the work's tensors own their Python
    objects). A process whose last collective is near its end can reach interpreter
    finalization first; the worker then dies inside `take_gil` and the process aborts with
    "terminate called without an active exception" (PyTorch #190489): 4 of 10 runs of three
    `all_gather_object` calls and exit, 0 of 20 with this pause. The pause lets those
    workers finish while the interpreter can still serve them. The group is not destroyed
    here: after a crash a destroy can wait on peers that are gone."""
    time.sleep(0.1)


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
        if not _EXIT_HOOK:
            _EXIT_HOOK.append(True)
            atexit.register(_leave_at_exit)
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


# ---------------------------------------------------------------------- the training runtime
# One interface for one process, data-parallel and FSDP training, so that the PPO loop reads
# the same for all three: `forward` (the policy's training forward, with the critic's head),
# `full()` (the full weights for rollouts and no-grad passes), `loss_scale`, `assign` (which
# micro-batches this rank runs), `reduce_gradients`, `save` / `load` (a checkpoint's
# weights and optimizer state) and `gathered_policy` (the whole policy on rank 0).


def _in_turn(cuts: Sequence[list[int]], start: int, dist: Dist) -> list[tuple[list[int], bool]]:
    """The micro-batches that fall to this rank when they are dealt out in turn, counting
    from `start` (micro-batches dealt before)."""
    return [(list(c), True) for i, c in enumerate(cuts)
            if (start + i) % dist.world == dist.rank]


def trainable_names(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def _check_kind(folder: Path, *, sharded: bool) -> None:
    held = (folder / "shards").is_dir()
    if held != sharded:
        raise ValueError(f"{folder}: a {'sharded' if held else 'whole'} checkpoint; resume "
                         f"it with shard: {'fsdp and several processes' if held else 'none'} "
                         f"(this run is {'sharded' if sharded else 'not sharded'})")


class Replicated:
    """The whole policy in every process: one process, or data-parallel training in which
    every rank takes the same step on the gradients summed over the ranks. Rank 0 writes
    whole checkpoints (the weights are the same everywhere)."""

    loss_scale = 1.0

    def __init__(self, policy: torch.nn.Module, value_head: torch.nn.Module | None,
                 dist: Dist, *, temperature: float, share_prompts: bool):
        self.policy, self.value_head, self.dist = policy, value_head, dist
        self.temperature = temperature
        self.share_prompts = share_prompts

    def forward(self, input_ids, attention_mask, mask, entropy: bool | str = False) -> dict:
        from seekrl.rl.forward import masked_logprobs

        return masked_logprobs(self.policy, input_ids, attention_mask, mask,
                               temperature=self.temperature, entropy=entropy,
                               value_head=self.value_head, share_prompts=self.share_prompts)

    def full(self):
        return nullcontext()

    def assign(self, cuts: Sequence[list[int]], start: int) -> list[tuple[list[int], bool]]:
        return _in_turn(cuts, start, self.dist)

    def reduce_gradients(self, params) -> None:
        self.dist.sum_gradients(params)   # every rank then takes the same step

    def save(self, folder: Path, optimizer) -> dict:
        """Rank 0 writes the trainable weights (and the critic's head) into `folder`;
        returns what `optim.pt` records: the whole optimizer state."""
        if self.dist.main:
            names = trainable_names(self.policy)
            torch.save({k: v for k, v in self.policy.state_dict().items() if k in names},
                       folder / "policy.pt")
            if self.value_head is not None:
                torch.save(self.value_head.state_dict(), folder / "value_head.pt")
        return {"optimizer": optimizer.state_dict(), "sharded_optimizer": False}

    def load(self, folder: Path, optimizer, saved: dict) -> None:
        _check_kind(folder, sharded=False)
        device = next(iter(self.policy.parameters())).device
        state = torch.load(folder / "policy.pt", map_location=device)
        missing = set(state) ^ trainable_names(self.policy)
        if missing:
            raise ValueError(f"{folder}: checkpoint does not match this model/config "
                             f"(differing parameters, e.g. {sorted(missing)[:3]})")
        self.policy.load_state_dict(state, strict=False)
        if self.value_head is not None:
            self.value_head.load_state_dict(torch.load(folder / "value_head.pt",
                                                       map_location=device))
        optimizer.load_state_dict(saved["optimizer"])

    def gathered_policy(self) -> torch.nn.Module | None:
        return self.policy if self.dist.main else None


def make_runtime(policy: torch.nn.Module, value_head: torch.nn.Module | None, dist: Dist, *,
                 shard: bool, pad_id: int, temperature: float, share_prompts: bool):
    """`Sharded` when asked for and there are several processes, else `Replicated`."""
    if shard and dist.active:
        return Sharded(ShardedForward(policy, value_head, temperature), dist, pad_id)
    return Replicated(policy, value_head, dist, temperature=temperature,
                      share_prompts=share_prompts)


# ---------------------------------------------------------------------- sharded training


class ShardedForward(torch.nn.Module):
    """The policy's training forward (`masked_logprobs`, with the critic's head) as one module
    call. FSDP gathers a shard group's weights in its module's forward hook, and seekrl's
    forward calls the backbone and the LM head apart: this module is the root whose forward
    holds both, so the weights outside the blocks (embeddings, final norm, LM head, value
    head) are gathered and their gradients reduced like the blocks'.

    Prompt sharing is off here. It runs the blocks once or twice per micro-batch depending
    on the rows, while every rank must gather each block the same number of times; and the
    suffix pass reaches the prompt pass through the KV cache, behind FSDP's hooks, so the
    prompt pass's backward would find its block's weights already freed. On CPU the
    sharded update is 1.4x slower for it (`bench/shard.py --unshared`)."""

    def __init__(self, policy: torch.nn.Module, value_head: torch.nn.Module | None,
                 temperature: float):
        super().__init__()
        self.policy = policy
        self.value_head = value_head
        self.temperature = temperature

    def forward(self, input_ids, attention_mask, mask, entropy: bool | str = False):
        from seekrl.rl.forward import masked_logprobs

        return masked_logprobs(self.policy, input_ids, attention_mask, mask,
                               temperature=self.temperature, entropy=entropy,
                               value_head=self.value_head, share_prompts=False)


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks (the classes transformers lists in `_no_split_modules`),
    each a shard group of its own."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        from seekrl.config import ConfigError
        raise ConfigError(f"shard fsdp: cannot find the transformer blocks of "
                          f"{type(model).__name__} (it lists no _no_split_modules)")
    return blocks


class Sharded:
    """A `ShardedForward` sharded over the training processes (FSDP2): every transformer
    block a group, the rest the root's group. FSDP averages the gradients over the ranks;
    the trainer wants their sum (each rank's micro-batch losses are already its share of
    the mini-batch's), so it scales its losses by `loss_scale`, the number of ranks.

    Built by every rank from rank 0's weights; keeps a weightless (meta) copy of the policy
    to save the final model into."""

    share_prompts = False   # see ShardedForward

    def __init__(self, root: ShardedForward, dist: Dist, pad_id: int):
        try:
            from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
        except ImportError:
            from seekrl.config import ConfigError
            raise ConfigError(f"shard fsdp: needs torch >= 2.6 (FSDP2); this is torch "
                              f"{torch.__version__}") from None
        if not dist.active:
            raise ValueError("Sharded needs several training processes")
        self.dist = dist
        self.loss_scale = float(dist.world)
        self.root = root
        self.skeleton = _weightless_copy(root.policy)
        policy = MixedPrecisionPolicy(reduce_dtype=torch.float32)   # bf16 weights: fp32 sums
        for block in transformer_blocks(root.policy):
            fully_shard(block, mp_policy=policy)
        if root.value_head is not None:   # float32 beside bf16 weights: a group of its own
            fully_shard(root.value_head, mp_policy=policy)
        fully_shard(root, mp_policy=policy)
        self.units = [m for m in root.modules() if isinstance(m, FSDPModule)]
        self._depth = 0
        # FSDP takes as its root the first shard group to run forward: run the root once,
        # before any block is called alone (rollouts call the policy, not this module)
        device = next(iter(root.parameters())).device
        ids = torch.full((1, 3), pad_id, dtype=torch.long, device=device)
        with torch.no_grad():
            root(ids, torch.ones_like(ids), torch.tensor([[0, 0, 1]], device=device))
        # the root keeps its weights gathered after a forward: shard them again, so that
        # the module holds its shards (the optimizer must be built on those)
        self._forget_forwards()

    @contextmanager
    def full(self) -> Iterator[None]:
        """The full weights on every rank for the block (one all-gather per group, a
        collective: every rank enters), freed after it. Forward passes inside gather nothing,
        and are forgotten on the way out, so ranks may run different numbers of them;
        nested uses gather once."""
        if self._depth == 0:
            for unit in self.units:
                unit.set_reshard_after_forward(False, recurse=False)
                unit.unshard()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._forget_forwards()
                for unit in self.units:
                    unit.set_reshard_after_forward(unit is not self.root, recurse=False)

    def _forget_forwards(self) -> None:
        """Reshard every group, and forget the forward passes run so far. FSDP records
        each block's forward, no-grad ones too, and the first backward prefetches
        (all-gathers) the last one recorded: after a phase in which ranks ran different
        numbers of forwards, one rank would gather where another does not, and wait."""
        reset = getattr(self.root, "reset_iter_state", None)   # recent torch; else by hand
        if callable(reset):
            reset()
            return
        for unit in self.units:
            unit.reshard()
            state = unit._get_fsdp_state()
            state._comm_ctx.post_forward_order.clear()
            for group in state._fsdp_param_groups:
                group._post_forward_indices.clear()

    def forward(self, input_ids, attention_mask, mask, entropy: bool | str = False) -> dict:
        return self.root(input_ids, attention_mask, mask, entropy=entropy)

    def assign(self, cuts: Sequence[list[int]], start: int) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches in turn, then passes of weight 0 (`False`) on the first
        one until it runs as many as the busiest rank: every pass gathers the blocks and
        reduces their gradients, a collective every rank must enter."""
        mine = _in_turn(cuts, start, self.dist)
        busiest = -(-len(cuts) // self.dist.world)
        return mine + [(list(cuts[0]), False)] * (busiest - len(mine))

    def reduce_gradients(self, params) -> None:
        """Nothing: FSDP has summed them in the backward (reduce-scatter)."""

    # ---- checkpoints
    def _state(self, optimizer) -> dict:
        """The trainable weights' shards, with the optimizer's when `optimizer` is given
        (reading an optimizer's state dict gives a fresh optimizer a state: a step at lr 0,
        which counts in AdamW's bias correction, so an optimizer that has not stepped yet
        is saved as nothing)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_state_dict,
        )

        options = StateDictOptions(ignore_frozen_params=True)
        if optimizer is None:
            return {"model": get_model_state_dict(self.root, options=options)}
        model, optim = get_state_dict(self.root, optimizer, options=options)
        return {"model": model, "optim": optim}

    def save(self, folder: Path, optimizer) -> dict:
        """The trainable weights and the optimizer state, each rank writing its shards into
        `folder/shards` (every rank calls this). Returns what `optim.pt` records of them:
        no whole optimizer state, and whether the shards hold the optimizer's."""
        import torch.distributed.checkpoint as dcp

        stepped = bool(optimizer.state)
        dcp.save(self._state(optimizer if stepped else None),
                 checkpoint_id=str(folder / "shards"))
        return {"optimizer": None, "sharded_optimizer": stepped}

    def load(self, folder: Path, optimizer, saved: dict) -> None:
        """A checkpoint `save` wrote; `saved` is its `optim.pt`."""
        _check_kind(folder, sharded=True)
        self._load_shards(folder / "shards", optimizer,
                          with_optimizer=saved.get("sharded_optimizer", True))

    def _load_shards(self, folder: Path, optimizer, with_optimizer: bool = True) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_state_dict,
        )

        state = self._state(optimizer if with_optimizer else None)
        try:
            dcp.load(state, checkpoint_id=str(folder))
        except Exception as err:   # noqa: BLE001 - dcp raises its own kinds, per rank
            raise ValueError(f"{folder}: sharded checkpoint does not match this model/config "
                             f"({str(err).splitlines()[0][:300]})") from None
        options = StateDictOptions(ignore_frozen_params=True, strict=False)
        if with_optimizer:
            set_state_dict(self.root, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"], options=options)
        else:
            set_model_state_dict(self.root, state["model"], options=options)

    def gathered_policy(self) -> torch.nn.Module | None:
        """The policy with its full weights as a plain module, on rank 0 (None on the
        others, which only take part in the gather): what `save_policy` writes."""
        main = self.dist.main
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.root, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        if not main:
            return None
        prefix = "policy."
        plain = copy.deepcopy(self.skeleton)
        plain.load_state_dict({k[len(prefix):]: v for k, v in full.items()
                               if k.startswith(prefix)}, assign=True)
        from seekrl.models import causal_lm

        tie = getattr(causal_lm(plain), "tie_weights", None)
        if callable(tie):
            tie()   # assign=True gave tied weights a tensor each
        return plain


def _weightless_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` whose parameters are on the meta device (no memory), tied ones
    still tied; buffers are copied."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        if id(p) not in memo:
            memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"),
                                             requires_grad=p.requires_grad)
    return copy.deepcopy(module, memo)


def clip_grad_norm(params: Sequence[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_` for sharded gradients too: the norm of the whole gradient (a
    collective when some are shards), then every gradient scaled by the same factor."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not any(hasattr(g, "full_tensor") for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = torch.nn.utils.get_total_norm(grads)
    full = getattr(norm, "full_tensor", None)
    if callable(full):
        norm = full()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def state_bytes(modules, optimizer) -> int:
    """Bytes of the training state held by this process: the modules' parameters and
    gradients and the optimizer's tensors (shards count their local part)."""
    def size(t) -> int:
        local = getattr(t, "to_local", None)
        t = local() if callable(local) else t
        return t.numel() * t.element_size()

    tensors: dict[int, Any] = {}
    for m in modules:
        for p in m.parameters() if m is not None else ():
            tensors[id(p)] = p
            if p.grad is not None:
                tensors[id(p.grad)] = p.grad
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                tensors[id(v)] = v
    return sum(size(t) for t in tensors.values())


def peak_memory(dist: Dist, device: str, state: int) -> dict[str, float]:
    """The most memory any rank held: `peak_gpu_mb`, the GPU memory allocated at the step's
    peak (on CUDA); `peak_rss_mb`, the process's peak resident memory since it started
    (Linux and macOS); `state_mb`, the training state this rank keeps between steps (`state`
    bytes: its weights or their shards, the reference's and the optimizer's moments), which
    sharding divides by the number of ranks."""
    from seekrl.runtime import peak_rss_mb

    out = {"state_mb": state / 2**20}
    rss = peak_rss_mb()
    if rss is not None:
        out["peak_rss_mb"] = rss
    if device.startswith("cuda"):
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    peaks = dist.gather([out])
    return {k: round(max(p[k] for p in peaks), 1) for k in out}

