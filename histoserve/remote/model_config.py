"""The one fetch of a served model's config: ``/v1/models``, ``/v2/models/{name}/config``.

Used for tile models, tissue models and slide heads alike; the answer is
read through the client's one core (:mod:`histoserve.remote.http`: a deadline,
a size bound) and retried by the one policy
(:meth:`~histoserve.remote.dispatch.RetryPolicy.run`) on connection errors, 5xx
and 429, as a Job's pod may start before its InferenceService is ready.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from histoserve.errors import RemoteError, RequestFailed, UsageError
from histoserve.remote.auth import Credentials
from histoserve.remote.dispatch import RetryPolicy
from histoserve.remote.http import Reply, new_client, send
from histoserve.remote.transport import RETRY_STATUS, status_error

MAX_CONFIG_BYTES = 16 << 20
"""Largest model list or config read: a multimodal config lists its genes (60,000 names ~ 1 MB)."""


def fetch_config(
    url: str,
    model: str | None,
    timeout_s: float,
    retry: RetryPolicy,
    credentials: Credentials | None = None,
    sleep: Callable[[float], Any] = time.sleep,
) -> tuple[str, Mapping[str, Any]]:
    """``(name, config)`` of ``model`` (else the only model) at one HTTP(S) URL.

    The one config fetch of the client (tile models, slide heads, tissue
    models): retried like inference requests on connection errors, 5xx and 429.

    Raises:
        UsageError: No such model, or no model named and the server serves several.
        RemoteError: The server cannot be reached or answers something unexpected.
    """
    with _Getter(url, timeout_s, retry, sleep, credentials) as getter:
        name = model or _only_model(getter)
        reply = getter.get(f"/v2/models/{name}/config")
        if reply.status == 404:
            raise UsageError(f"{getter.base} serves no model {name!r}: {getter.message(reply)}")
        getter.check(reply)
        try:
            config = reply.json()
        except ValueError as exc:
            raise RemoteError(f"{getter.base}: the config of {name!r} is not JSON") from exc
    if not isinstance(config, Mapping):
        raise RemoteError(f"{getter.base}: the config of {name!r} is not a JSON object")
    return name, config


def _only_model(getter: _Getter) -> str:
    base = getter.base
    reply = getter.get("/v1/models")
    getter.check(reply)
    try:
        models = [str(m) for m in reply.json().get("models") or []]
    except (ValueError, AttributeError, TypeError) as exc:
        raise RemoteError(f"{base}/v1/models: not a model list") from exc
    if len(models) != 1:
        raise UsageError(
            f"{base} serves {len(models)} models ({', '.join(models) or 'none'}): pick one with --model"
        )
    return str(models[0])


class _Getter:
    """GETs against one base URL through the client's one core, retried by the one policy."""

    def __init__(
        self,
        base: str,
        timeout_s: float,
        retry: RetryPolicy,
        sleep: Callable,
        credentials: Credentials | None = None,
    ):
        self.base, self._retry, self._sleep = base, retry, sleep
        self._timeout_s = timeout_s
        self._credentials = credentials or Credentials()
        self._http = new_client(base, timeout_s, self._credentials)
        self._rng = random.Random()

    def __enter__(self) -> _Getter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def get(self, path: str) -> Reply:
        """The answer (any status but a retryable one), or RemoteError when attempts run out."""

        def attempt(_: int) -> Reply:
            reply = send(
                self._http,
                self._credentials,
                "GET",
                path,
                timeout_s=self._timeout_s,
                max_bytes=MAX_CONFIG_BYTES,
            )
            if reply.status in RETRY_STATUS:
                raise status_error(reply.url, reply, self._credentials)
            return reply

        try:
            return self._retry.run(attempt, self._sleep, self._rng, what=f"GET {self.base}{path}")
        except RequestFailed as exc:
            raise RemoteError(
                f"cannot reach {self.base}{path} ({self._retry.max_attempts} attempts): "
                f"{exc.__cause__}"
            ) from exc

    def message(self, reply: Reply) -> str:
        """The server's error message, credentials scrubbed out."""
        return reply.message(self._credentials)

    def check(self, reply: Reply) -> None:
        """RemoteError for a 4xx/5xx answer, with the server's (scrubbed) message."""
        if reply.status >= 400:
            raise RemoteError(f"{reply.url}: HTTP {reply.status}: {self.message(reply)}")
