"""Micro-batching and caching in front of any retriever: the generic half of the server.

`SearchRunner` merges concurrent `search` calls into one retriever call (in one worker
thread, so the retriever need not be thread-safe); `LRUCache` remembers answers per
(query, k). Neither knows HTTP: `seekrl.retrieval.server` puts them behind FastAPI, and any
other front end (a gRPC server, an in-process pool of agents) can use them the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from seekrl.retrieval.base import Hit, Retriever

log = logging.getLogger(__name__)


class BatchSettings(Protocol):
    """What `SearchRunner` reads from its config (`ServerConfig` has it all; a config
    without `max_pending` sets no bound)."""
    batching: bool
    max_batch_size: int
    max_wait_ms: float


class Busy(Exception):
    """More queries are waiting for the retriever than `max_pending`: come back later."""


# --- the LRU cache -------------------------------------------------------------------------


class LRUCache:
    """(query, k) -> hits. Only touched from the event loop thread, so it needs no lock."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, int], list[Hit]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, int]) -> list[Hit] | None:
        if self.capacity == 0:
            return None
        value = self._items.get(key)
        if value is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: tuple[str, int], value: list[Hit]) -> None:
        if self.capacity == 0:
            return
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def stats(self) -> dict[str, Any]:
        lookups = self.hits + self.misses
        return {
            "capacity": self.capacity,
            "size": len(self._items),
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hits / lookups, 4) if lookups else 0.0,
        }


# --- calling the retriever -----------------------------------------------------------------


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future


@dataclass
class _SearchStats:
    requests: int = 0
    queries: int = 0
    retriever_calls: int = 0
    retriever_queries: int = 0
    retriever_errors: int = 0
    retriever_seconds: float = 0.0
    max_batch_queries: int = 0
    refused_busy: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)  # requests merged -> count


