"""A retrieval server that speaks the Search-R1 wire format, with micro-batching and a cache.

`POST /retrieve` takes `{"queries": [...], "topk": 3, "return_scores": true}` and answers
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` (without `return_scores`
each hit is the document object alone), exactly as Search-R1's `retrieval_server.py`, so
Search-R1, verl, verl-tool and SkyRL clients work unchanged. `GET /health` reports the index
manifest, the doc count, uptime, and cache and batching statistics.

Why batch: agents in an RL rollout send many small concurrent requests (one query each), while a
dense retriever is far cheaper per query on a batch (one encoder forward, one matrix product).
Concurrent requests wait in an asyncio queue for at most `max_wait_ms`, then go to the retriever
as one `search` call, in a worker thread so the event loop keeps accepting requests meanwhile.
The retriever is only ever called from that one thread, so it need not be thread-safe.
`run_server` goes one step further and keeps the index in a child process (`IndexProcess`),
so that retrieval and HTTP handling do not take turns on one GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import json
import logging
import math
import re
import socket
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    create_model,
    model_validator,
)
from starlette.requests import ClientDisconnect

from seekrl.retrieval.base import Hit, RetrievalError, Retriever
from seekrl.retrieval.batching import Busy, LRUCache, SearchRunner
from seekrl.retrieval.index_process import IndexProcess

__all__ = ["IndexProcess", "LRUCache", "RetrieveRequest", "SearchRunner", "ServerConfig",
           "bind_socket", "create_app", "format_result", "parse_request", "run_server"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class ServerConfig(BaseModel):
    """Server settings; every limit is checked per request and a violation names it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    default_topk: int = Field(3, ge=1, description="topk when a request leaves it out (Search-R1: 3)")
    max_topk: int = Field(100, ge=1, description="largest topk a request may ask for")
    # Search-R1's client sends every search of a turn in one request (train batch x
    # rollouts: thousands); the body limit bounds the memory whatever this is.
    max_queries: int = Field(4096, ge=1, description="queries per request")
    max_query_chars: int = Field(4096, ge=1, description="characters per query")
    # documents in one answer (queries x topk): the two limits at their most would build
    # about 400k documents, hundreds of MB of JSON, on the event loop
    max_hits: int = Field(65_536, ge=1, description="documents per answer (queries x topk)")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="request body size")
    # a client that declares a body and stalls would otherwise hold its connection and the
    # part it sent for ever; past this the request is answered 408
    body_timeout_s: float = Field(60.0, gt=0, le=3600,
                                  description="seconds to receive a request's body")
    batching: bool = Field(True, description="merge concurrent requests into one retriever call")
    # Small enough that a few dozen concurrent clients form two batches, one retrieved while
    # the other's HTTP is handled; larger batches buy little once the encoder is busy
    # (bench/retrieval_server.py measures the tail latency of each size)
    max_batch_size: int = Field(16, ge=1, description="queries per merged retriever call")
    # a second at most: a lone request waits this long for nothing
    max_wait_ms: float = Field(2.0, ge=0, le=1000, description="how long a batch waits for company")
    # a request that would take the queries waiting for the retriever past this is answered
    # 503 at once (clients retry with backoff); one request alone is always taken
    max_pending: int = Field(65_536, ge=1, description="queries waiting for the retriever")
    cache_size: int = Field(10_000, ge=0, description="LRU entries keyed by (query, k); 0 disables")

    @model_validator(mode="after")
    def _default_within_max(self):
        if self.default_topk > self.max_topk:
            raise ValueError(f"--default-topk {self.default_topk} is above --max-topk "
                             f"{self.max_topk}: every request without a topk would be refused")
        if self.max_topk > self.max_hits:
            # one query at a topk the server lists as allowed would be refused for its hits
            raise ValueError(f"--max-topk {self.max_topk} is above --max-hits "
                             f"{self.max_hits}: a request of one query at that topk "
                             f"would be refused (set --max-topk {self.max_hits} or less)")
        if self.max_pending < self.max_queries:
            # a request larger than max_pending is taken only when nothing else waits:
            # under load it is answered 503 for ever, and the client retries for minutes
            raise ValueError(f"--max-pending {self.max_pending} is below --max-queries "
                             f"{self.max_queries}: a request of that many queries would "
                             "wait for an idle server")
        return self


