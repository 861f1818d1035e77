"""Advantage estimators and losses against hand-computed values, and the masking invariant:
retrieved and prompt tokens get exactly zero gradient."""

from __future__ import annotations

import math

import pytest
import torch

from seekrl.agent.trajectory import Trajectory
from seekrl.config import AlgoConfig
from seekrl.rl.advantages import ESTIMATORS, compute_advantages
from seekrl.rl.loss import aggregate, kl_penalty, policy_loss, value_loss


def traj(group: str, mask: list[int]) -> Trajectory:
    return Trajectory(example_id=group, group_id=group, question="q", golden_answers=["a"],
                      token_ids=list(range(len(mask))), loss_mask=mask, prompt_len=0)


MASK = [0, 1, 1, 0, 1]
GROUPS = [traj("a", MASK), traj("a", MASK), traj("a", MASK), traj("b", MASK), traj("b", MASK)]
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0]


def scalars(result) -> list[float]:
    """The advantage on a policy token (outcome estimators give all of them the same)."""
    advs, _ = result
    return [round(float(a[1]), 4) for a in advs]


def test_every_estimator_is_zero_off_the_policy_tokens():
    values = [torch.zeros(5) for _ in GROUPS]
    for name in ESTIMATORS:
        advs, returns = compute_advantages(name, GROUPS, REWARDS, values=values)
        assert len(advs) == len(returns) == len(GROUPS)
        for a in advs:
            assert a[0] == 0 and a[3] == 0, name
            assert a.shape == (5,)


def test_grpo_hand_computed():
    # group a: rewards 1,0,0 -> mean 1/3, sample std sqrt(1/3) = 0.57735
    s = math.sqrt(1 / 3)
    expected = [(1 - 1 / 3) / s, (0 - 1 / 3) / s, (0 - 1 / 3) / s, 0.0, 0.0]  # group b: no variance
    got = scalars(compute_advantages("grpo", GROUPS, REWARDS, AlgoConfig(epsilon=0.0)))
    assert got == pytest.approx([round(x, 4) for x in expected], abs=1e-4)


def test_dr_grpo_rloo_reinforce_pp_hand_computed():
    assert scalars(compute_advantages("dr_grpo", GROUPS, REWARDS)) == \
        pytest.approx([0.6667, -0.3333, -0.3333, 0.0, 0.0], abs=1e-4)
    # rloo: baseline is the mean of the other samples: 1 - 0 = 1; 0 - 0.5 = -0.5
    assert scalars(compute_advantages("rloo", GROUPS, REWARDS)) == \
        pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0], abs=1e-4)
    # reinforce++: whitened over the batch's 15 policy tokens (nine 1s, six 0s)
    s = math.sqrt((9 * 0.4 ** 2 + 6 * 0.6 ** 2) / 14)
    assert scalars(compute_advantages("reinforce_pp", GROUPS, REWARDS,
                                      AlgoConfig(epsilon=0.0))) == \
        pytest.approx([round(x, 4) for x in [0.4 / s, -0.6 / s, -0.6 / s, 0.4 / s, 0.4 / s]],
                      abs=1e-4)


