"""RemoteRetriever: parsing Search-R1 answers, retries with backoff, 4xx not retried."""

from __future__ import annotations

import json

import httpx
import pytest

from seekrl.retrieval.base import Hit, RetrievalError, Retriever
from seekrl.retrieval.client import RemoteRetriever


def answer(queries: list[str], k: int, scores: bool = True) -> dict:
    def doc(q: str, i: int) -> dict:
        return {"id": f"{q}-{i}", "contents": f'"T{i}"\nabout {q}'}

    if scores:
        return {"result": [[{"document": doc(q, i), "score": 1.0 - i / 10} for i in range(k)]
                           for q in queries]}
    return {"result": [[doc(q, i) for i in range(k)] for q in queries]}


class FlakyServer:
    """A MockTransport handler that fails `failures` times (status or exception), then answers."""

    def __init__(self, failures: int = 0, fail_with: int | type[Exception] = 503,
                 scores: bool = True):
        self.failures, self.fail_with, self.scores = failures, fail_with, scores
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if len(self.requests) <= self.failures:
            if isinstance(self.fail_with, int):
                return httpx.Response(self.fail_with, json={"error": "index is warming up",
                                                            "detail": None})
            raise self.fail_with("connection refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok", "doc_count": 3})
        body = json.loads(request.content)
        return httpx.Response(200, json=answer(body["queries"], body["topk"], self.scores))


def remote(server: FlakyServer, url: str = "http://127.0.0.1:9", **kwargs) -> RemoteRetriever:
    kwargs.setdefault("backoff", 0.001)
    return RemoteRetriever(url, transport=httpx.MockTransport(server), **kwargs)


def test_search_sends_search_r1_request_and_parses_hits():
    server = FlakyServer()
    retriever = remote(server)
    assert isinstance(retriever, Retriever)
    hits = retriever.search(["paris", "rome"], k=2)
    sent = json.loads(server.requests[0].content)
    assert sent == {"queries": ["paris", "rome"], "topk": 2, "return_scores": True}
    assert server.requests[0].url.path == "/retrieve"
    assert hits[0] == [Hit("paris-0", "T0", "about paris", 1.0),
                       Hit("paris-1", "T1", "about paris", 0.9)]
    assert hits[1][0].doc_id == "rome-0"


def test_a_search_over_max_batch_goes_as_several_requests_in_order():
    """A rollout batch of several sub-queries a turn can ask more than a server takes in
    one request (`seekrl serve --max-queries`, 512): split, answered in order."""
    server = FlakyServer()
    queries = [f"q{i}" for i in range(7)]
    hits = remote(server, max_batch=3).search(queries, k=1)
    assert [json.loads(r.content)["queries"] for r in server.requests] == [
        queries[:3], queries[3:6], queries[6:]]
    assert [h[0].doc_id for h in hits] == [f"q{i}-0" for i in range(7)]
    with pytest.raises(ValueError, match="max_batch"):
        remote(server, max_batch=0)


def test_a_server_with_a_lower_query_limit_is_learned_from_its_refusal():
    """`seekrl serve --max-queries 2` refuses a request of 3 naming its limit: the client
    lowers its batch to 2 and goes on, answers in order; a refusal that does not help
    (a limit it already keeps) raises."""
    requests = []

    def server(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        queries = json.loads(request.content)["queries"]
        if len(queries) > 2:
            return httpx.Response(422, json={
                "error": f"field 'queries': {len(queries)} queries exceed max_queries (2)",
                "detail": {"field": "queries", "limit": "max_queries", "max": 2,
                           "value": len(queries)}})
        return httpx.Response(200, json=answer(queries, 1))

    retriever = RemoteRetriever("http://127.0.0.1:9", transport=httpx.MockTransport(server),
                                max_batch=4)
    queries = [f"q{i}" for i in range(11)]
    hits = retriever.search(queries, k=1)
    assert [h[0].doc_id for h in hits] == [f"q{i}-0" for i in range(11)]   # none left out
    assert retriever.max_batch == 2
    assert [len(json.loads(r.content)["queries"]) for r in requests] == [4, 2, 2, 2, 2, 2, 1]

    def stubborn(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"error": "too many", "detail": {
            "limit": "max_queries", "max": 1}})

    one = RemoteRetriever("http://127.0.0.1:9", transport=httpx.MockTransport(stubborn))
    with pytest.raises(RetrievalError, match="too many"):
        one.search(["a"], k=1)


def test_documents_without_scores_are_accepted():
    hits = remote(FlakyServer(scores=False)).search(["q"], k=1)
    assert hits == [[Hit("q-0", "T0", "about q", 0.0)]]


@pytest.mark.parametrize("url", ["http://127.0.0.1:9", "http://127.0.0.1:9/",
                                 "http://127.0.0.1:9/retrieve", "http://127.0.0.1:9/retrieve/"])
