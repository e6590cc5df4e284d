"""Which container and Kubernetes pod a process runs in, from ``/proc/PID/cgroup``.

Every span, metric and profile of a process carries ``container.id`` and, under
Kubernetes, ``k8s.pod.uid``: the two keys the OpenTelemetry Collector's
``k8sattributes`` processor can join on to add pod, namespace, node and
workload names (deploy/ documents that pipeline). Read once per process with
the rest of its resource. Runtimes name the cgroup differently; all put the
64-hex container id in a path component, usually the last:

- cgroup v2, systemd driver: ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``
  (``crio-<id>.scope``, ``docker-<id>.scope``, ``libpod-<id>.scope``);
- cgroupfs driver and cgroup v1: ``/kubepods/burstable/pod<uid>/<id>``, ``/docker/<id>``.
"""

from __future__ import annotations

import re

_CONTAINER = re.compile(r"(?:^|[-:])([0-9a-f]{64})(?:\.scope)?$")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def container_attributes(cgroup_text: str) -> dict[str, str]:
    """``container.id`` and ``k8s.pod.uid`` found in a /proc/PID/cgroup text (either may be absent)."""
    out: dict[str, str] = {}
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1].rstrip()
        if not path or path == "/":
            continue
        if "container.id" not in out:
            for part in reversed(path.split("/")):  # the innermost: podman nests a "container" cgroup
                m = _CONTAINER.search(part)
                if m:
                    out["container.id"] = m.group(1)
                    break
        if "k8s.pod.uid" not in out:
            m = _POD.search(path)
            if m:
                out["k8s.pod.uid"] = m.group(1).replace("_", "-")
    return out
