"""One async client for the Kubernetes API, over the official `kubernetes` client.

The official client is synchronous (urllib3); its calls run on a small thread pool of their own, so a slow API
server never blocks a service's event loop and never starves `asyncio.to_thread` callers. Requests go through the
client's own transport, configuration (in-cluster service account, kubeconfig, or a plain URL) and auth, by
resource path, so built-in resources and CRDs (JobSet, PyTorchJob, TrainJob) are handled alike. Objects are
plain dicts (what the API sends), read through the typed helpers in `chamber.common.kube.workloads` and `nodes`.
Every failure leaves as a `chamber.common.kube.errors` class.
"""

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlparse

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from chamber.common.kube.errors import KubeError, KubeForbidden, KubeNotFound, KubeUnavailable, from_status

T = TypeVar("T")
Obj = dict[str, Any]

REQUEST_TIMEOUT_S = 30.0
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource type: where its objects live in the API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


JOBS = Resource("batch", "v1", "jobs", "Job")
PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
TRAINJOBS = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
TRAININGRUNTIMES = Resource("trainer.kubeflow.org", "v1alpha1", "trainingruntimes", "TrainingRuntime")
CLUSTERTRAININGRUNTIMES = Resource(
    "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime", namespaced=False
)
RUNTIMES = {"TrainingRuntime": TRAININGRUNTIMES, "ClusterTrainingRuntime": CLUSTERTRAININGRUNTIMES}
"""What a TrainJob's `spec.runtimeRef.kind` may name."""


def configuration(target: str) -> k8s.Configuration:
    """The client configuration for `CHAMBER_KUBE_API`: `in-cluster`, `kubeconfig`, or an API server URL."""
    cfg = k8s.Configuration()
    if target == "in-cluster":
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    elif target == "kubeconfig":
        k8s_config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    elif urlparse(target).scheme in ("http", "https"):
        cfg.host = target.rstrip("/")
    else:
        raise KubeError(f"CHAMBER_KUBE_API={target!r}: use in-cluster, kubeconfig, or an http(s) URL")
    return cfg