def test_base_url_or_endpoint_url(url):
    server = FlakyServer()
    retriever = remote(server, url)
    assert retriever.base_url == "http://127.0.0.1:9"
    retriever.search(["q"], k=1)
    assert str(server.requests[0].url) == "http://127.0.0.1:9/retrieve"


@pytest.mark.parametrize("url", ["http://[::1", "http://localhost:abc"])
def test_a_malformed_url_is_named(url):
    with pytest.raises(ValueError, match=r"^url: .* is not a valid URL \(Invalid port"):
        RemoteRetriever(url)


def test_5xx_is_retried_then_succeeds():
    server = FlakyServer(failures=2, fail_with=503)
    hits = remote(server, retries=3).search(["q"], k=1)
    assert len(server.requests) == 3
    assert hits[0][0].doc_id == "q-0"


def test_connection_errors_are_retried_then_succeed():
    server = FlakyServer(failures=2, fail_with=httpx.ConnectError)
    assert remote(server, retries=2).health() == {"status": "ok", "doc_count": 3}
    assert len(server.requests) == 3


def test_backoff_doubles_between_attempts(monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr("seekrl.retrieval.client.time.sleep", sleeps.append)
    server = FlakyServer(failures=10, fail_with=500)
    with pytest.raises(RetrievalError, match="after 4 attempts.*warming up"):
        remote(server, retries=3, backoff=0.5, max_backoff=1.5).search(["q"], k=1)
    assert sleeps == [0.5, 1.0, 1.5]
    assert len(server.requests) == 4


def test_4xx_is_not_retried_and_carries_the_server_message():
    server = FlakyServer(failures=5, fail_with=422)
    with pytest.raises(RetrievalError, match="HTTP 422: index is warming up"):
        remote(server, retries=3).search(["q"], k=1)
    assert len(server.requests) == 1


def test_malformed_answers_raise_retrieval_error():
    def bad(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"result": [[{"document": {"contents": "x"}}]]})

    with pytest.raises(RetrievalError, match=r"result\[0\]\[0\].document: missing field 'id'"):
        RemoteRetriever("http://h", transport=httpx.MockTransport(bad)).search(["q"], k=1)

    for doc_id in (None, "  ", True, [1]):   # all of them became one id ("None", ...)
        def odd(request: httpx.Request, doc_id=doc_id) -> httpx.Response:
            return httpx.Response(200, json={"result": [[{"document": {
                "id": doc_id, "contents": "T\nx"}, "score": 1.0}]]})

        with pytest.raises(RetrievalError, match=r"result\[0\]\[0\].document.id: expected "
                                                 r"a string or integer that is not blank"):
            RemoteRetriever("http://h", transport=httpx.MockTransport(odd)).search(["q"], 1)

    def moved(request: httpx.Request) -> httpx.Response:
        return httpx.Response(307, headers={"location": "http://other/retrieve"}, json={})

    with pytest.raises(RetrievalError, match=r"redirected \(HTTP 307\) to http://other/retr"):
        RemoteRetriever("http://h", transport=httpx.MockTransport(moved)).search(["q"], k=1)

    def flat(request: httpx.Request) -> httpx.Response:   # the document alone, its score in
        return httpx.Response(200, json={"result": [[{"id": "d", "contents": "T\nx",
                                                       "score": 2.5}]]})

    hit = RemoteRetriever("http://h", transport=httpx.MockTransport(flat)).search(["q"], 1)
    assert hit[0][0].score == 2.5

    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"result": []})

    with pytest.raises(RetrievalError, match="expected 2 lists of hits, got 0 lists"):
        RemoteRetriever("http://h", transport=httpx.MockTransport(short)).search(["a", "b"], 1)


def test_empty_queries_make_no_request_and_bad_arguments_are_named():
    server = FlakyServer()
    assert remote(server).search([], k=3) == []
    assert server.requests == []
    with pytest.raises(TypeError, match="queries"):
        remote(server).search("a query", k=3)
    with pytest.raises(ValueError, match="url"):
        RemoteRetriever("localhost:8000")


