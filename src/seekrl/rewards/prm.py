"""The process reward model and its batched scorer: a causal LM with a scalar head that
scores a step from (question, steps so far, the new step), read at the step's last token
(`Step.end - 1`). The model is causal, so the score of a step never sees what came after
it, and one forward pass over a whole episode scores all its steps at once (ProRAG calls
the model once per step).

A PRM folder (what `seekrl prm train`, recipes/prm.py, writes) is a plain Hugging Face
checkpoint of the backbone (LoRA merged) plus `prm_head.pt` and `prm.json`;
`load_scorer(path)` gives the object the `prm` process reward calls
(`score_steps(trajectories) -> probabilities per step`, rewards/process.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seekrl.agent.trajectory import Trajectory
from seekrl.errors import ConfigError, DataError
from seekrl.models import (
    cast_weights,
    collate,
    hidden_states,
    pad_id_of,
    shared_prompts,
    suffix_hidden,
)

PRM_MARKER = "prm.json"


class ProcessRewardModel(nn.Module):
    """A causal LM's backbone and a linear head on its last hidden state."""

    def __init__(self, lm: nn.Module, head: nn.Linear | None = None):
        super().__init__()
        self.lm = lm
        self.head = head if head is not None else nn.Linear(lm.config.hidden_size, 1)
        if head is None:   # zero scores at the start: the labels decide where they go
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def step_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    rows: torch.Tensor, positions: torch.Tensor,
                    policy_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scores (logits) at `(rows[i], positions[i])`, one per requested step end. With
        `policy_mask` (1 on generated tokens), rows that share their prompt (a question's
        rollouts) run it once and reuse its KV cache, as the policy's forward does."""
        shared = shared_prompts(input_ids, attention_mask, policy_mask) \
            if policy_mask is not None else None
        if shared is not None:
            cuts = torch.tensor(shared[0], dtype=torch.long, device=positions.device)
            local = positions - cuts[rows]
            # an empty turn of old data is read inside the shared prompt (`step_end`),
            # which the suffix pass does not hold: read every row whole then
            if bool((local < 0).any()):
                shared = None
        h = suffix_hidden(self.lm, input_ids, attention_mask, *shared) if shared else None
        if h is None:
            h = hidden_states(self.lm, input_ids, attention_mask)
            return self.head(h[rows, positions].float()).squeeze(-1)
        return self.head(h[rows, local].float()).squeeze(-1)


def step_end(traj: Trajectory, index: int) -> int:
    """The token the head reads for step `index`: its last generated token."""
    s = traj.steps[index]
    # an empty turn (nothing generated) is read where its context ends
    return s.end - 1 if s.end > s.start else max(s.start - 1, 0)


def batch_scores(prm: ProcessRewardModel, items: Sequence[tuple[Trajectory, list[int]]],
                 pad_id: int, device) -> list[torch.Tensor]:
    """For each (trajectory, step indices), the logits of those steps, in one forward pass
    (each episode cut after the last step asked for)."""
    ends = [[step_end(t, i) for i in idx] for t, idx in items]
    cut = [max(e) + 1 if e else 1 for e in ends]
    ids, attn, policy = collate([t.token_ids[:c] for (t, _), c in zip(items, cut)],
                                [t.loss_mask[:c] for (t, _), c in zip(items, cut)], pad_id, device)
    rows = torch.tensor([r for r, e in enumerate(ends) for _ in e], dtype=torch.long,
                        device=ids.device)
    pos = torch.tensor([p for e in ends for p in e], dtype=torch.long, device=ids.device)
    flat = prm.step_logits(ids, attn, rows, pos, policy) if len(pos) \
        else torch.zeros(0, device=ids.device)
    out, i = [], 0
    for e in ends:
        out.append(flat[i:i + len(e)])
        i += len(e)
    return out


