"""The retrieval server: Search-R1 wire format, micro-batching, cache, limits, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from pydantic import ValidationError

from seekrl.retrieval.base import Hit, RetrievalError
from seekrl.retrieval.client import RemoteRetriever
from seekrl.retrieval.server import ServerConfig, create_app


class FakeRetriever:
    """Deterministic hits; records every call; can be slow or fail on a chosen query."""

    doc_count = 42

    def __init__(self, delay: float = 0.0, fail_on: str | None = None):
        self.delay, self.fail_on = delay, fail_on
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append((list(queries), k))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in queries:
            raise ValueError(f"cannot search {self.fail_on!r}")
        return [[Hit(f"{q}#{i}", f"Title {i}", f"text about {q}", float(k - i)) for i in range(k)]
                for q in queries]

    @property
    def retrieved_queries(self) -> list[str]:
        return [q for queries, _ in self.calls for q in queries]


def make_client(retriever=None, **config) -> TestClient:
    app = create_app(retriever or FakeRetriever(), manifest={"retriever": "fake"},
                     config=ServerConfig(**config))
    return TestClient(app)


def _through(client: TestClient) -> httpx.MockTransport:
    """A transport that hands a RemoteRetriever's requests to the app behind `client`."""
    def handle(request: httpx.Request) -> httpx.Response:
        r = client.request(request.method, request.url.path, content=request.content,
                           headers={"content-type": "application/json"})
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)
    return httpx.MockTransport(handle)


def post_concurrently(app, bodies: list[dict]) -> list[httpx.Response]:
    """Send all bodies at once over an in-process ASGI transport."""

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(*(client.post("/retrieve", json=b) for b in bodies))

    return asyncio.run(asyncio.wait_for(go(), timeout=30))


