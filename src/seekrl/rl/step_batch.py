"""Rewards as data, and the step batch the advantage estimators read.

Rewards are token-level, as in verl's `core_algos.py`: an episode's score is its outcome
(outcome + format reward - penalties, placed on the last policy token) plus one process
reward per step (placed on that step's last token, `Step.end - 1`). `Rewards` keeps both
parts as plain data (the outcome alone, the per-step rewards, each process source's part).

`StepBatch.build(trajectories, rewards, values=None)` lays a batch out once, as padded
tensors (B episodes x T tokens, S steps), so that estimators are tensor functions with
explicit masks: the token rewards, the loss mask, the step each token belongs to, the step
rewards with their mask, each process source's values with the steps it applies to, group
ids as an index, and the critic's values. The trajectories stay reachable for what only
their text holds (GiGPO's anchor states, `anchor_states`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from seekrl.agent.protocol import normalise_text
from seekrl.agent.trajectory import Trajectory, group_indices


@dataclass
class Rewards:
    """Each episode's outcome and each step's process reward; `tokens`, when given, one
    tensor per episode of rewards on single tokens (the KL penalty of `algo.kl_in_reward`),
    added to the token-level view and to the totals. `sources`, when given, the process
    reward's parts before they were summed: name -> (weight, one value per step of each
    episode, None where the source does not apply), for the estimators that normalise each
    source over the steps it judges (`dual_granularity`)."""
    outcome: list[float]
    steps: list[list[float]]
    tokens: list[torch.Tensor] | None = None
    sources: dict[str, tuple[float, list[list[float | None]]]] | None = None

    def __post_init__(self) -> None:
        if len(self.outcome) != len(self.steps):
            raise ValueError(f"rewards: {len(self.outcome)} outcomes but {len(self.steps)} "
                             "step lists")

    @classmethod
    def outcome_only(cls, trajectories: Sequence[Trajectory], outcome: Sequence[float]
                     ) -> "Rewards":
        return cls([float(r) for r in outcome], [[0.0] * len(t.steps) for t in trajectories])

    @classmethod
    def from_trajectories(cls, trajectories: Sequence[Trajectory],
                          weights: Mapping[str, float] | None = None) -> "Rewards":
        """`outcome_reward` and each step's `process_reward` (None counts as 0); with the
        process sources' `weights` (`reward.process`), each source's part from
        `Step.process_parts` as `sources`."""
        sources = None
        if weights:
            sources = {name: (float(w), [[s.process_parts.get(name) for s in t.steps]
                                         for t in trajectories])
                       for name, w in weights.items()}
        return cls([float(t.outcome_reward or 0.0) for t in trajectories],
                   [[float(s.process_reward or 0.0) for s in t.steps] for t in trajectories],
                   sources=sources)

    def totals(self) -> list[float]:
        extra = [float(x.sum()) for x in self.tokens] if self.tokens is not None \
            else [0.0] * len(self.outcome)
        return [o + sum(s) + e for o, s, e in zip(self.outcome, self.steps, extra)]

    def token_level(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """One tensor per trajectory: the outcome on its last policy token, each step's
        reward on that step's last token (`StepBatch.token_rewards`, unpadded)."""
        batch = StepBatch.build(trajectories, self)
        return batch.unpad(batch.token_rewards)


def last_policy_token(t: Trajectory) -> int | None:
    for i in range(len(t.loss_mask) - 1, -1, -1):
        if t.loss_mask[i]:
            return i
    return None


def step_reward_position(t: Trajectory, step) -> int:
    """Where a step's reward goes: its last token. A step without tokens (only in data
    written before turns kept their end-of-turn token) hands it to the nearest policy token
    before it, else after it, so no reward is lost."""
    if step.end > step.start:
        return step.end - 1
    for i in range(min(step.start, len(t.loss_mask)) - 1, -1, -1):
        if t.loss_mask[i]:
            return i
    for i in range(max(step.start, 0), len(t.loss_mask)):   # the nearest after it
        if t.loss_mask[i]:
            return i
    return 0


def anchor_states(t: Trajectory, kind: str) -> list[tuple]:
    """The state before each step: the queries so far (in order; another tool's calls with
    their argument, invalid turns as a turn), or the set of documents retrieved so far."""
    states, queries, docs = [], [], set(t.prompt_hits or [])
    for s in t.steps:
        states.append(tuple(queries) if kind == "queries" else tuple(sorted(docs)))
        if s.action == "search":
            queries.append(normalise_text(s.query))
        elif s.query is not None:   # `open 2` and `open 5` lead to different states
            queries.append(f"<{s.action}> " + normalise_text(s.query))
        else:
            queries.append(f"<{s.action}>")
        docs.update(s.hits)
    return states


