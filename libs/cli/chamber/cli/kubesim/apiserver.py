"""An emulated Kubernetes API server: kmock's `KubernetesEmulator` (pinned 0.8), with what Chamber needs added.

kmock serves the official client over HTTP with discovery from its bundled resource list. It keeps objects as
plain JSON and lacks what a scheduler talks to: `pods/binding`, `pods/eviction`, PUT, deletecollection, label and
field selectors, `uid`/`resourceVersion`/`creationTimestamp`/`generateName`, watches that resume from a resource
version (and answer `410 Gone` when it is too old), strategic merge patches, optimistic concurrency, status
subresources, graceful pod deletion, garbage collection of owned objects, and admission webhooks. This subclass
keeps kmock's server, request parsing, discovery and error rendering and answers every resource request itself
from one ordered store with a bounded event history (docs/kubernetes.md lists what it does and does not do).

In-process callers (the emulated Job controller and kubelets in `cluster.py`) use `create`, `update`, `remove`
and `subscribe`, which go through the same store and so emit the same watch events as HTTP clients see.
"""

import asyncio
import base64
import collections
import copy
import datetime
import gzip
import importlib.resources
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import rendering

from chamber.cli.kubesim.semantics import (
    SelectorError,
    disruptions_allowed,
    field_matcher,
    label_matcher,
    match_label_selector,
    merge_patch,
    strategic_merge_patch,
)

Obj = dict[str, Any]
Key = tuple[str, str, str]
"""(resource `group/version/plural`, namespace or "", name)."""

DROP: tuple[int, str, str, Obj] = (-1, "", "", {})
"""Put in a watcher's queue: end that watch stream."""
HISTORY = 4096
"""Watch events kept; a watch resuming from an older resource version gets `410 Gone`."""


class ApiError(kmock.KubernetesError):
    pass


def _error(status: int, reason: str, message: str) -> ApiError:
    return ApiError(status=status, reason=reason, message=message, details={})


def now_rfc3339() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def res_key(res: Any) -> str:
    return f"{res.group}/{res.version}/{res.plural}"


