"""The CLI's connection to a Chamber API: where it is, which token to send, and errors turned into sentences.

Where the URL and token come from, first found wins: `--url`/`--token`; `CHAMBER_URL`/`CHAMBER_TOKEN`; the file
`chamber login` writes (`$CHAMBER_CONFIG`, else `~/.config/chamber/config.json`, mode 0600); the local default
(`http://127.0.0.1:8080`, and the development token `make up` leaves in `.chamber/dev-admin-token`).
"""

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

DEV_TOKEN_FILE = Path(".chamber") / "dev-admin-token"
DEFAULT_URL = "http://127.0.0.1:8080"


class CliError(Exception):
    """Something the user should read: the API's explanation, or why the API could not be reached."""


def config_path() -> Path:
    explicit = os.environ.get("CHAMBER_CONFIG")
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "chamber" / "config.json"


def read_config() -> dict[str, str]:
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def write_config(url: str, token: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # it holds a token: private even where the file was there before, with another mode
    with os.fdopen(fd, "w") as out:
        json.dump({"url": url, "token": token}, out)
    return path


def read_token_file(path: Path) -> str:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in lines if line.strip() and not line.startswith("#")), "")


@dataclass(frozen=True)
class Target:
    url: str
    token: str
    token_source: str


def resolve(url: str | None = None, token: str | None = None) -> Target:
    config = read_config()
    found_url = url or os.environ.get("CHAMBER_URL") or config.get("url") or DEFAULT_URL
    if token:
        return Target(found_url.rstrip("/"), token, "--token")
    for source, value in (("CHAMBER_TOKEN", os.environ.get("CHAMBER_TOKEN")), ("login", config.get("token"))):
        if value:
            return Target(found_url.rstrip("/"), value, source)
    dev = read_token_file(DEV_TOKEN_FILE)
    return Target(found_url.rstrip("/"), dev, str(DEV_TOKEN_FILE) if dev else "none")


def _explain(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    if isinstance(body, dict) and "detail" in body:
        detail = str(body["detail"])
        if resp.status_code == 401:
            detail += " (run `chamber login --token <token>`)"
        return f"{body.get('title', 'error')} ({resp.status_code}): {detail}"
    return f"HTTP {resp.status_code}: {resp.text[:300]}"


class Api:
    """A thin synchronous client of the HTTP API; every failure is a CliError with the API's words."""

    def __init__(self, target: Target, timeout_s: float = 10.0) -> None:
        self.target = target
        headers = {"authorization": f"Bearer {target.token}"} if target.token else {}
        self.http = httpx.Client(base_url=target.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Api":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> Any:  # fmt: skip
        try:
            resp = self.http.request(method, path, json=json_body, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the Chamber API at {self.target.url}: {exc}") from exc
        if resp.status_code >= 400:
            raise CliError(_explain(resp))
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def events(self, topics: str, *, for_s: float | None = None) -> Iterator[tuple[str, Any]]:
        """The live stream (Server-Sent Events) as (event, data) pairs, until the connection ends (or `for_s`
        seconds pass without an event, when given)."""
        timeout = httpx.Timeout(10.0, read=for_s)
        try:
            with self.http.stream("GET", "/v1/stream", params={"topics": topics}, timeout=timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise CliError(_explain(resp))
                event = ""
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    elif line.startswith("data:") and line[5:].strip():
                        try:
                            yield event, json.loads(line[5:])
                        except ValueError:
                            continue
        except httpx.ReadTimeout:
            return
        except httpx.HTTPError as exc:
            raise CliError(f"the live stream from {self.target.url} ended: {exc}") from exc
