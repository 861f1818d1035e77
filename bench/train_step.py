"""One RL step on CPU with the bundled SmolLM2-135M: seekrl's agent step, and a single-turn
GRPO step of seekrl against TRL's `GRPOTrainer` doing the same work.

1. Agent step: one `Trainer.step` of seekrl's recipe, multi-turn search agent, 8 questions x
   G=4 from a synthetic world (the demo's: medium, 12-30-word documents, 1-3 hops) with a
   BM25 index, top-2 documents, <= 256 information tokens, <= 4 turns of <= 64 new tokens;
   full fine-tuning, float32, one optimizer step over the 32 episodes. Prints the time
   split (rollout / scoring / old log-probs / update) and tokens/s. The bundled model is
   not trained for the protocol (it rarely writes a valid tag), which is fine here: this
   is a speed benchmark, not a quality one.
2. Single-turn GRPO, side by side in one process: TRL's `GRPOTrainer` (standard
   prompt-completion GRPO, transformers `generate`) and seekrl's `Trainer` with
   `rollout.method=direct`, on the same model, the same 8 prompts (the world's first train
   questions through seekrl's direct prompt and the model's chat template; TRL gets that
   text as a plain-text `prompt` column, so no second template is applied: the token ids
   are checked to be the same), G=4, <= 64 new tokens, temperature 1.0, the same
   exact-match reward, no KL, clip 0.2 / 0.28, token-mean loss, lr 1e-6 constant, AdamW,
   grad-norm clip 1.0, micro-batches of 8 and exactly one optimizer step over the 32
   completions, no old-log-prob pass (one update: both skip it), full fine-tuning,
   float32, CPU, no gradient checkpointing (TRL's default is on; turned off for both),
   no logging backend, no saving. Each repeat builds a fresh model and trainer for each
   side (untimed) and times only the step: `trainer.train()` with `max_steps=1` for TRL,
   `Trainer.step(1)` for seekrl; the sides alternate which goes first. A process-wide
   warm-up (a short generate and one forward/backward of a throwaway copy of the model)
   runs before any timing; neither trainer gets a warm-up step. seekrl runs with its
   defaults, so a group's shared prompt goes through the model once (`algo.share_prompts`);
   `--unshared` adds a third side with that off, to attribute the difference.

3. With `--demo-policy DIR` (a trained agent, e.g. an SFT checkpoint of the demo's world):
   the demo's own RL step (src/seekrl/presets/demo/rl.yaml: 8 questions x G=4, micro-batches of 2, the top
   16 blocks trained, lr 3e-5) from that policy, as it ran before (float32, every right
   episode measured again after the update) and as it runs now (`dtype: bf16-mixed`, at
   most 4 measured again), alternating which goes first; `--demo-sides` picks the sides
   (`micro4`: `now` with a whole group per forward/backward, its prompt run once;
   `micro1`: one episode per forward/backward, no prompt shared, no padding);
   `demo_step_ratio_B_vs_A` = B's median step time / A's, A the first side.

    .venv/bin/python bench/train_step.py [--questions 8] [--group 4] [--max-new-tokens 64]
        [--repeats 1] [--skip-trl] [--skip-agent] [--threads N] [--unshared]
        [--device cuda --dtype bfloat16] [--arch qwen2.5-1.5b|tiny]
        [--demo-policy DIR [--demo-sides before,now]]

`--arch NAME` starts every side from random weights of that architecture instead of the
bundled model (bench/rollout.py's shapes: qwen2.5-0.5b/1.5b/3b; `tiny`, the GPU agenda's dry
run, so that its bfloat16 step takes seconds on a CPU without native bfloat16).

Prints key=value lines; the last line is the summary with trl_speedup (TRL step seconds /
seekrl step seconds, medians; `trl_speedup_gpu` on a GPU) and the agent step's headline.
On a GPU both sides run there in `--dtype` (TRL with `bf16` for bfloat16), the clock waits
for the GPU (`torch.cuda.synchronize`) before it stops, and each side reports its peak GPU
memory; the agent step also reports the rollout / trainer log-prob gap (mean, max).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from seekrl.agent.protocol import build_prompt, parse_action, plain_answer
from seekrl.config import TrainConfig
from seekrl.data.world import WorldConfig, generate_world, write_world
from seekrl.models import load_policy, load_tokenizer, mixed_precision
from seekrl.recipes.train import Trainer
from seekrl.retrieval.index import build_index, load_index
from seekrl.rewards.metrics import exact_match
from seekrl.rl import step_metrics as M
from seekrl.runtime import peak_rss_mb

MICRO_BATCH = 8


def policy(args):
    """The policy a side starts from: the bundled model, or with `--arch` random weights of
    that architecture (rollout.py's shapes; `tiny` is the GPU agenda's dry run, seconds on
    any CPU, in bfloat16 too)."""
    if not args.arch:
        return load_policy("smollm2-135m", dtype=args.dtype, device=args.device)
    from rollout import build_arch

    tok = load_tokenizer("smollm2-135m")   # the bundled vocabulary, not its weights
    mixed = args.dtype == "bf16-mixed"
    model = build_arch(args.arch, tok, torch.float32 if mixed else getattr(torch, args.dtype),
                       args.device)
    if mixed:
        mixed_precision(model)
    return model, tok


def build_world(work: Path, n_questions: int):
    world = generate_world(WorldConfig(seed=0, difficulty="medium", doc_words=(12, 30),
                                       hop_mix={1: 0.3, 2: 0.45, 3: 0.25}))
    paths = write_world(world, work / "world")
    retriever = load_index(build_index(paths["corpus"], work / "index", show_progress=False))
    return world, retriever, world.splits["train"][:n_questions]


def seekrl_config(args, method: str, out: Path, share_prompts: bool = True) -> TrainConfig:
    n = args.questions * args.group
    rollout = {"method": method, "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
               "top_p": 1.0, "batch_size": n}
    if method == "agent":
        rollout.update(max_turns=4, topk=2, max_info_tokens=256)
    return TrainConfig(
        data="(in memory)", out=str(out), seed=0, steps=1, save_every=0, device=args.device,
        dtype=args.dtype,
        questions_per_step=args.questions, group_size=args.group, train_layers=None,
        rollout=rollout,
        algo={"advantage": "grpo", "epochs": 1, "mini_batch_size": n,
              "micro_batch_size": min(MICRO_BATCH, n), "kl_coef": 0.0, "clip_low": 0.2,
              "clip_high": 0.28, "loss_agg": "token-mean", "share_prompts": share_prompts},
        optim={"lr": 1e-6, "schedule": "constant", "warmup_steps": 0, "max_grad_norm": 1.0})


def seekrl_step(args, method: str, questions, work: Path, retriever=None,
                share_prompts: bool = True) -> dict:
    """A fresh model and Trainer (untimed), then one timed `Trainer.step(1)`."""
    model, tok = policy(args)
    out = Path(tempfile.mkdtemp(prefix=f"seekrl-{method}-", dir=work))
    trainer = Trainer(seekrl_config(args, method, out, share_prompts), model=model, tokenizer=tok,
                      retriever=retriever, questions=questions, console=None)
    sync(args)
    started = time.perf_counter()
    record = trainer.step(1)
    sync(args)
    record["wall"] = time.perf_counter() - started
    record["generated"] = round(record[M.RESPONSE_LENGTH] * record[M.EPISODES])
    trainer.log.close()
    return record


# ---------------------------------------------------------------------- TRL


def em_reward(completions, golden_answers, **_):
    """seekrl's direct-method reward: the <answer> text, else the untagged reply, scored by EM."""
    rewards = []
    for text, golden in zip(completions, golden_answers):
        action = parse_action(text)
        answer = action.text if action.kind == "answer" else (plain_answer(text) or None)
        rewards.append(float(exact_match(answer, golden)))
    return rewards


