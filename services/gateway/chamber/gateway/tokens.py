"""API tokens: minted by an admin, stored hashed in a JetStream KV bucket, checked in memory on every request.

A token is shown once, when it is made; the bucket keeps only its SHA-256 (tokens are 256 random bits, so a plain
hash is enough: nothing to brute-force). Every gateway replica follows the bucket, so a revocation takes effect
everywhere within milliseconds. A token may be minted to expire (`expires_at`): from then on it is refused as a
revoked one is (the record stays listed until an admin revokes it), and it no longer counts as an admin.

The first admin token (id `admin`) comes from `CHAMBER_ADMIN_TOKEN`, else from `CHAMBER_ADMIN_TOKEN_FILE` when
that file exists, else it is minted at the first start, printed once, and written to that file when one is named
(`make up` names `.chamber/dev-admin-token`).
"""

import asyncio
import contextlib
import hashlib
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from chamber.common.bus import Bus
from chamber.common.bus.errors import BusError
from chamber.common.bus.kv_follow import KvEntry, KvFollow, follow_kv
from chamber.common.clock import Clock, SystemClock
from chamber.common.log import get_logger
from chamber.common.subjects import TOKENS_BUCKET
from chamber.gateway.core.authz import Principal, Role

log = get_logger(__name__)

BOOTSTRAP_ID = "admin"
REVOKED_BOOTSTRAP = "revoked-bootstrap"
"""Key of the SHA-256 of the bootstrap admin token last revoked: bootstrap does not bring that token back (found
by review: a leaked bootstrap token an admin revoked was written back, with full rights, at the next restart)."""
TOKEN_PREFIX = "chm_"
FILE_HEADER = (
    "# Chamber DEVELOPMENT admin token, written by the gateway at its first start (CHAMBER_ADMIN_TOKEN_FILE).\n"
    "# Whoever reads this file administers this Chamber. In production set CHAMBER_ADMIN_TOKEN instead.\n"
)


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    role: Role
    teams: tuple[str, ...] = ()
    secret_sha256: str
    created_at: float
    created_by: str = ""
    expires_at: float | None = None
    """When it stops being accepted (None: never)."""

    def principal(self) -> Principal:
        return Principal(id=self.id, name=self.name, role=self.role, teams=self.teams)

    def usable(self, now: float) -> bool:
        return self.expires_at is None or now < self.expires_at


_decoder = msgspec.json.Decoder(TokenRecord)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def read_token_file(path: str) -> str:
    """The token in a token file (comment lines skipped); empty when there is none."""
    try:
        text = Path(path).read_text()
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return lines[0] if lines else ""


