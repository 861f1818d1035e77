"""The simulated retriever's two decoding loops side by side: seekrl's rollout-engine loop
(`engine=seekrl`, the default) against Hugging Face's `model.generate` (`engine=generate`),
on the same simulator, queries and prompts, in one process.

    .venv/bin/python bench/simulator_engine.py --work-dir /tmp/seekrl-sim \\
        --simulator runs/simulator/sft/final --n-queries 48 --dtype bf16-mixed

The queries are the dev questions' hop queries of the demo's world (built in `--work-dir`
unless there), under the useful prompt (with question and gold answer), greedy as
`bench/simulated_search.py --stage quality` measures them, and sampled at the training
temperature (0.8). Each batch runs on both engines, which go first in turn (`--rounds`
passes over the queries), so a noisy machine slows both alike. Prints `key=value` figures: seconds per
query for each engine and their ratio, generated tokens, and for the greedy pass the share
of queries with a document holding the gold answer and the share of malformed outputs
(greedy decoding is the same computation, so these should agree up to float rounding);
the last line is a one-line summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from learning import _world

    from seekrl.agent.backends import text_decoder
    from seekrl.data.qa import read_qa_jsonl
    from seekrl.recipes.pipeline import DemoConfig
    from seekrl.retrieval.simulated import SimulatedRetriever, parse_documents, simulator_prompt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/seekrl-sim"))
    ap.add_argument("--simulator", default="smollm2-135m")
    ap.add_argument("--n-queries", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    demo = DemoConfig()
    world_dir, _ = _world(args.work_dir, demo)
    hops = [(ex, hop) for ex in read_qa_jsonl(world_dir / "dev.jsonl")
            for hop in ex.metadata.get("chain") or []][:args.n_queries]
    prompts = [simulator_prompt(hop["query"], demo.rollout.topk, question=ex.question,
                                answer=hop["answer"])
               for ex, hop in hops]
    base = SimulatedRetriever.from_pretrained(args.simulator, dtype=args.dtype)
    engines = ("seekrl", "generate")
    print(f"simulator={args.simulator} queries={len(prompts)} batch={args.batch_size} "
          f"dtype={args.dtype} max_new_tokens={args.max_new_tokens}", flush=True)
    figures: dict[str, float] = {}
    for label, temperature in (("greedy", 0.0), ("sampled", 0.8)):
        decoders = {"seekrl": text_decoder(base.model, base.tokenizer), "generate": None}
        sims = {e: SimulatedRetriever(base.model, base.tokenizer, decoder=decoders[e], seed=0,
                                      temperature=temperature, batch_size=args.batch_size,
                                      max_new_tokens=args.max_new_tokens) for e in engines}
        seconds = dict.fromkeys(engines, 0.0)
        texts: dict[str, list[str]] = {e: [] for e in engines}
        for _ in range(args.rounds):
            for b, start in enumerate(range(0, len(prompts), args.batch_size)):
                batch = prompts[start:start + args.batch_size]
                for e in (engines if b % 2 == 0 else engines[::-1]):
                    t0 = time.perf_counter()
                    got = sims[e].generate(batch)
                    seconds[e] += time.perf_counter() - t0
                    texts[e] += got
        n = len(prompts) * args.rounds
        for e in engines:
            tokens = sum(len(base.tokenizer(t, add_special_tokens=False)["input_ids"])
                         for t in texts[e])
            figures[f"{label}_{e}_s_per_query"] = seconds[e] / n
            print(f"{label}_{e}_s_per_query={seconds[e] / n:.3f} "
                  f"{label}_{e}_tokens_per_query={tokens / n:.1f}", flush=True)
            if label == "greedy":
                contained = malformed = 0
                for text, (_, hop) in zip(texts[e], hops * args.rounds):
                    docs, ok = parse_documents(text, demo.rollout.topk)
                    malformed += not ok
                    body = " ".join(x.lower() for _, x in docs)
                    contained += hop["answer"].lower() in body
                print(f"greedy_{e}_answer_contained={contained / n:.3f} "
                      f"greedy_{e}_malformed={malformed / n:.3f}", flush=True)
        if label == "greedy":
            same = sum(a == b for a, b in zip(texts["seekrl"], texts["generate"]))
            print(f"greedy_identical_outputs={same / n:.3f}", flush=True)
        ratio = seconds["generate"] / max(seconds["seekrl"], 1e-9)
        figures[f"{label}_speedup"] = ratio
        print(f"{label}_speedup={ratio:.2f}", flush=True)
    print(f"simulator_engine: seekrl's loop {figures['greedy_speedup']:.2f}x greedy, "
          f"{figures['sampled_speedup']:.2f}x sampled against model.generate "
          f"({figures['sampled_seekrl_s_per_query']:.2f} vs "
          f"{figures['sampled_generate_s_per_query']:.2f} s a query sampled)", flush=True)


if __name__ == "__main__":
    main()
