"""The random states a checkpoint keeps: every recipe's (SFT, the PRM, RL) through
`rng_state`, the CUDA generators included (dropout on a GPU draws there)."""

from __future__ import annotations

import random

import pytest
import torch

from seekrl.recipes.setup import rng_state, set_rng_state


class FakeCuda:
    """Two GPUs' generator states, as torch.cuda keeps them."""

    def __init__(self, count: int = 2):
        self.count = count
        self.states = [torch.tensor([i], dtype=torch.uint8) for i in range(count)]

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all",
                            lambda states: setattr(self, "states", list(states)))


def test_the_saved_states_come_back_cuda_included(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    saved = rng_state()
    drawn = (random.random(), torch.rand(3))
    cuda.states = [torch.tensor([9], dtype=torch.uint8)] * 2   # the GPUs drew meanwhile
    set_rng_state(saved)
    assert random.random() == drawn[0] and torch.equal(torch.rand(3), drawn[1])
    assert [int(s) for s in cuda.states] == [0, 1]


def test_other_gpus_than_the_checkpoints_start_afresh_and_say_so(monkeypatch):
    saved = rng_state()
    saved["cuda"] = [torch.tensor([5], dtype=torch.uint8)] * 4
    cuda = FakeCuda(count=2)
    cuda.install(monkeypatch)
    with pytest.warns(UserWarning, match="4 GPUs and 2 are visible"):
        set_rng_state(saved)
    assert [int(s) for s in cuda.states] == [0, 1]


def test_a_checkpoint_without_cuda_states_still_loads():
    saved = rng_state()
    saved.pop("cuda")             # written before the GPUs' states were kept
    drawn = random.random()
    set_rng_state(saved)
    assert random.random() == drawn