def write_token_file(path: str, token: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # the mode `os.open` gives applies only to a file it creates (found by review)
    with os.fdopen(fd, "w") as out:
        out.write(FILE_HEADER + token + "\n")


class LastAdmin(Exception):
    """Revoking this token would leave no admin token: nobody could manage tokens, teams or pools any more."""


class TokenStore:
    def __init__(self, kv: KeyValue, bus: Bus, clock: Clock | None = None) -> None:
        self.kv = kv
        self.bus = bus
        self.clock = clock or SystemClock()
        self._by_id: dict[str, TokenRecord] = {}
        self._by_hash: dict[str, TokenRecord] = {}
        self._follow: KvFollow | None = None
        self._revoked_bootstrap = ""
        """The SHA-256 of the bootstrap admin token last revoked (`REVOKED_BOOTSTRAP`)."""

    @classmethod
    async def open(cls, bus: Bus, clock: Clock | None = None) -> "TokenStore":
        return cls(await bus.key_value(TOKENS_BUCKET), bus, clock)

    def authenticate(self, token: str) -> Principal | None:
        record = self._by_hash.get(digest(token))
        return None if record is None or not record.usable(self.clock.now()) else record.principal()

    def refusal(self, token: str) -> str:
        """Why `authenticate` refuses `token`, for the caller."""
        record = self._by_hash.get(digest(token))
        if record is not None and not record.usable(self.clock.now()):
            when = datetime.fromtimestamp(record.expires_at or 0.0, UTC).isoformat(timespec="seconds")
            return f"token {record.id} expired at {when}: ask an admin for a new one"
        return "unknown or revoked token"

    def list(self) -> list[TokenRecord]:
        return sorted(self._by_id.values(), key=lambda r: (r.created_at, r.id))

    def get(self, token_id: str) -> TokenRecord | None:
        return self._by_id.get(token_id)

    def _remember(self, record: TokenRecord) -> None:
        self._forget(record.id)
        self._by_id[record.id] = record
        self._by_hash[record.secret_sha256] = record

    def _forget(self, token_id: str) -> None:
        old = self._by_id.pop(token_id, None)
        if old is not None and self._by_hash.get(old.secret_sha256) is old:
            del self._by_hash[old.secret_sha256]

    async def start(self) -> None:
        """Load every token, then follow changes (made by this or another gateway; `follow_kv`: heard at once after
        a NATS restart too, so a revocation made then takes effect at once)."""

        def on_entry(entry: KvEntry) -> None:
            if entry.key == REVOKED_BOOTSTRAP:
                self._revoked_bootstrap = entry.value.decode(errors="replace") if entry.value else ""
                return
            if not entry.value:
                self._forget(entry.key)
                return
            try:
                self._remember(_decoder.decode(entry.value))
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.error("tokens.undecodable", key=entry.key)

        self._follow = await follow_kv(self.bus.js, self.bus.names.bucket(TOKENS_BUCKET), ">", on_entry)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._follow.loaded.wait(), timeout=5.0)

    async def stop(self) -> None:
        if self._follow is not None:
            await self._follow.stop()

    async def create(
        self, *, name: str, role: Role, teams: tuple[str, ...], created_by: str, now: float,
        expires_at: float | None = None,
    ) -> tuple[TokenRecord, str]:  # fmt: skip
        """Mint a token; returns its record and the token itself (shown to the caller once, never stored)."""
        token = new_token()
        record = TokenRecord(id=secrets.token_hex(6), name=name, role=role, teams=teams, secret_sha256=digest(token),
                             created_at=now, created_by=created_by, expires_at=expires_at)  # fmt: skip
        await self._put(record, create=True)
        return record, token

    async def revoke(self, token_id: str) -> bool:
        """Revoke a token; `LastAdmin` for the last admin token (found by review: the last admin could revoke every
        admin token, its own too, and nobody could manage anything until the gateway restarted)."""
        record = self._by_id.get(token_id)
        if record is None:
            return False
        now = self.clock.now()
        if record.role == Role.ADMIN and not any(
            r.role == Role.ADMIN and r.id != token_id and r.usable(now) for r in self._by_id.values()
        ):
            raise LastAdmin(f"token {token_id} is the last admin token: mint another admin token first")
        try:
            if token_id == BOOTSTRAP_ID:
                await self.kv.put(REVOKED_BOOTSTRAP, record.secret_sha256.encode())
                self._revoked_bootstrap = record.secret_sha256
            await self.kv.delete(token_id)
        except nats.errors.Error as exc:
            raise BusError(f"cannot revoke token {token_id}: {exc}") from exc
        self._forget(token_id)
        return True

    async def _put(self, record: TokenRecord, *, create: bool) -> bool:
        """Store a record; with `create`, only when its id is new (False otherwise)."""
        data = msgspec.json.encode(record)
        try:
            if create:
                await self.kv.create(record.id, data)
            else:
                await self.kv.put(record.id, data)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except nats.errors.Error as exc:
            raise BusError(f"cannot store token {record.id}: {exc}") from exc
        self._remember(record)
        return True

    async def bootstrap(self, admin_token: str, token_file: str, now: float) -> str | None:
        """Make sure an admin can get in (see the module docstring). Returns a freshly minted token to announce."""
        given = admin_token or (read_token_file(token_file) if token_file else "")
        if given and digest(given) == self._revoked_bootstrap:
            log.warning("tokens.bootstrap_revoked", detail="the bootstrap admin token given was revoked: not "
                        "reinstated (give another one to make a new bootstrap admin)")  # fmt: skip
            return None
        if given:
            existing = self._by_id.get(BOOTSTRAP_ID)
            if existing is None or existing.secret_sha256 != digest(given) or existing.role != Role.ADMIN:
                await self._put(self._bootstrap_record(given, now), create=False)
            return None
        if not token_file and any(r.role == Role.ADMIN and r.usable(now) for r in self._by_id.values()):
            return None
        token = new_token()
        if token_file:
            await self._put(self._bootstrap_record(token, now), create=False)
            write_token_file(token_file, token)
            return token
        if not await self._put(self._bootstrap_record(token, now), create=True):
            return None  # another gateway made it first and announced it
        return token

    @staticmethod
    def _bootstrap_record(token: str, now: float) -> TokenRecord:
        return TokenRecord(id=BOOTSTRAP_ID, name="bootstrap admin", role=Role.ADMIN, secret_sha256=digest(token),
                           created_at=now, created_by="bootstrap")  # fmt: skip
