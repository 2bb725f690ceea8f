"""An in-memory Kubernetes API server on loopback that `helm install` /
`helm upgrade` (helm 3 and helm 4) and `helm template --dry-run=server`
can run against: kmock_server.py's emulator (kmock 0.8 plus its shims)
with what helm needs on top. Used by test_chart_upgrade.py.

Usage: python3 kmock_helm.py [PORT]   (0 or none: any free port; serves on
127.0.0.1 until killed; prints "ready <port>")

What helm needs that kmock lacks, and what this does:
* discovery of the built-in kinds the chart renders (and Pods, which the
  chart's guard looks up): kmock knows a resource only once it holds an
  object of it; here they are declared with their kind and scope, and the
  core group's APIResourceList says groupVersion "v1" (kmock: "/v1", which
  client-go's RESTMapper cannot use);
* /version: v1.30.0 (kmock answers 1.26; the chart's kubeVersion is >= 1.28);
* a CustomResourceDefinition is created Established (helm waits for it);
* helm's release records are Secrets written by client-go's typed client in
  protobuf (no fallback to JSON on 415): the Secret message (runtime.Unknown
  around v1.Secret: name, namespace, labels, annotations, data, type) is
  decoded here into JSON before kmock parses the request;
* `labelSelector` on lists (equality and existence terms; helm finds a
  release's records by `name=<release>,owner=helm`) — kmock ignores it;
* lists carry apiVersion and kind (<Kind>List), which the dynamic client
  (helm's `lookup`) requires;
* PATCH as helm sends it: helm 4 server-side apply
  (application/apply-patch+yaml, a JSON body) creates the object or makes
  it equal to the applied configuration (helm is the only field manager
  here, so that is what the real server would store; no managedFields, no
  conflicts); helm 3's three-way strategic merge patch
  (application/strategic-merge-patch+json) is applied with list merging by
  the key its $setElementOrder directives name, $patch: delete/replace,
  $retainKeys and $deleteFromPrimitiveList; `?dryRun=All` stores nothing.
What it does not do: defaulting, validation (helm runs with
--disable-openapi-validation: there is no /openapi), admission, controllers
(a StatefulSet never gets pods or status unless the test writes them).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import sys
from pathlib import Path

import aiohttp.web
import kmock
from kmock._internal import references

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kmock_server import SERVER_META, Emulator, failure, replacing, without_rv  # noqa: E402

# (group, version, plural, kind, namespaced)
BUILTINS = [
    ("", "v1", "secrets", "Secret", True),
    ("", "v1", "configmaps", "ConfigMap", True),
    ("", "v1", "services", "Service", True),
    ("", "v1", "serviceaccounts", "ServiceAccount", True),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    ("", "v1", "pods", "Pod", True),
    ("", "v1", "namespaces", "Namespace", False),
    ("apps", "v1", "statefulsets", "StatefulSet", True),
    ("apps", "v1", "deployments", "Deployment", True),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False),
    ("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", True),
]
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


# ---------------------------------------------------------------------------
# protobuf: just enough to read the Secret helm writes
# ---------------------------------------------------------------------------


def pb_fields(buf: bytes):
    """(field number, value) of one protobuf message (varint, length-delimited,
    fixed32/64 wire types)."""
    i = 0

    def varint() -> int:
        nonlocal i
        out = shift = 0
        while True:
            b = buf[i]
            i += 1
            out |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return out

    while i < len(buf):
        key = varint()
        num, wire = key >> 3, key & 7
        if wire == 0:
            yield num, varint()
        elif wire == 2:
            n = varint()
            yield num, buf[i:i + n]
            i += n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            yield num, buf[i:i + n]
            i += n
        else:
            raise ValueError(f"protobuf wire type {wire}")


def pb_map_entry(buf: bytes) -> tuple[str, bytes]:
    kv = dict(pb_fields(buf))
    return kv.get(1, b"").decode(), kv.get(2, b"")


def secret_from_protobuf(body: bytes) -> dict:
    """A v1.Secret from Kubernetes' protobuf envelope ("k8s\\0" +
    runtime.Unknown{typeMeta, raw}) as JSON. ObjectMeta fields: 1 name,
    3 namespace, 6 resourceVersion, 11 labels, 12 annotations; Secret
    fields: 1 metadata, 2 data, 3 type."""
    if body[:4] != b"k8s\x00":
        raise ValueError("not a Kubernetes protobuf body")
    unknown = dict(pb_fields(body[4:]))
    tm = {n: v.decode() for n, v in pb_fields(unknown[1])}
    if (tm.get(1), tm.get(2)) != ("v1", "Secret"):
        raise ValueError(f"protobuf {tm}: only Secrets are decoded")
    meta: dict = {}
    out: dict = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {}}
    for n, v in pb_fields(unknown[2]):
        if n == 1:
            for mn, mv in pb_fields(v):
                if mn == 1:
                    meta["name"] = mv.decode()
                elif mn == 3 and mv:
                    meta["namespace"] = mv.decode()
                elif mn == 6 and mv:
                    meta["resourceVersion"] = mv.decode()
                elif mn in (11, 12):
                    k, val = pb_map_entry(mv)
                    meta.setdefault("labels" if mn == 11 else "annotations", {})[k] = val.decode()
        elif n == 2:
            k, val = pb_map_entry(v)
            out["data"][k] = base64.b64encode(val).decode()
        elif n == 3:
            out["type"] = v.decode()
    return out


# ---------------------------------------------------------------------------
# strategic merge patch (the subset client-go's three-way merge emits)
# ---------------------------------------------------------------------------


def smp(obj, patch):
    """`patch` (a strategic merge patch) applied to `obj`; None = deleted."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "delete":
        return None
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    out = copy.deepcopy(obj) if isinstance(obj, dict) else {}
    deletes = {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys") or k.startswith("$setElementOrder/"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            deletes[k.split("/", 1)[1]] = v
        elif v is None:
            out.pop(k, None)
        elif isinstance(v, list) and f"$setElementOrder/{k}" in patch:
            out[k] = merge_list(out.get(k) or [], v, patch[f"$setElementOrder/{k}"])
        elif isinstance(v, dict):
            merged = smp(out.get(k), v)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        else:
            out[k] = copy.deepcopy(v)
    for k, gone in deletes.items():
        out[k] = [x for x in out.get(k, []) if x not in gone]
    if "$retainKeys" in patch:
        out = {k: v for k, v in out.items() if k in patch["$retainKeys"]}
    return out


def merge_list(cur: list, items: list, order: list) -> list:
    """A list with a merge strategy: elements matched by the merge key (the
    one key of the $setElementOrder entries), ordered as the patch says."""
    if not all(isinstance(e, dict) for e in cur + items + order):
        vals = cur + [x for x in items if x not in cur]
        rank = {v: i for i, v in enumerate(order)}
        return sorted(vals, key=lambda v: rank.get(v, len(rank)))
    keys = [k for e in order for k in e] or \
        [k for e in items if e.get("$patch") == "delete" for k in e if k != "$patch"]
    if not keys:
        return [smp(None, e) for e in items]
    mk = keys[0]
    by = {e.get(mk): copy.deepcopy(e) for e in cur}
    for e in items:
        k = e.get(mk)
        merged = smp(by.get(k), e)
        if merged is None:
            by.pop(k, None)
        else:
            by[k] = merged
    ranked = [e[mk] for e in order if e.get(mk) in by]
    return [by[k] for k in ranked] + [v for k, v in by.items() if k not in ranked]


# ---------------------------------------------------------------------------
# label selectors
# ---------------------------------------------------------------------------


def selector_matches(selector: str, labels: dict) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = (s.strip() for s in term.split("!=", 1))
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif " " in term or "(" in term:
            raise ValueError(f"label selector term {term!r} not supported")
        elif term not in labels:
            return False
    return True


# ---------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------


class HelmEmulator(Emulator):

    async def __call__(self, raw_request):
        # Before kmock parses the body: helm's release Secrets come in protobuf.
        if "protobuf" in raw_request.headers.get("Content-Type", ""):
            body = await raw_request.read()
            try:
                obj = secret_from_protobuf(body)
            except (ValueError, KeyError, IndexError) as e:
                return failure(415, "UnsupportedMediaType", f"protobuf body: {e}")
            raw_request._read_bytes = json.dumps(obj).encode()  # what kmock reads next
        return await super().__call__(raw_request)

    async def _serve_server_version(self, request):
        return {"major": "1", "minor": "30", "gitVersion": "v1.30.0", "gitCommit": "kmock",
                "gitTreeState": "clean", "buildDate": "2024-04-17T00:00:00Z",
                "goVersion": "go1.22.2", "compiler": "gc", "platform": "linux/amd64"}

    async def _serve_version(self, request):
        out = await super()._serve_version(request)
        if out.get("groupVersion") == "/v1":
            out["groupVersion"] = "v1"
        return out

    async def _serve_list(self, request):
        out = await super()._serve_list(request)
        res = request.resource
        info = self._resources[res] if res in self._resources else None
        out["apiVersion"] = f"{res.group}/{res.version}" if res.group else res.version
        out["kind"] = f"{(info and info.kind) or res.plural.capitalize()}List"
        sel = request.params.get("labelSelector")
        if sel:
            try:
                out["items"] = [o for o in out["items"]
                                if selector_matches(sel, o.get("metadata", {}).get("labels") or {})]
            except ValueError as e:
                return failure(400, "BadRequest", str(e))
        return out

    async def _handle(self, request):
        if request.resource is not None and request.method == "POST" and \
                request.resource.plural == "customresourcedefinitions" and isinstance(request.data, dict):
            names = request.data.get("spec", {}).get("names", {})
            request.data["status"] = {"acceptedNames": names, "conditions": [
                {"type": "NamesAccepted", "status": "True"}, {"type": "Established", "status": "True"}]}
        ctype = request.headers.get("Content-Type", "")
        if request.resource is not None and request.name is not None and request.method == "PATCH" and \
                ("apply-patch" in ctype or "strategic-merge-patch" in ctype):
            if self._writes is None:
                self._writes = asyncio.Lock()
            async with self._writes:
                return await self._patch(request, apply="apply-patch" in ctype)
        return await super()._handle(request)

    async def _patch(self, request, apply: bool):
        """Server-side apply (helm 4) or a strategic merge patch (helm 3)."""
        try:
            body = json.loads(request.body or b"null")
        except ValueError:
            return failure(415, "UnsupportedMediaType", "only JSON (which is YAML) bodies are served")
        if not isinstance(body, dict):
            return failure(400, "BadRequest", "the patch is not an object")
        key = (request.resource, request.namespace, request.name)
        stored = self._objects[key].raw if self._live(key) else None
        dry = request.params.get("dryRun") == "All"
        if stored is None:
            if not apply:
                return failure(404, "NotFound", f"{request.name} not found")
            new = copy.deepcopy(body)
            meta = new.setdefault("metadata", {})
            meta.setdefault("namespace", request.namespace)
            if dry:
                return aiohttp.web.json_response(new, status=201)
            meta["resourceVersion"] = str(next(self._rv))
            meta.setdefault("uid", f"uid-{meta['resourceVersion']}")
            meta.setdefault("generation", 1)
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            async with self._lock:
                if key in self._objects:
                    self._objects[key].create(new)
                else:
                    self._objects[key] = new
                raw = self._objects[key].raw
                await self._buses[request.resource].put({"type": "ADDED", "object": raw})
            return aiohttp.web.json_response(raw, status=201)
        if apply:
            new = copy.deepcopy(body)
            meta = new.setdefault("metadata", {})
            for k in SERVER_META + ("namespace",):
                if k in stored.get("metadata", {}):
                    meta[k] = stored["metadata"][k]
            if "status" in stored:
                new["status"] = copy.deepcopy(stored["status"])
        else:
            new = smp(stored, body)
        if without_rv(new) == without_rv(stored) or dry:
            return aiohttp.web.json_response(new if dry else stored)
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        if new.get("spec") != stored.get("spec"):
            new["metadata"]["generation"] = stored.get("metadata", {}).get("generation", 1) + 1
        async with self._lock:
            self._objects[key].patch(replacing(stored, new))
            raw = self._objects[key].raw
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)


async def main(port: int) -> None:
    async with HelmEmulator() as k, kmock.Server(k, port=port) as server:
        for group, version, plural, kind, namespaced in BUILTINS:
            k.resources[references.resource(group, version, plural)] = references.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs=VERBS)
        print("ready", server.port, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
