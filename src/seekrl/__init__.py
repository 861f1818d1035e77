"""seekrl: train LLM search agents with reinforcement learning and process supervision.

The names a notebook needs, importable from the package (each loads its module on first
use, so `import seekrl` stays light):

    import seekrl
    world = seekrl.generate_world(seed=0, entities=300)
    index = seekrl.index_documents(world.docs)              # BM25, in memory
    index.search(["Where was Ilsa Marrow born?"], 3)
    model, tok = seekrl.load_policy()                       # the bundled SmolLM2-135M
    cfg = seekrl.RolloutConfig(max_turns=2, max_new_tokens=32)
    engine = seekrl.RolloutEngine(seekrl.HFBackend(model, tok), tok, index, cfg)
    episodes = engine.run(world.splits["test"][:4])
"""

__version__ = "0.1.0"

_API = {
    # data
    "generate_world": "seekrl.data.world", "WorldConfig": "seekrl.data.world",
    "write_world": "seekrl.data.world", "QAExample": "seekrl.data.qa", "load_qa": "seekrl.data.qa",
    # retrieval
    "build_index": "seekrl.retrieval.index", "load_index": "seekrl.retrieval.index",
    "index_documents": "seekrl.retrieval.index", "Hit": "seekrl.retrieval.base",
    "RemoteRetriever": "seekrl.retrieval.client",
    # the agent
    "load_policy": "seekrl.models", "HFBackend": "seekrl.agent.backends",
    "RolloutEngine": "seekrl.agent.rollout", "RolloutConfig": "seekrl.agent.rollout",
    "Trajectory": "seekrl.agent.trajectory", "read_trajectories": "seekrl.agent.trajectory",
    # evaluation
    "evaluate": "seekrl.eval.evaluate", "load_eval_data": "seekrl.eval.evaluate",
    # training
    "Trainer": "seekrl.recipes.train", "run_sft": "seekrl.recipes.sft", "load_config": "seekrl.config",
    "TrainConfig": "seekrl.config", "SFTConfig": "seekrl.config",
    # errors
    "SeekrlError": "seekrl.errors",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'seekrl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
