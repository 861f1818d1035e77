"""Model plumbing across transformers versions: the KV cache's keyword and output name."""

from __future__ import annotations

import inspect
import os
import platform
import subprocess
import sys

import pytest
import torch

from seekrl.models import cache_kwarg, load_tokenizer, output_cache, tiny_policy


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


def _fresh_probe(monkeypatch, **env):
    from seekrl import runtime

    monkeypatch.setattr(runtime, "_HUB", {})
    for key in ("HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return runtime


def test_hub_unreachable_says_why_at_once(monkeypatch):
    import socket
    import time

    runtime = _fresh_probe(monkeypatch, HF_HUB_OFFLINE="1")
    assert runtime.hub_unreachable() == "HF_HUB_OFFLINE is set"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))   # bound, never listening: connections are refused
    port = closed.getsockname()[1]
    runtime = _fresh_probe(monkeypatch, HF_ENDPOINT=f"http://127.0.0.1:{port}")
    started = time.time()
    assert "127.0.0.1 cannot be reached" in runtime.hub_unreachable()
    assert time.time() - started < 2
    closed.close()
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    runtime = _fresh_probe(monkeypatch, HF_ENDPOINT=f"http://127.0.0.1:{listening.getsockname()[1]}")
    assert runtime.hub_unreachable() is None
    listening.close()


def test_an_unreachable_hub_gives_the_cache_or_a_one_line_error(monkeypatch, tmp_path):
    import huggingface_hub.constants as hub_constants
    import pytest

    from seekrl.models import ModelError, resolve_model

    _fresh_probe(monkeypatch, HF_HUB_OFFLINE="1")
    snapshot = tmp_path / "models--someorg--somemodel" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--someorg--somemodel" / "refs").mkdir()
    (tmp_path / "models--someorg--somemodel" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    assert resolve_model("someorg/somemodel") == str(snapshot)
    with pytest.raises(ModelError, match="not in the Hugging Face cache, and the hub is out of "
                                         r"reach \(HF_HUB_OFFLINE is set\)"):
        resolve_model("someorg/othermodel")


TRIM_SCRIPT = """
from seekrl.runtime import trim_heap
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
big = bytearray(16 << 20); del big    # freeing a mapped block raises glibc's mmap threshold
keep = [bytearray(1 << 20) for _ in range(300)]   # ... so these 300 MiB come from the heap
last = keep[-1]; del keep             # its top stays in use: only a trim frees the rest
before = rss(); done = trim_heap(); after = rss()
print(done, before - after)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_trim_heap_returns_freed_heap_pages_unless_malloc_is_left_alone():
    """300 MiB freed in the middle of the heap stay resident until `trim_heap` hands them
    back; SEEKRL_MALLOC=default leaves malloc alone (nothing handed back)."""
    def run(setting: str | None) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "SEEKRL_MALLOC"}
        if setting is not None:
            env["SEEKRL_MALLOC"] = setting
        done = subprocess.run([sys.executable, "-c", TRIM_SCRIPT], env=env,
                              capture_output=True, text=True, check=True)
        return done.stdout.split()

    trimmed, freed = run(None)
    assert trimmed == "True" and int(freed) >= 250
    # nothing handed back: the resident set moves by no more than the reading itself
    # allocates (rounded down to whole MiB, a few KiB can cross a boundary)
    trimmed, freed = run("default")
    assert trimmed == "False" and abs(int(freed)) <= 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_mmap_threshold_is_fixed_only_when_asked(tmp_path):
    """In a fresh process: malloc left as it is unless SEEKRL_MALLOC gives a threshold in
    bytes (then fixed on glibc, the second call answering from memory); anything but
    default or a number is refused by name."""
    def run(setting: str | None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "SEEKRL_MALLOC"}
        if setting is not None:
            env["SEEKRL_MALLOC"] = setting
        return subprocess.run([sys.executable, "-c", "from seekrl.runtime import "
                               "fix_mmap_threshold as f\nprint(f(), f())"],
                              env=env, capture_output=True, text=True)

    glibc = platform.libc_ver()[0] == "glibc"
    assert run(None).stdout.split()[:2] == ["False", "False"]   # off unless asked
    assert run("default").stdout.split()[:2] == ["False", "False"]
    assert run(str(4 << 20)).stdout.split()[:2] == [str(glibc)] * 2   # a threshold, in bytes
    bad = run("4MB")
    assert bad.returncode != 0 and "SEEKRL_MALLOC: expected 'default' or a threshold in " \
        "bytes, got '4MB'" in bad.stderr


# ---------------------------------------------------------------- the end of a turn
def _tokenizer_with_eos(token: str):
    from seekrl.models import load_tokenizer

    tok = load_tokenizer()
    tok.eos_token = token        # as a base model's tokenizer: EOS is not the turn's end
    tok.pad_token = token        # (and pads with EOS)
    return tok


def test_the_turns_end_is_read_off_the_chat_template():
    from seekrl.models import end_of_turn_ids, load_tokenizer

    tok = load_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_ids(tok) == {tok.eos_token_id} == {im_end}
    base = _tokenizer_with_eos("<|endoftext|>")
    assert base.eos_token_id != im_end
    assert end_of_turn_ids(base) == {base.eos_token_id, im_end}


def test_a_tokenizer_without_a_chat_template_ends_turns_on_eos_alone():
    from seekrl.models import end_of_turn_ids

    tok = _tokenizer_with_eos("<|endoftext|>")
    tok.chat_template = None
    assert end_of_turn_ids(tok) == {tok.eos_token_id}


class _Always(torch.nn.Module):
    """An LM head whose logits always pick one token."""

    def __init__(self, vocab: int, token: int):
        super().__init__()
        self.vocab, self.token = vocab, token

    def forward(self, h):
        out = torch.zeros(*h.shape[:-1], self.vocab, dtype=h.dtype)
        out[..., self.token] = 10.0
        return out


class _Script(torch.nn.Module):
    """An LM head whose logits pick the script's next token at each call (the prefill's
    last position, then one decoding step a call)."""

    def __init__(self, vocab: int, tokens: list[int]):
        super().__init__()
        self.vocab, self.tokens, self.calls = vocab, tokens, 0

    def forward(self, h):
        out = torch.zeros(*h.shape[:-1], self.vocab, dtype=h.dtype)
        out[..., self.tokens[min(self.calls, len(self.tokens) - 1)]] = 10.0
        self.calls += 1
        return out


def _word_start_tokenizer():
    """A tokenizer that marks a word's start with U+2581 and drops its space when one
    token is decoded alone (Llama 2's and Mistral's decoder)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</": 1, "\u2581search": 2, ">": 3, "search": 4, "\u2581a": 5}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", pad_token="<unk>")


