"""Step labels for a process reward model: Monte-Carlo tree search over search steps, or
plain Monte-Carlo rollouts (the cheap alternative), both written in one format.

MCTS (ProRAG's stage 2, with rules instead of an LLM judge). A node is one step: a model
turn and the environment's answer to it; the root is the prompt. A simulation walks down
from the root by PUCT (uniform prior), `Q(c) + c * P(c) * sqrt(N(parent)) / (1 + N(c))`,
until it reaches a node not yet expanded, and expands it with `expansions` continuations
sampled in one batch. Each continuation is a whole episode: its first new step becomes a
child (continuations whose step does the same thing, the same query or the same answer,
share one child) and the rest of it is that child's simulation, so an expansion of K
continuations costs K simulations. An episode's reward (answer F1 or EM) is backed up with
a discount per step: a node at depth j of an episode that ended after L steps receives
`reward * gamma ** (L - j)`. Reaching a terminal node (an answer, or the turn budget
spent) backs up its own reward again at no generation cost. The budget is `simulations`
per question.

Trees of many questions grow together: each round, every tree with budget left selects one
node, and all their expansions go to the rollout engine in one call (prefix continuation,
so the shared context is prefilled once).

Output (a folder, `LabelWriter`): `nodes.jsonl` (one line per node: question, parent,
depth, the step, the path of steps to it, N, Q), `labels.jsonl` (`Trajectory` records
whose labelled steps carry `Step.value` = Q and `metadata["visits"]` = N per step; for
MCTS one episode per leaf, its path labelled), and `pairs.jsonl` (sibling steps from the
same prefix, better and worse, with their Q gap) filtered by rules: both visited at least
`min_visits` times, a Q gap of at least `min_gap` (ties never pair), the better step
well-formed and not repeating an earlier query.

Monte-Carlo labels (Math-Shepherd style): `samples` episodes per question, and for every
step an episode went on from, `mc_samples` continuations; a step's label is the mean reward
of its continuations (the last step's, the episode's own reward). Episodes whose steps do
the same thing so far share a node (as in MCTS), its label the sample-weighted mean of
their estimates, written to `nodes.jsonl` in the MCTS format. Pairs are first steps of the
same question (siblings from the prompt: the only ones sharing their tokens before the step).

Questions are processed in chunks of `trees_per_batch`; each finished chunk is appended to
the files and recorded in `progress.json` (written atomically), so a killed run resumes
after the last whole chunk and never keeps half of one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from seekrl.agent.protocol import normalise_text
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.agent.trajectory import Step, Trajectory
from seekrl.config import flat_keys
from seekrl.data.qa import QAExample
from seekrl.recipes.labels import Labels, LabelWriter, SearchStats

ScoreFn = Callable[[Trajectory], float]


def step_key(step: Step) -> str:
    """What a step does, for de-duplicating siblings: the same query (or another tool's
    same argument), the same answer, or the same kind of invalid turn, is the same child
    whatever the reasoning around it."""
    if step.action == "answer":
        return "answer:" + normalise_text(step.answer or "")
    if step.action == "invalid":
        return "invalid:" + (step.reason or "")
    # a search or another tool's call (`open` a document): its own action and argument,
    # so opening document 1 and document 7 are two children, neither an invalid turn
    return f"{step.action}:" + normalise_text(step.query or "")


@dataclass
class Node:
    id: int
    parent: int | None
    depth: int                       # steps on the path from the root (root: 0)
    traj: Trajectory                 # an episode through this node: its first `depth` steps
    key: str = ""                    # step_key of the node's step
    children: list[int] = field(default_factory=list)
    visits: int = 0                  # N
    value_sum: float = 0.0           # W
    terminal: bool = False           # the episode ended at this step
    reward: float | None = None      # a terminal node's episode reward
    expanded: bool = False

    @property
    def q(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0

    @property
    def step(self) -> Step | None:
        return self.traj.steps[self.depth - 1] if self.depth else None


class Tree:
    """One question's search tree, and the PUCT / backup rules."""

    def __init__(self, example: QAExample, root: Trajectory, *, c_puct: float = 2.5,
                 gamma: float = 0.99):
        self.example = example
        self.nodes = [Node(0, None, 0, root)]
        self.c_puct, self.gamma = c_puct, gamma
        self.simulations = 0

    def puct(self, parent: Node, child: Node) -> float:
        prior = 1.0 / len(parent.children)
        return child.q + self.c_puct * prior * math.sqrt(parent.visits) / (1 + child.visits)

    def select(self) -> Node:
        """From the root down by PUCT (ties to the older child) to a node that is terminal
        or not expanded yet."""
        node = self.nodes[0]
        while node.expanded and node.children and not node.terminal:
            node = max((self.nodes[c] for c in node.children),
                       key=lambda c: (self.puct(node, c), -c.id))
        return node

    def backup(self, node: Node, reward: float, end_depth: int) -> None:
        """One simulation's reward into the node and its ancestors, discounted by the steps
        between each of them and the episode's end."""
        current: Node | None = node
        while current is not None:
            current.visits += 1
            current.value_sum += reward * self.gamma ** (end_depth - current.depth)
            current = self.nodes[current.parent] if current.parent is not None else None

    def expand(self, node: Node, continuations: Sequence[Trajectory], score: ScoreFn) -> None:
        """Children from continuations of `node` (each a whole episode), and one backup per
        continuation."""
        by_key = {self.nodes[c].key: self.nodes[c] for c in node.children}
        for cont in continuations:
            reward = float(score(cont))
            if len(cont.steps) <= node.depth:      # nothing generated: no room was left
                node.terminal, node.reward = True, reward
                self.backup(node, reward, node.depth)
                continue
            step = cont.steps[node.depth]
            key = step_key(step)
            went_on = step.info_end is not None
            child = by_key.get(key)
            if child is None:
                child = Node(len(self.nodes), node.id, node.depth + 1, cont, key,
                             terminal=not went_on, reward=None if went_on else reward)
                self.nodes.append(child)
                node.children.append(child.id)
                by_key[key] = child
            elif child.terminal and went_on and not child.expanded:
                # the same action went on here (the first one ran out of room): the node is
                # a state to search from, with this episode as its representative
                child.terminal, child.reward, child.traj = False, None, cont
            elif not child.step.well_formed and step.well_formed and \
                    (went_on or child.terminal) and not child.expanded:
                child.traj = cont          # show the cleanest turn for the action
            self.backup(child, reward, len(cont.steps))
        node.expanded = True

    def path(self, node: Node) -> list[Node]:
        """The nodes from the root's first child down to `node`."""
        out = []
        while node.parent is not None:
            out.append(node)
            node = self.nodes[node.parent]
        return out[::-1]