class FakeClock:
    """time.monotonic and time.sleep for the client: sleeping moves the clock."""

    def __init__(self, monkeypatch):
        self.now, self.sleeps = 1000.0, []
        monkeypatch.setattr("seekrl.retrieval.client.time.monotonic", lambda: self.now)
        monkeypatch.setattr("seekrl.retrieval.client.time.sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def busy_server(times: int, status: int = 503, retry_after: str | None = "2"):
    """Answers busy `times` times (seekrl serve's overload answer), then searches."""
    server = FlakyServer()

    def handler(request: httpx.Request) -> httpx.Response:
        if len(server.requests) < times:
            server.requests.append(request)
            headers = {} if retry_after is None else {"Retry-After": retry_after}
            return httpx.Response(status, headers=headers, json={
                "error": "server busy: 70000 queries waiting", "detail": {"limit": "max_pending"}})
        return server(request)

    return server, handler


def test_a_busy_server_is_waited_for_as_it_asks_without_using_up_retries(monkeypatch):
    clock = FakeClock(monkeypatch)
    server, handler = busy_server(times=10)
    retriever = RemoteRetriever("http://127.0.0.1:9", transport=httpx.MockTransport(handler),
                                retries=1, backoff=0.5)
    hits = retriever.search(["q"], k=1)
    assert hits[0][0].doc_id == "q-0"
    assert len(server.requests) == 11            # 10 busy answers, more than `retries`
    assert clock.sleeps == [2.0] * 10            # the Retry-After, not the backoff


def test_a_server_busy_past_busy_wait_fails_naming_it(monkeypatch):
    clock = FakeClock(monkeypatch)
    server, handler = busy_server(times=1000, retry_after="30")
    retriever = RemoteRetriever("http://127.0.0.1:9", transport=httpx.MockTransport(handler),
                                busy_wait=100)
    with pytest.raises(RetrievalError, match=r"still busy after 100 s.*HTTP 503.*70000 queries"):
        retriever.search(["q"], k=1)
    assert clock.sleeps == [30.0, 30.0, 30.0, 10.0]   # the last wait cut to what is left
    assert len(server.requests) == 5


@pytest.mark.parametrize("status, retry_after, waits", [
    (429, None, [0.5, 0.5]),             # too many requests: busy, at the backoff
    (429, "0", [0.5, 0.5]),              # no busy loop on a zero
    (503, "Wed, 21 Oct 2015 07:28:00 GMT", [0.5, 0.5]),   # a date already past
    (503, "soon", [0.5, 0.5]),           # unreadable: waited for at the backoff
])
def test_busy_answers_without_a_usable_wait_use_the_backoff(monkeypatch, status, retry_after,
                                                            waits):
    clock = FakeClock(monkeypatch)
    server, handler = busy_server(times=2, status=status, retry_after=retry_after)
    retriever = RemoteRetriever("http://127.0.0.1:9", transport=httpx.MockTransport(handler),
                                retries=0, backoff=0.5)
    assert retriever.search(["q"], k=1)[0][0].doc_id == "q-0"
    assert clock.sleeps == waits


def test_a_503_without_retry_after_is_an_error_and_uses_retries(monkeypatch):
    clock = FakeClock(monkeypatch)
    server, handler = busy_server(times=10, retry_after=None)
    retriever = RemoteRetriever("http://127.0.0.1:9", transport=httpx.MockTransport(handler),
                                retries=2, backoff=0.5)
    with pytest.raises(RetrievalError, match="after 3 attempts"):
        retriever.search(["q"], k=1)
    assert clock.sleeps == [0.5, 1.0]


def test_busy_wait_must_not_be_negative():
    with pytest.raises(ValueError, match="busy_wait"):
        RemoteRetriever("http://127.0.0.1:9", busy_wait=-1)


@pytest.mark.parametrize("key, value", [("backoff", float("nan")), ("max_backoff", -1.0),
                                        ("max_backoff", float("inf")), ("timeout", 0.0),
                                        ("timeout", -5.0)])
def test_waits_that_would_fail_at_the_first_retry_are_refused_at_once(key, value):
    """time.sleep(-1) or a NaN backoff failed only after the first 5xx, with a bare error."""
    with pytest.raises(ValueError, match=rf"^{key}: expected"):
        RemoteRetriever("http://127.0.0.1:9", **{key: value})
    RemoteRetriever("http://127.0.0.1:9", timeout=None)   # no limit, as httpx takes it


def test_no_documents_asked_is_no_request():
    """k <= 0 answers no documents, as a local index does (the server would read topk 0
    as its default and send 3)."""
    server = FlakyServer()
    assert remote(server).search(["a", "b"], k=0) == [[], []]
    assert remote(server).search(["a"], k=-1) == [[]]
    assert server.requests == []


def test_a_score_too_large_for_a_float_is_named():
    def huge(request: httpx.Request) -> httpx.Response:
        body = '{"result": [[{"document": {"id": "d", "contents": "T\\nx"}, "score": 1' + \
            "0" * 400 + "}]]}"
        return httpx.Response(200, content=body.encode(),
                              headers={"content-type": "application/json"})

    r = RemoteRetriever("http://127.0.0.1:9", transport=httpx.MockTransport(huge))
    with pytest.raises(RetrievalError, match=r"result\[0\]\[0\]\.score: expected a number"):
        r.search(["q"], k=1)


def test_contents_are_kept_as_the_server_sent_them():
    """A quoted title (wiki-18) is read as the title without its quotes, and the document
    goes on (to a ranker, or a server in front) as it came."""
    (hit,) = remote(FlakyServer()).search(["q"], k=1)[0]
    assert (hit.title, hit.text, hit.contents) == ("T0", "about q", '"T0"\nabout q')
    assert hit == Hit("q-0", "T0", "about q", 1.0) and "stored" not in hit.to_dict()

