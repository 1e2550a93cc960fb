"""Server URLs as they may be shown: NATS and Redis URLs carry their passwords (`nats://user:pw@host`), and a log
line or an error message that quotes one would hand the password to whoever reads the logs."""

from urllib.parse import urlparse, urlunparse


def redact(url: str) -> str:
    """The URL with any password replaced by `***` (user names stay: they help and are not secret), and a NATS
    token (a user name without a password) too. A URL too malformed to parse is hidden whole."""
    try:
        parsed = urlparse(url)
        token = parsed.scheme in ("nats", "tls") and parsed.username is not None and parsed.password is None
        if parsed.password is None and not token:
            return url
        host = parsed.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parsed.port}" if parsed.port is not None else ""
    except ValueError:
        return "***"
    netloc = f"***@{host}{port}" if token else f"{parsed.username or ''}:***@{host}{port}"
    return urlunparse(parsed._replace(netloc=netloc))