def test_reinforce_pp_whitens_over_tokens_not_sequences():
    # rewards 1,0,1,0 with 2 and 20 policy tokens: per-sequence standardising would give the
    # short right answers and the long wrong ones equal and opposite scalars, so the mean over
    # tokens would be far from 0 (-0.709); whitened over tokens it is 0
    trajs = [traj("a", [1] * n) for n in (2, 20, 2, 20)]
    advs, returns = compute_advantages("reinforce_pp", trajs, [1.0, 0.0, 1.0, 0.0])
    flat = torch.cat(advs)
    assert float(flat.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(flat.std()) == pytest.approx(1.0, abs=1e-4)
    assert returns[0].tolist() == [1.0, 1.0] and returns[1].sum() == 0


def test_gae_skips_retrieved_tokens():
    t = traj("g", [0, 1, 1, 0, 0, 1])
    values = [torch.tensor([9.0, 0.5, 0.25, 9.0, 9.0, 0.75])]  # 9s: masked, must be ignored
    (a,), (ret,) = compute_advantages("gae", [t], [1.0], AlgoConfig(gamma=1.0, lam=1.0,
                                                                        whiten=False),
                                      values=values)
    # gamma = lambda = 1: advantage = final reward - V at each policy token
    assert a.tolist() == pytest.approx([0, 0.5, 0.75, 0, 0, 0.25])
    assert ret.tolist() == pytest.approx([0, 1.0, 1.0, 0, 0, 1.0])   # advantage + value
    (a,), _ = compute_advantages("gae", [t], [1.0], AlgoConfig(gamma=0.5, lam=0.5,
                                                                   whiten=False),
                                 values=values)
    d3 = 1.0 - 0.75
    d2 = 0.5 * 0.75 - 0.25
    d1 = 0.5 * 0.25 - 0.5
    a3, a2 = d3, d2 + 0.25 * d3
    assert a.tolist() == pytest.approx([0, d1 + 0.25 * a2, a2, 0, 0, a3])
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", [t], [1.0])


def test_unknown_estimator_and_bad_lengths():
    with pytest.raises(ValueError, match="grpo"):
        compute_advantages("magic", GROUPS, REWARDS)
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages("grpo", GROUPS, REWARDS[:2])


def test_aggregations_hand_computed():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(aggregate(v, m, "token-mean")) == pytest.approx((1 + 2 + 4) / 3)
    assert float(aggregate(v, m, "seq-mean-token-mean")) == pytest.approx((1.5 + 4) / 2)
    assert float(aggregate(v, m, "seq-mean-token-sum")) == pytest.approx((3 + 4) / 2)
    assert float(aggregate(v, m, "seq-mean-token-sum-norm", 10)) == pytest.approx(0.35)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(v, m, "nope")


def test_policy_loss_clip_higher():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1, 1.0]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # token 0: ratio 1.5 clipped to 1.28 (A>0); token 1: ratio 0.5 clipped to 0.8 (A<0)
    expected = (-1.28 + 0.8 - 1.1) / 3
    assert float(loss) == pytest.approx(expected, abs=1e-5)
    assert stats["clip_frac"] == pytest.approx(2 / 3)


def test_kl_estimators():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx([0.5, 0.0])
    assert kl_penalty(lp, ref, "k3").tolist() == pytest.approx([math.exp(-0.5) - 1 + 0.5, 0.0])
    assert (kl_penalty(torch.randn(50), torch.randn(50), "k3") >= 0).all()


def test_dual_clip_caps_the_loss_of_a_negative_advantage():
    """A = -1 at ratio 50: the clipped surrogate alone is 50 and grows with the ratio; dual
    clipping caps it at clip_c = 3 and the capped token gets no gradient."""
    mask = torch.ones(1, 2)
    adv = torch.tensor([[-1.0, 1.0]])
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(50.0), math.log(50.0)]], requires_grad=True)
    loss, stats = policy_loss(new, old, adv, mask, clip_c=None)
    assert float(loss) == pytest.approx((50.0 - 1.28) / 2, rel=1e-5)
    loss, stats = policy_loss(new, old, adv, mask, clip_c=3.0)
    assert float(loss) == pytest.approx((3.0 - 1.28) / 2, rel=1e-5)
    assert stats["dual_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad.abs().sum() == 0   # token 0 capped, token 1 clipped above: both constant
    # near the old policy nothing changes
    near = torch.tensor([[0.1, -0.1]])
    assert float(policy_loss(near, old, adv, mask, clip_c=3.0)[0]) == \
        float(policy_loss(near, old, adv, mask, clip_c=None)[0])
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss(near, old, adv, mask, clip_c=0.5)


def test_kl_is_clamped_and_k1_is_refused_as_a_loss_term():
    from seekrl.config import ConfigError, TrainConfig, build_config

    far = kl_penalty(torch.tensor([0.0]), torch.tensor([-40.0]), "k3")
    assert float(far) == 10.0   # exp(40) would dominate any batch
    assert float(kl_penalty(torch.tensor([-40.0]), torch.tensor([0.0]), "k1")) == -10.0
    from seekrl.recipes.train import check_config

    def checked(*overrides):
        cfg = build_config(TrainConfig, {"data": "x"}, list(overrides))
        check_config(cfg)
        return cfg

    with pytest.raises(ConfigError, match="kl_estimator: k1 as a loss term"):
        checked("algo.kl_coef=0.1", "algo.kl_estimator=k1")
    with pytest.raises(ConfigError, match="kl_in_reward: .* read by gae and reinforce_pp only"):
        checked("algo.kl_in_reward=true", "algo.kl_coef=0.1")   # dr_grpo
    checked("algo.kl_in_reward=true")   # KL off: fine
    cfg = checked("algo.kl_coef=0.1", "algo.kl_estimator=k1", "algo.kl_in_reward=true",
                  "algo.advantage=reinforce_pp")
    assert cfg.algo.kl_in_reward


def test_token_rewards_join_the_token_view_and_the_totals():
    from seekrl.rl.advantages import Rewards

    t = traj("a", [1, 1, 0, 1])
    r = Rewards([1.0], [[]], tokens=[torch.tensor([0.0, -0.1, 0.0, -0.2])])
    assert r.totals() == pytest.approx([0.7])
    assert r.token_level([t])[0].tolist() == pytest.approx([0.0, -0.1, 0.0, 0.8])


def test_value_loss_clipping():
    m = torch.ones(1, 1)
    # the clipped value (0.2) is further from the return (2) than the value (1): its error wins
    v, old, ret = torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]])
    assert float(value_loss(v, old, ret, m, clip=None)) == pytest.approx(0.5)
    assert float(value_loss(v, old, ret, m, clip=0.2)) == pytest.approx(0.5 * 1.8 ** 2)
    # the clipped value is nearer the return (0): the unclipped error stays
    ret = torch.tensor([[0.0]])
    assert float(value_loss(v, old, ret, m, clip=0.2)) == pytest.approx(0.5)  # max(1, 0.04)


def _shared_prompt_batch():
    """Five episodes over two prompts (as G rollouts of two questions), with retrieved
    stretches inside the responses and rows of different lengths."""
    from seekrl.models import collate

    g = torch.Generator().manual_seed(0)
    p1, p2 = torch.randint(5, 500, (9,), generator=g).tolist(), \
        torch.randint(5, 500, (6,), generator=g).tolist()
    tail = lambda n: torch.randint(5, 500, (n,), generator=g).tolist()  # noqa: E731
    rows = [p1 + tail(7), p2 + tail(12), p1 + tail(3), p2 + tail(5), p1 + tail(10)]
    masks = [[0] * 9 + [1, 1, 1, 0, 0, 1, 1], [0] * 6 + [1] * 4 + [0] * 5 + [1] * 3,
             [0] * 9 + [1, 1, 1], [0] * 6 + [1] * 5, [0] * 9 + [1] * 10]
    return collate(rows, masks, 0)


@pytest.mark.parametrize("share", [False, True])
def test_masked_tokens_get_exactly_zero_gradient_in_the_trainers_forward(share):
    """The path the trainer takes (`masked_logprobs`, with and without prompt sharing): the
    final hidden state at a position gets gradient iff it predicts a policy token, so the
    prompt and the retrieved documents are never trained on."""
    from seekrl.models import backbone, tiny_policy
    from seekrl.rl.forward import masked_logprobs

    model, _ = tiny_policy(seed=3)
    ids, attn, mask = _shared_prompt_batch()
    finals = []   # every output of the last norm: the hidden states the LM head reads

    def keep(_module, _inputs, output):
        output.retain_grad()
        finals.append(output)

    handle = backbone(model).norm.register_forward_hook(keep)
    try:
        out = masked_logprobs(model, ids, attn, mask, entropy=True, share_prompts=share)
    finally:
        handle.remove()
    lp = out["logprobs"]
    loss, _ = policy_loss(lp, lp.detach(), torch.ones_like(lp), mask)
    kl = aggregate(kl_penalty(lp, lp.detach() - 0.1, "k3"), mask)
    (loss + 0.1 * kl - 0.01 * aggregate(out["entropy"], mask)).backward()
    assert len(finals) == (2 if share else 1)   # shared: the prompt pass, then the suffixes
    hidden = finals[-1]
    cuts = [0] * len(ids)
    if share:
        assert finals[0].grad is None             # only its KV cache is used
        from seekrl.models import shared_prompts
        cuts = shared_prompts(ids, attn, mask)[0]
    trained = torch.zeros(hidden.shape[:2], dtype=torch.bool)
    for r, c in enumerate(cuts):                  # hidden[r, j] is position c + j of row r
        for j in range(hidden.shape[1]):
            t = c + j
            trained[r, j] = t + 1 < ids.shape[1] and bool(mask[r, t + 1]) and bool(attn[r, t])
    assert torch.count_nonzero(hidden.grad[~trained]) == 0
    assert bool((hidden.grad[trained].abs().sum(-1) > 0).all())


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_forward_equals_the_plain_forward(lora):
    """One prompt pass whose KV cache is repeated per row: the same log-probs, entropy,
    values and parameter gradients as running every row in full."""
    from seekrl.models import shared_prompts, tiny_policy
    from seekrl.rl.forward import ValueHead, masked_logprobs

    model, _ = tiny_policy(seed=2)
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    head = ValueHead(64)
    ids, attn, mask = _shared_prompt_batch()
    assert shared_prompts(ids, attn, mask) == ([8, 5, 8, 5, 8], [0, 1, 0, 1, 0])
    results = []
    for share in (False, True):
        model.zero_grad()
        out = masked_logprobs(model, ids, attn, mask, entropy=True, value_head=head,
                              share_prompts=share)
        (out["logprobs"].sum() + 0.1 * out["entropy"].sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out, grads))
    (plain, g_plain), (shared, g_shared) = results
    for key in ("logprobs", "entropy", "values"):
        assert plain[key].shape == shared[key].shape == ids.shape
        torch.testing.assert_close(plain[key], shared[key], atol=2e-5, rtol=1e-4)
        assert torch.count_nonzero(shared[key][mask == 0]) == 0
    assert g_plain.keys() == g_shared.keys() and g_plain
    for n in g_plain:
        torch.testing.assert_close(g_plain[n], g_shared[n], atol=2e-5, rtol=1e-3, msg=n)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_equal_the_full_logits_grid(temperature):
    """The trainer's head-at-policy-positions forward against the plain one: the whole
    [batch, seq, vocab] grid from the model's own logits, shifted by one."""
    from seekrl.models import tiny_policy
    from seekrl.rl.forward import masked_logprobs

    model, _ = tiny_policy(seed=2)
    ids, attn, mask = _shared_prompt_batch()
    with torch.no_grad():
        out = masked_logprobs(model, ids, attn, mask, entropy=True, temperature=temperature,
                              share_prompts=False)
        logits = model(input_ids=ids, attention_mask=attn).logits.float() / temperature
    logp = torch.log_softmax(logits[:, :-1], dim=-1)        # position t predicts token t + 1
    want_lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    want_h = -(logp.exp() * logp).sum(-1)
    on = mask[:, 1:].bool()
    assert on.any() and (~on).any()
    for key, want in (("logprobs", want_lp), ("entropy", want_h)):
        got = out[key][:, 1:]
        torch.testing.assert_close(got[on], want[on], atol=1e-5, rtol=1e-5)
        assert torch.count_nonzero(got[~on]) == 0 and torch.count_nonzero(out[key][:, 0]) == 0
    assert (want_h[on] > 0).all()


