"""Credentials for a protected endpoint: a CA bundle, a bearer token, extra headers.

``--ca-cert FILE`` verifies ``https://`` and ``grpcs://`` servers against that
CA bundle (default: the system's). ``--token-file FILE`` (else
``$HISTOSERVE_TOKEN``) is sent as ``Authorization: Bearer <token>`` and every
``--header 'Name: value'`` as is: HTTP headers over REST, call metadata
(names lower-cased, as gRPC requires) over gRPC, on every request and every
retry, the model-info requests included.

Secrets never reach output. Every value is checked before any request, and a
bad one is a :class:`UsageError` (exit 2) naming the header (or where the
token came from), never the value: no control character (C0, DEL, C1: a
CR/LF would split the request, and HTTP libraries put the offending value
in their own error), nothing outside latin-1 (all HTTP can carry; an
invisible U+200B pasted with a token is the usual case), at most
:data:`MAX_VALUE_BYTES`, and printable ASCII only when a ``grpc(s)://`` URL
will carry it (gRPC's rule for metadata). :class:`Credentials` keeps the
token and header values out of its ``repr``; :meth:`Credentials.scrub`
takes them out of any server message shown (the whole message first, then
it is cut: a secret straddling the cut leaves no prefix behind); URLs with
user-info (``http://user:pass@host``, or an ``@`` anywhere, whatever the
scheme) are refused (:func:`check_url`) and shown redacted (:func:`redact_url`),
so no URL shown anywhere (messages, ``requests_per_url``, progress) can carry a
password. ``--ca-cert`` is loaded once, when the credentials are: a file that
is not a PEM CA bundle is a usage error naming it.
Credentials sent over plain ``http://``/``grpc://`` give one warning per run
(:func:`warn_if_plaintext`).
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from histoserve.errors import UsageError

TOKEN_ENV = "HISTOSERVE_TOKEN"
MAX_VALUE_BYTES = 8192
"""Longest header value or token: servers and proxies refuse longer heads (8-16 KiB)."""
_FORBIDDEN = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "te"}
)
_PLAIN = ("http://", "grpc://")
_TLS = ("https://", "grpcs://")
_SCRUB_MIN_CHARS = 4  # shorter values are not hidden in server messages (they would garble them)
MESSAGE_MAX_CHARS = 500
"""Longest server message quoted (an HTML error page would drown the reason)."""
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/+")  # ``http://``, and typos such as ``http:/``
logger = logging.getLogger("histoserve.embed")


@dataclass(frozen=True)
class Credentials:
    """What is sent to prove who the client is, and how the server is verified.

    Attributes:
        ca_cert: PEM CA bundle for ``https://``/``grpcs://`` (None: system CAs).
        token: Bearer token (None: no ``Authorization`` header). Not in ``repr``.
        headers: Extra ``(name, value)`` pairs. Not in ``repr``.
        token_source: How messages name the token (``the token from --token-file F``).
        trust_env: Use the environment's proxy variables (``--trust-env``); by
            default they are ignored, so no proxy sees the token or the tiles.

    Raises:
        UsageError: A header name or value, or the token, that cannot be sent
            (see the module docstring); the message never shows a value.
    """

    ca_cert: Path | None = None
    token: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    token_source: str = "the token"
    trust_env: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", tuple(tuple(h) for h in self.headers))
        object.__setattr__(self, "_ssl_context", None)  # built once, by httpx_verify
        for name, value in self.headers:
            _check_name(name)
            _check_value(value, f"--header {name!r}", grpc=False)
        if self.token is not None:
            _check_value(self.token, self.token_source, grpc=False)

    @property
    def sends_secrets(self) -> bool:
        """Whether any token or header goes with the requests."""
        return bool(self.token or self.headers)

    def http_headers(self) -> dict[str, str]:
        """Headers for every HTTP request: ``Authorization`` first, then the extra ones."""
        out = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        out.update(self.headers)
        return out

    def http_header_bytes(self) -> dict[str, bytes]:
        """:meth:`http_headers` encoded as latin-1 (httpx would encode ``str`` as ASCII)."""
        return {k: v.encode("latin-1") for k, v in self.http_headers().items()}

    def grpc_metadata(self) -> dict[str, str]:
        """The same as gRPC call metadata (lower-case keys)."""
        return {k.lower(): v for k, v in self.http_headers().items()}

    def httpx_verify(self) -> ssl.SSLContext | bool:
        """``verify=`` for httpx: a context trusting ``ca_cert``, else True (system CAs).

        The context is built on the first call and shared by every client after it.

        Raises:
            UsageError: ``ca_cert`` cannot be read or holds no PEM certificate.
        """
        if self.ca_cert is None:
            return True
        context = getattr(self, "_ssl_context", None)
        if context is None:
            context = _ca_context(self.ca_cert)
            object.__setattr__(self, "_ssl_context", context)
        return context

    def check_urls(self, urls: Sequence[str]) -> None:
        """What depends on where the credentials go: gRPC's stricter rule, ``--ca-cert``'s use.

        ``--ca-cert`` is loaded here, once (:meth:`httpx_verify`), so that a bad
        file stops the run before any work.

        Raises:
            UsageError: A value that is not printable ASCII when a ``grpc(s)://``
                URL carries it, a header name gRPC reserves, ``--ca-cert``
                without any ``https://``/``grpcs://`` URL to verify, or a
                ``--ca-cert`` file that is not a PEM CA bundle.
        """
        if self.ca_cert is not None and not any(u.startswith(_TLS) for u in urls):
            raise UsageError(
                f"--ca-cert {self.ca_cert}: no https:// or grpcs:// URL to verify with it; "
                "use https:// (or grpcs://) URLs, or drop --ca-cert"
            )
        self.httpx_verify()
        if not any(u.startswith(("grpc://", "grpcs://")) for u in urls):
            return
        for name, value in self.headers:
            lower = name.lower()
            if lower.startswith("grpc-") or lower.endswith("-bin"):
                raise UsageError(
                    f"--header {name!r}: gRPC reserves names starting 'grpc-' and ending "
                    "'-bin'; pick another name for grpc:// URLs"
                )
            _check_value(value, f"--header {name!r}", grpc=True)
        if self.token is not None:
            _check_value(self.token, self.token_source, grpc=True)

    def scrub(self, text: str, max_chars: int | None = None) -> str:
        """``text`` with every token and header value replaced by ``***``, then cut.

        For messages that quote what a server said: a server (or proxy) that
        echoes the credentials it refused must not put them in ``status.csv``.
        The whole text is scrubbed before it is cut to ``max_chars`` (None: not
        cut), so a secret straddling the cut leaves no prefix behind.
        """
        secrets = [self.token or "", *(v for _, v in self.headers)]
        for secret in sorted(secrets, key=len, reverse=True):
            if len(secret) >= _SCRUB_MIN_CHARS:
                text = text.replace(secret, "***")
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars] + f"... ({len(text) - max_chars} more characters)"
        return text


def _ca_context(ca_cert: Path) -> ssl.SSLContext:
    """An SSL context trusting the PEM bundle ``ca_cert``; UsageError naming it otherwise."""
    try:
        return ssl.create_default_context(cafile=str(ca_cert))
    except ssl.SSLError as exc:
        raise UsageError(
            f"--ca-cert {ca_cert}: not a PEM CA bundle ({exc.reason or exc}); give the CA's "
            "certificate(s) as PEM text ('-----BEGIN CERTIFICATE-----'; convert a DER "
            "file with: openssl x509 -inform der -in CA.der -out ca.pem)"
        ) from exc
    except OSError as exc:
        raise UsageError(f"--ca-cert {ca_cert}: cannot read it ({exc.strerror})") from exc


def _check_name(name: str) -> None:
    valid = bool(name) and name.isascii() and all(ch.isalnum() or ch in "-_" for ch in name)
    if not valid:
        raise UsageError(
            "--header: the name before ':' must be ASCII letters, digits, - or _ "
            "(the header is not shown: it may hold a secret)"
        )
    if name.lower() in _FORBIDDEN:
        raise UsageError(f"--header {name!r}: set by the client itself, cannot be given")


def _check_value(value: str, what: str, *, grpc: bool) -> None:
    """UsageError naming ``what`` (never ``value``) when ``value`` cannot be sent."""
    for index, ch in enumerate(value, start=1):
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            raise UsageError(
                f"{what}: character {index} is a control character (U+{code:04X}; a line "
                "break, NUL, tab, ...): remove it (the value is not shown)"
            )
        if code > 0xFF:
            raise UsageError(
                f"{what}: character {index} is outside latin-1, which HTTP cannot carry "
                "(often an invisible character pasted with it, such as a zero-width space "
                "or a byte-order mark): remove it (the value is not shown)"
            )
        if grpc and code > 0x7E:
            raise UsageError(
                f"{what}: character {index} is not printable ASCII, which gRPC metadata "
                "(grpc:// and grpcs:// URLs) requires: remove it (the value is not shown)"
            )
    if len(value) > MAX_VALUE_BYTES:
        raise UsageError(
            f"{what}: {len(value)} bytes, more than the {MAX_VALUE_BYTES} servers and "
            "proxies accept in one header (the value is not shown)"
        )


def parse_header(text: str, position: int = 1) -> tuple[str, str]:
    """``'Name: value'`` -> ``(name, value)`` (``position``: which ``--header``, for messages).

    Raises:
        UsageError: No colon, an empty or invalid name, or a header the client
            sets itself (the message names the header, never the value).
    """
    name, sep, value = text.partition(":")
    if not sep:
        raise UsageError(
            f"--header number {position} has no ':'; give 'Name: value' "
            "(the text is not shown: it may hold a secret)"
        )
    name, value = name.strip(), value.strip(" \t")
    _check_name(name)
    return name, value


def load_credentials(
    ca_cert: Path | None,
    token_file: Path | None,
    headers: Sequence[str],
    env: Mapping[str, str],
    trust_env: bool = False,
) -> Credentials:
    """Credentials from the flags: the token from ``token_file``, else ``$HISTOSERVE_TOKEN``.

    Raises:
        UsageError: The CA or token file cannot be read, the token file is
            empty, a header is malformed, or a value cannot be sent.
    """
    if ca_cert is not None and not Path(ca_cert).is_file():
        raise UsageError(f"--ca-cert {ca_cert}: no such file")
    token, source = env.get(TOKEN_ENV) or None, f"the token from ${TOKEN_ENV}"
    if token is not None:
        if not isinstance(token, str):
            raise UsageError(f"${TOKEN_ENV}: expected a string, got {type(token).__name__}")
        token = token.strip()
    if token_file is not None:
        source = f"the token from --token-file {token_file}"
        try:  # utf-8-sig: a byte-order mark an editor wrote is not part of the token
            token = Path(token_file).read_text(encoding="utf-8-sig").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"--token-file {token_file}: cannot read it as UTF-8 text ({type(exc).__name__})"
            ) from exc
        if not token:
            raise UsageError(f"--token-file {token_file} is empty")
    return Credentials(
        Path(ca_cert) if ca_cert is not None else None,
        token or None,
        tuple(parse_header(h, i) for i, h in enumerate(headers, start=1)),
        source,
        trust_env,
    )


def redact_url(url: str) -> str:
    """``url`` with any user-info, query and fragment replaced by ``***``.

    User-info is everything from the scheme (``http://``, or a typo such as
    ``http:/``; none: the start) to the last ``@``, wherever that ``@`` is, so
    ``http:/alice:pw@host`` and ``http://alice:p/w@host`` show no password. It
    goes first: a password holding ``?`` or ``#`` is not half kept by the cut.
    """
    at = url.rfind("@")
    if at >= 0:
        scheme = _SCHEME.match(url)
        start = scheme.end() if scheme is not None and scheme.end() <= at else 0
        url = url[:start] + "***" + url[at:]
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=len(url))
    return url[:cut] + ("***" if cut < len(url) else "")


def check_url(url: str, flag: str = "--url") -> None:
    """UsageError for a URL that would carry a secret: user-info (any ``@``), a query, a fragment.

    The message shows the URL with those parts as ``***`` (:func:`redact_url`).
    Credentials go in ``--token-file``/``$HISTOSERVE_TOKEN`` or ``--header``,
    never in a URL, so that no URL shown anywhere can carry one.
    """
    if "@" in url:
        raise UsageError(
            f"{flag} {redact_url(url)!r}: a user name or password in a URL is not "
            "supported (it would show wherever the URL is shown); pass a token with "
            "--token-file or $HISTOSERVE_TOKEN, or --header 'Authorization: Basic ...'"
        )
    if "?" in url or "#" in url:
        raise UsageError(
            f"{flag} {redact_url(url)!r}: a query or fragment in a server URL is not "
            "supported; give scheme://host:port"
        )


def warn_if_plaintext(credentials: Credentials | None, urls: Sequence[str]) -> None:
    """One warning (never a value) when a token or headers go to a plain ``http://``/``grpc://`` URL."""
    if credentials is None or not credentials.sends_secrets:
        return
    plain = sorted({u for u in urls if u.startswith(_PLAIN)})
    if not plain:
        return
    what = "the bearer token" if credentials.token else "the --header values"
    if credentials.token and credentials.headers:
        what = "the bearer token and --header values"
    more = f" and {len(plain) - 1} other plain URL(s)" if len(plain) > 1 else ""
    logger.warning(
        "%s go unencrypted to %s%s: anyone on the network path can read them; "
        "use https:// or grpcs:// for protected endpoints",
        what,
        plain[0],
        more,
    )
