"""Model plumbing across transformers versions: the KV cache's keyword and output name."""

from __future__ import annotations

import inspect

import torch

from seekrl.models import cache_kwarg, output_cache, tiny_policy


class _OldStyle(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        return {"past_key_values": "kv"}


def test_cache_kwarg_follows_the_forward_signature():
    model, _ = tiny_policy(seed=0)
    takes = inspect.signature(type(model).forward).parameters
    assert cache_kwarg(model) == ("cache" if "cache" in takes else "past_key_values")
    assert cache_kwarg(_OldStyle()) == "past_key_values"


def test_a_cache_passed_under_that_name_is_used_and_read_back():
    """Prefill, then one token through the returned cache: the same logits as the whole
    sequence at once (the cache was taken, not ignored), and no deprecation warning."""
    model, _ = tiny_policy(seed=0)
    ids = torch.randint(5, 300, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(input_ids=ids).logits[:, -1]
        first = model(input_ids=ids[:, :-1], use_cache=True)
        cache = output_cache(first)
        assert cache is not None
        last = model(input_ids=ids[:, -1:], use_cache=True,
                     position_ids=torch.tensor([[5]]), **{cache_kwarg(model): cache}).logits[:, -1]
    torch.testing.assert_close(last, whole, atol=1e-5, rtol=1e-4)
    assert output_cache({"past_key_values": "kv"}) == "kv"
