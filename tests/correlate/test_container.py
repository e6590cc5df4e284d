"""container.id and k8s.pod.uid from the cgroup paths container runtimes really write."""

from __future__ import annotations

import os

import pytest

from otelbpf.correlate.container import container_attributes
from otelbpf.correlate.process_info import ProcessInfo

CID = "3f4e9c0a7b1d2e5f" * 4  # 64 hex digits
UID = "1d2c3b4a-5e6f-4a1b-8c9d-0e1f2a3b4c5d"


@pytest.mark.parametrize(
    "text, expected",
    [
        # cgroup v2, kubelet with the systemd driver, containerd
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope\n",
            {"container.id": CID, "k8s.pod.uid": UID},
        ),
        # cgroup v2, CRI-O; guaranteed QoS (no QoS slice)
        (
            f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
            {"container.id": CID, "k8s.pod.uid": UID},
        ),
        # cgroup v1, cgroupfs driver: several hierarchies, the same path
        (
            f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n",
            {"container.id": CID, "k8s.pod.uid": UID},
        ),
        (f"0::/system.slice/docker-{CID}.scope\n", {"container.id": CID}),
        (f"0::/machine.slice/libpod-{CID}.scope/container\n", {"container.id": CID}),  # podman's inner cgroup
        (f"0::/user.slice/{CID[:63]}\n", {}),  # 63 digits: not an id
        (f"1:name=systemd:/docker/{CID}\n", {"container.id": CID}),
        ("0::/user.slice/user-0.slice/session-3.scope\n", {}),
        ("0::/\n", {}),
        ("garbage without colons\n\n", {}),
    ],
)
def test_container_and_pod_from_cgroup_paths(text: str, expected: dict) -> None:
    assert container_attributes(text) == expected


def test_a_process_outside_containers_has_neither_attribute() -> None:
    res = ProcessInfo().resource(os.getpid())
    with open(f"/proc/{os.getpid()}/cgroup") as f:
        expected = container_attributes(f.read())
    assert {k: res.attributes.get(k) for k in ("container.id", "k8s.pod.uid") if k in res.attributes} == expected