def as_rewards(trajectories: Sequence[Trajectory], rewards: Rewards | Sequence[float]
               ) -> Rewards:
    """`rewards` checked against the trajectories: a `Rewards`, or one outcome per
    trajectory (no step rewards)."""
    if not isinstance(rewards, Rewards):
        rewards = list(rewards)
        if len(rewards) != len(trajectories):
            raise ValueError(f"rewards: expected one per trajectory ({len(trajectories)}), "
                             f"got {len(rewards)}")
        rewards = Rewards.outcome_only(trajectories, rewards)
    if len(rewards.outcome) != len(trajectories):
        raise ValueError(f"rewards: expected one per trajectory ({len(trajectories)}), "
                         f"got {len(rewards.outcome)}")
    for t, steps in zip(trajectories, rewards.steps):
        if len(steps) != len(t.steps):
            raise ValueError(f"rewards: episode {t.example_id!r} has {len(t.steps)} steps but "
                             f"{len(steps)} step rewards")
    for source, (_, rows) in (rewards.sources or {}).items():
        if len(rows) != len(trajectories) or any(len(r) != len(t.steps)
                                                 for r, t in zip(rows, trajectories)):
            raise ValueError(f"rewards: process source {source!r} does not have one value per "
                             "step of every episode")
    return rewards


@dataclass
class StepSource:
    """One process source's part of the step rewards: its weight, its value per step
    (B, S; 0 where it does not apply) and where it applies (B, S; False for a None step and
    for padding)."""
    weight: float
    values: torch.Tensor
    applies: torch.Tensor