class PRMScorer:
    """`score_steps(trajectories)`: the probability that each step leads to a right answer
    (sigmoid of the head), batched; what `reward.process.prm` calls."""

    def __init__(self, prm: ProcessRewardModel, tokenizer, *, device: str = "cpu",
                 batch_size: int = 8):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size: expected episodes per forward pass, at least 1; "
                              f"got {batch_size!r}")
        self.prm, self.tokenizer, self.device, self.batch_size = prm, tokenizer, device, batch_size
        self.pad_id = pad_id_of(tokenizer)

    def logits(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        return self._rows(trajectories, probabilities=False)

    def score_steps(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        return self._rows(trajectories, probabilities=True)

    @torch.no_grad()
    def _rows(self, trajectories: Sequence[Trajectory], *, probabilities: bool
              ) -> list[list[float]]:
        vocab = self.prm.lm.get_input_embeddings().num_embeddings
        for t in trajectories:
            if t.token_ids and max(t.token_ids) >= vocab:
                raise DataError(f"episode {t.example_id!r} holds token id {max(t.token_ids)}, "
                                f"past the PRM's {vocab} embeddings: it was written with "
                                "another tokenizer", field="token_ids")
        was = self.prm.training
        self.prm.eval()
        out: list[list[float]] = [[] for _ in trajectories]
        order = sorted(range(len(trajectories)), key=lambda i: len(trajectories[i].token_ids))
        try:
            with cast_weights(self.prm.lm):   # bf16-mixed: weights cast once a call
                for b in range(0, len(order), self.batch_size):
                    chunk = [i for i in order[b:b + self.batch_size] if trajectories[i].steps]
                    if not chunk:
                        continue
                    scores = batch_scores(self.prm, [(trajectories[i],
                                                      list(range(len(trajectories[i].steps))))
                                                     for i in chunk], self.pad_id, self.device)
                    for i, s in zip(chunk, scores):
                        out[i] = (torch.sigmoid(s) if probabilities else s).tolist()
        finally:
            self.prm.train(was)
        return out


def prm_folder(path: str | Path) -> Path:
    """The folder holding a PRM: `path` itself, or the `final/` of a `seekrl prm train` run
    folder. FileNotFoundError when it holds neither."""
    path = Path(path)
    if not (path / PRM_MARKER).is_file() and (path / "final" / PRM_MARKER).is_file():
        return path / "final"
    if not (path / PRM_MARKER).is_file():
        raise FileNotFoundError(f"{path}: not a process reward model folder (no {PRM_MARKER}; "
                                "`seekrl prm train` writes one in its out/final)")
    return path


def load_prm(path: str | Path, *, dtype: str = "float32", device: str = "cpu"
             ) -> tuple[ProcessRewardModel, Any]:
    from seekrl.models import load_policy

    path = prm_folder(path)
    lm, tokenizer = load_policy(str(path), dtype=dtype, device=device)
    head = nn.Linear(lm.config.hidden_size, 1)
    head.load_state_dict(torch.load(path / "prm_head.pt", map_location=device))
    return ProcessRewardModel(lm, head.to(device)).eval(), tokenizer


def load_scorer(path: str | Path, *, device: str = "cpu", batch_size: int = 8,
                dtype: str = "float32") -> PRMScorer:
    """The PRM at `path` as a scorer; `dtype` as a policy's (`bf16-mixed`: the forward under
    autocast, with the weights cast once per scoring call)."""
    prm, tokenizer = load_prm(path, device=device, dtype=dtype)
    return PRMScorer(prm, tokenizer, device=device, batch_size=batch_size)


def check_scorer_tokenizer(scorer: Any, tokenizer, who: str) -> None:
    """A PRM reads the policy's token ids as they are: refuse one whose tokenizer differs
    (a scorer without a tokenizer of its own, such as a test's, passes)."""
    from seekrl.models import tokenizer_fingerprint

    theirs = getattr(scorer, "tokenizer", None)
    if theirs is None or theirs is tokenizer or not hasattr(theirs, "get_vocab"):
        return
    if tokenizer_fingerprint(theirs) != tokenizer_fingerprint(tokenizer):
        raise ConfigError(f"{who}: the PRM has another tokenizer than the policy; train it "
                          "on a backbone that shares the policy's tokenizer")
