"""An in-memory Kubernetes API server on loopback for the operator's
end-to-end test: kmock's KubernetesEmulator (PyPI kmock==0.8) with the gap
that matters to kube-rs shimmed.

Usage: python3 kmock_server.py PORT   (serves until killed; prints "ready")

Test control (not Kubernetes): POST /_shim/hold {"suffix": S, "contains": C}
makes the next write whose path ends with S and whose body contains C hang
unapplied (a client
killed while it waits is a client killed before that write);
GET /_shim/held answers how many writes hang; POST /_shim/release drops
them (each answered 503, never applied).

kmock gaps (issue 15) and what this does about them:
* it sets no resourceVersion: every create and update here stamps a
  increasing metadata.resourceVersion into the stored object (so watch
  events and GETs carry one, as kube's watcher expects), and an update
  naming a resourceVersion other than the stored one is refused with 409
  Conflict, as the real API server does (the operator's finalizer patches
  rely on it);
* it emits watch events for no-op writes: an update that leaves the object
  unchanged (merge-patch semantics) is answered with the stored object, no
  new resourceVersion and no event;
* its JSON-patch `test` on null differs from the real API server: not
  shimmed, the operator sends merge patches only, so it is not reached;
* its 404 and 409 answers carry reasons of its own ("Object Not Found",
  "Object Already Exists"): answered here with the real server's
  "NotFound" / "AlreadyExists" (kube's `get_opt` matches "NotFound");
* it serves no PUT (replace), which leader election needs for its Lease
  (coordination.k8s.io/v1): a PUT of a named object is turned into the
  merge patch that makes the stored object equal to the body (server-owned
  metadata kept), under the same resourceVersion check; a PUT of a missing
  object is 404, as the real API server.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import sys

import aiohttp.web
import kmock
from kmock._internal import enums


def merged(obj, patch):
    """RFC 7386 JSON merge patch of `patch` onto `obj` (a new value)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(obj) if isinstance(obj, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merged(out.get(k), v)
    return out


# Metadata the API server owns: a replace keeps the stored values.
SERVER_META = ("uid", "creationTimestamp", "generation", "resourceVersion",
               "deletionTimestamp")


def replacing(stored, new):
    """The RFC 7386 merge patch that turns `stored` into `new`."""
    if not isinstance(stored, dict) or not isinstance(new, dict):
        return copy.deepcopy(new)
    patch = {k: None for k in stored if k not in new}
    for k, v in new.items():
        if stored.get(k) != v:
            patch[k] = replacing(stored.get(k), v)
    return patch


def failure(code, reason, message):
    return aiohttp.web.json_response(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure",
         "reason": reason, "code": code, "message": message}, status=code)


def conflict(message):
    return failure(409, "Conflict", message)


def without_rv(obj):
    obj = copy.deepcopy(obj)
    obj.get("metadata", {}).pop("resourceVersion", None)
    return obj