def trl_step(args, prompts: list[str], golden: list[list[str]], work: Path) -> dict:
    """A fresh model and GRPOTrainer (untimed), then one timed `train()` of one step."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    n = args.questions * args.group
    micro = min(MICRO_BATCH, n)
    if n % micro:
        raise SystemExit(f"questions x group ({n}) must be a multiple of {micro} for TRL")
    model, tok = policy(args)
    gpu = args.device.startswith("cuda")
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-", dir=work),
        per_device_train_batch_size=micro, gradient_accumulation_steps=n // micro,
        steps_per_generation=n // micro, num_iterations=1, num_generations=args.group,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        learning_rate=1e-6, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, optim="adamw_torch", max_steps=1, use_cpu=not gpu,
        bf16=args.dtype == "bfloat16",
        fp16=False, gradient_checkpointing=False, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
        log_completions=False)
    dataset = Dataset.from_dict({"prompt": prompts, "golden_answers": golden})
    trainer = GRPOTrainer(model=model, reward_funcs=em_reward, args=config,
                          train_dataset=dataset, processing_class=tok)
    clock = {"generate": 0.0, "rollout": 0.0, "training_step": 0.0, "completion_tokens": 0,
             "eos": 0}

    def timed(name, fn, count=False):
        def wrapper(*a, **k):
            t = time.perf_counter()
            result = fn(*a, **k)
            clock[name] += time.perf_counter() - t
            if count:  # _generate_single_turn -> (completion_ids, logprobs)
                ids = result[0]
                clock["completion_tokens"] += sum(len(c) for c in ids)
                clock["eos"] += sum(1 for c in ids if c and c[-1] in trainer.eos_token_ids)
            return result
        return wrapper

    trainer._generate_single_turn = timed("generate", trainer._generate_single_turn, count=True)
    trainer._generate_and_score_completions = timed("rollout",
                                                    trainer._generate_and_score_completions)
    trainer.training_step = timed("training_step", trainer.training_step)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    sync(args)
    started = time.perf_counter()
    trainer.train()
    sync(args)
    wall = time.perf_counter() - started
    logged = next((h for h in trainer.state.log_history if "completions/mean_length" in h), {})
    mean_len = logged.get("completions/mean_length", float("nan"))
    return {"wall": wall, "generate": clock["generate"], "rollout": clock["rollout"],
            "train_micro": clock["training_step"] - clock["rollout"],
            "other": wall - clock["training_step"],
            "completion_tokens_logged": round(mean_len * n),
            "completion_tokens": clock["completion_tokens"],
            # seekrl does not keep the EOS token it samples; TRL keeps it in the completion
            "generated": clock["completion_tokens"] - clock["eos"],
            "clipped_ratio": logged.get("completions/clipped_ratio"),
            "reward": logged.get("reward"), "global_step": trainer.state.global_step,
            "checkpointing": bool(config.gradient_checkpointing),
            "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if gpu else None}


# ---------------------------------------------------------------------- main


def sync(args) -> None:
    """Wait for the GPU's queued work, so that the clock measures it."""
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


