"""An in-memory Kubernetes API server on loopback for the operator's
end-to-end test: kmock's KubernetesEmulator (PyPI kmock==0.8) with the gap
that matters to kube-rs shimmed.

Usage: python3 kmock_server.py PORT   (serves until killed; prints "ready")

kmock gaps (issue 15) and what this does about them:
* it sets no resourceVersion: every create and update here stamps a
  increasing metadata.resourceVersion into the stored object (so watch
  events and GETs carry one, as kube's watcher expects);
* its JSON-patch `test` on null differs from the real API server: the
  operator sends merge patches only, so it is not reached;
* it emits watch events for no-op writes: harmless here, the operator writes
  status only when it changed (the test asserts the write count settles).
"""

from __future__ import annotations

import asyncio
import itertools
import sys

import kmock
from kmock._internal import enums


class Emulator(kmock.KubernetesEmulator):
    _rv = itertools.count(1)

    async def _handle(self, request):
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