class Emulator(kmock.KubernetesEmulator):
    _rv = itertools.count(1)
    _writes: asyncio.Lock | None = None

    _holds: list | None = None
    _held: list | None = None

    async def _shim(self, request):
        """The test-control endpoints (see the module docstring)."""
        if self._holds is None:
            self._holds, self._held = [], []
        path = request.url.path
        if path == "/_shim/hold":
            self._holds.append({"suffix": request.data["suffix"],
                                "contains": request.data.get("contains", "")})
            return aiohttp.web.json_response({})
        if path == "/_shim/held":
            return aiohttp.web.json_response({"held": len(self._held)})
        if path == "/_shim/release":
            for ev in self._held:
                ev.set()
            self._held.clear()
            return aiohttp.web.json_response({})
        return failure(404, "NotFound", path)

    async def _hold(self, request):
        """Hang this write if a hold matches it; True if it was held."""
        for h in self._holds or []:
            body = request.body.decode(errors="replace")
            if request.url.path.endswith(h["suffix"]) and h["contains"] in body:
                self._holds.remove(h)
                ev = asyncio.Event()
                self._held.append(ev)
                await ev.wait()
                return True
        return False

    async def _handle(self, request):
        if request.url.path.startswith("/_shim/"):
            return await self._shim(request)
        if request.method != enums.method.GET and await self._hold(request):
            return failure(503, "ServiceUnavailable", "held by the test, never applied")
        # The resourceVersion check and the write it admits are one step:
        # kmock's own lock can yield between them, and two PUTs naming the
        # same version would then both win (leader election relies on
        # exactly one winning).
        if request.resource is None:
            return await super()._handle(request)
        if request.action == enums.action.FETCH and request.subresource is None and \
                not self._live((request.resource, request.namespace, request.name)):
            # kmock's reason is "Object Not Found"; clients (kube's get_opt)
            # match the real server's "NotFound".
            return failure(404, "NotFound", f"{request.name} not found")
        if request.method == enums.method.GET:
            return await super()._handle(request)
        if self._writes is None:
            self._writes = asyncio.Lock()
        async with self._writes:
            return await self._write(request)

    def _live(self, key) -> bool:
        return key in self._objects and not self._objects[key].deleted

    async def _write(self, request):
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            meta = request.data.get("metadata", {})
            if self._live((request.resource, request.namespace or meta.get("namespace"),
                           meta.get("name"))):
                # kmock's reason is "Object Already Exists"; the real one's:
                return failure(409, "AlreadyExists", f"{meta.get('name')} already exists")
        if request.resource is not None and request.name is not None and \
                request.method == enums.method.PUT and isinstance(request.data, dict):
            key = (request.resource, request.namespace, request.name)
            if not self._live(key):
                return failure(404, "NotFound", f"{request.name} not found")
            stored = self._objects[key].raw
            body = copy.deepcopy(request.data)
            meta = body.setdefault("metadata", {})
            for k in SERVER_META:
                meta.pop(k, None)
                if k in stored.get("metadata", {}):
                    meta[k] = stored["metadata"][k]
            want = request.data.get("metadata", {}).get("resourceVersion")
            have = stored.get("metadata", {}).get("resourceVersion")
            if want is not None and want != have:
                return conflict(f"resourceVersion {want} is not {have}")
            if without_rv(body) == without_rv(stored):
                return aiohttp.web.json_response(stored)
            body["metadata"]["resourceVersion"] = str(next(self._rv))
            # kmock routes no PUT to a reaction: apply and answer here.
            async with self._lock:
                self._objects[key].patch(replacing(stored, body))
                raw = self._objects[key].raw
                await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
            return aiohttp.web.json_response(raw)
        if request.resource is not None and isinstance(request.data, dict) and \
                request.action == enums.action.UPDATE:
            key = (request.resource, request.namespace, request.name)
            stored = self._objects[key].raw if key in self._objects and \
                not self._objects[key].deleted else None
            if stored is not None:
                # Optimistic concurrency, as the real API server: a write
                # naming a resourceVersion other than the stored one is 409.
                want = request.data.get("metadata", {}).get("resourceVersion")
                have = stored.get("metadata", {}).get("resourceVersion")
                if want is not None and want != have:
                    return conflict(f"resourceVersion {want} is not {have}")
                # A write that changes nothing: no new resourceVersion and
                # no watch event (kmock would emit one).
                if without_rv(merged(stored, request.data)) == without_rv(stored):
                    return aiohttp.web.json_response(stored)
        if request.resource is not None and isinstance(request.data, dict) and \
                request.action in (enums.action.CREATE, enums.action.UPDATE):
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
            if request.action == enums.action.CREATE:
                meta = request.data["metadata"]
                meta.setdefault("uid", f"uid-{meta['resourceVersion']}")
                meta.setdefault("generation", 1)
                meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            elif "spec" in request.data:
                # The real server bumps generation on spec changes.
                key = (request.resource, request.namespace, request.name)
                if key in self._objects:
                    gen = self._objects[key].get("metadata", {}).get("generation", 1)
                    request.data["metadata"]["generation"] = gen + 1
        return await kmock.KubernetesEmulator._handle(self, request)


async def main(port: int) -> None:
    async with Emulator() as k, kmock.Server(k, port=port):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
