"""`RemoteRetriever`: the `Retriever` protocol over HTTP, for any Search-R1-compatible server."""

from __future__ import annotations

import datetime
import email.utils
import math
import time
from typing import Any, Self

import httpx

from seekrl.retrieval.base import Hit, RetrievalError


class RemoteRetriever:
    """Searches a Search-R1-compatible `/retrieve` endpoint (seekrl's server or Search-R1's own).

    Connection errors, timeouts and 5xx answers are retried `retries` times, waiting
    `backoff * 2**attempt` seconds (capped at `max_backoff`) in between; a 4xx answer is the
    caller's mistake and raises `RetrievalError` at once with the server's message. A busy
    server (429, or 503 with `Retry-After`: `seekrl serve` past its `--max-pending`) is not
    broken: it is asked again after the wait it names, for up to `busy_wait` seconds in all,
    without using up `retries` (a trainer sharing a loaded server would otherwise fail
    after a few seconds).
    A search of more than `max_batch` queries (a rollout batch of several sub-queries a
    turn can hold thousands) goes as several requests of at most that many, in order:
    `seekrl serve` refuses a request over its `--max-queries` (4096 by default). A server
    started with a lower limit says so in its refusal; `max_batch` then drops to it and the
    search goes on in smaller requests (once: a second refusal raises).
    """

    def __init__(self, url: str, timeout: float | None = 30.0, retries: int = 3, backoff: float = 0.5,
                 max_backoff: float = 8.0, transport: httpx.BaseTransport | None = None,
                 max_batch: int = 512, busy_wait: float = 300.0):
        if retries < 0:
            raise ValueError(f"retries: expected >= 0, got {retries}")
        if max_batch < 1:
            raise ValueError(f"max_batch: expected >= 1 queries a request, got {max_batch}")
        self.max_batch = max_batch
        for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
            if not 0 <= value < float("inf"):   # NaN too: it would fail at the first retry
                raise ValueError(f"{name}: expected >= 0 seconds, got {value}")
        if timeout is not None and not 0 < timeout < float("inf"):   # None: no limit
            raise ValueError(f"timeout: expected > 0 seconds or None, got {timeout}")
        if not busy_wait >= 0:
            raise ValueError(f"busy_wait: expected >= 0 seconds, got {busy_wait}")
        self.busy_wait = busy_wait
        # accept the endpoint url as well as the base url
        base = url.rstrip("/").removesuffix("/retrieve")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"url: expected http(s)://host:port[/retrieve], got {url!r}")
        self.base_url = base
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        try:
            self._client = httpx.Client(base_url=base, timeout=timeout, transport=transport)
        except httpx.InvalidURL as err:   # "http://[::1", a port that is not a number
            raise ValueError(f"url: {url!r} is not a valid URL ({err})") from None

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("queries: expected a list of strings, got a single str")
        if not queries:
            return []
        queries = list(queries)
        if k <= 0:   # no documents, as a local index answers (the server reads 0 as its default)
            return [[] for _ in queries]
        found: list[list[Hit]] = []
        while len(found) < len(queries):
            chunk = queries[len(found):len(found) + self.max_batch]
            try:
                found += self._search(chunk, k)
            except _OverLimit as refused:
                if not 1 <= refused.limit < len(chunk):
                    raise
                self.max_batch = refused.limit     # the server's --max-queries, learned
        return found

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """One request: a result list for each query, checked."""
        payload = {"queries": queries, "topk": int(k), "return_scores": True}
        data = self._request("POST", "/retrieve", json=payload)
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            got = f"{len(result)} lists" if isinstance(result, list) else _kind(result)
            raise RetrievalError(f"{self.base_url}/retrieve: field 'result': expected "
                                 f"{len(queries)} lists of hits, got {got}")
        return [[self._hit(item, i, j) for j, item in enumerate(hits)]
                for i, hits in enumerate(_as_list(result, "result", self.base_url))]

    def health(self) -> dict[str, Any]:
        """The server's /health: manifest, doc count, uptime, cache and batching stats."""
        return self._request("GET", "/health")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteRetriever({self.base_url!r})"

    def _hit(self, item: Any, i: int, j: int) -> Hit:
        where = f"{self.base_url}/retrieve: result[{i}][{j}]"
        if not isinstance(item, dict):
            raise RetrievalError(f"{where}: expected an object, got {_kind(item)}")
        # With return_scores the hit is {"document": doc, "score": s}; a server that ignores
        # the flag sends the document alone, which then gets its own score or 0.
        doc, score = (item["document"], item.get("score")) if "document" in item \
            else (item, item.get("score", 0.0))
        if not isinstance(doc, dict):
            raise RetrievalError(f"{where}.document: expected an object, got {_kind(doc)}")
        for key in ("id", "contents"):
            if key not in doc:
                raise RetrievalError(f"{where}.document: missing field '{key}'")
        if not isinstance(doc["contents"], str):
            raise RetrievalError(f"{where}.document.contents: expected a string, "
                                 f"got {_kind(doc['contents'])}")
        doc_id = doc["id"]   # evidence, `open` and gold matching name a document by it
        if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool) \
                or not str(doc_id).strip():
            raise RetrievalError(f"{where}.document.id: expected a string or integer that "
                                 f"is not blank, got {doc_id!r}")
        try:
            score = float("nan") if score is None else float(score)
        except (TypeError, ValueError, OverflowError):   # 1e400 written as an integer
            raise RetrievalError(f"{where}.score: expected a number, got {score!r}") from None
        return Hit.from_contents(str(doc["id"]), doc["contents"], score)

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self.base_url}{path}"
        last_error = ""
        failures, busy_since, wait = 0, None, 0.0
        while True:
            if wait:
                time.sleep(wait)
            try:
                response = self._client.request(method, path, **kwargs)
            except httpx.TransportError as exc:  # refused, reset, timed out: worth retrying
                last_error = f"{type(exc).__name__}: {exc}"
                response = None
            busy = None if response is None else _busy_for(response)
            if busy is not None:
                now = time.monotonic()
                busy_since = now if busy_since is None else busy_since
                left = busy_since + self.busy_wait - now
                if left <= 0:
                    raise RetrievalError(
                        f"{method} {url}: the server was still busy after {self.busy_wait:g} s "
                        f"(busy_wait); last answer HTTP {response.status_code}: "
                        f"{_server_message(response)}")
                # the wait the server asks for, at least `backoff` and never a busy loop
                wait = min(max(busy, self.backoff, 0.05), left)
                continue
            if response is None or response.status_code >= 500:
                if response is not None:
                    last_error = f"HTTP {response.status_code}: {_server_message(response)}"
                failures += 1
                if failures > self.retries:
                    break
                wait = min(self.backoff * 2 ** (failures - 1), self.max_backoff)
                continue
            if 300 <= response.status_code < 400:   # not followed: a POST's body would be lost
                raise RetrievalError(f"{method} {url} was redirected (HTTP "
                                     f"{response.status_code}) to "
                                     f"{response.headers.get('location', '(no Location)')}: "
                                     "give that address as the retriever url")
            if response.status_code >= 400:
                message = (f"{method} {url} was refused with HTTP {response.status_code}: "
                           f"{_server_message(response)}")
                limit = _query_limit(response)
                raise RetrievalError(message) if limit is None else _OverLimit(message, limit)
            try:
                return response.json()
            except ValueError:
                raise RetrievalError(f"{method} {url}: the answer is not JSON: "
                                     f"{response.text[:200]!r}") from None
        raise RetrievalError(f"{method} {url} failed after {self.retries + 1} attempts; "
                             f"last error: {last_error}")