def test_stop_strings_read_each_token_as_it_reads_in_the_text():
    """"</ search>" is no "</search>": a token decoded alone loses its word-start space
    under such tokenizers, and the joined pieces stopped the turn there."""
    from seekrl.agent.backends import HFBackend, Sampling, token_texts

    tok = _word_start_tokenizer()
    assert tok.decode([1, 2, 3]) == "</ search>" and tok.decode([2]) == "search"
    assert token_texts(tok, [1, 2, 3, 4]) == ["</", " search", ">", "search"]
    model, _ = tiny_policy(tok)
    model.lm_head = _Script(model.config.vocab_size, [1, 2, 3, 1, 4, 3, 5, 5])
    out = HFBackend(model, tok).generate([[5]], 8, Sampling(greedy=True, stop=("</search>",)))
    assert list(out[0]) == [1, 2, 3, 1, 4, 3]   # "</ search></search>": the second stops it
    # the bundled tokenizer reads every token alike either way
    bundled = load_tokenizer()
    ids = range(0, len(bundled), 97)
    assert token_texts(bundled, ids) == bundled.batch_decode([[i] for i in ids])


def test_a_turn_stops_at_the_templates_end_of_turn_when_eos_is_another_token():
    from seekrl.agent.backends import HFBackend, Sampling

    tok = _tokenizer_with_eos("<|endoftext|>")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    model, _ = tiny_policy(tok)
    model.lm_head = _Always(model.config.vocab_size, im_end)
    model.eval()
    backend = HFBackend(model, tok)
    assert im_end in backend.stop_ids
    out = backend.generate([tok.encode("hello", add_special_tokens=False)], 12,
                           Sampling(greedy=True))
    assert list(out[0]) == [im_end]      # one token, kept: not 12 tokens of <|im_end|>
