"""The one place the client builds HTTP connections, and what every request through them is held to.

Every HTTP request of the client (inference, model config and lists, slide
heads, the tissue model, :class:`~histoserve.HistoserveClient`) goes through
an ``httpx.Client`` made by :func:`new_client`, which holds it to:

- **One deadline per request.** httpx's timeouts bound each socket operation,
  so a server dripping a valid answer a byte a second never times out. Here
  every socket operation (connect, TLS, each read and write) waits at most
  until the deadline of the request in progress on that thread (:func:`deadline`),
  and none starts after it: ``timeout_s`` is connect to last byte. The
  clamp is a network backend given to httpcore's pool (httpcore's public
  extension point), so headers and body are bounded alike.
- **Bounded answers.** :func:`read_bounded` refuses an answer whose
  ``Content-Length`` is over what the request can expect before reading it,
  and stops reading one that grows past it; requests ask for
  ``Accept-Encoding: identity`` and an answer that is compressed anyway is
  refused, so a small gzip body never inflates into gigabytes.
- **No proxy unless asked.** Environment proxy variables (``HTTP_PROXY``,
  ``ALL_PROXY``, ...) are ignored unless ``Credentials.trust_env``
  (``--trust-env``); then a token or header over a plain ``http://`` server
  URL through a proxy is refused (the proxy would read it; an ``https://`` URL
  is tunnelled).

``Retry-After`` (RFC 9110, section 10.2.3: delta-seconds or an HTTP-date)
has its one parser here (:func:`parse_retry_after`); a malformed header
never hides the error that carried it.

TLS (the CA bundle) and the credential headers come from
:class:`~histoserve.remote.auth.Credentials`.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpcore
import httpx

from histoserve import jsonsafe
from histoserve.errors import BadAnswer, RetryableError, UsageError
from histoserve.remote.auth import MESSAGE_MAX_CHARS, Credentials, redact_url

HEADER_HEADROOM_BYTES = 64 << 10
"""What an answer may carry beyond its tensors: the JSON header, names, parameters."""
ERROR_BODY_BYTES = 64 << 10
"""What is read of an error answer (4xx/5xx): its message, not a page of HTML."""
_local = threading.local()


@contextmanager
def deadline(timeout_s: float) -> Iterator[None]:
    """Holds every socket operation of this thread's requests to ``timeout_s`` from now."""
    previous = getattr(_local, "at", None)
    _local.at = time.monotonic() + timeout_s
    try:
        yield
    finally:
        _local.at = previous