def _new_tokens(t: Trajectory) -> int:
    return t.n_decoded - t.prefix_tokens


def grow_search_trees(engine: RolloutEngine, examples: Sequence[QAExample], score: ScoreFn, *,
                      simulations: int, expansions: int, c_puct: float = 2.5,
                      gamma: float = 0.99, seed: int = 0) -> tuple[list[Tree], SearchStats]:
    """MCTS for many questions at once, `simulations` per question (see the module doc)."""
    if simulations < 1 or expansions < 1:
        raise ValueError("simulations and expansions must be positive")
    started = time.time()
    stats = SearchStats()
    roots = engine.prompt_episodes(examples)
    trees = [Tree(ex, root, c_puct=c_puct, gamma=gamma) for ex, root in zip(examples, roots)]
    while True:
        jobs: list[tuple[Tree, Node, int]] = []
        for tree in trees:
            while tree.simulations < simulations:
                node = tree.select()
                if node.terminal:   # its reward is known: back it up again, nothing to generate
                    tree.backup(node, node.reward or 0.0, node.depth)
                    tree.simulations += 1
                    continue
                k = min(expansions, simulations - tree.simulations)
                jobs.append((tree, node, k))
                tree.simulations += k
                break
        if not jobs:
            break
        prefixes = [(node.traj, node.depth) for _, node, k in jobs for _ in range(k)]
        grown = engine.continue_from(prefixes, 1, seed=seed + 7919 * stats.rounds)
        stats.rounds += 1
        i = 0
        for tree, node, k in jobs:
            conts = [g[0] for g in grown[i:i + k]]
            i += k
            tree.expand(node, conts, score)
            stats.rollouts += k
            stats.generated_tokens += sum(_new_tokens(c) for c in conts)
    stats.simulations = sum(t.simulations for t in trees)
    stats.seconds = time.time() - started
    return trees, stats


# ---------------------------------------------------------------------- labels as records
@dataclass
class PairRules:
    min_visits: int = 2
    min_gap: float = 0.2