def _busy_for(response: httpx.Response) -> float | None:
    """Seconds a busy server asks the client to wait (429, or 503 with `Retry-After`; 0 when
    it names no wait it can be read as), else None: not busy."""
    if response.status_code not in (429, 503):
        return None
    after = response.headers.get("retry-after")
    if after is None:
        return 0.0 if response.status_code == 429 else None
    try:
        seconds = float(after)
    except ValueError:   # an HTTP date
        try:
            when = email.utils.parsedate_to_datetime(after)
        except (TypeError, ValueError):
            return 0.0
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return seconds if seconds > 0 and math.isfinite(seconds) else 0.0


class _OverLimit(RetrievalError):
    """seekrl's server refused a request of more queries than its `--max-queries` (or its
    `--max-hits` documents allow at the request's topk)."""

    def __init__(self, message: str, limit: int):
        super().__init__(message)
        self.limit = limit


def _query_limit(response: httpx.Response) -> int | None:
    """The queries a request may hold, from a seekrl server's refusal of too many
    (`max_queries`, or `max_hits`: documents at this topk), else None."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return None
    if not isinstance(detail, dict):
        return None
    key = {"max_queries": "max", "max_hits": "max_queries"}.get(detail.get("limit"))
    value = detail.get(key) if key else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _server_message(response: httpx.Response) -> str:
    """The `error` field of seekrl's JSON errors, FastAPI's `detail`, or the raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("error", "detail"):
            if body.get(key):
                return str(body[key])
    return str(body)[:500]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _as_list(value: Any, name: str, base_url: str) -> list:
    for i, item in enumerate(value):
        if not isinstance(item, list):
            raise RetrievalError(f"{base_url}/retrieve: field '{name}[{i}]': expected a list of "
                                 f"hits, got {_kind(item)}")
    return value