@attrs.define(kw_only=True)
class ChamberKubeEmulator(kmock.KubernetesEmulator):
    """The emulated API server. Enter it (`async with`) and serve it with `kmock.Server(emulator)`."""

    history: int = HISTORY
    bookmark_interval_s: float = 5.0
    store: dict[Key, Obj] = attrs.field(factory=dict, init=False)
    revision: int = attrs.field(default=0, init=False)
    events: collections.deque[tuple[int, str, str, Obj]] = attrs.field(factory=collections.deque, init=False)
    oldest: int = attrs.field(default=0, init=False)
    """Resource versions up to this one are no longer in `events`: a watch from them gets 410."""
    subscribers: set[asyncio.Queue[tuple[int, str, str, Obj]]] = attrs.field(factory=set, init=False)
    http: aiohttp.ClientSession | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kmock's bundled discovery (what `resources.load_bundled()` reads, without its deprecated loader)
        bundled = importlib.resources.files("kmock._internal").joinpath("resources.json.gz").read_bytes()
        self.resources.load_data(gzip.decompress(bundled))
        # JobSet's CRD, as if installed (jobset.x-k8s.io/v1alpha2)
        self.resources["jobset.x-k8s.io/v1alpha2/jobsets"] = kmock.ResourceInfo(
            kind="JobSet", singular="jobset", namespaced=True, subresources={"status"},
            verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
        )  # fmt: skip
        # Kubeflow training-operator's PyTorchJob CRD, as if installed (kubeflow.org/v1)
        self.resources["kubeflow.org/v1/pytorchjobs"] = kmock.ResourceInfo(
            kind="PyTorchJob", singular="pytorchjob", namespaced=True, subresources={"status"},
            verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
        )  # fmt: skip

        # Kubeflow Trainer v2's CRDs, as if installed (trainer.kubeflow.org/v1alpha1)
        self.resources["trainer.kubeflow.org/v1alpha1/trainjobs"] = kmock.ResourceInfo(
            kind="TrainJob", singular="trainjob", namespaced=True, subresources={"status"},
            verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
        )  # fmt: skip
        self.resources["trainer.kubeflow.org/v1alpha1/trainingruntimes"] = kmock.ResourceInfo(
            kind="TrainingRuntime", singular="trainingruntime", namespaced=True,
            verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
        )  # fmt: skip
        self.resources["trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"] = kmock.ResourceInfo(
            kind="ClusterTrainingRuntime", singular="clustertrainingruntime", namespaced=False,
            verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
        )  # fmt: skip

    async def __aenter__(self) -> "ChamberKubeEmulator":
        await super().__aenter__()
        self.http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None
        await super().__aexit__(*exc)

    # ---- the store ---------------------------------------------------------------------------------------------

    def _record(self, rkey: str, kind: str, obj: Obj) -> None:
        item = (self.revision, rkey, kind, copy.deepcopy(obj))
        self.events.append(item)
        while len(self.events) > self.history:
            self.oldest = self.events.popleft()[0]
        for queue in list(self.subscribers):
            queue.put_nowait(item)

    def _bump(self, obj: Obj) -> None:
        self.revision += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.revision)

    def read(self, rkey: str, namespace: str, name: str) -> Obj | None:
        obj = self.store.get((rkey, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def read_all(self, rkey: str, namespace: str | None = None) -> list[Obj]:
        return [copy.deepcopy(o) for (r, ns, _), o in self.store.items() if r == rkey and namespace in (None, ns)]

    def create(self, rkey: str, obj: Obj, namespace: str = "") -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _error(422, "Invalid", "metadata.name or metadata.generateName is required")
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        key = (rkey, meta.get("namespace", ""), meta["name"])
        if key in self.store:
            plural = rkey.rsplit("/", 1)[1]
            raise _error(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        _defaults(rkey, obj)
        self._bump(obj)
        self.store[key] = obj
        self._record(rkey, "ADDED", obj)
        return copy.deepcopy(obj)

    def update(self, rkey: str, namespace: str, name: str, change: Callable[[Obj], Obj | None]) -> Obj:
        """Apply `change` to a copy of the object (it returns the new object, or None for no change)."""
        key = (rkey, namespace, name)
        current = self.store.get(key)
        if current is None:
            raise _error(404, "NotFound", f'{rkey.rsplit("/", 1)[1]} "{name}" not found')
        new = change(copy.deepcopy(current))
        if new is None or new == current:
            return copy.deepcopy(current)
        meta = new.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "name", "namespace"):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
        if new.get("spec") != current.get("spec"):
            meta["generation"] = int(current["metadata"].get("generation", 1)) + 1
        if meta.get("deletionTimestamp") and current["metadata"].get("finalizers") and not meta.get("finalizers"):
            return self._drop(key, new)  # its last finalizer was removed: now it goes
        self._bump(new)
        self.store[key] = new
        self._record(rkey, "MODIFIED", new)
        return copy.deepcopy(new)

    def remove(self, rkey: str, namespace: str, name: str, *, orphan: bool = False) -> Obj:
        """Delete at once (finalizers hold it with a deletionTimestamp); owned objects are collected."""
        key = (rkey, namespace, name)
        current = self.store.get(key)
        if current is None:
            raise _error(404, "NotFound", f'{rkey.rsplit("/", 1)[1]} "{name}" not found')
        if current["metadata"].get("finalizers"):
            return self.update(rkey, namespace, name, lambda o: _mark_deleted(o, 0))
        gone = self._drop(key, copy.deepcopy(current))
        if not orphan:
            self._collect(current["metadata"]["uid"])
        return gone

    def _drop(self, key: Key, obj: Obj) -> Obj:
        self.store.pop(key, None)
        self._bump(obj)
        self._record(key[0], "DELETED", obj)
        return copy.deepcopy(obj)

    def _collect(self, owner_uid: str) -> None:
        for key, obj in list(self.store.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == owner_uid for o in owners) and key in self.store:
                self.delete_gracefully(*key)

    def delete_gracefully(self, rkey: str, namespace: str, name: str, grace_s: int | None = None) -> Obj:
        """A pod on a node gets its termination grace period (the kubelet finishes it); anything else goes now."""
        current = self.store.get((rkey, namespace, name))
        if current is None:
            raise _error(404, "NotFound", f'{rkey.rsplit("/", 1)[1]} "{name}" not found')
        if rkey == "/v1/pods" and (current.get("spec") or {}).get("nodeName"):
            if current["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(current)
            grace = grace_s if grace_s is not None else int(current["spec"].get("terminationGracePeriodSeconds", 30))
            if grace > 0 and (current.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                return self.update(rkey, namespace, name, lambda o: _mark_deleted(o, grace))
        return self.remove(rkey, namespace, name)

    def subscribe(self) -> asyncio.Queue[tuple[int, str, str, Obj]]:
        queue: asyncio.Queue[tuple[int, str, str, Obj]] = asyncio.Queue()
        self.subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[tuple[int, str, str, Obj]]) -> None:
        self.subscribers.discard(queue)

    def drop_watches(self) -> None:
        """End every open watch stream (as an API server restart or a load balancer does); clients resume."""
        for queue in list(self.subscribers):
            queue.put_nowait(DROP)

    def compact(self) -> None:
        """Forget the event history (as etcd compaction does): every watch resuming from before now gets 410."""
        self.events.clear()
        self.oldest = self.revision

    # ---- HTTP --------------------------------------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if len(self._requests) > 2000:  # kmock records every request for assertions; a long run keeps the last
            del self._requests[:-200]
        res = request.resource
        if res is not None and res.plural is None and res.version is not None and request.method.value == "GET":
            doc = await self._serve_version(request)  # /api/v1, /apis/<group>/<version>: resource discovery
            return _json(doc if isinstance(doc, dict) else {})
        if res is None or res.plural is None or res.version is None:
            return await super(kmock.KubernetesEmulator, self)._handle(request)  # /api, /apis, /version
        if res not in self.resources:
            raise _error(404, "NotFound", f"the server could not find the requested resource ({res_key(res)})")
        try:
            return await self._serve(request, res_key(res))
        except SelectorError as exc:
            raise _error(400, "BadRequest", str(exc)) from exc
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise _error(422, "Invalid", f"the patch could not be applied: {exc}") from exc

    async def _serve(self, request: rendering.Request, rkey: str) -> aiohttp.web.StreamResponse:
        method, ns, name, sub = request.method.value, request.namespace or "", request.name, request.subresource
        params = request.params
        body: Any = request.data if isinstance(request.data, (dict, list)) else None
        doc: Obj = body if isinstance(body, dict) else {}
        if method == "GET" and params.get("watch") in ("true", "True", "1"):
            return await self._watch(request, rkey)
        if method == "GET" and name:
            obj = self.read(rkey, ns, name)
            if obj is None:
                raise _error(404, "NotFound", f'{rkey.rsplit("/", 1)[1]} "{name}" not found')
            return _json(obj)
        if method == "GET":
            return _json(self._list_doc(request, rkey))
        if method == "POST" and rkey == "/v1/bindings":
            return _json(self._bind(ns, str((doc.get("metadata") or {}).get("name")), doc), 201)
        if method == "POST" and name and sub == "binding":
            return _json(self._bind(ns, name, doc), 201)
        if method == "POST" and name and sub == "eviction":
            return _json(self._evict(ns, name), 201)
        if method == "POST" and not name:
            obj = await self._admit(request, rkey, dict(doc))
            return _json(self.create(rkey, obj, ns), 201)
        if method in ("PUT", "PATCH") and name:
            status_only = sub == "status"
            if method == "PUT":
                return _json(self._replace(rkey, ns, name, dict(doc), status_only))
            ctype = str(request.headers.get("Content-Type") or request.headers.get("content-type") or "")
            return _json(self._patch(rkey, ns, name, body, ctype, status_only=status_only))
        if method == "DELETE" and name:
            uid = (doc.get("preconditions") or {}).get("uid")
            if uid and (current := self.read(rkey, ns, name)) is not None:
                _check_uid(current, uid)
            grace = doc.get("gracePeriodSeconds")
            if doc.get("propagationPolicy") == "Orphan":
                return _json(self.remove(rkey, ns, name, orphan=True))
            return _json(self.delete_gracefully(rkey, ns, name, None if grace is None else int(grace)))
        if method == "DELETE":
            for obj in self._selected(request, rkey):
                meta = obj["metadata"]
                self.delete_gracefully(rkey, meta.get("namespace", ""), meta["name"])
            return _json({"apiVersion": "v1", "kind": "Status", "status": "Success"})
        raise _error(405, "MethodNotAllowed", f"{method} is not supported on {request.url.path}")

    def _selected(self, request: rendering.Request, rkey: str) -> list[Obj]:
        labels = label_matcher(request.params.get("labelSelector"))
        fields = field_matcher(request.params.get("fieldSelector"))
        return [
            o for o in self.read_all(rkey, request.namespace)
            if labels(o["metadata"].get("labels") or {}) and fields(o)
        ]  # fmt: skip

    def _list_doc(self, request: rendering.Request, rkey: str) -> Obj:
        info = self.resources[request.resource]  # type: ignore[index]
        return {
            "apiVersion": rkey.rsplit("/", 1)[0].lstrip("/"), "kind": f"{info.kind or 'Object'}List",
            "metadata": {"resourceVersion": str(self.revision)}, "items": self._selected(request, rkey),
        }  # fmt: skip

    def _replace(self, rkey: str, ns: str, name: str, body: Obj, status_only: bool) -> Obj:
        def change(current: Obj) -> Obj:
            _check_version(current, body)
            if status_only:
                return dict(current, status=body.get("status", {}))
            new = dict(body)
            if "status" in current:
                new["status"] = current["status"]
            new["metadata"] = dict(body.get("metadata") or {}, resourceVersion=current["metadata"]["resourceVersion"])
            return new

        return self.update(rkey, ns, name, change)

    def _patch(self, rkey: str, ns: str, name: str, body: Any, ctype: str, *, status_only: bool) -> Obj:
        def change(current: Obj) -> Obj:
            if "json-patch" in ctype:
                new = jsonpatch.apply_patch(current, body if isinstance(body, list) else [])
            else:
                if isinstance(body, dict):
                    _check_version(current, body)
                patcher = strategic_merge_patch if "strategic" in ctype else merge_patch
                new = patcher(current, body)
            if status_only:
                return dict(current, status=new.get("status", {}))
            if "status" in current or "status" in new:
                new["status"] = current.get("status", {})
            return dict(new)

        return self.update(rkey, ns, name, change)

    def _bind(self, ns: str, name: str, body: Obj) -> Obj:
        target = (body.get("target") or {}).get("name")
        if not target:
            raise _error(422, "Invalid", "Binding.target.name is required")
        uid = (body.get("metadata") or {}).get("uid")

        def change(pod: Obj) -> Obj:
            if uid and pod["metadata"]["uid"] != uid:
                raise _error(409, "Conflict", f"pod {name}: uid {uid} is not the pod's uid {pod['metadata']['uid']}")
            if pod["metadata"].get("deletionTimestamp"):
                raise _error(409, "Conflict", f"pod {name} is being deleted, cannot be assigned to a host")
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound:
                raise _error(409, "Conflict", f"pod {name} is already assigned to node {bound!r}")
            pod["spec"]["nodeName"] = target
            _set_condition(pod, "PodScheduled", "True", "")
            return pod

        self.update("/v1/pods", ns, name, change)
        return {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}

    def _evict(self, ns: str, name: str) -> Obj:
        pod = self.read("/v1/pods", ns, name)
        if pod is None:
            raise _error(404, "NotFound", f'pods "{name}" not found')
        labels = pod["metadata"].get("labels") or {}
        for pdb in self.read_all("policy/v1/poddisruptionbudgets", ns):
            selector = (pdb.get("spec") or {}).get("selector")
            if not selector or not match_label_selector(selector, labels):
                continue
            covered = [
                p
                for p in self.read_all("/v1/pods", ns)
                if match_label_selector(selector, p["metadata"].get("labels") or {})
            ]
            healthy = sum(1 for p in covered if _running(p) and not p["metadata"].get("deletionTimestamp"))
            if _running(pod) and disruptions_allowed(pdb, healthy, len(covered)) < 1:
                raise _error(
                    429, "TooManyRequests",
                    f"Cannot evict pod as it would violate the pod's disruption budget ({pdb['metadata']['name']}).",
                )  # fmt: skip
        self.update(
            "/v1/pods", ns, name, lambda p: _set_condition(p, "DisruptionTarget", "True", "EvictionByEvictionAPI")
        )
        self.delete_gracefully("/v1/pods", ns, name)
        return {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}

    async def _watch(self, request: rendering.Request, rkey: str) -> aiohttp.web.StreamResponse:
        params = request.params
        since = params.get("resourceVersion") or ""
        labels = label_matcher(params.get("labelSelector"))
        fields = field_matcher(params.get("fieldSelector"))
        bookmarks = params.get("allowWatchBookmarks") in ("true", "True", "1")
        timeout = float(params.get("timeoutSeconds") or 1800)
        ns, name = request.namespace, request.name

        def wanted(item: tuple[int, str, str, Obj]) -> bool:
            _, r, _, obj = item
            meta = obj["metadata"]
            return (
                r == rkey and ns in (None, meta.get("namespace", "")) and name in (None, meta["name"])
                and labels(meta.get("labels") or {}) and fields(obj)
            )  # fmt: skip

        queue: asyncio.Queue[tuple[int, str, str, Obj]] | None = None
        if since not in ("", "0") and int(since) < self.oldest:
            first: list[Obj] = [{"type": "ERROR", "object": {
                "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 410, "reason": "Expired",
                "message": f"too old resource version: {since} ({self.oldest})",
            }}]  # fmt: skip
        else:
            queue = self.subscribe()  # before reading the store or the history: no event falls in between
            if since in ("", "0"):
                objs = [o for o in self._selected(request, rkey) if name in (None, o["metadata"]["name"])]
                first = [{"type": "ADDED", "object": o} for o in objs]
            else:
                history = [e for e in list(self.events) if e[0] > int(since) and wanted(e)]
                first = [{"type": t, "object": o} for _, _, t, o in history]
        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        try:
            for event in first:
                await response.write(json.dumps(event).encode() + b"\n")
            if queue is None:
                return response
            async for event in self._live(queue, wanted, bookmarks, timeout, rkey):
                await response.write(json.dumps(event).encode() + b"\n")
        except ConnectionError:
            pass  # the client went away
        finally:
            if queue is not None:
                self.unsubscribe(queue)
        return response

    async def _live(
        self, queue: asyncio.Queue[tuple[int, str, str, Obj]], wanted: Callable[[Any], bool], bookmarks: bool,
        timeout_s: float, rkey: str,
    ) -> AsyncIterator[Obj]:  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=min(left, self.bookmark_interval_s))
            except TimeoutError:
                if bookmarks:
                    kind = rkey.rsplit("/", 1)[1]
                    yield {
                        "type": "BOOKMARK",
                        "object": {"kind": kind, "metadata": {"resourceVersion": str(self.revision)}},
                    }
                continue
            if item is DROP:
                return
            if wanted(item):
                yield {"type": item[2], "object": item[3]}

    # ---- admission ---------------------------------------------------------------------------------------------

    async def _admit(self, request: rendering.Request, rkey: str, obj: Obj) -> Obj:
        """Call the admission webhooks registered in the store (mutating, then validating), as the API server
        does for CREATE: URL webhooks only (the emulator cannot reach in-cluster services)."""
        res = request.resource
        assert res is not None
        if request.namespace:
            obj.setdefault("metadata", {})["namespace"] = request.namespace
        for mutating in (True, False):
            kind = "mutatingwebhookconfigurations" if mutating else "validatingwebhookconfigurations"
            for config in self.read_all(f"admissionregistration.k8s.io/v1/{kind}"):
                for hook in config.get("webhooks") or []:
                    if _hook_matches(hook, res, obj):
                        obj = await self._call_hook(hook, res, request, obj, mutating)
        return obj

    async def _call_hook(self, hook: Obj, res: Any, request: rendering.Request, obj: Obj, mutating: bool) -> Obj:
        url = (hook.get("clientConfig") or {}).get("url")
        name = hook.get("name", "webhook")
        if not url or self.http is None:
            return obj
        info = self.resources[res]
        review = {
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()), "operation": "CREATE", "namespace": request.namespace or "",
                "name": obj.get("metadata", {}).get("name", ""),
                "kind": {"group": res.group, "version": res.version, "kind": info.kind},
                "resource": {"group": res.group, "version": res.version, "resource": res.plural},
                "object": obj, "userInfo": {"username": "emulated-user"}, "dryRun": False,
            },
        }  # fmt: skip
        try:
            timeout = aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds", 10)))
            async with self.http.post(url, json=review, timeout=timeout) as resp:
                answer = (await resp.json()).get("response") or {}
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                return obj
            raise _error(
                500, "InternalError", f'Internal error occurred: failed calling webhook "{name}": {exc}'
            ) from exc
        if not answer.get("allowed"):
            status = answer.get("status") or {}
            raise _error(
                int(status.get("code") or 403), str(status.get("reason") or "Forbidden"),
                f'admission webhook "{name}" denied the request: {status.get("message", "")}',
            )  # fmt: skip
        if mutating and answer.get("patch"):
            ops = json.loads(base64.b64decode(answer["patch"]))
            patched: Obj = jsonpatch.apply_patch(obj, ops)
            return patched
        return obj

    # ---- discovery: the core group's version is `v1`, not `/v1` (kubectl needs it) -------------------------------

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        doc = await super()._serve_version(request)
        if isinstance(doc, dict) and str(doc.get("groupVersion", "")).startswith("/"):
            doc["groupVersion"] = doc["groupVersion"][1:]
        return doc