class SearchRunner:
    """Runs `retriever.search` in one worker thread, merging concurrent requests when batching.

    `search(queries, k)` is awaited by request handlers. With batching, a background task
    drains an asyncio queue: it takes the first pending request, gathers more for at most
    `max_wait_ms` or until `max_batch_size` queries, and makes one retriever call per distinct k.
    Batches run one after another: while one is in the worker thread the next one fills up,
    so batches grow with load by themselves and `max_wait_ms` only matters when idle.
    """

    def __init__(self, retriever: Retriever, config: BatchSettings):
        self.retriever = retriever
        self.config = config
        self.stats = _SearchStats()
        self._executor: ThreadPoolExecutor | None = None   # made when first needed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task | None = None
        self._carry: _Pending | None = None  # taken from the queue but too big for the last batch
        self.in_flight = 0   # queries handed to search() and not yet answered

    # lifecycle: the queue and task belong to one event loop; (re)create them lazily for the
    # running loop, so the app works whether or not the ASGI lifespan was run.
    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        self._loop = loop
        self._queue = asyncio.Queue()
        self._carry = None
        self._task = loop.create_task(self._batch_loop(), name="seekrl-batcher")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._task = None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        # made again on the next call: an app whose lifespan ran twice (a second test
        # client) had answered every search 500 from a shut executor
        self._executor = None

    def _worker(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="seekrl-retriever")
        return self._executor

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        bound = getattr(self.config, "max_pending", None)
        # under overload the queue would grow without end while clients time out and send
        # the same queries again; past the bound a request is refused at once (Busy)
        if bound is not None and self.in_flight and self.in_flight + len(queries) > bound:
            self.stats.refused_busy += 1
            raise Busy(f"{self.in_flight} queries are waiting for the retriever "
                       f"(max_pending {bound}); retry later")
        self.stats.requests += 1
        self.stats.queries += len(queries)
        self.in_flight += len(queries)
        try:
            if not self.config.batching:
                return await self._call_retriever(queries, k)
            self._ensure_started()
            future = asyncio.get_running_loop().create_future()
            self._queue.put_nowait(_Pending(queries, k, future))
            return await future
        finally:
            self.in_flight -= len(queries)

    def _timed_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        # timed inside the worker thread, so that waiting for the thread is not counted
        start = time.perf_counter()
        try:
            return self.retriever.search(queries, k)
        except StopIteration as err:   # a future cannot hold one: the caller would wait forever
            raise RuntimeError(f"the retriever raised StopIteration ({err!r})") from err
        finally:
            self.stats.retriever_seconds += time.perf_counter() - start

    async def _call_retriever(self, queries: list[str], k: int) -> list[list[Hit]]:
        loop = asyncio.get_running_loop()
        self.stats.retriever_calls += 1
        self.stats.retriever_queries += len(queries)
        try:
            results = await loop.run_in_executor(self._worker(), self._timed_search, queries, k)
        except Exception:
            self.stats.retriever_errors += 1
            raise
        if not isinstance(results, list) or len(results) != len(queries):
            got = len(results) if isinstance(results, list) else type(results).__name__
            raise RuntimeError(
                f"retriever returned {got} result lists for {len(queries)} queries"
            )
        return results

    async def _next_batch(self) -> list[_Pending]:
        first = self._carry or await self._queue.get()
        self._carry = None
        batch, size = [first], len(first.queries)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.max_wait_ms / 1000
        while size < self.config.max_batch_size:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            if size + len(item.queries) > self.config.max_batch_size:
                self._carry = item  # starts the next batch; a lone oversized request runs alone
                break
            batch.append(item)
            size += len(item.queries)
        return batch

    async def _batch_loop(self) -> None:
        while True:
            # a request whose caller went away (its handler cancelled: the client left) is
            # not searched for nobody
            batch = [p for p in await self._next_batch() if not p.future.done()]
            if not batch:
                continue
            n_requests, n_queries = len(batch), sum(len(p.queries) for p in batch)
            self.stats.batch_sizes[n_requests] = self.stats.batch_sizes.get(n_requests, 0) + 1
            self.stats.max_batch_queries = max(self.stats.max_batch_queries, n_queries)
            by_k: dict[int, list[_Pending]] = {}
            for pending in batch:
                by_k.setdefault(pending.k, []).append(pending)
            try:
                for k, group in by_k.items():
                    await self._run_group(group, k)
            except Exception as exc:  # a bug here must fail these requests, not hang them
                log.exception("batch loop failed")
                for pending in batch:
                    _resolve(pending.future, exc)

    async def _run_group(self, group: list[_Pending], k: int) -> None:
        # Identical queries in flight at once (e.g. the first search of every rollout of one
        # question in a GRPO group) are retrieved once; a sampled retriever (a simulator)
        # answers each on its own draw.
        sampled = getattr(self.retriever, "sampled", False)
        group = [p for p in group if not p.future.done()]   # left while the last group ran
        if not group:
            return
        asked = [q for pending in group for q in pending.queries]
        if not sampled:
            asked = list(dict.fromkeys(asked))
        try:
            results = await self._call_retriever(asked, k)
        except Exception as exc:  # noqa: BLE001 - any retriever failure goes back to the caller
            if len(group) == 1 or isinstance(exc, TimeoutError):   # a timeout, retried
                for pending in group:                               # alone, waits as long
                    _resolve(pending.future, exc)
                return
            # One bad query must not fail everyone's request: retry each request alone.
            log.warning("batched retriever call failed (%s); retrying request by request", exc)
            for pending in group:
                if pending.future.done():   # its client left: search for no one
                    continue
                try:
                    _resolve(pending.future, await self._call_retriever(pending.queries, k))
                except Exception as single_exc:  # noqa: BLE001 - as above
                    _resolve(pending.future, single_exc)
            return
        if sampled:   # in order: each query its own answer
            answers = iter(results)
            for pending in group:
                _resolve(pending.future, [next(answers) for _ in pending.queries])
            return
        by_query = dict(zip(asked, results))
        for pending in group:
            _resolve(pending.future, [by_query[q] for q in pending.queries])

    def stats_dict(self) -> dict[str, Any]:
        s = self.stats
        batches = sum(s.batch_sizes.values())
        merged = sum(n * c for n, c in s.batch_sizes.items())
        return {
            "enabled": self.config.batching,
            "max_batch_size": self.config.max_batch_size,
            "max_wait_ms": self.config.max_wait_ms,
            "requests": s.requests,
            "queries": s.queries,
            "batches": batches,
            "mean_requests_per_batch": round(merged / batches, 3) if batches else 0.0,
            "max_queries_per_batch": s.max_batch_queries,
            "retriever_calls": s.retriever_calls,
            "retriever_queries": s.retriever_queries,
            "retriever_errors": s.retriever_errors,
            "retriever_seconds": round(s.retriever_seconds, 4),
            "in_flight": self.in_flight,
            "refused_busy": s.refused_busy,
        }


def _resolve(future: asyncio.Future, outcome: Any) -> None:
    if future.done():  # the client went away and its handler was cancelled (its future too)
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
