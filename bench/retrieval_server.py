"""Retrieval server throughput and latency, with micro-batching on and off, BM25 and dense.

    python bench/retrieval_server.py [--seconds 10] [--clients 32] [--docs 20000]

Builds a synthetic world of at least `--docs` documents, a BM25 and a dense index over it,
then for each (retriever, batching) serves the index with `run_server` from a subprocess on a
free loopback port and drives it with `--clients` concurrent closed-loop clients (asyncio; a
minimal keep-alive HTTP client by default, `--client httpx` for httpx), each sending
one-query Search-R1 requests with questions from the world. The cache is off and no two
in-flight queries are equal, so every timing is real retrieval. Prints `key=value` lines;
the last line is a one-line summary with `dense_speedup` (batched / unbatched QPS) and
`bm25_p99_ms` (batched). `--work-dir DIR` keeps the world and indexes for the next run (the
dense index of 20k documents takes ~25 minutes to build on 2 CPU cores)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

from seekrl.data.world import generate_world, write_world
from seekrl.retrieval.index import build_index

# The server runs in its own process so that the load generator does not share its GIL.
SERVER_CODE = """
import json, sys
from seekrl.retrieval.server import run_server
run_server(sys.argv[1], port=int(sys.argv[2]), log_level="warning", **json.loads(sys.argv[3]))
"""


def make_world(work: Path, docs: int, seed: int) -> tuple[Path, list[str]]:
    """A world with at least `docs` documents (the "hard" preset: ~3 documents per entity)."""
    corpus = work / "world" / "corpus.jsonl"
    if not corpus.is_file():
        entities = math.ceil(docs / 3) + 10
        for _ in range(4):
            world = generate_world(entities=entities, seed=seed, difficulty="hard")
            if len(world.docs) >= docs:
                break
            entities = math.ceil(entities * docs / len(world.docs)) + 10
        else:
            raise RuntimeError(f"could not generate a world with {docs} documents")
        write_world(world, work / "world")
    questions = []
    for split in ("train", "dev", "test"):
        with open(work / "world" / f"{split}.jsonl", encoding="utf-8") as f:
            questions += [json.loads(line)["question"] for line in f if line.strip()]
    return corpus, questions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(index_dir: Path, config: dict) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER_CODE, str(index_dir), str(port),
                             json.dumps(config)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # loading the dense encoder takes a few seconds
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not come up within 180 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


class RawHTTPClient:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams, for load generation only.

    httpx costs a few ms of CPU per request here (more than the server spends); on a
    small machine the load generator would then measure itself. `--client httpx` uses httpx.
    """

    def __init__(self, url: str):
        parts = httpx.URL(url)
        self.host, self.port = parts.host, parts.port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload: dict) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        body = json.dumps(payload).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        self.writer.write(head.encode() + body)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    async def aclose(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


class HttpxClient:
    def __init__(self, url: str, tls: ssl.SSLContext):
        # the clients share one TLS context: unused on http://, but costly to build 32 times
        self.http = httpx.AsyncClient(base_url=url, timeout=30, verify=tls)

    async def post(self, path: str, payload: dict) -> tuple[int, bytes]:
        r = await self.http.post(path, json=payload)
        return r.status_code, r.content

    async def aclose(self) -> None:
        await self.http.aclose()


async def drive(url: str, questions: list[str], clients: int, seconds: float,
                warmup: float, client_kind: str = "raw") -> dict:
    """Closed-loop load: each client sends its next request as soon as the last returns.

    The measured window opens once `warmup` seconds have passed and every client has had an
    answer (so start-up queues are not measured), and lasts `seconds`; a request counts when
    it is both sent and answered inside the window.
    """
    order = questions[:]
    random.Random(0).shuffle(order)
    next_index = 0
    latencies: list[float] = []
    errors = 0
    answered = [0] * clients
    window: list[float] = []  # [opens, closes] once the warm-up is over

    async def client(i: int, http: RawHTTPClient | HttpxClient) -> None:
        nonlocal next_index, errors
        while not window or time.perf_counter() < window[1]:
            sent = time.perf_counter()
            # round-robin over the shuffled questions: no two in-flight queries are equal
            query = order[next_index % len(order)]
            next_index += 1
            status, _ = await http.post("/retrieve", {"queries": [query], "topk": 3,
                                                      "return_scores": True})
            done = time.perf_counter()
            answered[i] += 1
            if status != 200:
                errors += 1
            elif window and window[0] <= sent and done <= window[1]:
                latencies.append(done - sent)
            if not window and done >= start + warmup and min(answered) > 0:
                window.extend([done, done + seconds])

    # One connection per client, as N independent agents would have (a shared httpx pool
    # costs O(connections) per request); all exist before the clock starts.
    tls = ssl.create_default_context()
    https = [RawHTTPClient(url) if client_kind == "raw" else HttpxClient(url, tls)
             for _ in range(clients)]
    try:
        start = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i, http in enumerate(https)))
    finally:
        for http in https:
            await http.aclose()
    async with httpx.AsyncClient(timeout=10) as http:
        health = (await http.get(f"{url}/health")).json()
    ms = np.array(latencies) * 1000
    return {
        "qps": len(latencies) / seconds,
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        "requests": len(latencies),
        "errors": errors,
        "mean_batch": health["batching"]["mean_requests_per_batch"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--max-batch-size", type=int, default=16,
                        help="16 splits 32 clients into two batches that overlap (one is "
                             "retrieved while the other's HTTP is handled)")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="load generator: a minimal asyncio HTTP client, or httpx")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keep the world and indexes here and reuse them (default: temp)")
    parser.add_argument("--retrievers", default="bm25,dense",
                        help="which indexes to serve: bm25, dense or both (bm25 alone skips the "
                             "dense index's ~25-minute build)")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.retrievers.split(",") if k.strip()]
    if not kinds or any(k not in ("bm25", "dense") for k in kinds):
        parser.error(f"--retrievers: expected bm25, dense or both, got {args.retrievers!r}")

    tmp = None
    if args.work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="seekrl-bench-")
        work = Path(tmp.name)
    else:
        work = args.work_dir
        work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        corpus, questions = make_world(work, args.docs, args.seed)
        with open(corpus, encoding="utf-8") as f:
            n_docs = sum(1 for _ in f)
        print(f"docs={n_docs} questions={len(questions)} world_s={time.perf_counter() - t0:.1f}")
        indexes = {}
        for kind in kinds:
            t0 = time.perf_counter()
            out = work / f"index-{kind}"
            if not (out / "manifest.json").is_file():
                build_index(corpus, out, kind, overwrite=True, show_progress=False)
            indexes[kind] = out
            print(f"{kind}_build_s={time.perf_counter() - t0:.1f}")

        http = "httptools" if importlib.util.find_spec("httptools") else "h11"
        print(f"clients={args.clients} client={args.client} seconds={args.seconds} "
              f"cpus={os.cpu_count()} load_avg_1m={os.getloadavg()[0]:.2f} http={http} "
              f"max_wait_ms={args.max_wait_ms} max_batch_size={args.max_batch_size}")
        figures: dict[str, dict] = {}
        for kind in kinds:
            for batching in (True, False):
                config = {"batching": batching, "cache_size": 0, "max_wait_ms": args.max_wait_ms,
                          "max_batch_size": args.max_batch_size}
                name = f"{kind}_{'batched' if batching else 'unbatched'}"
                with serve(indexes[kind], config) as url:
                    stats = asyncio.run(drive(url, questions, args.clients, args.seconds,
                                              args.warmup, args.client))
                figures[name] = stats
                print(" ".join(f"{name}_{key}={value:.4g}" if isinstance(value, float)
                               else f"{name}_{key}={value}" for key, value in stats.items()),
                      flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()

    parts = [f"docs={n_docs}", f"clients={args.clients}"]
    for kind in kinds:
        batched, unbatched = figures[f"{kind}_batched"], figures[f"{kind}_unbatched"]
        parts += [f"{kind}_speedup={batched['qps'] / unbatched['qps']:.2f}",
                  f"{kind}_qps={batched['qps']:.0f}", f"{kind}_p99_ms={batched['p99_ms']:.1f}"]
    print("summary: " + " ".join(parts))


if __name__ == "__main__":
    main()