def server_settings(config: dict[str, Any]) -> ServerConfig:
    """`ServerConfig` from `seekrl serve`'s limits, a bad one named by its flag."""
    try:
        return ServerConfig(**config)
    except ValidationError as err:
        said = []
        for e in err.errors():
            name = str(e["loc"][0]) if e["loc"] else ""
            flag = f"--{name.replace('_', '-')}" if name else "serve"
            said.append(f"{flag}: {e['msg'].removeprefix('Value error, ')} (got "
                        f"{e.get('input')!r})" if name else e["msg"].removeprefix("Value error, "))
        raise RetrievalError("; ".join(said)) from None


class RetrieveRequest(BaseModel):
    """The Search-R1 request; unknown fields are ignored so richer clients still work."""

    model_config = ConfigDict(extra="ignore")

    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: bool | None = False


class RequestError(Exception):
    """A client mistake: answered as `{"error": message, "detail": detail}` with a 4xx status."""

    def __init__(self, status: int, message: str, detail: Any = None):
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail


# --- request parsing and responses ---------------------------------------------------------


def _json_response(payload: Any, status: int = 200) -> Response:
    # Serialised here rather than by FastAPI's jsonable_encoder: it is several times cheaper
    # and this path runs once per request under load.
    return Response(json.dumps(payload, ensure_ascii=False).encode(), status,
                    media_type="application/json")


def _error(status: int, message: str, detail: Any = None) -> Response:
    response = _json_response({"error": message, "detail": detail}, status)
    if status in (408, 413):
        # the body was left unread: the connection ends with the answer (kept open, a
        # client that stalls could hold it past any timer)
        response.headers["Connection"] = "close"
    return response