def _labelled(traj: Trajectory, values: Sequence[float | None], visits: Sequence[int | None],
              method: str, node_ids: Sequence[int | None] | None = None) -> dict:
    """A trajectory record with `Step.value` set on the labelled steps (None elsewhere)."""
    record = traj.to_dict()
    for step, v in zip(record["steps"], list(values) + [None] * len(record["steps"])):
        step["value"] = v
        step["process_reward"], step["process_parts"] = None, {}
    n = len(record["steps"])
    record["metadata"] = {**record["metadata"], "label": method,
                          "visits": (list(visits) + [None] * n)[:n]}
    if node_ids is not None:
        record["metadata"]["node_ids"] = (list(node_ids) + [None] * n)[:n]
    return record


def _pair_problem(better: Node | tuple[Trajectory, int], prefix: Trajectory, depth: int
                  ) -> str | None:
    traj, index = (better.traj, better.depth - 1) if isinstance(better, Node) else better
    step = traj.steps[index]
    if not step.well_formed:
        return "better_malformed"
    if step.action == "search":
        earlier = {normalise_text(s.query or "") for s in prefix.steps[:depth]
                   if s.action == "search"}
        if normalise_text(step.query or "") in earlier:
            return "better_repeats_query"
    return None


def _gap_pairs(better: float, worse: float, min_gap: float) -> bool:
    """Whether two siblings' Q values pair: judged on the gap as written (6 places), so a
    float tie (Q values backed up in another order, 1e-16 apart) does not pair with a gap
    of 0.0 that the label reader refuses, and a gap of min_gap is not lost to rounding
    (0.7 - 0.2 = 0.49999999999999994)."""
    gap = round(better - worse, 6)
    return gap > 0 and gap >= min_gap


def _pair_record(example_id: str, depth: int, better: tuple[Trajectory, float, int],
                 worse: tuple[Trajectory, float, int], method: str) -> dict:
    (bt, bq, bn), (wt, wq, wn) = better, worse
    return {"example_id": example_id, "depth": depth, "label": method,
            "q_better": round(bq, 6), "q_worse": round(wq, 6), "gap": round(bq - wq, 6),
            "n_better": bn, "n_worse": wn,
            "better": _labelled(bt, [None] * depth + [bq], [None] * depth + [bn], method),
            "worse": _labelled(wt, [None] * depth + [wq], [None] * depth + [wn], method)}


def tree_labels(trees: Sequence[Tree], rules: PairRules) -> Labels:
    out = Labels()
    for tree in trees:
        ex_id = tree.example.id
        for node in tree.nodes:
            step = node.step
            out.nodes.append({
                "example_id": ex_id, "node": node.id, "parent": node.parent,
                "depth": node.depth, "N": node.visits, "Q": round(node.q, 6),
                "terminal": node.terminal, "reward": node.reward,
                "action": step.action if step else None,
                "query": step.query if step else None,
                "answer": step.answer if step else None,
                "text": step.text if step else None,
                "path": [n.key for n in tree.path(node)],     # the prefix, step by step
                "children": list(node.children)})
            if node.parent is not None and not node.children:   # a leaf: label its path
                path = tree.path(node)
                out.labels.append(_labelled(node.traj, [n.q for n in path],
                                            [n.visits for n in path], "mcts",
                                            [n.id for n in path]))
            kids = sorted((tree.nodes[c] for c in node.children), key=lambda n: -n.q)
            for a, b in combinations(kids, 2):
                if a.visits < rules.min_visits or b.visits < rules.min_visits:
                    out.reject("few_visits")
                elif not _gap_pairs(a.q, b.q, rules.min_gap):
                    out.reject("small_gap")
                elif (why := _pair_problem(a, node.traj, node.depth)) is not None:
                    out.reject(why)
                else:
                    out.pairs.append(_pair_record(ex_id, node.depth, (a.traj, a.q, a.visits),
                                                  (b.traj, b.q, b.visits), "mcts"))
    return out