class WatchStream:
    """One open watch request: iterate its events (dicts with `type` and `object`) in a worker thread; `close()`
    from any thread ends the iteration at once (it shuts the socket down, as the official `Watch.stop` does)."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self._closed = False

    def __iter__(self) -> Iterator[Obj]:
        try:
            for line in iter_resp_lines(self._response):  # type: ignore[no-untyped-call]
                if self._closed:
                    return
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if not self._closed:
                raise KubeUnavailable(f"watch stream broke: {exc}") from exc
        finally:
            self._release()

    def close(self) -> None:
        self._closed = True
        import socket

        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _release(self) -> None:
        with contextlib.suppress(Exception):  # the connection may already be gone; nothing to release then
            self._response.release_conn()


class KubeClient:
    """Async facade: `get`, `list`, `create`, `patch`, `delete`, the `binding` and `eviction` subresources, and
    raw watch streams (see `chamber.common.kube.watch` for the list -> watch -> relist loop)."""

    def __init__(self, cfg: k8s.Configuration, *, threads: int = 8) -> None:
        self.api = k8s.ApiClient(cfg)
        self.host = cfg.host
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
        self._watch_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kube-watch")

    @classmethod
    def connect(cls, target: str) -> "KubeClient":
        return cls(configuration(target))

    async def _run(self, fn: Callable[[], T], *, watch: bool = False) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._watch_pool if watch else self._pool, fn)

    def _call(
        self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
        content_type: str | None = None, timeout: float | tuple[float, float] | None = REQUEST_TIMEOUT_S,
    ) -> Any:  # fmt: skip
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        method_, url, headers_, body_, post = self.api.param_serialize(
            method, path, query_params=params, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            return self.api.call_api(method_, url, headers_, body_, post, _request_timeout=timeout)
        except ApiException as exc:
            raise from_status(exc.status or 0, exc.body, str(exc.reason or exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailable(f"{method} {path}: {exc}") from exc

    def _json(self, method: str, path: str, **kwargs: Any) -> Obj:
        resp = self._call(method, path, **kwargs)
        try:  # the body is read after the call returned: an answer that breaks off raises only here
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailable(f"{method} {path}: the answer broke off: {exc}") from exc
        if not 200 <= resp.status < 300:
            raise from_status(resp.status, data)
        try:
            doc: Obj = json.loads(data) if data else {}
        except ValueError as exc:
            raise KubeUnavailable(f"{method} {path}: unreadable answer: {exc}") from exc
        return doc

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        """Any API call by path; returns the decoded JSON body."""
        return await self._run(partial(self._json, method, path, **kwargs))

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        return await self.request("GET", res.path(namespace, name))

    async def list(
        self, res: Resource, namespace: str | None = None, *, labels: str | None = None, fields: str | None = None
    ) -> tuple[list[Obj], str]:
        """Every matching object and the list's resource version (where a watch resumes)."""
        doc = await self.request("GET", res.path(namespace), query={"labelSelector": labels, "fieldSelector": fields})
        items = [dict(item, apiVersion=res.api_version, kind=res.kind) for item in doc.get("items") or []]
        return items, str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def create(self, res: Resource, obj: Obj, namespace: str | None = None) -> Obj:
        return await self.request("POST", res.path(namespace), body=obj)

    async def patch(
        self, res: Resource, name: str, patch: Any, namespace: str | None = None, *, content_type: str = MERGE,
        sub: str | None = None,
    ) -> Obj:  # fmt: skip
        return await self.request("PATCH", res.path(namespace, name, sub), body=patch, content_type=content_type)

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, *, propagation: str | None = None,
        grace_s: int | None = None, uid: str = "",
    ) -> Obj:  # fmt: skip
        """`uid`: only the object of that UID (another one of the same name is a conflict, `KubeConflict`)."""
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation:
            body["propagationPolicy"] = propagation
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        if uid:
            body["preconditions"] = {"uid": uid}
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def serves(self, res: Resource) -> bool:
        """Whether the API server serves this resource (a CRD such as JobSet may not be installed)."""
        base = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        try:
            doc = await self.request("GET", base)
        except (KubeNotFound, KubeForbidden):
            return False
        return any(r.get("name") == res.plural for r in doc.get("resources") or [])

    async def bind(self, namespace: str, pod: str, node: str, uid: str = "") -> None:
        """Bind a pod to a node (what a scheduler does): `pods/binding`. Conflict if it is bound already."""
        meta: Obj = {"name": pod, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": {"kind": "Node", "name": node}}
        await self.request("POST", PODS.path(namespace, pod, "binding"), body=body)

    async def evict(self, namespace: str, pod: str) -> None:
        """Evict a pod through `pods/eviction`, which honours PodDisruptionBudgets (`KubeTooManyRequests` when one
        forbids it now)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
        await self.request("POST", PODS.path(namespace, pod, "eviction"), body=body)

    async def open_watch(
        self, res: Resource, namespace: str | None = None, *, resource_version: str = "", labels: str | None = None,
        fields: str | None = None, timeout_s: int = 300,
    ) -> WatchStream:  # fmt: skip
        """Open a watch from `resource_version` with bookmarks; the server ends it after `timeout_s`."""
        query = {
            "watch": "true", "allowWatchBookmarks": "true", "resourceVersion": resource_version or None,
            "labelSelector": labels, "fieldSelector": fields, "timeoutSeconds": timeout_s,
        }  # fmt: skip
        path = res.path(namespace)

        def open_() -> WatchStream:
            resp = self._call("GET", path, query=query, timeout=(10.0, timeout_s + 30.0))
            if not 200 <= resp.status < 300:
                raise from_status(resp.status, resp.read())
            return WatchStream(resp.response)

        return await self._run(open_)

    async def iterate(self, stream: WatchStream, on_event: Callable[[Obj], None]) -> None:
        """Drain a watch stream in a watch thread, handing each event to `on_event` in that thread."""

        def drain() -> None:
            for event in stream:
                on_event(event)

        await self._run(drain, watch=True)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._watch_pool.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.api.close)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
