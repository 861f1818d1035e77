"""What an RL run's rollouts search, built from its config in one place: the index (or your
own retriever), a ranker over its candidates (and, with `ranker.train`, the ranker's
updater, trained on each step's searches), and simulated search (an LLM writes the
documents, its noise following a curriculum over the run). The trainer asks it for the
retriever of a step's rollouts, hands it each step's episodes, and saves / loads its state
with the checkpoint."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from seekrl.agent.trajectory import Trajectory
from seekrl.config import TrainConfig
from seekrl.errors import ConfigError
from seekrl.recipes.setup import open_index

# what a simulator counts (SimulatedRetriever.stats), logged as simulator_<count>_total
SIMULATOR_COUNTS = ("queries", "noisy", "malformed", "empty", "short", "cut", "tokens")


class SearchEnvironment:
    """`retriever`: the run's `index`, what rollouts search without a simulator (opened for
    evaluations alone with simulated search; None when nothing searches it);
    `eval_retriever`: what evaluations search (`eval.index`'s, on the main process only;
    else `retriever`);
    `simulator`: simulated search's engine or None; `ranker_updater`: the co-trained
    ranker's updater or None; `simulator_totals`: the simulators' counts summed over the
    processes."""

    def __init__(self, cfg: TrainConfig, retriever=None, *, dist, device: str):
        self.cfg, self.dist, self.device = cfg, dist, device
        self.simulator_totals: dict[str, int] = {}
        self.ranker_updater = None
        self.simulator = self._load_simulator()
        # simulated search and self-search need no index for their rollouts, only for
        # evaluations (sim-to-real)
        simulated = cfg.simulator is not None or cfg.rollout.self_search
        needs = None
        if retriever is None and cfg.rollout.method != "direct" and not simulated:
            needs = f"rollout.method {cfg.rollout.method!r} searches"
        elif retriever is None and cfg.eval.data and not cfg.eval.index:
            needs = "eval.data is set: the dev evaluation searches"
        if needs:
            retriever = open_index(cfg.index, needs, cfg.retriever)
        rk = cfg.ranker
        if rk is not None and retriever is not None:   # rollouts and evaluations see its order
            from seekrl.retrieval.ranker import RankerUpdater, load_ranker, ranked_retriever

            ranker = load_ranker(rk.model, kind=rk.kind, device=device, max_len=rk.max_len,
                                 temperature=rk.temperature, first=retriever)
            if rk.train:   # trained on each step's searches
                self.ranker_updater = RankerUpdater(ranker, rk.lr, seed=cfg.seed)
            retriever = ranked_retriever(retriever, ranker, rk.candidates,
                                         keep_candidates=rk.train)
        self.retriever = retriever
        # what evaluations search: `eval.index` when set (opened where evaluations run, on
        # the main process, and ordered by the same ranker), else the rollouts' retriever
        self.eval_retriever = retriever
        if cfg.eval.data and cfg.eval.index:
            self.eval_retriever = None
            if dist.main:
                own = open_index(cfg.eval.index, "eval.index", cfg.retriever)
                self.eval_retriever = own
                if rk is not None:
                    self.eval_retriever = ranked_retriever(own, retriever.ranker, rk.candidates)
                    self._share_ranker(retriever.ranker)

    def _share_ranker(self, ranker) -> None:
        """`ranker` orders both retrievers; the rollouts' takes it last, since a query
        encoder binds to the index it searches and trains on the rollouts' documents."""
        if self.eval_retriever is not None and self.eval_retriever is not self.retriever:
            self.eval_retriever.ranker = ranker
        self.retriever.ranker = ranker

    def _load_simulator(self):
        """The simulated search engine (ZeroSearch) of `simulator`, its decoding loop the
        rollout engine's (`simulator.engine: seekrl`) or `model.generate`; None without."""
        from seekrl.agent.backends import text_decoder
        from seekrl.models import ModelError
        from seekrl.retrieval.simulated import SimulatedRetriever, prompt_mismatch

        sim, cfg = self.cfg.simulator, self.cfg
        if sim is None:
            return None
        why = prompt_mismatch(sim.model, topk=cfg.rollout.topk, words=sim.words)
        if why and self.dist.main:
            warnings.warn(f"{why} (rollout.topk, simulator.words)", stacklevel=2)
        try:
            return SimulatedRetriever.from_pretrained(
                sim.model, device=self.device, dtype=cfg.dtype,
                max_new_tokens=sim.max_new_tokens, temperature=sim.temperature,
                batch_size=sim.batch_size, words=sim.words, seed=cfg.seed,
                make_decoder=text_decoder if sim.engine == "seekrl" else None)
        except ModelError as err:
            raise ConfigError(f"simulator.model: {str(err).removeprefix('model: ')}") from None

    def for_rollouts(self, seed: int, progress: float):
        """What a step's rollouts search: the simulator when `simulator` is set, its noise
        following the curriculum at `progress` (the share of the run behind it, 0 to 1), its
        draws seeded by the rollouts' `seed`; else the run's retriever."""
        sim = self.cfg.simulator
        if sim is None:
            return self.retriever
        from seekrl.retrieval.simulated import noise_probability

        self.simulator.reseed(seed)
        self.simulator.set_noise(noise_probability(progress, 1.0, sim.noise_start,
                                                   sim.noise_end, sim.noise_base))
        return self.simulator

    def ranker_seconds(self) -> float | None:
        """The ranker's scoring seconds so far (None without a ranker)."""
        return getattr(self.retriever, "seconds", None) if self.cfg.ranker else None

    def after_rollouts(self, trajs: Sequence[Trajectory], ranked_before: float | None
                       ) -> dict[str, Any]:
        """The step record's part about search: the simulator's noise and counts (summed
        over the processes: each rank's simulator answers its own rollouts), the ranker's
        share of the rollouts' time (a cost the token budget does not see), and the
        co-trained ranker's update on this step's searches."""
        record: dict[str, Any] = {}
        if self.simulator is not None:
            own = self.simulator.stats
            self.simulator_totals = {k: int(v) for k, v in self.dist.sum_values(
                {k: own[k] for k in SIMULATOR_COUNTS}).items()}
            record["simulator_noise"] = round(self.simulator.noise, 4)
            record.update({f"simulator_{k}_total": v for k, v in self.simulator_totals.items()})
        if ranked_before is not None:
            record["time_ranker_score"] = round(self.retriever.seconds - ranked_before, 2)
        if self.ranker_updater is not None:
            record.update(self._train_ranker(trajs))
        return record

    def _train_ranker(self, trajs: Sequence[Trajectory]) -> dict[str, Any]:
        """The ranker's update on this step's searches, with the candidates it was given
        (the ranker's labels and loss); the rollouts' own candidates are then forgotten."""
        from seekrl.recipes.ranker import training_examples, trajectory_records

        rr, rk = self.retriever, self.cfg.ranker
        records = [r for r in trajectory_records(trajs) if r["query"] in rr.last]
        examples = training_examples(records, [rr.last[r["query"]] for r in records])
        rr.forget()
        t0 = time.time()
        stats = self.ranker_updater.update(examples, rk.updates_per_step, rk.batch_size)
        return {**stats, "ranker_updates": self.ranker_updater.updates,
                "time_ranker_update": round(time.time() - t0, 2)}

    # ------------------------------------------------------------------ checkpoints
    def save(self, folder: Path) -> None:
        """The co-trained ranker and its optimizer's state into `folder`/ranker."""
        if self.ranker_updater is not None:
            self.retriever.ranker.save(folder / "ranker")
            torch.save(self.ranker_updater.state_dict(), folder / "ranker" / "updater.pt")

    def check_checkpoint(self, folder: Path) -> None:
        if self.ranker_updater is not None and not (folder / "ranker").is_dir():
            # refused before anything is loaded: the start ranker would go on silently
            raise ConfigError(f"ranker.train: the checkpoint {folder} holds no ranker/ (it was "
                              "not written by a run that trained its ranker); resume with "
                              "the config it was written with")

    def load(self, folder: Path) -> None:
        if self.ranker_updater is None:
            return
        from seekrl.retrieval.ranker import RankerUpdater, load_ranker

        rk = self.cfg.ranker
        ranker = load_ranker(str(folder / "ranker"), device=self.device)
        self._share_ranker(ranker)
        self.ranker_updater = RankerUpdater(ranker, rk.lr, seed=self.cfg.seed)
        self.ranker_updater.load_state_dict(torch.load(
            folder / "ranker" / "updater.pt", map_location=self.device, weights_only=False))

    def state_dict(self) -> dict[str, int]:
        return dict(self.simulator_totals)

    def load_state_dict(self, totals: dict[str, int]) -> None:
        """The simulators' totals go on from the checkpoint's: rank 0 holds them, the other
        ranks count from 0, and the step's sum over the ranks is the total again."""
        self.simulator_totals = dict(totals)
        if self.simulator is not None:
            self.simulator.stats.clear()
            if self.dist.main:
                self.simulator.stats.update(self.simulator_totals)
