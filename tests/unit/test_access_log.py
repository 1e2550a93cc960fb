"""The console access log cannot be forged by a request's path (found by review: a `%0a` in an unauthenticated
request's path began a new, convincing log line; a `%00` made grep call the log binary)."""

import io

from chamber.gateway.access_log import AccessLog


def _line(path: str) -> str:
    out = io.StringIO()
    log = AccessLog("console", out=out)
    log.line(method="GET", path=path, status=401, ms=0.1, who="-", request_id="r1")
    log.flush()
    return out.getvalue()


def test_a_path_with_a_newline_or_a_nul_stays_on_its_line_escaped() -> None:
    forged = "/v1/jobs/x\n2026-12-06T00:00:00.000000Z [error    ] scheduler.crashed service=scheduler"
    text = _line(forged)
    assert text.count("\n") == 1
    assert text.endswith("\n")
    assert "\\n2026-12-06" in text
    assert "\x00" not in _line("/v1/jobs/\x00x")


def test_a_path_cannot_add_fields() -> None:
    text = _line("/x status=200 who=admin")
    assert 'path="/x status=200 who=admin"' in text
    assert text.rstrip().endswith("status=401 who=-")


def test_a_plain_path_is_written_as_it_is() -> None:
    assert " path=/v1/jobs/j-1 " in _line("/v1/jobs/j-1")
