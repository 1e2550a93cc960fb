"""`chamber webhook-cert`: the admission webhooks' TLS certificate, self-signed, for the Helm chart's hook Job.

Run as a Helm hook before install/upgrade (creates the Secret the gateway mounts) and after (puts the CA into
the webhook configurations' `caBundle`, which exist by then). Idempotent: a Secret whose certificate names the
same service and is valid for more than 30 more days is kept, so an upgrade does not rotate it needlessly.
(With `certManager.enabled`, cert-manager does all of this instead and this command is not run.)
"""

import asyncio
import base64
import datetime
import re
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from chamber.common.kube.client import KubeClient, Resource
from chamber.common.kube.errors import KubeConflict, KubeNotFound

SECRETS = Resource("", "v1", "secrets", "Secret")
MUTATING = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "", namespaced=False)
VALIDATING = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "", namespaced=False)
RENEW_BEFORE = datetime.timedelta(days=30)
WRITE_ATTEMPTS = 5
PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n?", re.DOTALL)


def dns_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def issue(names: list[str], now: datetime.datetime, days: int = 730) -> dict[str, bytes]:
    """A CA and a serving certificate for `names`: PEM `ca.crt`, `tls.crt`, `tls.key`."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chamber-webhook-ca")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days * 2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[2])]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    return {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": _pem_key(key),
    }


def still_good(secret: dict[str, Any], names: list[str], now: datetime.datetime) -> bool:
    """The Secret holds a certificate for the same names that is valid for a while yet."""
    data = secret.get("data") or {}
    if not all(k in data for k in ("ca.crt", "tls.crt", "tls.key")):
        return False
    try:
        cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    except (ValueError, x509.ExtensionNotFound):
        return False
    return sorted(sans) == sorted(names) and cert.not_valid_after_utc - now > RENEW_BEFORE


async def ensure(client: KubeClient, namespace: str, service: str, secret: str, webhook: str) -> str:
    """Issue the certificate when there is none or it is due (`still_good`), and put its CA into the webhook
    configurations. A renewal puts the new CA into them before the Secret changes, next to the old one: the
    gateway serves the old certificate until the kubelet updates its mounted Secret and it reloads it (a minute or
    so), and with `failurePolicy: Fail` an admission it could not answer would refuse a labelled Job. The CA before
    the current one stays trusted until the next renewal (`ca_bundle`).

    Two runs may renew at once (an upgrade's hook and the daily CronJob). The Secret is written only if it is
    still the one read (its `resourceVersion`; a create fails if one appeared); the run that loses reads the
    winner's certificate and puts its CA first, with the CA served before next to it, so the configurations end
    up trusting the certificate the Secret holds, whichever run wrote it last."""
    now = datetime.datetime.now(tz=datetime.UTC)
    names = dns_names(service, namespace)
    served = b""  # the CA found when this run renewed and lost the race: the gateway may still serve it
    for _ in range(WRITE_ATTEMPTS):
        try:
            current: dict[str, Any] | None = await client.get(SECRETS, secret, namespace)
        except KubeNotFound:
            current = None
        if current is not None and still_good(current, names, now):
            ca = base64.b64decode(current["data"]["ca.crt"])
            patched = await _set_ca(client, webhook, ca, now, served)
            return f"certificate kept in {namespace}/{secret}; caBundle set on {patched} webhook configuration(s)"
        pem = issue(names, now)
        data = {k: base64.b64encode(v).decode() for k, v in pem.items()}
        metadata = {"name": secret, "namespace": namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": metadata, "data": data}
        old = (current or {}).get("data") or {}
        previous = base64.b64decode(old["ca.crt"]) if "ca.crt" in old else b""
        patched = await _set_ca(client, webhook, pem["ca.crt"], now, previous)  # trusted before it is served
        try:
            if current is None:
                await client.create(SECRETS, body, namespace)
            else:
                await client.request("PUT", SECRETS.path(namespace, secret), body=body)
        except KubeConflict:
            served = served or previous
            continue  # another run wrote the Secret since it was read: its certificate is the one to trust
        return f"certificate issued in {namespace}/{secret}; caBundle set on {patched} webhook configuration(s)"
    raise KubeConflict(f"{namespace}/{secret} changed under every one of {WRITE_ATTEMPTS} attempts to write it")


async def _set_ca(client: KubeClient, webhook: str, ca: bytes, now: datetime.datetime, previous: bytes = b"") -> int:
    """Put `ca_bundle` into every webhook of both configurations; how many configurations exist (before install,
    none yet: the post-install run patches them)."""
    patched = 0
    for kind in (MUTATING, VALIDATING):
        try:
            config = await client.get(kind, webhook)
        except KubeNotFound:
            continue
        hooks = config["webhooks"]
        bundled = base64.b64decode((hooks[0].get("clientConfig") or {}).get("caBundle") or "") if hooks else b""
        value = base64.b64encode(ca_bundle(ca, previous + bundled, now)).decode()
        with_ca = [dict(h, clientConfig=dict(h.get("clientConfig") or {}, caBundle=value)) for h in hooks]
        await client.patch(kind, webhook, {"webhooks": with_ca})
        patched += 1
    return patched


def ca_bundle(ca: bytes, others: bytes, now: datetime.datetime) -> bytes:
    """`ca` first, then the first other CA in `others` (PEM blocks, in order; one that does not parse is skipped)
    that differs from it and is still valid: at most two, so an old CA is trusted for one renewal more, never for
    ever."""
    current = x509.load_pem_x509_certificate(ca)
    for block in PEM_BLOCK.findall(others):
        try:
            cert = x509.load_pem_x509_certificate(block)
        except ValueError:
            continue
        if cert != current and cert.not_valid_after_utc > now:
            return ca + cert.public_bytes(serialization.Encoding.PEM)
    return ca


def run(namespace: str, service: str, secret: str, webhook: str, api: str = "in-cluster") -> str:
    async def go() -> str:
        client = KubeClient.connect(api)
        try:
            return await ensure(client, namespace, service, secret, webhook)
        finally:
            await client.close()

    return asyncio.run(go())