def test_shared_prompts_only_when_rows_share_one():
    from seekrl.models import collate, shared_prompts

    ids, attn, mask = collate([[1, 2, 3, 4], [7, 2, 3, 4]], [[0, 0, 1, 1], [0, 0, 1, 1]], 0)
    assert shared_prompts(ids, attn, mask) is None      # prompts [1] and [7]
    # the prompt ends before the token whose hidden state predicts the first policy token
    ids, attn, mask = collate([[1, 2, 3, 4], [1, 9, 3, 4]], [[0, 0, 1, 1], [0, 0, 1, 1]], 0)
    assert shared_prompts(ids, attn, mask) == ([1, 1], [0, 0])
    ids, attn, mask = collate([[1, 2, 3, 4], [1, 2, 3, 6]], [[0, 0, 0, 1], [0, 0, 0, 1]], 0)
    assert shared_prompts(ids, attn, mask) == ([2, 2], [0, 0])
    # a row whose first token is already trained has no prompt to share
    ids, attn, mask = collate([[1, 2], [1, 2]], [[0, 1], [0, 1]], 0)
    assert shared_prompts(ids, attn, mask) is None


@pytest.mark.parametrize("arch", ["sliding_window", "absolute_positions"])
def test_prompt_sharing_reads_rows_whole_when_its_layout_would_outgrow_the_model(arch):
    """A short prompt with a long suffix sits, in the shared layout, behind the longest
    prompt: past a sliding window's cut (wrong log-probs, silently) or past an absolute
    position table (an IndexError), though every row fits. Then rows are read whole."""
    from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

    from seekrl.models import collate
    from seekrl.rl.forward import masked_logprobs

    torch.manual_seed(0)
    if arch == "sliding_window":
        model = MistralForCausalLM(MistralConfig(
            vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
            max_position_embeddings=64)).eval()
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=32,
                                           n_layer=1, n_head=2)).eval()
    prompt = list(range(1, 12))
    rows = [prompt + [20, 21], prompt + [22, 23], [5, 6] + list(range(30, 43))]   # 13, 13, 15
    masks = [[0] * 11 + [1, 1], [0] * 11 + [1, 1], [0, 0] + [1] * 13]
    ids, attn, mask = collate(rows, masks, 0)
    with torch.no_grad():
        whole = masked_logprobs(model, ids, attn, mask, share_prompts=False)["logprobs"]
        shared = masked_logprobs(model, ids, attn, mask, share_prompts=True)["logprobs"]
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-4)


def test_shared_prompt_forward_with_activation_checkpointing():
    """A model that returns no KV cache (activation checkpointing in training) takes the
    plain path: still the right log-probs."""
    from seekrl.models import backbone, output_cache, tiny_policy
    from seekrl.rl.forward import masked_logprobs

    model, _ = tiny_policy(seed=2)
    ids, attn, mask = _shared_prompt_batch()
    with torch.no_grad():
        plain = masked_logprobs(model, ids, attn, mask, share_prompts=False)["logprobs"]
    model.activation_checkpointing_enable()
    model.train()
    assert output_cache(backbone(model)(input_ids=ids, attention_mask=attn,
                                        use_cache=True)) is None
    out = masked_logprobs(model, ids, attn, mask)["logprobs"]
    out.sum().backward()
    torch.testing.assert_close(out.detach(), plain, atol=2e-5, rtol=1e-4)
    # the old log-probs (eval mode, checkpointing still on) take the training pass's own
    # path: the first PPO ratio is 1 to the last bit (the shared pass differed by ~1e-6)
    model.eval()
    with torch.no_grad():
        old = masked_logprobs(model, ids, attn, mask)["logprobs"]
    assert torch.equal(old, out.detach())


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    return Gemma2ForCausalLM(Gemma2Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=0.5))


def _granite():
    from transformers import GraniteConfig, GraniteForCausalLM

    return GraniteForCausalLM(GraniteConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, logits_scaling=8.0))