def _short(value: Any, limit: int = 80) -> Any:
    """The offending value for an error message: scalars as they are, the rest abridged."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)   # NaN / Infinity are not JSON: a strict client rejects the body
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# a body of a million wrong items is answered with this many, and a count of the rest
_MAX_DETAIL = 20


def _too_many_queries(count: int | None, config: ServerConfig) -> RequestError:
    said = f"{count} queries exceed" if count is not None else "more queries than"
    return RequestError(
        422, f"field 'queries': {said} max_queries ({config.max_queries}) per request",
        {"field": "queries", "limit": "max_queries", "max": config.max_queries,
         "value": count})


def _validation_error(exc: ValidationError, config: ServerConfig) -> RequestError:
    errors = exc.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        return RequestError(400, f"malformed JSON body: {errors[0]['msg']}",
                            {"reason": errors[0].get("ctx", {}).get("error")})
    for err in errors:
        if err["type"] == "too_long" and tuple(err["loc"]) == ("queries",):
            return _too_many_queries(err.get("ctx", {}).get("actual_length"), config)
    detail = []
    for err in errors[:_MAX_DETAIL]:
        where = ".".join(str(part) for part in err["loc"]) or "body"
        entry = {"field": where, "message": err["msg"]}
        if err["type"] != "missing":
            entry["value"] = _short(err.get("input"))
        detail.append(entry)
    first = detail[0]
    message = f"field '{first['field']}': {first['message']}"
    if "value" in first:
        message += f" (got {first['value']!r})"
    if len(errors) > 1:
        message += f"; and {len(errors) - 1} more"
    if len(errors) > len(detail):
        detail.append({"more": len(errors) - len(detail)})
    return RequestError(422, message, detail)


async def _read_body(request: Request, max_bytes: int, timeout_s: float = 60.0) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(413, f"request body of {declared} bytes exceeds max_body_bytes "
                                f"({max_bytes})",
                           {"limit": "max_body_bytes", "max": max_bytes, "value": int(declared)})
    chunks: list[bytes] = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:  # a chunked body with no length: stop reading at the limit
                raise RequestError(413, f"request body exceeds max_body_bytes ({max_bytes})",
                                   {"limit": "max_body_bytes", "max": max_bytes})
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout_s)
    except ClientDisconnect:   # gone mid-upload: nobody reads the answer, nothing to log
        raise RequestError(400, "the client disconnected before its body was read") from None
    except asyncio.TimeoutError:
        got = sum(map(len, chunks))
        raise RequestError(408, f"request body not received within body_timeout_s "
                                f"({timeout_s:g} s; {got} bytes arrived"
                                + (f" of {declared})" if declared is not None else ")"),
                           {"limit": "body_timeout_s", "max": timeout_s, "received": got}) from None
    return b"".join(chunks)


# an absolute path: a root ("/" or a drive), then folders, then the last part; quoted (as
# OSError quotes its file) it may hold spaces, unquoted it ends at one
_QUOTED_PATH = re.compile(r"""(['"])(?:[A-Za-z]:)?[\\/](?:[^'"\n\\/]*[\\/])+([^'"\n\\/]*)\1""")
_PATH = re.compile(r"(?<![\w.~/])(?:[A-Za-z]:)?[\\/](?:[^\s'\":\\/]+[\\/])+([^\s'\":\\/]*)")


def _public_error(exc: BaseException) -> str:
    """An exception for a 500 body: its type and message with each absolute path cut to its
    last part. A server bound beyond loopback should not show the machine's folder layout
    (as /health does not); the log keeps the whole traceback."""
    text = _QUOTED_PATH.sub(lambda m: m.group(1) + (m.group(2) or "<path>") + m.group(1),
                            str(exc))
    return f"{type(exc).__name__}: {_PATH.sub(lambda m: m.group(1) or '<path>', text)}"


@functools.lru_cache(maxsize=8)
def _request_model(max_queries: int) -> type[RetrieveRequest]:
    # The count limit inside the schema: the validator stops at item max_queries + 1, where
    # a check after validation would first collect an error for each of millions of items.
    return create_model("RetrieveRequest", __base__=RetrieveRequest,
                        queries=(Annotated[list[StrictStr], Field(max_length=max_queries)], ...))


def parse_request(body: bytes, config: ServerConfig) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body against the schema and the limits: (queries, k, scores).
    An empty `queries` is valid (Search-R1's client sends one when no rollout searched)."""
    try:
        req = _request_model(config.max_queries).model_validate_json(body)
    except ValidationError as exc:
        raise _validation_error(exc, config) from None
    queries = req.queries
    for i, query in enumerate(queries):
        if len(query) > config.max_query_chars:
            raise RequestError(
                422, f"field 'queries.{i}': {len(query)} characters exceed max_query_chars "
                     f"({config.max_query_chars})",
                {"field": f"queries.{i}", "index": i, "limit": "max_query_chars",
                 "max": config.max_query_chars, "value": len(query)})
    # Search-R1 falls back to its default topk when the field is missing, null or 0.
    k = req.topk or config.default_topk
    if not 1 <= k <= config.max_topk:
        raise RequestError(
            422, f"field 'topk': {k} is outside [1, max_topk={config.max_topk}]",
            {"field": "topk", "limit": "max_topk", "min": 1, "max": config.max_topk, "value": k})
    if len(queries) * k > config.max_hits:
        fits = config.max_hits // k
        raise RequestError(
            422, f"field 'queries': {len(queries)} queries x topk {k} = {len(queries) * k} "
                 f"documents exceed max_hits ({config.max_hits}); send at most {fits} queries "
                 "a request at this topk",
            {"field": "queries", "limit": "max_hits", "max": config.max_hits,
             "max_queries": fits, "value": len(queries) * k})
    return queries, k, bool(req.return_scores)


def _document(hit: Hit) -> dict[str, str]:
    return {"id": hit.doc_id, "contents": hit.contents}


def _score(hit: Hit) -> float | None:
    # NaN / inf are not JSON; strict parsers (JS, Go) would reject the whole response.
    return hit.score if math.isfinite(hit.score) else None


def format_result(results: list[list[Hit]], return_scores: bool) -> dict[str, Any]:
    if return_scores:
        return {"result": [[{"document": _document(h), "score": _score(h)} for h in hits]
                           for hits in results]}
    return {"result": [[_document(h) for h in hits] for hits in results]}


# --- the app -------------------------------------------------------------------------------


_REF = "#/components/schemas/{}"
_DOCUMENT = {"type": "object", "required": ["id", "contents"],
             "properties": {"id": {"type": "string"},
                            "contents": {"type": "string",
                                         "description": "title, a newline, the text"}}}
_RETRIEVE_SCHEMAS = {
    "RetrieveRequest": RetrieveRequest.model_json_schema(),
    "Document": _DOCUMENT,
    "ScoredDocument": {"type": "object", "required": ["document", "score"],
                       "properties": {"document": {"$ref": _REF.format("Document")},
                                      "score": {"type": "number"}}},
    "RetrieveResponse": {
        "type": "object", "required": ["result"],
        "properties": {"result": {
            "type": "array", "description": "one list of hits per query, best first",
            "items": {"type": "array", "items": {"oneOf": [
                {"$ref": _REF.format("Document")}, {"$ref": _REF.format("ScoredDocument")}]}}}}},
    "RetrieveError": {"type": "object", "required": ["error"],
                      "properties": {"error": {"type": "string"}, "detail": {}}},
}