_NOW = {"dtype": "bf16-mixed", "monitor": {"displacement_episodes": 4}}
DEMO_SIDES = {"before": {"dtype": "float32", "monitor": {"displacement_episodes": 8}},
              "now": _NOW,
              # one whole group (G = 4, one prompt) per forward/backward instead of half a
              # group: its shared prompt runs once, not twice, at ~2x the activations
              "micro4": {**_NOW, "algo": {"micro_batch_size": 4}},
              "micro1": {**_NOW, "algo": {"micro_batch_size": 1}}}


def demo_steps(args, work: Path) -> str:
    """The demo's RL step (src/seekrl/presets/demo/rl.yaml: its batch, micro-batches, trained layers
    and rollout limits) from `--demo-policy` on the demo's world, for each side of
    `DEMO_SIDES`, `--repeats` times in alternating order; the same seed, so the first
    rollout draws the same questions. Returns the summary's part."""
    from seekrl.config import merged
    from seekrl.recipes.pipeline import DemoConfig, rl_config

    demo = DemoConfig()
    sides = [x.strip() for x in args.demo_sides.split(",") if x.strip()]
    if len(set(sides)) != len(sides) or len(sides) < 2 \
            or any(x not in DEMO_SIDES for x in sides):
        raise SystemExit(f"--demo-sides: two or more different sides of "
                         f"{', '.join(DEMO_SIDES)}, got "
                         f"{args.demo_sides!r}")
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for r in range(args.repeats):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            out = Path(tempfile.mkdtemp(prefix=f"seekrl-demo-{side}-", dir=work))
            side_demo = demo.model_copy(update={"rl": merged(
                {"steps": 1, "log": {"save_rollouts": 0}}, DEMO_SIDES[side])})
            cfg = rl_config(side_demo, model=args.demo_policy, index_dir=work / "index",
                            train_file=work / "world" / "train.jsonl", out=out)
            trainer = Trainer(cfg, console=None)
            started = time.perf_counter()
            record = trainer.step(1)
            record["wall"] = time.perf_counter() - started
            trainer.log.close()
            runs[side].append(record)
            print(f"repeat={r} demo_side={side} step_s={record['wall']:.1f} "
                  f"rollout_s={record[M.TIME_ROLLOUT]:.1f} update_s={record[M.TIME_UPDATE]:.1f} "
                  f"generated_tokens={record[M.ROLLOUT_TOKENS]} "
                  f"valid_format={record[M.VALID_FORMAT]} reward={record[M.REWARD]} "
                  f"rollout_logp_gap={record.get(M.ROLLOUT_LOGP_GAP)}", flush=True)
    step = {side: median([x["wall"] for x in rs]) for side, rs in runs.items()}
    for side, rs in runs.items():
        print(f"demo_step_s_{side}={step[side]:.1f} "
              f"demo_rollout_s_{side}={median([x[M.TIME_ROLLOUT] for x in rs]):.1f} "
              f"demo_update_s_{side}={median([x[M.TIME_UPDATE] for x in rs]):.1f} "
              f"demo_rollout_tok_s_{side}={median([x[M.TOKENS_PER_S] for x in rs]):.1f}")
    base, *others = sides
    return " ".join(f"demo_step_ratio_{side}_vs_{base}={step[side] / step[base]:.2f}"
                    for side in others) + \
        f" (demo RL step: {', '.join(f'{x} {step[x]:.1f}s' for x in sides)})"