def _json(doc: Obj, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.json_response(doc, status=status)


def _check_uid(current: Obj, uid: object) -> None:
    """A UID precondition (a patch's `metadata.uid`, a delete's `preconditions.uid`): the object is another one of
    the same name (deleted and made again) unless its UID is the one given."""
    if uid and uid != current["metadata"].get("uid"):
        raise _error(
            409, "Conflict",
            f'Operation cannot be fulfilled on {current.get("kind", "object")} "{current["metadata"]["name"]}": '
            f'Precondition failed: UID in precondition: {uid}, UID in object meta: {current["metadata"].get("uid")}',
        )  # fmt: skip


def _check_version(current: Obj, body: Obj) -> None:
    _check_uid(current, (body.get("metadata") or {}).get("uid"))
    wanted = (body.get("metadata") or {}).get("resourceVersion")
    if wanted and wanted != current["metadata"].get("resourceVersion"):
        raise _error(
            409, "Conflict",
            f'Operation cannot be fulfilled on {current.get("kind", "object")} "{current["metadata"]["name"]}": the '
            "object has been modified; please apply your changes to the latest version and try again",
        )  # fmt: skip


def _mark_deleted(obj: Obj, grace: int) -> Obj:
    obj["metadata"]["deletionTimestamp"] = now_rfc3339()
    obj["metadata"]["deletionGracePeriodSeconds"] = grace
    return obj


def _set_condition(obj: Obj, kind: str, status: str, reason: str) -> Obj:
    conditions = [c for c in obj.setdefault("status", {}).get("conditions") or [] if c.get("type") != kind]
    conditions.append({"type": kind, "status": status, "reason": reason, "lastTransitionTime": now_rfc3339()})
    obj["status"]["conditions"] = conditions
    return obj


def _running(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _hook_matches(hook: Obj, res: Any, obj: Obj) -> bool:
    if not match_label_selector(hook.get("objectSelector"), obj.get("metadata", {}).get("labels") or {}):
        return False
    for rule in hook.get("rules") or []:
        ops, groups = rule.get("operations") or [], rule.get("apiGroups") or []
        versions, resources = rule.get("apiVersions") or [], rule.get("resources") or []
        if (
            ("CREATE" in ops or "*" in ops) and (res.group in groups or "*" in groups)
            and (res.version in versions or "*" in versions) and (res.plural in resources or "*" in resources)
        ):  # fmt: skip
            return True
    return False


def _defaults(rkey: str, obj: Obj) -> None:
    """The defaults the real API server applies that Chamber and its emulated controllers read."""
    spec = obj.setdefault("spec", {}) if rkey in ("batch/v1/jobs", "/v1/pods", "/v1/nodes") else None
    if rkey == "batch/v1/jobs" and spec is not None:
        spec.setdefault("parallelism", 1)
        spec.setdefault("completions", spec["parallelism"])
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        tpl = spec.setdefault("template", {}).setdefault("spec", {})
        tpl.setdefault("terminationGracePeriodSeconds", 30)
        tpl.setdefault("schedulerName", "default-scheduler")
        obj.setdefault("status", {})
    elif rkey == "/v1/pods" and spec is not None:
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        obj.setdefault("status", {}).setdefault("phase", "Pending")
