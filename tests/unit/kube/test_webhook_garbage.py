"""The admission webhooks answer any body: a malformed AdmissionReview is a 400, an object of the wrong shape (the
mutating webhook sees it before the API server validates it) is refused with what could not be read, never a
500 (found by review: both were 500s)."""

from typing import Any

import pytest
from litestar.testing import TestClient

from chamber.gateway.kube_intake import Admission, webhook_app
from tests.support.kube import gpu_job


@pytest.mark.parametrize("body", [{"request": "x"}, {"request": {"operation": "CREATE", "object": [1]}},
                                  {"request": [1]}])  # fmt: skip
def test_a_malformed_admission_review_is_a_400(body: dict[str, Any]) -> None:
    with TestClient(webhook_app(Admission())) as client:
        for path in ("/mutate", "/validate"):
            answer = client.post(path, json=body)
            assert answer.status_code == 400, answer.text
            assert "AdmissionReview" in answer.text


def _bent(job: dict[str, Any]) -> dict[str, Any]:
    job["spec"]["template"]["spec"]["containers"] = "not a list"
    return job


@pytest.mark.parametrize("obj", [
    {"kind": "Job", "apiVersion": "batch/v1", "metadata": {"labels": ["chamber.io/team"]}},
    {**gpu_job("j"), "spec": [1, 2]},
    _bent(gpu_job("j")),
])  # fmt: skip
def test_an_object_of_the_wrong_shape_is_refused_with_why(obj: dict[str, Any]) -> None:
    with TestClient(webhook_app(Admission())) as client:
        for path in ("/mutate", "/validate"):
            answer = client.post(path, json={"request": {"uid": "u1", "operation": "CREATE", "object": obj}})
            assert answer.status_code == 200, answer.text
            response = answer.json()["response"]
            assert response["uid"] == "u1"
            if not response["allowed"]:
                assert response["status"]["code"] == 400
                assert response["status"]["message"].startswith("chamber: ")