def warm_up(args, prompt: str) -> None:
    """Process-wide first-call costs (allocator, kernels), paid before any timing."""
    model, tok = policy(args)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids.to(args.device)
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                       do_sample=True, pad_token_id=tok.pad_token_id)
    model.train()
    model(input_ids=ids.repeat(2, 1), labels=ids.repeat(2, 1)).loss.backward()


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    from rollout import ARCHS  # bench/, beside this script

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--skip-trl", action="store_true", help="no single-turn comparison")
    p.add_argument("--skip-agent", action="store_true", help="no multi-turn agent step")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU comparison")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "bf16-mixed"))
    p.add_argument("--arch", default="", choices=("", *ARCHS),
                   help="random weights of this architecture (default: the bundled model)")
    p.add_argument("--demo-policy", type=Path, default=None,
                   help="a trained agent (e.g. an SFT checkpoint): time the demo's own RL step "
                        "from it (its RL config, 8 x 4 episodes, top 16 layers), as it was "
                        "(float32, every right episode measured again after the update) and "
                        "as the demo runs it now (bf16-mixed, 4 measured again), alternating")
    p.add_argument("--demo-sides", default="before,now",
                   help=f"with --demo-policy: the sides timed, the first the reference of "
                        f"the ratios (from: {', '.join(DEMO_SIDES)})")
    p.add_argument("--unshared", action="store_true",
                   help="a third single-turn side: seekrl with algo.share_prompts off (every "
                        "episode's prompt run in full in the update), to attribute the gain")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import transformers
    transformers.utils.logging.disable_progress_bar()

    work = Path(tempfile.mkdtemp(prefix="seekrl-bench-train-step-"))
    world, retriever, questions = build_world(work, args.questions)
    _, tok = load_policy("smollm2-135m")
    prompts = [build_prompt(tok, q.question, "direct") for q in questions]
    same_ids = all(tok(t)["input_ids"] == tok.encode(t, add_special_tokens=False) for t in prompts)
    print(f"questions={len(questions)} group={args.group} max_new_tokens={args.max_new_tokens} "
          f"repeats={args.repeats} threads={threads} model={args.arch or 'smollm2-135m'} "
          f"torch={torch.__version__} "
          f"transformers={transformers.__version__} docs={len(world.docs)}")
    warm_up(args, prompts[0])

    demo_summary = demo_steps(args, work) if args.demo_policy else None
    agent = None
    if not args.skip_agent:
        agent = seekrl_step(args, "agent", questions, work, retriever=retriever)
        torch.set_num_threads(threads)
        print(f"agent_peak_rss_mb={peak_rss_mb()}")   # the agent step runs first
        print(f"agent_episodes={agent[M.EPISODES]} agent_generated_tokens={agent['generated']} "
              f"agent_searches={agent[M.SEARCHES]} agent_valid_format={agent[M.VALID_FORMAT]} "
              f"agent_reward={agent[M.REWARD]}")
        print(f"agent_time_rollout={agent[M.TIME_ROLLOUT]} agent_time_scoring="
              f"{agent[M.TIME_SCORING]} agent_time_old_logprobs={agent[M.TIME_OLD_LOGPROBS]} "
              f"agent_time_update={agent[M.TIME_UPDATE]} agent_time_step={agent[M.TIME_STEP]} "
              f"agent_rollout_tok_s={agent[M.TOKENS_PER_S]} "
              f"agent_train_tok_s={agent[M.TRAIN_TOKENS_PER_S]}")
        print(f"agent_rollout_logp_gap={agent.get(M.ROLLOUT_LOGP_GAP)} "
              f"agent_rollout_logp_gap_max={agent.get('rollout_logp_gap_max')} "
              f"agent_peak_gpu_mb={agent.get('peak_gpu_mb')}")

    trl_runs: list[dict] = []
    seek_runs: list[dict] = []
    unshared_runs: list[dict] = []
    if not args.skip_trl:
        try:
            import trl
        except ImportError:
            raise SystemExit("the TRL comparison needs trl: .venv/bin/pip install 'seekrl[bench]' "
                             "(or pass --skip-trl)") from None
        print(f"trl={trl.__version__} prompt_tokens_same={same_ids} "
              f"prompt_tokens_mean={sum(len(tok.encode(t)) for t in prompts) / len(prompts):.1f}")
        golden = [list(q.golden_answers) for q in questions]
        for r in range(args.repeats):
            order = ("trl", "seekrl") if r % 2 == 0 else ("seekrl", "trl")
            if args.unshared:
                order = order[:1] + ("unshared",) + order[1:]
            for side in order:
                torch.set_num_threads(threads)
                if side == "trl":
                    with contextlib.redirect_stdout(io.StringIO()):  # TRL prints its logs
                        run = trl_step(args, prompts, golden, work)
                    trl_runs.append(run)
                    print(f"repeat={r} side=trl step_s={run['wall']:.1f} "
                          f"generate_s={run['generate']:.1f} rollout_s={run['rollout']:.1f} "
                          f"train_micro_s={run['train_micro']:.1f} other_s={run['other']:.1f} "
                          f"generated_tokens={run['generated']} "
                          f"completion_tokens={run['completion_tokens']} "
                          f"completion_tokens_logged={run['completion_tokens_logged']} "
                          f"clipped_ratio={run['clipped_ratio']} reward={run['reward']} "
                          f"optimizer_steps={run['global_step']} "
                          f"activation_checkpointing={run['checkpointing']} "
                          f"peak_gpu_mb={run['peak_gpu_mb']}")
                else:
                    run = seekrl_step(args, "direct", questions, work,
                                      share_prompts=side == "seekrl")
                    (seek_runs if side == "seekrl" else unshared_runs).append(run)
                    print(f"repeat={r} side={side} step_s={run['wall']:.1f} "
                          f"rollout_s={run[M.TIME_ROLLOUT]:.1f} "
                          f"old_logprobs_s={run[M.TIME_OLD_LOGPROBS]:.1f} "
                          f"update_s={run[M.TIME_UPDATE]:.1f} "
                          f"generated_tokens={run['generated']} reward={run[M.REWARD]} "
                          f"valid_format={run[M.VALID_FORMAT]} "
                          f"peak_gpu_mb={run.get('peak_gpu_mb')}")

    summary = ["summary:"]
    if trl_runs and seek_runs:
        trl_s = median([x["wall"] for x in trl_runs])
        seek_s = median([x["wall"] for x in seek_runs])
        trl_tok = median([x["generated"] for x in trl_runs])
        seek_tok = median([x["generated"] for x in seek_runs])
        trl_gen = median([x["generate"] for x in trl_runs])
        seek_gen = median([x[M.TIME_ROLLOUT] for x in seek_runs])
        trl_upd = median([x["wall"] - x["rollout"] for x in trl_runs])
        seek_upd = median([x[M.TIME_UPDATE] for x in seek_runs])
        print(f"single_turn_trl_step_s={trl_s:.1f} single_turn_seekrl_step_s={seek_s:.1f} "
              f"single_turn_trl_generated_tokens={trl_tok:.0f} "
              f"single_turn_seekrl_generated_tokens={seek_tok:.0f}")
        print(f"single_turn_trl_generate_s={trl_gen:.1f} single_turn_seekrl_rollout_s={seek_gen:.1f} "
              f"generate_speedup={trl_gen / seek_gen:.2f} "
              f"single_turn_trl_after_rollout_s={trl_upd:.1f} "
              f"single_turn_seekrl_update_s={seek_upd:.1f} update_speedup={trl_upd / seek_upd:.2f}")
        print(f"single_turn_trl_gen_tok_s={trl_tok / trl_gen:.1f} "
              f"single_turn_seekrl_gen_tok_s={seek_tok / seek_gen:.1f}")
        if unshared_runs:
            un_s = median([x["wall"] for x in unshared_runs])
            un_upd = median([x[M.TIME_UPDATE] for x in unshared_runs])
            print(f"single_turn_unshared_step_s={un_s:.1f} single_turn_unshared_update_s="
                  f"{un_upd:.1f} share_prompts_update_speedup={un_upd / seek_upd:.2f} "
                  f"trl_speedup_unshared={trl_s / un_s:.2f}")
        key = "trl_speedup_gpu" if args.device.startswith("cuda") else "trl_speedup"
        summary.append(f"{key}={trl_s / seek_s:.2f} (TRL {trl_s:.1f}s vs seekrl {seek_s:.1f}s "
                       f"per single-turn step, {trl_tok:.0f} vs {seek_tok:.0f} tokens)")
    if demo_summary:
        summary.append(demo_summary)
    if agent is not None:
        summary.append(f"agent_step={agent['wall']:.1f}s (rollout {agent[M.TIME_ROLLOUT]:.1f}s "
                       f"at {agent[M.TOKENS_PER_S]} tok/s, old_logprobs "
                       f"{agent[M.TIME_OLD_LOGPROBS]:.1f}s, update {agent[M.TIME_UPDATE]:.1f}s)")
    peak = peak_rss_mb()
    print(f"peak_rss_mb={peak}")   # the whole run's peak (the largest side sets it)
    summary.append(f"peak_rss_mb={peak}")
    print(" ".join(summary))


if __name__ == "__main__":
    main()
