"""An index served from a child process: retrieval and HTTP handling then do not take turns
on one GIL. `IndexProcess` is a `Retriever`; the server uses it by default."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import signal
import threading
from pathlib import Path
from typing import Any

from seekrl.retrieval.base import Hit, RetrievalError

log = logging.getLogger(__name__)


# --- the index in its own process ------------------------------------------------------------


class SearchTimeout(RetrievalError, TimeoutError):
    """The index process did not answer in time (a batcher does not retry its requests one
    by one: each would wait as long again)."""


class IndexProcess:
    """A `Retriever` that loads `index_dir` in a child process and searches there.

    Why: BM25 scoring and the HTTP handling are both Python and would take turns on one GIL.
    In a child process retrieval of one batch runs in parallel with the parsing and answering
    of the requests around it, which raises throughput and cuts latency under load. Only the
    queries and the hits cross the pipe. A child that dies is restarted on the next search;
    one that does not answer a search within `search_timeout` seconds is killed (the
    search fails, the next one restarts it), so a hung child cannot hang every request.
    """

    def __init__(self, index_dir: str | Path, device: str = "cpu", start_timeout: float = 600,
                 faiss_gpu: bool = False, search_timeout: float = 600):
        self.index_dir, self.device, self.start_timeout = str(index_dir), device, start_timeout
        self.search_timeout = search_timeout
        self.faiss_gpu = faiss_gpu
        self.manifest: dict = {}
        self.doc_count: int | None = None
        # one request on the pipe at a time; close() takes it too (re-entrant: a failed
        # restart inside search closes)
        self._lock = threading.RLock()
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # fork is unsafe with threads and torch
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_index_process_main, name="seekrl-index",
                                 args=(self.index_dir, self.device, child_conn,
                                       self.faiss_gpu), daemon=True)
        self._proc.start()
        child_conn.close()
        if not self._conn.poll(self.start_timeout):
            self.close()
            raise RetrievalError(f"{self.index_dir}: the index process did not load the index "
                                 f"within {self.start_timeout:.0f} s")
        status, *payload = self._recv()
        if status != "ready":
            self.close()
            raise RetrievalError(f"{self.index_dir}: {payload[0]}")
        self.manifest, self.doc_count = payload

    def _recv(self) -> tuple:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=5)
            raise RetrievalError(f"{self.index_dir}: the index process exited "
                                 f"(code {self._proc.exitcode})") from None

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        with self._lock:
            if not self._proc.is_alive() or self._conn.closed:
                log.warning("index process is gone (code %s); restarting it", self._proc.exitcode)
                self._conn.close()     # the dead child's pipe
                self._start()
            try:
                self._conn.send((list(queries), int(k)))
            except (BrokenPipeError, OSError):
                raise RetrievalError(f"{self.index_dir}: the index process exited") from None
            if not self._conn.poll(self.search_timeout):
                self._proc.kill()
                self._proc.join(timeout=10)
                self._conn.close()     # a late answer is never read as the next search's
                raise SearchTimeout(f"{self.index_dir}: the index process did not answer "
                                    f"{len(queries)} queries within {self.search_timeout:g} "
                                    "s; it was stopped and restarts on the next search")
            status, payload = self._recv()
        if status != "ok":
            raise RetrievalError(payload)
        return payload

    def close(self, timeout: float = 30.0) -> None:
        """Stop the child: asked to exit once the search in flight (a server's worker thread
        may still be in one at shutdown) has its answer; killed when that takes over
        `timeout` seconds or it does not exit."""
        held = self._lock.acquire(timeout=timeout)
        try:
            if held:
                try:
                    self._conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
                self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout=10)
            if held:
                self._conn.close()   # not under a search's feet: it ends on EOF instead
        finally:
            if held:
                self._lock.release()


def _index_process_main(index_dir: str, device: str, conn: Any, faiss_gpu: bool = False
                        ) -> None:
    # The parent owns the life of this process: Ctrl-C reaches the whole process group, and
    # the parent stops the child itself when its server has shut down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from seekrl.retrieval.index import load_index

    try:
        index = load_index(index_dir, device=device, faiss_gpu=faiss_gpu)
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    # The index and encoder are many long-lived objects; moving them out of the collector's
    # reach keeps full collections (latency spikes) short.
    gc.collect()
    gc.freeze()
    conn.send(("ready", index.manifest, index.doc_count))
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        if message is None:
            return
        queries, k = message
        try:
            conn.send(("ok", index.search(queries, k)))
        except Exception as exc:  # noqa: BLE001 - the parent turns it into a 500
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