def _clamp(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of the thread's deadline; ``error`` once it passed."""
    at = getattr(_local, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A socket stream whose every operation ends by the request's deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> _Stream:
        timeout = _clamp(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's own socket backend, each stream held to the request's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        timeout = _clamp(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        timeout = _clamp(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Transport(httpx.HTTPTransport):
    """httpx's transport over a pool (direct or through one proxy) built with :class:`_Backend`.

    httpx's own constructor is not called: it would build a pool without the
    backend. Everything else (requests, streams, its error mapping) is httpx's.
    """

    def __init__(self, verify: Any, limits: httpx.Limits, proxy: str | None) -> None:
        common: dict[str, Any] = {
            "ssl_context": httpx.create_ssl_context(verify=verify, trust_env=False),
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry,
            "network_backend": _Backend(),
        }
        if proxy is None:
            self._pool = httpcore.ConnectionPool(**common)
            return
        via = httpx.Proxy(proxy)
        self._pool = httpcore.HTTPProxy(
            proxy_url=httpcore.URL(
                scheme=via.url.raw_scheme,
                host=via.url.raw_host,
                port=via.url.port,
                target=via.url.raw_path,
            ),
            proxy_auth=via.raw_auth,
            proxy_headers=via.headers.raw,
            proxy_ssl_context=via.ssl_context,
            **common,
        )


def new_client(
    base_url: str,
    timeout_s: float,
    credentials: Credentials | None = None,
    *,
    limits: httpx.Limits | None = None,
) -> httpx.Client:
    """The ``httpx.Client`` for ``base_url`` (see the module docstring for what it enforces).

    Requests through it must run inside :func:`deadline` to be bounded as a
    whole; outside one, ``timeout_s`` bounds each socket operation.

    Raises:
        UsageError: ``credentials.trust_env`` and the environment names a proxy that is not ``http(s)://``, or
            a plain ``http://`` one while a token or header would cross it.
    """
    credentials = credentials or Credentials()
    proxy = _proxy_for(base_url, credentials) if credentials.trust_env else None
    limits = limits or httpx.Limits()
    headers = {**credentials.http_header_bytes(), "accept-encoding": b"identity"}
    return httpx.Client(
        base_url=base_url,
        timeout=timeout_s,
        headers=headers,
        trust_env=False,
        transport=_Transport(credentials.httpx_verify(), limits, proxy),
    )


def _proxy_for(url: str, credentials: Credentials) -> str | None:
    """The environment's proxy for ``url`` (``NO_PROXY`` honoured), checked; None: direct."""
    parsed = httpx.URL(url)
    if urllib.request.proxy_bypass(parsed.host):
        return None
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parsed.scheme) or proxies.get("all")
    if not proxy:
        return None
    shown = redact_url(proxy)
    if not proxy.startswith(("http://", "https://")):
        raise UsageError(
            f"proxy {shown} for {url}: only http:// and https:// proxies are supported"
        )
    if parsed.scheme == "http" and credentials.sends_secrets:
        raise UsageError(
            f"proxy {shown} for {url}: the token and headers would reach the proxy in the clear; "
            "use an https:// server URL (tunnelled through the proxy) or set NO_PROXY for it"
        )
    return proxy


@dataclass(frozen=True)
class Reply:
    """One whole answer: where it came from, its status, headers and body."""

    url: str
    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        """The body as JSON (``ValueError`` when it is not)."""
        return jsonsafe.loads(self.body, self.url)

    def message(self, credentials: Credentials) -> str:
        """The server's ``{"error": ...}`` (else its text), credentials scrubbed out, then cut."""
        text = self.body.decode("utf-8", "replace")
        try:
            data = jsonsafe.loads(text, self.url)
            message = str(data.get("error", text)) if isinstance(data, Mapping) else text
        except ValueError:
            message = text
        return credentials.scrub(message, MESSAGE_MAX_CHARS)


def send(
    client: httpx.Client,
    credentials: Credentials,
    method: str,
    path: str,
    *,
    timeout_s: float,
    max_bytes: int,
    content: Any = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """One request through ``client``, whole within ``timeout_s``, its answer within ``max_bytes``.

    An error answer (4xx/5xx) is read up to :data:`ERROR_BODY_BYTES` (its message).

    Raises:
        RetryableError: The connection failed or the deadline passed.
        BadAnswer: The answer is larger than ``max_bytes`` or compressed.
    """
    url = redact_url(f"{client.base_url}".rstrip("/") + path)
    try:
        with (
            deadline(timeout_s),
            client.stream(method, path, content=content, headers=headers) as response,
        ):
            failed = response.status_code >= 400
            body = read_bounded(response, ERROR_BODY_BYTES if failed else max_bytes, cut=failed)
    except httpx.TimeoutException as exc:
        raise RetryableError(f"{url}: no whole answer within {timeout_s:g} s") from exc
    except httpx.HTTPError as exc:
        message = credentials.scrub(str(exc), MESSAGE_MAX_CHARS)
        raise RetryableError(f"{url}: {type(exc).__name__}: {message}") from exc
    if isinstance(body, str):
        raise BadAnswer(f"{url}: {body} (not read)")
    return Reply(url, response.status_code, response.headers, body)


def read_bounded(response: httpx.Response, max_bytes: int, *, cut: bool = False) -> bytes | str:
    """The body of a streamed ``response``, or why it was refused (a ``str``).

    Refused unread when ``Content-Length`` says more than ``max_bytes`` or the
    body is compressed (identity was asked for); refused as soon as more than
    ``max_bytes`` arrive otherwise. ``cut``: its first ``max_bytes`` instead of
    a refusal (an error message).
    """
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        return f"a {encoding!r}-encoded answer (identity was asked for)"
    declared = response.headers.get("content-length")
    if (
        not cut
        and declared is not None
        and declared.strip().isdigit()
        and int(declared) > max_bytes
    ):
        return f"an answer of {int(declared):,} bytes, more than the {max_bytes:,} this request can need"
    body = bytearray()
    for chunk in response.iter_raw():
        body += chunk
        if len(body) > max_bytes:
            if cut:
                return bytes(body[:max_bytes])
            return f"an answer of more than the {max_bytes:,} bytes this request can need"
    return bytes(body)


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header value.

    Args:
        value: The header as received; None or empty when absent.
        now_s: The current time (seconds since the epoch) an HTTP-date is
            measured from; the wall clock when None.

    Returns:
        Seconds (``>= 0``; a date in the past is ``0.0``), or None when the
        header is absent, negative, not finite or neither form.
    """
    if not value or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        return _seconds_until(text, time.time() if now_s is None else now_s)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _seconds_until(text: str, now_s: float) -> float | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        return None
    return max(0.0, when.timestamp() - now_s)