def _retrieve_path(config: ServerConfig) -> dict:
    """The OpenAPI description of POST /retrieve (a plain route FastAPI cannot see)."""
    def error(what: str) -> dict:
        return {"description": what, "content": {"application/json": {
            "schema": {"$ref": _REF.format("RetrieveError")}}}}
    return {"post": {
        "summary": "Search: the Search-R1 retrieval request",
        "description": (f"`queries` (at most {config.max_queries}, each at most "
                        f"{config.max_query_chars} characters), `topk` (default "
                        f"{config.default_topk} when missing, null or 0; at most {config.max_topk}); with "
                        "`return_scores` each hit is {document, score}."),
        "operationId": "retrieve",
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": _REF.format("RetrieveRequest")}}}},
        "responses": {
            "200": {"description": "hits per query", "content": {"application/json": {
                "schema": {"$ref": _REF.format("RetrieveResponse")}}}},
            "400": error("malformed JSON body"),
            "408": error("request body not received within body_timeout_s"),
            "413": error("request body larger than max_body_bytes"),
            "422": error("a field is missing, of the wrong type or past a limit"),
            "500": error("the retriever failed (the server keeps serving)"),
            "503": error("more queries waiting for the retriever than max_pending: retry")}}}


class _ClientGone(Exception):
    pass


