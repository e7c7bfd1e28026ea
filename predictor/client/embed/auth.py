"""Credentials for a protected endpoint: a CA bundle, a bearer token, extra headers.

``--ca-cert FILE`` verifies ``https://`` and ``grpcs://`` servers against that
CA bundle (default: the system's). ``--token-file FILE`` (else
``$HISTOSERVE_TOKEN``) is sent as ``Authorization: Bearer <token>`` and every
``--header 'Name: value'`` as is: HTTP headers over REST, call metadata
(names lower-cased, as gRPC requires) over gRPC, on every request and every
retry, the model-info requests included.

Secrets never reach output: :class:`Credentials` keeps the token and header
values out of its ``repr``; error messages name a header, never its value;
the transports put them only on the wire.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from predictor.client.embed.errors import UsageError

TOKEN_ENV = "HISTOSERVE_TOKEN"
_FORBIDDEN = frozenset({"host", "content-length", "content-type", "transfer-encoding"})


@dataclass(frozen=True)
class Credentials:
    """What is sent to prove who the client is, and how the server is verified.

    Attributes:
        ca_cert: PEM CA bundle for ``https://``/``grpcs://`` (None: system CAs).
        token: Bearer token (None: no ``Authorization`` header). Not in ``repr``.
        headers: Extra ``(name, value)`` pairs. Not in ``repr``.
    """

    ca_cert: Path | None = None
    token: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def http_headers(self) -> dict[str, str]:
        """Headers for every HTTP request: ``Authorization`` first, then the extra ones."""
        out = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        out.update(self.headers)
        return out

    def grpc_metadata(self) -> dict[str, str]:
        """The same as gRPC call metadata (lower-case keys)."""
        return {k.lower(): v for k, v in self.http_headers().items()}

    def httpx_verify(self) -> ssl.SSLContext | bool:
        """``verify=`` for httpx: a context trusting ``ca_cert``, else True (system CAs)."""
        if self.ca_cert is None:
            return True
        return ssl.create_default_context(cafile=str(self.ca_cert))


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` -> ``(name, value)``.

    Raises:
        UsageError: No colon, an empty or invalid name, or a header the client
            sets itself (the message names the header, never the value).
    """
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    valid = name and all(ch.isalnum() or ch in "-_" for ch in name)
    if not sep or not valid:
        shown = name if valid else "<unparsable>"
        raise UsageError(f"--header {shown!r}: must be 'Name: value' (letters, digits, - or _)")
    if name.lower() in _FORBIDDEN:
        raise UsageError(f"--header {name!r}: set by the client itself, cannot be given")
    return name, value


def load_credentials(
    ca_cert: Path | None,
    token_file: Path | None,
    headers: Sequence[str],
    env: Mapping[str, str],
) -> Credentials:
    """Credentials from the flags: the token from ``token_file``, else ``$HISTOSERVE_TOKEN``.

    Raises:
        UsageError: The CA or token file cannot be read, the token file is
            empty, or a header is malformed.
    """
    if ca_cert is not None and not Path(ca_cert).is_file():
        raise UsageError(f"--ca-cert {ca_cert}: no such file")
    token = env.get(TOKEN_ENV) or None
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"--token-file {token_file}: cannot read it ({type(exc).__name__})"
            ) from exc
        if not token:
            raise UsageError(f"--token-file {token_file} is empty")
    if token is not None and any(ch in token for ch in "\r\n"):
        raise UsageError("the token has a line break inside it")
    return Credentials(
        Path(ca_cert) if ca_cert is not None else None,
        token,
        tuple(parse_header(h) for h in headers),
    )
