"""Passwords in server URLs never reach a log line or an error message (on Kubernetes the chart puts the NATS and
Valkey passwords in the URLs, and container logs are read by more people than the Secret)."""

import pytest

from chamber.common.urls import redact


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://chamber:s3cret@nats:4222", "nats://chamber:***@nats:4222"),
        ("redis://:s3cret@valkey:6379/0", "redis://:***@valkey:6379/0"),
        ("nats://[::1]:4222", "nats://[::1]:4222"),
        ("nats://u:p@[::1]:4222", "nats://u:***@[::1]:4222"),
        ("nats://s3cr3ttoken@nats:4222", "nats://***@nats:4222"),  # a NATS token is the user part
        ("redis://user@valkey:6379", "redis://user@valkey:6379"),
        ("nats://u:p@nats:99999", "***"),  # an impossible port: hidden whole, not an error
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown
