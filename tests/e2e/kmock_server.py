"""An in-memory Kubernetes API server on loopback for the operator's
end-to-end test: kmock's KubernetesEmulator (PyPI kmock==0.8) with the gap
that matters to kube-rs shimmed.

Usage: python3 kmock_server.py PORT   (serves until killed; prints "ready")

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
  shimmed, the operator sends merge patches only, so it is not reached.
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


def without_rv(obj):
    obj = copy.deepcopy(obj)
    obj.get("metadata", {}).pop("resourceVersion", None)
    return obj


class Emulator(kmock.KubernetesEmulator):
    _rv = itertools.count(1)

    async def _handle(self, request):
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
                    return aiohttp.web.json_response(
                        {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "Conflict", "code": 409,
                         "message": f"resourceVersion {want} is not {have}"}, status=409)
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
        return await super()._handle(request)


async def main(port: int) -> None:
    async with Emulator() as k, kmock.Server(k, port=port):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
