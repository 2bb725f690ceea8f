"""The chart on a real cluster — skipped unless one is configured.

Set KAAS_TEST_KUBE_CONTEXT to a kubectl context whose cluster has an RWX
StorageClass (KAAS_TEST_STORAGE_CLASS) and can pull the images named by
KAAS_TEST_IMAGE / KAAS_TEST_OPERATOR_IMAGE (repository:tag). The test
installs the chart into a fresh namespace, waits for the brokers to be
ready, applies a KafkaTopic and waits for Ready, deletes it, and uninstalls.
Needs `helm` (tests/k8s/.tools/helm4) and `kubectl` on PATH. CI has no
cluster: there it is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from test_chart import CHART, helm

CTX = os.environ.get("KAAS_TEST_KUBE_CONTEXT")
pytestmark = pytest.mark.skipif(not CTX, reason="no cluster configured (KAAS_TEST_KUBE_CONTEXT)")


def kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    r = subprocess.run(["kubectl", "--context", CTX, *args], input=input, capture_output=True,
                       text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
    return r.stdout


@pytest.mark.timeout(900)
def test_install_topic_uninstall():
    ns = f"kaas-test-{uuid.uuid4().hex[:6]}"
    image, tag = os.environ["KAAS_TEST_IMAGE"].rsplit(":", 1)
    op_image, op_tag = os.environ["KAAS_TEST_OPERATOR_IMAGE"].rsplit(":", 1)
    sc = os.environ["KAAS_TEST_STORAGE_CLASS"]
    h = str(helm("helm4"))
    subprocess.run([h, "--kube-context", CTX, "install", "kaas", str(CHART), "-n", ns,
                    "--create-namespace", "--wait", "--timeout", "10m",
                    "--set", f"image.repository={image}", "--set", f"image.tag={tag}",
                    "--set", f"operator.image.repository={op_image}",
                    "--set", f"operator.image.tag={op_tag}",
                    "--set", f"storage.data.storageClassName={sc}",
                    "--set", f"storage.controlPlane.storageClassName={sc}",
                    "--set", "storage.keepOnUninstall=false"], check=True, timeout=700)
    try:
        kubectl("-n", ns, "apply", "-f", "-", input=json.dumps({
            "apiVersion": "kaas.io/v1alpha1", "kind": "KafkaTopic",
            "metadata": {"name": "smoke"}, "spec": {"partitions": 3}}))
        deadline = time.time() + 120
        while True:
            obj = json.loads(kubectl("-n", ns, "get", "kafkatopic", "smoke", "-o", "json"))
            conds = obj.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                assert obj["status"]["topicId"]
                break
            assert time.time() < deadline, obj
            time.sleep(2)
        kubectl("-n", ns, "delete", "kafkatopic", "smoke", "--wait=true", "--timeout=120s")
    finally:
        subprocess.run([h, "--kube-context", CTX, "uninstall", "kaas", "-n", ns, "--wait"],
                       timeout=600)
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
