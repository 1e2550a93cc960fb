"""The webhooks serve a renewed certificate without a restart: cert-manager renews it in the mounted Secret (with
a self-signed issuer, under a new CA that the CA injector hands the API server), and the old one would be refused
until the gateway happened to restart (with failurePolicy Fail, so would every labelled Job)."""

import asyncio
import contextlib
import datetime
import ssl
from pathlib import Path

import pytest
import uvicorn

from chamber.cli.infra import free_port
from chamber.cli.webhook_cert import issue
from chamber.gateway.kube_intake import Admission, reload_certificate, webhook_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def write(cert_dir: Path, pair: dict[str, bytes]) -> None:
    for name in ("tls.crt", "tls.key"):
        (cert_dir / f".{name}").write_bytes(pair[name])
        (cert_dir / f".{name}").replace(cert_dir / name)


def served(port: int) -> bytes:
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    return ssl.PEM_cert_to_DER_cert(pem)


async def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    names = ["chamber-webhooks", "chamber-webhooks.chamber", "chamber-webhooks.chamber.svc"]
    now = datetime.datetime.now(datetime.UTC)
    first, renewed = issue(names, now), issue(names, now)
    write(tmp_path, first)
    port = free_port()
    config = uvicorn.Config(webhook_app(Admission()), host="127.0.0.1", port=port, log_config=None,
                            ssl_certfile=str(tmp_path / "tls.crt"), ssl_keyfile=str(tmp_path / "tls.key"))  # fmt: skip
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    stop = asyncio.Event()
    reloading = asyncio.create_task(reload_certificate(config, str(tmp_path), stop, every_s=0.05))
    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
            await asyncio.sleep(0.02)
        der = ssl.PEM_cert_to_DER_cert
        assert await asyncio.to_thread(served, port) == der(first["tls.crt"].decode())
        write(tmp_path, renewed)  # as the kubelet updates the mounted Secret
        async with asyncio.timeout(10):
            while await asyncio.to_thread(served, port) != der(renewed["tls.crt"].decode()):  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # polling what a TLS client is served
    finally:
        stop.set()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.gather(serving, reloading)