def mc_labels(engine: RolloutEngine, examples: Sequence[QAExample], score: ScoreFn, *,
              samples: int, mc_samples: int, rules: PairRules, seed: int = 0
              ) -> tuple[Labels, SearchStats]:
    """Monte-Carlo step labels (see the module doc), in the format of `tree_labels`."""
    from seekrl.rewards.process import ProcessContext, mc_value

    started = time.time()
    roots = engine.prompt_episodes(examples)
    trajs = [t for group in engine.continue_from([(r, 0) for r in roots], samples, seed=seed)
             for t in group]
    for t in trajs:
        t.group_id = t.example_id
    ctx = ProcessContext(continue_episodes=lambda prefixes, n: engine.continue_from(
        prefixes, n, seed=seed + 104_729), episode_score=score, mc_samples=mc_samples)
    mc_value(trajs, ctx)                  # fills Step.value with V(t)
    stats = SearchStats(rollouts=len(trajs) + int(ctx.stats["mc_continuations"]),
                        generated_tokens=sum(_new_tokens(t) for t in trajs)
                        + int(ctx.stats["mc_tokens"]), rounds=2)
    stats.simulations = stats.rollouts
    out = Labels()
    by_question: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_question.setdefault(t.example_id, []).append(t)
    for ex_id, group in by_question.items():
        nodes, paths = _mc_tree(ex_id, group, mc_samples, score)
        out.nodes.extend(nodes)
        for t, ids in zip(group, paths):
            out.labels.append(_labelled(t, [nodes[i]["Q"] for i in ids],
                                        [nodes[i]["N"] for i in ids], "mc", ids))
        # first steps are siblings from the prompt (the same token prefix); deeper nodes
        # of this tree share step keys, not tokens, so they do not pair
        first = {ids[0]: t for t, ids in zip(group, paths) if ids}
        kids = sorted(((t, nodes[i]["Q"], nodes[i]["N"]) for i, t in first.items()),
                      key=lambda x: -x[1])
        for a, b in combinations(kids, 2):
            if a[2] < rules.min_visits or b[2] < rules.min_visits:
                out.reject("few_visits")
            elif not _gap_pairs(a[1], b[1], rules.min_gap):
                out.reject("small_gap")
            elif (why := _pair_problem((a[0], 0), a[0], 0)) is not None:
                out.reject(why)
            else:
                out.pairs.append(_pair_record(ex_id, 0, a, b, "mc"))
    stats.seconds = time.time() - started
    return out, stats


def _mc_tree(ex_id: str, group: Sequence[Trajectory], mc_samples: int, score: ScoreFn
             ) -> tuple[list[dict], list[list[int]]]:
    """One question's MC-labelled episodes as a tree of node records in the MCTS format:
    episodes whose steps do the same thing so far (`step_key`) share a node, whose N is
    its estimates' samples (`mc_samples` continuations, or 1 for an episode's own last
    step) and whose Q their sample-weighted mean. Returns the records and each episode's
    node ids, step by step."""
    rewards = [float(score(t)) for t in group]
    root = {"example_id": ex_id, "node": 0, "parent": None, "depth": 0, "N": len(group),
            "Q": round(sum(rewards) / max(1, len(group)), 6), "terminal": False,
            "reward": None, "action": None, "query": None, "answer": None, "text": None,
            "path": [], "children": []}
    nodes, index, sums, paths = [root], {}, {}, []
    for t, reward in zip(group, rewards):
        parent, path, ids = root, (), []
        for k, step in enumerate(t.steps):
            last = k == len(t.steps) - 1
            path += (step_key(step),)
            node = index.get(path)
            if node is None:
                node = {"example_id": ex_id, "node": len(nodes), "parent": parent["node"],
                        "depth": k + 1, "N": 0, "Q": 0.0, "terminal": last, "reward": None,
                        "action": step.action, "query": step.query, "answer": step.answer,
                        "text": step.text, "path": list(path), "children": []}
                index[path] = node
                nodes.append(node)
                parent["children"].append(node["node"])
                sums[node["node"]] = 0.0
            n = 1 if last else mc_samples
            node["N"] += n
            sums[node["node"]] += n * float(step.value)
            node["terminal"] = node["terminal"] and last   # ended here in every episode
            node["reward"] = reward if node["terminal"] else None
            ids.append(node["node"])
            parent = node
        paths.append(ids)
    for i, total in sums.items():
        nodes[i]["Q"] = round(total / nodes[i]["N"], 6)
    return nodes, paths


# ---------------------------------------------------------------------- the recipe
def check_config(cfg) -> None:
    """The labelling recipe's registry names and cross-key rules (`LabelConfig`)."""
    from seekrl.recipes.setup import check_episode_recipe

    check_episode_recipe(cfg, "labelling")