async def _unless_gone(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result, or _ClientGone once the client disconnects first: its search is
    cancelled (dropped from the batch queue), since a client that timed out and sends it
    again would otherwise have the server do it twice, behind its own abandoned copy."""
    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:   # the handler itself cancelled (the server stopping)
        task.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise _ClientGone
    return task.result()


def create_app(retriever: Retriever, manifest: dict | None = None,
               config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving `retriever`; `manifest` is shown by /health, its corpus path
    cut to the file name: a server bound beyond loopback should not show the machine's folder
    layout, and the corpus's sha256 next to it identifies the corpus anyway."""
    config = config or ServerConfig()
    manifest = public_manifest(manifest)
    runner = SearchRunner(retriever, config)
    # a sampled engine (a simulator) answers each query afresh: nothing to cache
    sampled = bool(getattr(retriever, "sampled", False))
    cache = LRUCache(0 if sampled else config.cache_size)
    started = time.time()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await runner.stop()
        runner.close()

    app = FastAPI(title="seekrl retrieval server", lifespan=lifespan)
    app.state.runner, app.state.cache, app.state.config = runner, cache, config

    async def internal_error(request: Request, exc: Exception) -> Response:
        # a bug must still answer JSON, like every other error of this server
        return _error(500, f"internal error: {_public_error(exc)}")

    app.add_exception_handler(Exception, internal_error)

    async def retrieve(request: Request) -> Response:
        try:
            body = await _read_body(request, config.max_body_bytes, config.body_timeout_s)
            queries, k, return_scores = parse_request(body, config)
        except RequestError as exc:
            return _error(exc.status, exc.message, exc.detail)
        if not queries:
            return _json_response({"result": []})

        if sampled:   # each query on its own draw, repeats too
            results: list[list[Hit] | None] = [None] * len(queries)
            missing = list(queries)
        else:
            results = [cache.get((q, k)) for q in queries]
            missing = list(dict.fromkeys(q for q, r in zip(queries, results) if r is None))
        if missing:
            try:
                fetched = await _unless_gone(request, runner.search(missing, k))
            except _ClientGone:
                return Response(status_code=499)   # nobody reads it
            except Busy as exc:
                return Response(json.dumps({"error": f"server busy: {exc}", "detail": {
                    "limit": "max_pending", "max": config.max_pending}}).encode(), 503,
                    media_type="application/json", headers={"Retry-After": "1"})
            except Exception as exc:
                log.exception("retriever failed on %d queries", len(missing))
                return _error(500, f"retriever failed: {_public_error(exc)}",
                              {"queries": len(missing), "topk": k})
            if sampled:
                results = fetched
            else:
                found = dict(zip(missing, fetched))
                for q in missing:
                    cache.put((q, k), found[q])
                results = [r if r is not None else found[q] for q, r in zip(queries, results)]
        return _json_response(format_result(results, return_scores))

    # A plain Starlette route: it skips FastAPI's per-request dependency solving, which costs
    # more than the rest of this handler; the body is parsed and validated above anyway.
    # FastAPI does not see such a route, so its schema is added to /openapi.json by hand.
    app.add_route("/retrieve", retrieve, methods=["POST"])

    def openapi() -> dict:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(
                _RETRIEVE_SCHEMAS)
            schema.setdefault("paths", {})["/retrieve"] = _retrieve_path(config)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    counts = getattr(retriever, "stats", None)   # a simulated engine's: what it wrote

    @app.get("/health")
    async def health() -> Response:
        return _json_response({
            "status": "ok",
            **({"simulator": dict(counts)} if isinstance(counts, Counter) else {}),
            "manifest": manifest or {},
            "doc_count": getattr(retriever, "doc_count", (manifest or {}).get("doc_count")),
            "uptime_s": round(time.time() - started, 3),
            "cache": cache.stats(),
            "batching": runner.stats_dict(),
            "limits": {"default_topk": config.default_topk, "max_topk": config.max_topk,
                       "max_queries": config.max_queries,
                       "max_query_chars": config.max_query_chars,
                       "max_body_bytes": config.max_body_bytes,
                       "body_timeout_s": config.body_timeout_s,
                       "max_hits": config.max_hits, "max_pending": config.max_pending},
        })

    return app


def public_manifest(manifest: dict | None) -> dict:
    """The index manifest as /health shows it: the corpus by file name, not full path."""
    shown = dict(manifest or {})
    if isinstance(shown.get("corpus"), str):
        shown["corpus"] = Path(shown["corpus"]).name
    return shown


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), or a `RetrievalError` in one line when the address
    is taken or cannot be bound. Bound before the index loads (minutes for a large one),
    so a busy port fails at once and no other process can take it in the meantime."""
    if not 0 <= port <= 65535:
        raise RetrievalError(f"--port {port}: expected 0 to 65535 (0: any free port)")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as err:
        raise RetrievalError(f"--host {host}: cannot resolve it ({err.strerror})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn does
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise RetrievalError(f"--port {port}: {host}:{port} is already in use (another "
                                 "server?); pick another port") from None
        raise RetrievalError(f"--host {host} --port {port}: cannot bind "
                             f"({err.strerror})") from None
    # Listening now, not when uvicorn starts: two sockets with SO_REUSEADDR may both bind
    # a port until one listens, so a second server would load its index before failing.
    sock.listen(2048)
    return sock


def server_url(sock: socket.socket) -> str:
    """http://host:port of a bound socket (the port it really got; IPv6 hosts bracketed)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_server(index_dir: str | Path | None, host: str = "127.0.0.1", port: int = 8000,
               log_level: str = "info", device: str = "cpu", index_process: bool | None = None,
               faiss_gpu: bool = False, simulate: str | None = None, noise: float = 0.0,
               ranker: str | None = None, candidates: int = 10, make_decoder=None,
               words: int | None = None, sim_max_new_tokens: int | None = None,
               sim_temperature: float | None = None, **config: Any) -> None:
    """Load the index in `index_dir` and serve it until interrupted.

    With `simulate` (a causal LM: a Hugging Face id or path, or `smollm2-135m`) and no index,
    the model writes each query's documents (retrieval/simulated.py; `noise`: the share of
    queries answered with noisy documents; `words`, `sim_max_new_tokens`, `sim_temperature`:
    its document length, tokens per query and sampling, as `simulator.*` in training, None
    the simulator's defaults; `seekrl serve` checks them by that section's ranges, as this
    layer reads no config), in the server's process; requests carry queries alone, so its
    useful documents come from the query, not from a gold answer.
    `make_decoder(model, tokenizer)` gives it a decoder (`seekrl serve` hands in the
    rollout engine's loop, `agent.backends.text_decoder`; None: `model.generate`).

    `config` holds `ServerConfig` fields (e.g. `batching=False`, `cache_size=0`). The default
    host is loopback: pass `host="0.0.0.0"` deliberately to serve other machines. `device`
    is where a dense encoder runs ("cpu", "cuda"). With `index_process` (None: yes, for an
    index) the index lives in a child process (see `IndexProcess`); with False, in the
    server's process; a simulated engine has no index, and either choice is refused with it.
    `faiss_gpu` searches a flat / IVF dense index on the GPU too (faiss-gpu, `device` cuda).
    With `ranker` (a folder `seekrl ranker train` wrote, or an encoder: `minilm`), the index's
    top `candidates` per query are reordered by it, in the server's process, and the best
    topk answered (retrieval/ranker.py).
    """
    import uvicorn

    from seekrl.retrieval.index import load_index

    server_config = server_settings(config)  # checked before the (slow) index load
    from uvicorn.config import LOG_LEVELS
    if log_level.lower() not in LOG_LEVELS:
        raise RetrievalError(f"log level: expected one of {', '.join(LOG_LEVELS)}, got "
                             f"{log_level!r}")
    if (index_dir is None) == (simulate is None):
        raise RetrievalError("serve: give an index folder or a model to simulate search with, "
                             "one of the two")
    if not 0 <= noise <= 1:
        raise RetrievalError(f"--noise: expected a probability from 0 to 1, got {noise}")
    sim_settings = {"words": words, "max_new_tokens": sim_max_new_tokens,
                    "temperature": sim_temperature}
    flags = {"words": "--words", "max_new_tokens": "--sim-max-new-tokens",
             "temperature": "--sim-temperature"}
    if simulate is None:
        given = ["--noise"] * (noise != 0) + [flags[k] for k, v in sim_settings.items()
                                              if v is not None]
        if given:
            raise RetrievalError(f"{', '.join(given)}: settings of a simulated engine "
                                 "(--simulate); an index has none")
    if faiss_gpu and simulate is not None:
        raise RetrievalError("--faiss-gpu: searches an index on the GPU; a simulated engine "
                             "has none")
    if index_process is not None and simulate is not None:
        raise RetrievalError(f"index_process={index_process}: where an index lives; a "
                             "simulated engine has none (leave index_process out)")
    if ranker is not None and simulate is not None:
        raise RetrievalError("serve: --ranker orders an index's candidates; a simulated engine "
                             "has none")
    if candidates < 1:
        raise RetrievalError(f"--candidates: expected at least 1, got {candidates}")
    ordering = None
    if ranker is not None:                  # loaded before the port is taken: a bad path fails
        from seekrl.retrieval.ranker import load_ranker

        ordering = load_ranker(ranker, device=device)
        if ordering.kind == "query":   # it searches the faiss index itself, in this process
            index_process = False
    sock = bind_socket(host, port)          # so is the port, and it stays ours meanwhile
    retriever = None
    # from here on a failure (a bad index, simulator or ranker) closes the socket: one left
    # listening holds the port and answers no one
    try:
        if simulate is not None:
            from seekrl.retrieval.simulated import (
                DEFAULT_WORDS,
                SimulatedRetriever,
                prompt_mismatch,
            )

            chosen = {k: v for k, v in sim_settings.items() if v is not None}
            why = prompt_mismatch(simulate, topk=None, words=chosen.get("words", DEFAULT_WORDS))
            if why:
                warnings.warn(f"{why} (--words)", stacklevel=2)
            retriever = SimulatedRetriever.from_pretrained(
                simulate, device=device, noise=noise, make_decoder=make_decoder, **chosen)
            manifest = {"type": "simulated", "model": simulate, "noise": noise,
                        "words": retriever.words, "max_new_tokens": retriever.max_new_tokens,
                        "temperature": retriever.temperature}
            doc_count, index_dir = 0, f"simulated search ({simulate})"
        elif index_process is not False:
            retriever = IndexProcess(index_dir, device=device, faiss_gpu=faiss_gpu)
            manifest, doc_count = retriever.manifest, retriever.doc_count
        else:
            retriever = load_index(index_dir, device=device, faiss_gpu=faiss_gpu)
            manifest, doc_count = retriever.manifest, retriever.doc_count
            gc.collect()  # see _index_process_main
            gc.freeze()
        served = retriever
        if ordering is not None:
            from seekrl.retrieval.ranker import ranked_retriever

            served = ranked_retriever(retriever, ordering, candidates)
            manifest = {**manifest, "ranker": ranker, "ranker_kind": ordering.kind,
                        "candidates": candidates}
        app = create_app(served, manifest=manifest, config=server_config)
        # said on stdout whatever the logging set-up (a user needs the address; port 0 picks)
        print(f"serving {index_dir} ({doc_count or 'no'} docs) on {server_url(sock)}/retrieve "
              f"(health: {server_url(sock)}/health)", flush=True)
        uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                      access_log=False)).run(sockets=[sock])
    finally:
        sock.close()
        if isinstance(retriever, IndexProcess):
            retriever.close()
