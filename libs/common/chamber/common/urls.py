"""Server URLs as they may be shown: NATS and Redis URLs carry their passwords (`nats://user:pw@host`), and a log
line or an error message that quotes one would hand the password to whoever reads the logs."""

from urllib.parse import urlparse, urlunparse


def redact(url: str) -> str:
    """The URL with any password replaced by `***` (user names stay: they help and are not secret)."""
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    user = parsed.username or ""
    host = parsed.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parsed.port}" if parsed.port is not None else "")
    return urlunparse(parsed._replace(netloc=netloc))