def run_labelling(cfg, *, model=None, tokenizer=None, retriever=None, backend=None,
                  questions: Sequence[QAExample] | None = None, console=None,
                  resume: bool = False) -> dict:
    """`seekrl mcts`: label the steps of `cfg.data`'s questions with the policy `cfg.model`
    (MCTS or MC, `cfg.search.method`) into `cfg.out`; returns the totals of `progress.json`
    with simulations per second. `backend` (with `tokenizer`) replaces the policy: tests
    play a scripted one."""
    from seekrl.agent.backends import HFBackend
    from seekrl.config import dump_config
    from seekrl.data.qa import load_qa
    from seekrl.models import load_policy, tokenizer_fingerprint
    from seekrl.recipes.setup import (
        check_world_index,
        open_index,
        set_seed,
        units_within_budget,
    )
    from seekrl.rewards.outcome import get_outcome

    check_config(cfg)
    search = cfg.search
    # everything that decides the labels (a resumed run may label more questions)
    settings = flat_keys(cfg.model_dump(mode="json", exclude={"out", "questions", "device"}))
    questions = list(questions) if questions is not None else load_qa(cfg.data, "train")
    if cfg.questions is not None:
        questions = questions[:cfg.questions]
    if not questions:
        raise ValueError(f"data: {cfg.data} has no questions")
    if retriever is None:       # a missing index is named before anything is written
        retriever = open_index(cfg.index, "labelling plays search episodes", cfg.retriever)
        check_world_index(cfg.index, cfg.data)
    writer = LabelWriter(cfg.out, resume=resume, settings=settings)   # refuses before loading
    set_seed(cfg.seed)
    if model is None and backend is None:
        model, tokenizer = load_policy(cfg.model, dtype=cfg.dtype, device=cfg.device)
    writer.check_tokenizer(tokenizer_fingerprint(tokenizer))
    dump_config(cfg, Path(cfg.out) / "config.yaml")
    backend = backend or HFBackend(model.eval(), tokenizer, attention=cfg.rollout.attention)
    engine = RolloutEngine(backend, tokenizer, retriever,
                           RolloutConfig.of(cfg.rollout, seed=cfg.seed))
    outcome = get_outcome(cfg.reward)
    score = lambda t: outcome(t.answer, t.golden_answers)          # noqa: E731
    rules = PairRules(min_visits=search.min_visits, min_gap=search.min_gap)
    say = console.print if console is not None else (lambda *a, **k: None)
    done = writer.done
    todo = [q for q in questions if q.id not in done]
    chunk = search.trees_per_batch
    # a run that stopped at its token budget stays stopped on resume (the rate recomputed
    # then could pay for another question)
    stopped = writer.progress.get("stopped")
    for c in range(0, len(todo) if stopped is None else 0, chunk):
        part = todo[c:c + chunk]
        if search.max_tokens is not None:   # the last chunk: what the budget pays for
            n = units_within_budget(search.max_tokens,
                                    writer.progress["stats"].get("generated_tokens", 0),
                                    len(writer.done), len(part))
            if n < len(part):
                stopped, part = f"token budget of {search.max_tokens}", part[:n]
                writer.progress["stopped"] = stopped   # saved with the chunk, or just below
            if not part:
                writer.save_progress()
                break
        # one seed per chunk written (a folder from before the count: full chunks so far);
        # len(done) // chunk repeated a seed when a resume labelled past a short chunk
        written = writer.progress.get("chunks", len(writer.done) // chunk)
        seed = cfg.seed + 1_000_003 * (written + 1)
        if search.method == "mcts":
            trees, stats = grow_search_trees(engine, part, score,
                                             simulations=search.simulations,
                                             expansions=search.expansions,
                                             c_puct=search.c_puct, gamma=search.gamma, seed=seed)
            labels = tree_labels(trees, rules)
        else:
            labels, stats = mc_labels(engine, part, score, samples=search.samples,
                                      mc_samples=search.mc_samples, rules=rules, seed=seed)
        writer.progress["chunks"] = written + 1
        writer.write([q.id for q in part], labels, stats)
        total = writer.progress["stats"]
        say(f"{len(writer.done)}/{len(questions)} questions  {total['simulations']:.0f} "
            f"simulations  {total['pairs']:.0f} pairs  "
            f"{total['simulations'] / max(total['seconds'], 1e-9):.2f} sim/s")
        if stopped:
            break
    if stopped:
        say(f"{stopped} generated tokens reached after {len(writer.done)} questions")
    total = dict(writer.progress["stats"])
    total["budget"] = stopped
    total["simulations_per_s"] = round(total.get("simulations", 0)
                                       / max(total.get("seconds", 0), 1e-9), 3)
    total["questions"] = len(writer.done)
    total["rejected"] = dict(writer.progress["rejected"])
    total["out"] = str(cfg.out)
    return total
