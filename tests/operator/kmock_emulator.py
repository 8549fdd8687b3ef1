"""kmock 0.8's KubernetesEmulator plus what a real Kopf operator needs from an API server.

- every created object gets uid, resourceVersion, generation 1 and creationTimestamp; create answers 201;
- `metadata.generateName` gets a random suffix (kmock 0.8 ignores it, so all but the first of Kopf's
  events, which are all named `kopf-event-…` that way, fail with 409);
- every update bumps resourceVersion (merge- and JSON-patches alike), and generation when spec changes;
- a JSON-patch whose `test` op fails answers 422, as the apiserver does (Kopf then waits for the next event);
- a patch of the `scale` subresource sets the TrainingJob's spec.workers (specReplicasPath), and the
  subresource answers an autoscaling/v1 Scale (kmock 0.8 answers the whole object, on which
  `kubectl scale` fails: 'no kind "TrainingJob" is registered ... in scheme "k8s.io/client-go/scale/util.go"');
- list responses carry kind and apiVersion;
- lists report the newest resourceVersion, and a watch from that version sends only the objects
  changed since (kmock 0.8 replays every object as ADDED, so Kopf handles a stale copy after its own
  patch, its next patch fails its `test`, and it waits for an event that never comes);
- a watch subscribes to changes *before* it snapshots the existing objects (kmock 0.8 subscribes
  after, so a change made in between is lost).
Still not emulated (the operator does not rely on them): label selectors, garbage collection,
status/spec isolation, PUT, server-side apply, namespaces.
"""
from __future__ import annotations

import copy
import datetime
import itertools
import uuid
from typing import Any

import jsonpatch
import kmock
from aiohttp import web
from kmock._internal import dicts

_versions = itertools.count(1)
_latest = [0]  # the newest resourceVersion handed out (lists report it, as the apiserver does)


def _next_version() -> str:
    _latest[0] = next(_versions)
    return str(_latest[0])


class Emulator(kmock.KubernetesEmulator):
    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None:
            self._prepare(request)
        response = await super()._handle(request)
        if request.action == kmock.action.CREATE and response.status == 200:
            response.set_status(201)
        if request.subresource == "scale" and response.status == 200:
            return self._scale_of(request) or response
        return response

    def _scale_of(self, request: kmock.Request) -> web.Response | None:
        """The TrainingJob's Scale, by the CRD's paths (spec.workers, status.workers, status.selector)."""
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        job = self.objects[key].raw
        meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
        return web.json_response({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta},
            "spec": {"replicas": spec.get("workers", 0)},
            "status": {"replicas": status.get("workers", 0), "selector": status.get("selector", "")},
        })

    def _prepare(self, request: kmock.Request) -> None:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            if meta.get("generateName") and not meta.get("name"):
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
            meta.update(
                uid=str(uuid.uuid4()),
                resourceVersion=_next_version(),
                generation=1,
                creationTimestamp=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        elif request.action == kmock.action.UPDATE and request.name is not None:
            if request.subresource == "scale" and isinstance(request.data, dict):
                replicas = (request.data.get("spec") or {}).get("replicas")
                request.data.clear()
                request.data.update({"spec": {"workers": replicas}})
            key = (request.resource, request.namespace, request.name)
            if key not in self.objects or self.objects[key].deleted:
                return  # kmock answers 404
            current = copy.deepcopy(self.objects[key].raw)
            try:
                updated = dicts.patch_dict(current, request.data)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=f"the JSON-patch test failed: {exc}") from None
            meta = {"resourceVersion": _next_version()}
            if request.subresource is None and updated.get("spec") != current.get("spec"):
                meta["generation"] = int(current.get("metadata", {}).get("generation") or 1) + 1
            if isinstance(request.data, dict):
                request.data.setdefault("metadata", {}).update(meta)
            elif isinstance(request.data, list):
                request.data.extend({"op": "add", "path": f"/metadata/{k}", "value": v} for k, v in meta.items())

    async def _serve_watch(self, request: kmock.Request) -> Any:
        yield b""
        bus = self._buses[request.resource]
        async with self._lock:  # writers publish under this lock: nothing slips between mark and snapshot
            marker = await bus.mark()
            objs = self._KubernetesEmulator__get_objs(request, strict=False)
            since = request.params.get("resourceVersion", "")
            if since.isdigit():  # continuing a list: only what changed after it, as the apiserver does
                events = [{"type": "MODIFIED", "object": obj.raw} for obj in objs
                          if not obj.deleted and int(obj.raw.get("metadata", {}).get("resourceVersion") or 0) > int(since)]
            else:
                events = [{"type": "ADDED", "object": obj.raw} for obj in objs if not obj.deleted]
        try:
            for event in events:
                yield event
            async for event in bus.stream(since=marker):
                meta = event.get("object", {}).get("metadata", {})
                if self._KubernetesEmulator__check(request, request.resource, meta.get("namespace"), meta.get("name"), strict=False):
                    yield event
        finally:
            await bus.unmark(marker)

    async def _serve_list(self, request: kmock.Request) -> Any:
        result = await super()._serve_list(request)
        resource = request.resource
        info = self.resources[resource] if resource in self.resources else None
        kind = (info.kind if info is not None and info.kind else (resource.plural or "").capitalize()) + "List"
        group_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        return {**result, "kind": kind, "apiVersion": group_version, "metadata": {"resourceVersion": str(_latest[0])}}