@dataclass
class StepBatch:
    """A batch of episodes laid out for the estimators: B episodes, padded to T tokens and
    S steps. Float tensors are float32 on tokens and float64 (the rewards' own precision)
    on episodes and steps; padding is 0 (False, -1 for indices)."""
    trajectories: list[Trajectory]   # for what only their text holds, and old-form estimators
    rewards: Rewards                 # as given (old-form estimators read it)
    lengths: torch.Tensor            # (B,) long: len(token_ids)
    loss_mask: torch.Tensor          # (B, T) float32: 1 on policy tokens
    policy: torch.Tensor             # (B, T) bool: loss_mask != 0
    token_rewards: torch.Tensor      # (B, T) float32: outcome, step rewards, `Rewards.tokens`
    step_index: torch.Tensor         # (B, T) long: the step holding each token, -1 outside
    step_mask: torch.Tensor          # (B, S) bool: a real step
    step_rewards: torch.Tensor       # (B, S) float64: each step's process reward
    step_reward_position: torch.Tensor  # (B, S) long: the token its reward sits on
    outcome: torch.Tensor            # (B,) float64
    totals: torch.Tensor             # (B,) float64: outcome + step rewards + token rewards
    sources: dict[str, StepSource]   # each process source's part (empty: none given)
    group_index: torch.Tensor        # (B,) long: the group, numbered by first appearance
    groups: list[torch.Tensor]       # each group's episodes (ascending), by group_index
    n_searches: torch.Tensor         # (B,) long
    tree_ids: list[int | None]       # `Trajectory.tree`
    values: torch.Tensor | None = None   # (B, T) float32: the critic's V at each token
    # steps without tokens (old data), as (episode, step): their value goes to one token
    empty_steps: list[tuple[int, int]] = field(default_factory=list)
    _anchors: dict[str, list[list[tuple]]] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.loss_mask.shape)

    @classmethod
    def build(cls, trajectories: Sequence[Trajectory], rewards: Rewards | Sequence[float],
              values: Sequence[torch.Tensor] | None = None) -> "StepBatch":
        """`rewards`: a `Rewards`, or one outcome per trajectory. `values`: one tensor per
        trajectory aligned with `token_ids` (a critic's), or None."""
        trajectories = list(trajectories)
        rewards = as_rewards(trajectories, rewards)
        B = len(trajectories)
        lengths = [len(t.token_ids) for t in trajectories]
        n_steps = [len(t.steps) for t in trajectories]
        T, S = max(lengths, default=0), max(n_steps, default=0)
        # laid out in numpy (a row from a list, a slice, a float32 scalar add: each far
        # cheaper than a tensor op), then handed to torch without a copy
        loss_mask = np.zeros((B, T), dtype=np.float32)
        step_index = np.full((B, T), -1, dtype=np.int64)
        position = np.zeros((B, S), dtype=np.int64)
        empty = []
        for b, t in enumerate(trajectories):
            n = lengths[b]
            if len(t.loss_mask) != n:
                raise ValueError(f"episode {t.example_id!r}: {n} tokens but "
                                 f"{len(t.loss_mask)} loss_mask entries")
            loss_mask[b, :n] = t.loss_mask
            for k, s in enumerate(t.steps):
                if s.end > s.start:
                    step_index[b, s.start:min(s.end, n)] = k
                else:
                    empty.append((b, k))
                position[b, k] = step_reward_position(t, s)
        last = np.where(loss_mask != 0, np.arange(T), -1).max(axis=1, initial=-1)
        # the outcome, then each step's reward, added in float32 in this order (as a
        # tensor per episode, `r[i] += value`, would)
        token_rewards = np.zeros((B, T), dtype=np.float32)
        for b, (outcome, steps) in enumerate(zip(rewards.outcome, rewards.steps)):
            if last[b] < 0:
                continue
            token_rewards[b, last[b]] += np.float32(outcome)
            for k, value in enumerate(steps):
                token_rewards[b, position[b, k]] += np.float32(value)
        loss_mask = torch.from_numpy(loss_mask)
        policy = loss_mask != 0
        step_mask = torch.arange(S) < torch.tensor(n_steps, dtype=torch.long)[:, None]
        step_rewards = torch.tensor([row + [0.0] * (S - len(row)) for row in rewards.steps],
                                    dtype=torch.float64).reshape(B, S)
        token_rewards = torch.from_numpy(token_rewards)
        if rewards.tokens is not None:
            extra = torch.zeros(B, T, dtype=torch.float32)
            for b, x in enumerate(rewards.tokens):
                x = x[:lengths[b]]
                extra[b, :len(x)] = x.to(torch.float32)
            token_rewards = token_rewards + extra

        sources = {}
        for name, (weight, rows) in (rewards.sources or {}).items():
            pad = [row + [None] * (S - len(row)) for row in rows]
            sources[name] = StepSource(
                weight,
                torch.tensor([[0.0 if v is None else float(v) for v in row] for row in pad],
                             dtype=torch.float64).reshape(B, S),
                torch.tensor([[v is not None for v in row] for row in pad],
                             dtype=torch.bool).reshape(B, S))

        padded_values = None
        if values is not None:
            values = list(values)
            if len(values) != B:
                raise ValueError(f"values: expected one per trajectory ({B}), got {len(values)}")
            padded_values = torch.zeros(B, T, dtype=torch.float32)
            for b, (t, v) in enumerate(zip(trajectories, values)):
                if len(v) != lengths[b]:
                    raise ValueError(f"values: episode {t.example_id!r} has {lengths[b]} tokens "
                                     f"but {len(v)} values")
                padded_values[b, :lengths[b]] = v.detach().float().cpu()

        members = group_indices(trajectories)
        group_index = torch.zeros(B, dtype=torch.long)
        groups = []
        for g, idx in enumerate(members.values()):
            groups.append(torch.tensor(idx, dtype=torch.long))
            group_index[groups[-1]] = g
        return cls(
            trajectories=trajectories, rewards=rewards,
            lengths=torch.tensor(lengths, dtype=torch.long), loss_mask=loss_mask,
            policy=policy, token_rewards=token_rewards,
            step_index=torch.from_numpy(step_index),
            step_mask=step_mask, step_rewards=step_rewards,
            step_reward_position=torch.from_numpy(position),
            outcome=torch.tensor(rewards.outcome, dtype=torch.float64),
            totals=torch.tensor(rewards.totals(), dtype=torch.float64),
            sources=sources, group_index=group_index, groups=groups,
            n_searches=torch.tensor([t.n_searches for t in trajectories], dtype=torch.long),
            tree_ids=[t.tree for t in trajectories], values=padded_values, empty_steps=empty)

    # ------------------------------------------------------------------ views

    def unpad(self, x: torch.Tensor) -> list[torch.Tensor]:
        """A (B, T) tensor as one 1-D tensor per episode, aligned with its `token_ids`."""
        return [x[b, :n] for b, n in enumerate(self.lengths.tolist())]

    def per_step(self, values: torch.Tensor, present: torch.Tensor | None = None
                 ) -> torch.Tensor:
        """(B, T) float32: each step's value (`values`, B x S) on that step's policy tokens;
        zero outside the steps and where `present` (B x S, default `step_mask`) is False. A
        step without tokens adds its value to the token its reward goes to."""
        present = self.step_mask if present is None else present
        B, T = self.shape
        if values.shape[1] == 0:
            out = torch.zeros(B, T, dtype=torch.float32)
        else:
            v = torch.where(present, values, 0.0).to(torch.float32)
            out = torch.where(self.step_index >= 0, v.gather(1, self.step_index.clamp(min=0)),
                              0.0)
        for b, k in self.empty_steps:
            if not present[b, k]:
                continue
            p = int(self.step_reward_position[b, k])
            j = int(self.step_index[b, p])
            if j < k or not present[b, j]:   # a later step's tokens would have overwritten it
                out[b, p] += float(values[b, k])
        return out * self.loss_mask

    def applies(self, present: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the policy tokens where `per_step(values, present)` puts a value."""
        return self.per_step(torch.ones(present.shape, dtype=torch.float32), present) > 0

    def anchor_states(self, kind: str) -> list[list[tuple]]:
        """`anchor_states` of every episode (computed once per kind)."""
        if kind not in self._anchors:
            self._anchors[kind] = [anchor_states(t, kind) for t in self.trajectories]
        return self._anchors[kind]