@pytest.mark.parametrize("build", [_gemma2, _granite])
def test_training_logprobs_apply_the_models_logit_postprocessing(build):
    """Gemma 2 soft-caps its final logits inside its forward, Granite divides them by
    `logits_scaling`; the trainer's LM-head shortcut must do the same, or its log-probs
    differ from the sampler's."""
    from seekrl.rl.forward import masked_logprobs

    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50)   # logits well past the cap, where it matters
    ids = torch.randint(3, 300, (2, 9))
    attn = torch.ones_like(ids)
    mask = torch.zeros(2, 9)
    mask[:, 5:] = 1
    with torch.no_grad():
        ours = masked_logprobs(model, ids, attn, mask, share_prompts=False)["logprobs"]
        ref = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[:, :-1].gather(
            -1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(ours[:, 6:], ref[:, 5:], atol=1e-4, rtol=1e-4)


def test_alibi_models_are_refused_with_one_line():
    from transformers import BloomConfig, BloomForCausalLM

    from seekrl.agent.backends import HFBackend
    from seekrl.models import ModelError, load_tokenizer

    model = BloomForCausalLM(BloomConfig(vocab_size=300, hidden_size=32, n_layer=1, n_head=2))
    with pytest.raises(ModelError, match="ALiBi"):
        HFBackend(model, load_tokenizer())


def test_sliding_window_models_are_refused_past_their_window():
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from seekrl.agent.backends import HFBackend, Sampling
    from seekrl.models import ModelError, load_tokenizer, sliding_window
    from seekrl.rl.forward import masked_logprobs

    small = dict(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1)
    mistral = MistralForCausalLM(MistralConfig(sliding_window=16, **small)).eval()
    assert sliding_window(mistral) == 16
    # Qwen2 carries a window it does not use
    assert sliding_window(Qwen2ForCausalLM(Qwen2Config(sliding_window=16,
                                                       use_sliding_window=False, **small))) is None
    tok = load_tokenizer()
    backend = HFBackend(mistral, tok)
    greedy = Sampling(greedy=True)
    assert len(backend.generate([[1, 2, 3, 4]], 4, greedy)[0]) <= 4     # inside: fine
    with pytest.raises(ModelError, match="exceeds the model's sliding attention window of 16"):
        backend.generate([list(range(1, 18))], 4, greedy)
    # the engine checks the episode budget once: max_total_tokens above the window is refused
    from seekrl.agent.rollout import RolloutConfig, RolloutEngine
    RolloutEngine(backend, tok, None, RolloutConfig(max_total_tokens=16, method="direct"))
    with pytest.raises(ModelError, match="set rollout.max_total_tokens .* to at most 16"):
        RolloutEngine(backend, tok, None, RolloutConfig(max_total_tokens=17, method="direct"))
    ids = torch.randint(3, 300, (1, 20))
    with pytest.raises(ModelError, match="sliding attention window"):
        masked_logprobs(mistral, ids, torch.ones_like(ids), torch.ones(1, 20))


def test_tis_weights_are_the_truncated_ratio_on_policy_tokens_only():
    from seekrl.rl.loss import tis_weights

    old = torch.tensor([[math.log(0.5), math.log(0.5), math.log(0.9), 0.0]])
    rollout = torch.tensor([[math.log(0.5), math.log(0.1), math.log(0.3), -7.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w, stats = tis_weights(old, rollout, mask, cap=2.0)
    # ratio 1, 5 (capped at 2), 3 (capped at 2); off the mask: 1
    assert w.tolist()[0] == pytest.approx([1.0, 2.0, 2.0, 1.0])
    assert stats["tis_weight"] == pytest.approx(5 / 3) and stats["tis_clip_frac"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="tis_cap"):
        tis_weights(old, rollout, mask, cap=0.0)


def test_token_weights_scale_each_tokens_gradient():
    logp = torch.zeros((1, 3), requires_grad=True)
    adv = torch.ones((1, 3))
    mask = torch.ones((1, 3))
    weights = torch.tensor([[1.0, 2.0, 0.5]])
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, agg="token-mean",
                          token_weights=weights)
    loss.backward()
    # d/dlogp of -A * ratio at ratio 1 is -A / n per token, times its weight
    assert logp.grad.tolist()[0] == pytest.approx([-1 / 3, -2 / 3, -0.5 / 3])


def test_llds_regularises_only_fallen_tokens_of_fallen_non_negative_actions():
    from seekrl.rl.loss import llds_penalty

    # prompt | action 0: tokens 1, 2 | information | action 1: tokens 4, 5
    mask = torch.tensor([[0, 1, 1, 0, 1, 1]], dtype=torch.float32)
    actions = torch.tensor([[-1, 0, 0, -1, 1, 1]])
    old = torch.tensor([[0.0, -1.0, -1.0, 0.0, -1.0, -1.0]])
    # action 0 lost 0.5 - 0.2 = 0.3 (fell); action 1 lost 0.05 - 0.2 = -0.15 (rose)
    new = torch.tensor([[0.0, -1.5, -0.8, 0.0, -1.05, -0.8]], requires_grad=True)
    adv = torch.ones(1, 6)
    loss, stats = llds_penalty(new, old, adv, mask, actions, gate="action")
    assert float(loss) == pytest.approx(0.5 / 4)            # token 1 only, over 4 tokens
    assert stats["llds_frac"] == pytest.approx(1 / 4)
    loss.backward()
    assert new.grad[0].tolist() == pytest.approx([0, -0.25, 0, 0, 0, 0])
    # the whole response fell (0.3 - 0.15 > 0): every fallen token counts, token 4 too
    resp, _ = llds_penalty(new, old, adv, mask, actions, gate="response")
    assert float(resp) == pytest.approx((0.5 + 0.05) / 4)
    # a negative advantage: the update means to lower it, LLDS leaves it alone
    neg = torch.tensor([[0.0, -1.0, -1.0, 0.0, 1.0, 1.0]])
    assert float(llds_penalty(new, old, neg, mask, actions)[0]) == 0.0
    # before any update the policy is the sampling one: nothing to preserve
    same = old.clone().requires_grad_(True)
    zero, _ = llds_penalty(same, old, adv, mask, actions)
    zero.backward()
    assert float(zero) == 0.0 and not same.grad.any()


def test_llds_needs_an_update_to_compare_with():
    from seekrl.config import ConfigError, TrainConfig, build_config
    from seekrl.recipes.train import check_config

    one_update = build_config(TrainConfig, {"data": "x"}, [
        "algo.llds_coef=0.1", "questions_per_step=2", "group_size=2", "algo.mini_batch_size=4"])
    with pytest.raises(ConfigError, match="algo.llds_coef: .* one update per batch"):
        check_config(one_update)
    check_config(build_config(TrainConfig, {"data": "x"}, [
        "algo.llds_coef=0.1", "questions_per_step=2", "group_size=2", "algo.mini_batch_size=2"]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("score", [0.1, 1.1, 0.3])
def test_a_tied_group_gets_exactly_zero_advantage_at_any_size(name, score):
    """Eight episodes all scoring 0.1 (a valid wrong answer's format reward): float32's mean
    of them is not exactly 0.1, and GRPO gave each -0.0074, Dr. GRPO -7.45e-9 (past dynamic
    sampling's 1e-9 test: the tied group was kept as informative)."""
    for size in range(2, 17):
        group = [traj("g", MASK) for _ in range(size)]
        advs, _ = compute_advantages(name, group, [score] * size)
        assert all(bool((a == 0).all()) for a in advs), (name, score, size)


def test_reinforce_pp_on_a_batch_of_equal_returns_is_zero_not_nan():
    """Every return 0 (early training) at epsilon 0: 0 / (0 + 0) was NaN on every token;
    every return 0.1 at the default epsilon: a uniform non-zero value from the mean's
    rounding."""
    for score, eps in ((0.0, 0.0), (0.1, 1e-8), (0.1, 1e-6)):
        advs, _ = compute_advantages("reinforce_pp", GROUPS, [score] * len(GROUPS),
                                     cfg=AlgoConfig(epsilon=eps))
        assert all(bool((a == 0).all()) for a in advs), (score, eps)


def test_reinforce_pp_leaves_the_signal_check_to_the_scores():
    """Its advantages are whitened over the batch, so a group whose episodes tie gets
    non-zero ones: dynamic sampling must read the scores (batch_relative), else it keeps
    every tied group."""
    from seekrl.rl.advantages import FACTS, batch_relative

    assert batch_relative("reinforce_pp")
    assert not any(batch_relative(n) for n in FACTS if n != "reinforce_pp")
    advs, _ = compute_advantages("reinforce_pp", GROUPS, [1.0, 1.0, 1.0, 0.0, 0.0])
    assert float(advs[0][1]) != 0   # group "a" ties, yet its advantages are not zero


def test_a_huge_log_ratio_gives_a_finite_loss_and_gradient():
    """exp(94.5) overflows float32: the clipped branch's zero gradient times inf was NaN for
    the whole micro-batch. The log-ratio is clamped to +-20 first, as verl does."""
    for adv in (1.0, -1.0):
        logp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
        old = torch.tensor([[-95.0, -1.0]])
        loss, _ = policy_loss(logp, old, torch.full((1, 2), adv), torch.ones(1, 2))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all(), adv


def test_k3_on_a_collapsed_token_has_a_finite_gradient():
    logp = torch.tensor([-95.0, -1.0], requires_grad=True)
    kl = kl_penalty(logp, torch.tensor([-1.0, -1.0]), "k3")
    kl.sum().backward()
    assert float(kl[0]) == 10.0 and float(kl[1]) == 0.0
    assert torch.isfinite(logp.grad).all()