@contextlib.contextmanager
def served(app):
    """A real uvicorn server of `app` on a free loopback port, in a thread: its base URL.
    Stopped (and checked stopped) on the way out."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # a free loopback port, held so nothing else takes it
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
    assert not thread.is_alive()


# --- wire format -----------------------------------------------------------------------------


def test_response_with_scores_matches_search_r1():
    with make_client() as client:
        r = client.post("/retrieve", json={"queries": ["a", "b"], "topk": 2, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and all(len(hits) == 2 for hits in result)
    assert result[0][0] == {"document": {"id": "a#0", "contents": "Title 0\ntext about a"},
                            "score": 2.0}
    assert result[1][1]["document"]["id"] == "b#1"


def test_response_without_scores_is_documents_alone():
    with make_client() as client:
        for body in ({"queries": ["a"], "topk": 1}, {"queries": ["a"], "topk": 1,
                                                     "return_scores": False}):
            r = client.post("/retrieve", json=body)
            assert r.status_code == 200
            assert r.json() == {"result": [[{"id": "a#0", "contents": "Title 0\ntext about a"}]]}


def test_topk_defaults_to_three_and_extra_fields_are_ignored():
    retriever = FakeRetriever()
    with make_client(retriever) as client:
        # Search-R1's server takes a missing, null or 0 topk as its default (`if not topk`)
        for body in ({"queries": ["q"]}, {"queries": ["q2"], "topk": None, "extra": [1, 2]},
                     {"queries": ["q3"], "topk": 0}):
            r = client.post("/retrieve", json=body)
            assert r.status_code == 200
            assert len(r.json()["result"][0]) == 3
    assert [k for _, k in retriever.calls] == [3, 3, 3]


def test_health_reports_manifest_count_uptime_cache_batching():
    with make_client() as client:
        client.post("/retrieve", json={"queries": ["a"]})
        health = client.get("/health").json()
    assert health["status"] == "ok"
    assert health["manifest"] == {"retriever": "fake"}
    assert health["doc_count"] == 42
    assert health["uptime_s"] >= 0
    assert health["cache"]["misses"] == 1
    assert health["batching"]["enabled"] is True
    assert health["batching"]["retriever_calls"] == 1


# --- batching ----------------------------------------------------------------------------------


def test_concurrent_requests_are_merged_into_fewer_retriever_calls():
    retriever = FakeRetriever(delay=0.05)
    app = create_app(retriever, config=ServerConfig(max_wait_ms=20, cache_size=0))
    responses = post_concurrently(app, [{"queries": [f"q{i}"], "topk": 2} for i in range(16)])
    assert all(r.status_code == 200 for r in responses)
    for i, r in enumerate(responses):  # each request gets its own query's hits back
        assert r.json()["result"][0][0]["id"] == f"q{i}#0"
    assert sorted(retriever.retrieved_queries) == sorted(f"q{i}" for i in range(16))
    assert len(retriever.calls) <= 3
    assert max(len(queries) for queries, _ in retriever.calls) >= 8


def test_without_batching_each_request_is_one_retriever_call():
    retriever = FakeRetriever(delay=0.01)
    app = create_app(retriever, config=ServerConfig(batching=False, cache_size=0))
    responses = post_concurrently(app, [{"queries": [f"q{i}"]} for i in range(8)])
    assert all(r.status_code == 200 for r in responses)
    assert len(retriever.calls) == 8
    assert all(len(queries) == 1 for queries, _ in retriever.calls)


def test_batches_respect_max_batch_size_and_split_by_topk():
    retriever = FakeRetriever(delay=0.02)
    app = create_app(retriever, config=ServerConfig(max_batch_size=4, max_wait_ms=20,
                                                    cache_size=0))
    bodies = [{"queries": [f"q{i}"], "topk": 1 + i % 2} for i in range(12)]
    responses = post_concurrently(app, bodies)
    assert all(r.status_code == 200 for r in responses)
    for body, r in zip(bodies, responses):
        assert len(r.json()["result"][0]) == body["topk"]
    assert all(len(queries) <= 4 for queries, _ in retriever.calls)
    # each call is at one topk, the topk its queries asked for (q1, q3, ... at 2)
    assert all(k == 1 + int(q[1:]) % 2 for queries, k in retriever.calls for q in queries)
    assert sorted(q for queries, _ in retriever.calls for q in queries) == \
        sorted(b["queries"][0] for b in bodies)


def test_identical_concurrent_queries_are_retrieved_once():
    retriever = FakeRetriever(delay=0.02)
    app = create_app(retriever, config=ServerConfig(max_wait_ms=20, cache_size=0))
    responses = post_concurrently(app, [{"queries": ["same"]} for _ in range(8)])
    assert all(r.json()["result"][0][0]["id"] == "same#0" for r in responses)
    assert retriever.retrieved_queries.count("same") < 8


def test_a_sampled_engine_answers_every_query_afresh():
    """A simulator draws each answer (a noisy or useful prompt, sampled tokens): repeats of
    a query, in one request, across concurrent requests or later, each reach it; nothing is
    cached or merged (a GRPO group asking alike would all read one draw)."""
    class Sampled(FakeRetriever):
        sampled = True

    retriever = Sampled(delay=0.02)
    app = create_app(retriever, config=ServerConfig(max_wait_ms=20))
    responses = post_concurrently(app, [{"queries": ["same", "same"]} for _ in range(4)])
    assert all(len(r.json()["result"]) == 2 for r in responses)
    assert retriever.retrieved_queries.count("same") == 8
    with TestClient(app) as client:
        client.post("/retrieve", json={"queries": ["same"]})
        assert client.get("/health").json()["cache"]["size"] == 0
    assert retriever.retrieved_queries.count("same") == 9


# --- cache -----------------------------------------------------------------------------------


def test_cached_queries_skip_the_retriever():
    retriever = FakeRetriever()
    with make_client(retriever) as client:
        first = client.post("/retrieve", json={"queries": ["a", "b"], "topk": 2})
        second = client.post("/retrieve", json={"queries": ["b", "a", "c"], "topk": 2})
        other_k = client.post("/retrieve", json={"queries": ["a"], "topk": 1})
        cache = client.get("/health").json()["cache"]
    assert first.json()["result"] == second.json()["result"][1::-1]
    assert other_k.status_code == 200
    assert retriever.calls == [(["a", "b"], 2), (["c"], 2), (["a"], 1)]
    assert cache["hits"] == 2 and cache["size"] == 4


def test_cache_size_zero_disables_the_cache():
    retriever = FakeRetriever()
    with make_client(retriever, cache_size=0) as client:
        for _ in range(3):
            client.post("/retrieve", json={"queries": ["a"]})
        assert client.get("/health").json()["cache"]["size"] == 0
    assert len(retriever.calls) == 3


def test_cache_evicts_least_recently_used():
    retriever = FakeRetriever()
    with make_client(retriever, cache_size=2) as client:
        for q in ["a", "b", "a", "c", "a", "b"]:  # "b" was evicted by "c"; "a" stayed fresh
            client.post("/retrieve", json={"queries": [q]})
    assert retriever.retrieved_queries == ["a", "b", "c", "b"]


# --- limits and bad input ----------------------------------------------------------------------


@pytest.mark.parametrize("body, limit, needle", [
    ({"queries": ["q"] * 5}, "max_queries", "5 queries"),
    ({"queries": ["ok", "x" * 11]}, "max_query_chars", "queries.1"),
    ({"queries": ["q"], "topk": 11}, "max_topk", "11"),
    ({"queries": ["q"], "topk": -1}, "max_topk", "-1"),
])
def test_limits_answer_422_naming_the_limit_and_value(body, limit, needle):
    retriever = FakeRetriever()
    with make_client(retriever, max_queries=4, max_query_chars=10, max_topk=10) as client:
        r = client.post("/retrieve", json=body)
    assert r.status_code == 422
    error = r.json()
    assert limit in error["error"] and needle in error["error"]
    assert error["detail"]["limit"] == limit
    assert retriever.calls == []


def test_body_size_limit_answers_413():
    with make_client(max_body_bytes=1024) as client:
        r = client.post("/retrieve", json={"queries": ["x" * 2000]})
    assert r.status_code == 413
    assert "max_body_bytes" in r.json()["error"]


@pytest.mark.parametrize("content, status, needle", [
    (b"{not json", 400, "malformed JSON"),
    (b"", 400, "malformed JSON"),
    (b"[1, 2]", 422, "body"),
    (b"{}", 422, "'queries'"),
    (b'{"queries": "one string"}', 422, "'queries'"),
    (b'{"queries": ["ok", 7]}', 422, "'queries.1'"),
    (b'{"queries": [null]}', 422, "'queries.0'"),
    (b'{"queries": ["q"], "topk": "three"}', 422, "'topk'"),
    (b'{"queries": ["q"], "topk": 2.5}', 422, "'topk'"),
    (b'{"queries": ["q"], "return_scores": "maybe"}', 422, "'return_scores'"),
    (b'{"queries": ["q"], "topk": NaN}', 422, "'topk'"),        # Python's parser takes NaN
    (b'{"queries": ["q"], "topk": 1e400}', 422, "'topk'"),      # and reads this as inf
    (b'{"queries": [NaN]}', 422, "'queries.0'"),
])
def test_malformed_requests_answer_4xx_json(content, status, needle):
    retriever = FakeRetriever()
    with make_client(retriever) as client:
        r = client.post("/retrieve", content=content,
                        headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        # strict JSON (no NaN / Infinity), which any client can read
        body = json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} in {r.text}"))
        assert needle in body["error"]
        assert client.post("/retrieve", json={"queries": ["fine"]}).status_code == 200
    assert retriever.calls == [(["fine"], 3)]


def test_an_empty_query_list_is_answered_with_an_empty_result():
    # Search-R1's client posts its turn's searches with no check for none (every rollout
    # answered): its own server answers {"result": []}, and the client reads ["result"].
    retriever = FakeRetriever()
    with make_client(retriever) as client:
        r = client.post("/retrieve", json={"queries": [], "topk": 3, "return_scores": True})
        assert r.status_code == 200 and r.json() == {"result": []}
        # a bad topk is still a mistake with nothing to search
        assert client.post("/retrieve", json={"queries": [], "topk": -1}).status_code == 422
    assert retriever.calls == []


def test_a_body_of_many_wrong_items_is_refused_at_the_count_limit_not_item_by_item():
    # Validated item by item, 400,000 wrong items gave one error each (seconds and hundreds
    # of MB on the event loop); the count limit stops the validator first.
    retriever = FakeRetriever()
    with make_client(retriever, max_queries=100) as client:
        started = time.perf_counter()
        r = client.post("/retrieve", content=b'{"queries": [' + b"0," * 400_000 + b'0]}',
                        headers={"content-type": "application/json"})
        took = time.perf_counter() - started
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == {"field": "queries", "limit": "max_queries", "max": 100,
                                      "value": 400_001}
        assert len(r.content) < 1000 and took < 30
        # under the count limit, a list of wrong items names the first ones and counts the rest
        r = client.post("/retrieve", json={"queries": [0] * 100})
        assert r.status_code == 422
        detail = r.json()["detail"]
        assert [d["field"] for d in detail[:-1]] == [f"queries.{i}" for i in range(20)]
        assert detail[-1] == {"more": 80} and "and 99 more" in r.json()["error"]
    assert retriever.calls == []


def test_a_client_gone_mid_upload_is_a_4xx_not_a_logged_500():
    from starlette.requests import ClientDisconnect

    from seekrl.retrieval.server import RequestError, _read_body

    class Gone:
        headers: dict = {}

        async def stream(self):
            yield b'{"queries": ['
            raise ClientDisconnect()

    with pytest.raises(RequestError, match="disconnected") as err:
        asyncio.run(_read_body(Gone(), 1024))
    assert err.value.status == 400


def test_a_body_that_stalls_is_answered_408_naming_the_limit():
    from seekrl.retrieval.server import RequestError, _read_body

    class Stalled:
        headers = {"content-length": "100"}

        async def stream(self):
            yield b'{"queries": ['
            await asyncio.sleep(30)   # the rest never comes
            yield b"]}"

    started = time.monotonic()
    with pytest.raises(RequestError, match="body_timeout_s") as err:
        asyncio.run(_read_body(Stalled(), 1024, timeout_s=0.2))
    assert time.monotonic() - started < 5
    assert err.value.status == 408
    assert err.value.detail == {"limit": "body_timeout_s", "max": 0.2, "received": 13}
    assert "13 bytes arrived of 100" in err.value.message


def test_a_stalled_upload_to_a_real_server_is_408_and_others_are_served_meanwhile():
    app = create_app(FakeRetriever(), config=ServerConfig(body_timeout_s=0.5))
    with served(app) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: 100\r\n\r\n{\"queries\"")
            ok = httpx.post(f"{url}/retrieve", json={"queries": ["a"]}, timeout=10)
            assert ok.status_code == 200
            answer = b""
            while chunk := slow.recv(65536):   # to the end: the server closes the connection
                answer += chunk
    text = answer.decode()
    assert text.startswith("HTTP/1.1 408") and "body_timeout_s" in text
    assert "connection: close" in text.lower()


@pytest.mark.parametrize("path", ["/home/someone/indexes/wiki/shard-3.faiss",
                                  "/home/Some One/indexes/wiki/shard-3.faiss",
                                  "C:\\Users\\Some One\\indexes\\shard-3.faiss"])
def test_a_500_body_names_a_file_not_its_folders(path):
    class Missing(FakeRetriever):
        def search(self, queries, k):
            raise FileNotFoundError(2, "No such file or directory", path)

    with make_client(Missing()) as client:
        r = client.post("/retrieve", json={"queries": ["a"]})
    assert r.status_code == 500
    assert "'shard-3.faiss'" in r.json()["error"] and "FileNotFoundError" in r.json()["error"]
    assert "Some" not in r.text and "someone" not in r.text and "indexes" not in r.text


def test_a_500_body_keeps_what_is_not_an_absolute_path():
    from seekrl.retrieval.server import _public_error

    said = _public_error(ValueError("cannot search 'a/b' at http://host/x from /srv/i/d.bin"))
    assert said == "ValueError: cannot search 'a/b' at http://host/x from d.bin"


def test_serve_s_default_limits_are_the_server_s():
    import inspect

    from seekrl.cli import serve

    defaults = {name: p.default for name, p in inspect.signature(serve).parameters.items()}
    for name in ("max_queries", "max_query_chars", "max_topk", "default_topk", "cache_size",
                 "max_batch_size", "max_wait_ms", "max_pending", "body_timeout_s"):
        assert defaults[name] == ServerConfig.model_fields[name].default, name


def test_seekrl_client_waits_out_the_busy_answer_as_it_asks(monkeypatch):
    # the 503 + Retry-After of max_pending, read by RemoteRetriever: it waits the second the
    # server names and asks again, past its `retries` (0 here), until the search is served
    from seekrl.retrieval import batching
    busy_twice = iter([True, True])
    real = batching.SearchRunner.search

    async def search(self, queries, k):
        if next(busy_twice, False):
            raise batching.Busy("max_pending 4: too many queries waiting")
        return await real(self, queries, k)

    monkeypatch.setattr(batching.SearchRunner, "search", search)
    sleeps: list[float] = []
    monkeypatch.setattr("seekrl.retrieval.client.time.sleep", sleeps.append)
    with make_client() as client:
        remote = RemoteRetriever("http://testserver", transport=_through(client), retries=0)
        assert [h.doc_id for h in remote.search(["q"], k=2)[0]] == ["q#0", "q#1"]
        assert client.get("/health").json()["batching"]["in_flight"] == 0
    assert sleeps == [1.0, 1.0]


def test_an_answer_of_more_documents_than_max_hits_is_refused_and_the_client_splits():
    """queries x topk bounds one answer's size (4096 x 100 would build ~400k documents on the
    event loop); the refusal says how many queries fit, and seekrl's client goes on with
    requests of that many, every answer in order."""
    with make_client(max_hits=8, max_topk=8) as client:
        r = client.post("/retrieve", json={"queries": list("abcde"), "topk": 2})
        assert r.status_code == 422 and r.json()["detail"] == {
            "field": "queries", "limit": "max_hits", "max": 8, "max_queries": 4, "value": 10}
        assert "send at most 4 queries a request at this topk" in r.json()["error"]
        assert client.post("/retrieve", json={"queries": list("abcd"), "topk": 2}
                           ).status_code == 200
        assert client.get("/health").json()["limits"]["max_hits"] == 8

        remote = RemoteRetriever("http://testserver", transport=_through(client), retries=0)
        hits = remote.search([f"q{i}" for i in range(9)], k=2)
        assert [h[0].doc_id for h in hits] == [f"q{i}#0" for i in range(9)]
        assert remote.max_batch == 4
        assert client.post("/retrieve", json={"queries": ["q"], "topk": 8}).status_code == 200
    # a topk the server allows is never too many hits for one query: refused when set up
    with pytest.raises(ValueError, match=r"--max-topk 100 is above --max-hits 8: .*"
                                         r"set --max-topk 8 or less"):
        ServerConfig(max_hits=8)


@pytest.mark.parametrize("batching", [True, False])
def test_past_max_pending_a_request_is_answered_503_at_once_and_the_rest_are_served(batching):
    # a slow retriever and six concurrent requests of two queries: the first two requests
    # fill max_pending (4), the others are refused at once with a 503 a client retries
    retriever = FakeRetriever(delay=1.0)   # long enough for all six to arrive on a busy CI
    app = create_app(retriever, config=ServerConfig(max_pending=4, max_queries=4, cache_size=0,
                                                     max_wait_ms=50, batching=batching))
    bodies = [{"queries": [f"q{i}a", f"q{i}b"]} for i in range(6)]
    responses = post_concurrently(app, bodies)
    codes = [r.status_code for r in responses]
    assert sorted(codes) == [200, 200, 503, 503, 503, 503], codes
    busy = next(r for r in responses if r.status_code == 503)
    assert "max_pending 4" in busy.json()["error"] and busy.headers["retry-after"] == "1"
    assert busy.json()["detail"] == {"limit": "max_pending", "max": 4}
    assert sorted(retriever.retrieved_queries) == sorted(
        q for body, r in zip(bodies, responses) if r.status_code == 200 for q in body["queries"])
    with TestClient(app) as client:   # nothing is left counted once they are answered
        health = client.get("/health").json()["batching"]
        assert health["in_flight"] == 0 and health["refused_busy"] == 4
        # one request alone is taken however many it holds (nothing else waits)
        assert client.post("/retrieve", json={"queries": list("abcd")}).status_code == 200


def test_max_pending_below_max_queries_is_refused():
    """A request larger than max_pending is taken only when nothing else waits: under load
    it was answered 503 for ever, and the client retried it for minutes."""
    with pytest.raises(ValidationError, match="--max-pending 3 is below --max-queries 4"):
        ServerConfig(max_queries=4, max_pending=3)


async def _raw_post(app, body: dict, leave_after: float | None = None) -> list[dict]:
    """One POST /retrieve through the ASGI interface; `leave_after`: the client
    disconnects that many seconds after sending its body (else once it has the answer)."""
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    sent: list[dict] = []
    answered = asyncio.Event()

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        if leave_after is not None:
            await asyncio.sleep(leave_after)
        else:
            await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    scope = {"type": "http", "method": "POST", "path": "/retrieve", "raw_path": b"/retrieve",
             "headers": [(b"content-type", b"application/json")], "query_string": b"",
             "http_version": "1.1", "scheme": "http", "server": ("test", 80),
             "client": ("c", 1), "root_path": ""}
    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("batching", [True, False])
def test_a_request_whose_client_left_is_not_searched(batching):
    """The handler awaited its search whatever became of the client: one that timed out
    and sent its queries again had the server search them twice, behind the abandoned copy
    (and counted in in_flight). A client that leaves while its request waits for the
    retriever has it dropped from the queue."""
    retriever = FakeRetriever(delay=0.6)
    app = create_app(retriever, config=ServerConfig(cache_size=0, batching=batching))

    async def go():
        first = asyncio.ensure_future(_raw_post(app, {"queries": ["a"]}))
        await asyncio.sleep(0.1)          # "a" is in the retriever now
        left = await _raw_post(app, {"queries": ["b"]}, leave_after=0.1)
        return await first, left

    first, left = asyncio.run(asyncio.wait_for(go(), timeout=30))
    assert first[0]["status"] == 200 and left[0]["status"] == 499
    time.sleep(0.8)                       # the worker would have taken "b" by now
    assert retriever.retrieved_queries == ["a"]
    assert app.state.runner.in_flight == 0


def test_the_app_serves_again_after_its_lifespan_ended():
    """The retriever's worker thread was made once and shut down with the lifespan: a
    second client of the same app had every search answered 500."""
    app = create_app(FakeRetriever(), config=ServerConfig(cache_size=0))
    for _ in range(2):
        with TestClient(app) as client:
            assert client.post("/retrieve", json={"queries": ["a"]}).status_code == 200


def test_retriever_failure_is_500_and_the_server_keeps_serving():
    with make_client(FakeRetriever(fail_on="bad")) as client:
        r = client.post("/retrieve", json={"queries": ["bad"]})
        assert r.status_code == 500
        assert "ValueError" in r.json()["error"] and "bad" in r.json()["error"]
        assert client.post("/retrieve", json={"queries": ["good"]}).status_code == 200
        batching = client.get("/health").json()["batching"]
        assert batching["retriever_errors"] == 1 and batching["in_flight"] == 0


@pytest.mark.parametrize("batching", [True, False])
def test_a_retriever_raising_stop_iteration_is_a_500_not_a_hung_server(batching):
    """A future cannot hold StopIteration (asyncio refuses it): the request and, with
    batching, every later one waited forever."""
    class Stray(FakeRetriever):
        def search(self, queries, k):
            if "stray" in queries:
                next(iter([]))
            return super().search(queries, k)

    app = create_app(Stray(), config=ServerConfig(batching=batching))
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.post("/retrieve", json={"queries": ["stray"]})
        assert r.status_code == 500 and "StopIteration" in r.json()["error"]
        assert client.post("/retrieve", json={"queries": ["fine"]}).status_code == 200
        assert client.get("/health").json()["batching"]["in_flight"] == 0


def test_one_failing_query_fails_only_its_own_request_in_a_batch():
    retriever = FakeRetriever(delay=0.02, fail_on="bad")
    app = create_app(retriever, config=ServerConfig(max_wait_ms=20, cache_size=0))
    bodies = [{"queries": [q]} for q in ["a", "b", "bad", "c", "d"]]
    responses = post_concurrently(app, bodies)
    assert [r.status_code for r in responses] == [200, 200, 500, 200, 200]


def test_a_request_whose_client_left_is_not_searched_again_after_a_failed_batch():
    """A merged call fails on one bad query and the requests are retried one by one; a
    client that left meanwhile (its handler cancelled) is not searched for."""
    from seekrl.retrieval.batching import SearchRunner

    async def scenario() -> list[list[str]]:
        loop = asyncio.get_running_loop()
        tasks: dict[str, asyncio.Task] = {}

        class LeavesDuringTheMergedCall(FakeRetriever):
            def search(self, queries, k):
                if len(queries) > 1:   # the merged call: client "a" leaves while it runs
                    loop.call_soon_threadsafe(tasks["a"].cancel)
                return super().search(queries, k)

        retriever = LeavesDuringTheMergedCall(fail_on="bad")
        runner = SearchRunner(retriever, ServerConfig(max_wait_ms=50, cache_size=0))
        for q in ("a", "bad", "c"):
            tasks[q] = asyncio.create_task(runner.search([q], 1))
        done = await asyncio.gather(*tasks.values(), return_exceptions=True)
        await runner.stop()
        runner.close()
        assert isinstance(done[0], asyncio.CancelledError)
        assert isinstance(done[1], ValueError) and done[2][0][0].doc_id == "c#0"
        return [queries for queries, _ in retriever.calls]

    assert asyncio.run(scenario()) == [["a", "bad", "c"], ["bad"], ["c"]]


def test_a_timed_out_batch_is_not_retried_request_by_request():
    # each retry of a timeout would wait as long again, holding the one worker thread
    class Hung(FakeRetriever):
        def search(self, queries, k):
            self.calls.append((list(queries), k))
            time.sleep(0.02)
            raise TimeoutError("did not answer in time")

    retriever = Hung()
    app = create_app(retriever, config=ServerConfig(max_wait_ms=50, cache_size=0))
    responses = post_concurrently(app, [{"queries": [q]} for q in "abcd"])
    assert [r.status_code for r in responses] == [500] * 4
    assert all("did not answer" in r.json()["error"] for r in responses)
    # each query asked once, in merged calls (a merged call's requests were retried alone)
    assert sorted(q for queries, _ in retriever.calls for q in queries) == list("abcd")
    assert len(retriever.calls) < 4


def test_wrong_length_from_retriever_is_500_not_a_crash():
    class Broken(FakeRetriever):
        def search(self, queries, k):
            return []

    with make_client(Broken()) as client:
        r = client.post("/retrieve", json={"queries": ["a"]})
        assert r.status_code == 500 and "0 result lists for 1 queries" in r.json()["error"]


def test_server_config_rejects_unknown_and_bad_settings():
    with pytest.raises(ValueError, match="max_batchsize"):
        ServerConfig(max_batchsize=3)
    with pytest.raises(ValueError, match="cache_size"):
        ServerConfig(cache_size=-1)


# --- the real server over loopback ----------------------------------------------------------------


def test_real_uvicorn_server_with_search_r1_request_and_remote_retriever():
    app = create_app(FakeRetriever(), manifest={"retriever": "fake"},
                     config=ServerConfig(max_queries=3))
    with served(app) as url:
        r = httpx.post(f"{url}/retrieve", timeout=10,
                       json={"queries": ["What is the capital of France?"], "topk": 2,
                             "return_scores": True})
        assert r.status_code == 200
        hit = r.json()["result"][0][0]
        assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}

        with RemoteRetriever(f"{url}/retrieve", timeout=10, retries=0) as remote:
            hits = remote.search(["paris", "rome"], k=2)
            assert [h.doc_id for h in hits[1]] == ["rome#0", "rome#1"]
            assert hits[0][0] == Hit("paris#0", "Title 0", "text about paris", 2.0)
            assert remote.health()["doc_count"] == 42
            with pytest.raises(RetrievalError, match="HTTP 422.*max_topk"):
                remote.search(["q"], k=1000)
            # a server below the client's batch of 512: learned from its refusal
            hits = remote.search([f"q{i}" for i in range(7)], k=1)
            assert [h[0].doc_id for h in hits] == [f"q{i}#0" for i in range(7)]
            assert remote.max_batch == 3


def test_unexpected_errors_answer_json_500():
    class Weird(FakeRetriever):
        def search(self, queries, k):
            return [[object()] for _ in queries]  # not a Hit: formatting the answer fails

    with TestClient(create_app(Weird()), raise_server_exceptions=False) as client:
        r = client.post("/retrieve", json={"queries": ["a"]})
        assert r.status_code == 500 and "internal error" in r.json()["error"]
        assert client.get("/health").status_code == 200


def test_index_process_serves_a_real_index_like_the_index_itself(tmp_path):
    from seekrl.retrieval.index import build_index, load_index
    from seekrl.retrieval.server import IndexProcess

    corpus = tmp_path / "corpus.jsonl"
    docs = [("d0", "Paris\nParis is the capital of France."),
            ("d1", "Rome\nRome is the capital of Italy."),
            ("d2", "Oslo\nOslo is the capital of Norway."),
            ("d3", '"Bergen"\nBergen is a city in Norway. ')]   # wiki-18's quoted title
    corpus.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in docs))
    index_dir = build_index(corpus, tmp_path / "index", "bm25", show_progress=False)

    process = IndexProcess(index_dir)
    try:
        assert process.doc_count == 4 and process.manifest["retriever"] == "bm25"
        queries = ["capital of Italy", "Norway"]
        assert process.search(queries, 2) == load_index(index_dir).search(queries, 2)
        with make_client(process) as client:   # contents go out as the corpus holds them
            r = client.post("/retrieve", json={"queries": ["Bergen"], "topk": 1})
            assert r.json()["result"][0][0] == {"id": "d3", "contents": docs[3][1]}
        with make_client(process) as client:
            r = client.post("/retrieve", json={"queries": ["France"], "topk": 1})
            assert r.json()["result"][0][0]["id"] == "d0"
        process._proc.kill()  # a crashed child is restarted on the next search
        process._proc.join(timeout=10)
        dead = process._conn
        assert process.search(["Rome"], 1)[0][0].doc_id == "d1"
        assert dead.closed      # the dead child's pipe is not left open
        # a child that does not answer in time is stopped, its pipe closed (its late answer
        # is never read as the next search's), and the next search restarts it
        late = process._conn
        late.poll = lambda timeout: False   # no answer within search_timeout
        with pytest.raises(RetrievalError, match="did not answer 1 queries within"):
            process.search(["Oslo"], 1)
        assert not process._proc.is_alive() and late.closed
        assert process.search(["Oslo"], 1)[0][0].doc_id == "d2"
    finally:
        process.close()
    assert not process._proc.is_alive()

    # a search in flight at shutdown (a server's worker thread): close waits for it, and
    # past its timeout kills the child rather than write on the pipe under the search
    process = IndexProcess(index_dir)
    held, release = threading.Event(), threading.Event()

    def in_flight():
        with process._lock:
            held.set()
            release.wait(10)

    worker = threading.Thread(target=in_flight)
    worker.start()
    held.wait(10)
    process.close(timeout=0.2)
    assert not process._proc.is_alive() and not process._conn.closed
    release.set()
    worker.join(10)


def test_index_process_reports_a_bad_index_dir(tmp_path):
    from seekrl.retrieval.server import IndexProcess

    with pytest.raises(RetrievalError, match="not a seekrl index"):
        IndexProcess(tmp_path)


def test_serve_on_a_busy_port_fails_in_one_line_before_loading_the_index(tmp_path):
    from typer.testing import CliRunner

    from seekrl.cli import app

    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        # the index does not exist: had it been loaded first, that would be the error
        r = CliRunner().invoke(app, ["serve", "--index", str(tmp_path / "missing"),
                                     "--port", str(port)])
    finally:
        busy.close()
    assert r.exit_code == 2
    assert f"127.0.0.1:{port} is already in use" in r.output
    assert "Traceback" not in r.output


def test_a_failed_load_after_the_port_is_taken_gives_the_port_back(tmp_path):
    """The port is bound before the (slow) index load; an index that fails to load closes
    it, even while the error (and its frames) are still held, as a notebook holds them."""
    from seekrl.retrieval.server import bind_socket, run_server

    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(Exception) as held:
        run_server(tmp_path / "missing", port=port, index_process=False)
    assert "missing" in str(held.value)
    again = bind_socket("127.0.0.1", port)   # "already in use" while the socket leaked
    again.close()


def test_openapi_schema_describes_retrieve():
    """Schema-driven clients and fuzzers see /retrieve, its request and its answers."""
    with TestClient(create_app(FakeRetriever())) as client:
        schema = client.get("/openapi.json").json()
    post = schema["paths"]["/retrieve"]["post"]
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"queries", "topk", "return_scores"} <= set(request["properties"])
    assert {"200", "400", "413", "422"} <= set(post["responses"])
    assert "/health" in schema["paths"]


def test_a_second_server_cannot_take_a_bound_port_while_the_first_loads():
    """Both set SO_REUSEADDR, which lets two sockets bind one port until one listens: the
    first listens at once, so the second fails at once, not after loading its index."""
    from seekrl.retrieval.server import bind_socket

    first = bind_socket("127.0.0.1", 0)
    try:
        with pytest.raises(RetrievalError, match="already in use"):
            bind_socket("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()


def test_health_shows_the_corpus_by_name_not_its_path():
    app = create_app(FakeRetriever(), manifest={"retriever": "bm25", "corpus_sha256": "ab",
                                                "corpus": "/home/someone/data/corpus.jsonl"})
    with TestClient(app) as client:
        shown = client.get("/health").json()["manifest"]
    assert shown == {"retriever": "bm25", "corpus_sha256": "ab", "corpus": "corpus.jsonl"}


@pytest.mark.parametrize("port", [-1, 65536, 99999])
def test_a_port_out_of_range_is_one_line(port):
    from seekrl.retrieval.server import bind_socket

    with pytest.raises(RetrievalError, match=rf"--port {port}: expected 0 to 65535"):
        bind_socket("127.0.0.1", port)


def test_the_url_is_the_bound_address():
    from seekrl.retrieval.server import bind_socket, server_url

    sock = bind_socket("127.0.0.1", 0)   # any free port, on loopback
    try:
        assert server_url(sock) == f"http://127.0.0.1:{sock.getsockname()[1]}"
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()


def test_serve_prints_the_address_it_listens_on(tmp_path):
    """`seekrl serve --port 0` says where it listens (the port the system picked), and that
    address answers; the server is stopped by the test (loopback only)."""
    import re
    import subprocess
    import sys

    from seekrl.retrieval.index import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "d0", "contents": "Oslo\nOslo is in Norway."}) + "\n")
    index_dir = build_index(corpus, tmp_path / "index", "bm25", show_progress=False)
    proc = subprocess.Popen([sys.executable, "-m", "seekrl.cli", "serve", "--index",
                             str(index_dir), "--port", "0", "--no-index-process",
                             "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        deadline = time.time() + 180   # a busy CI machine: the import alone can take a minute
        while time.time() < deadline and "serving" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the server exited before saying where it is"
        found = re.search(r"on (http://127\.0\.0\.1:(\d+))/retrieve", line)
        assert found and int(found.group(2)) > 0, line
        health = httpx.get(f"{found.group(1)}/health", timeout=10).json()
        assert health["status"] == "ok" and health["manifest"]["corpus"] == "corpus.jsonl"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
