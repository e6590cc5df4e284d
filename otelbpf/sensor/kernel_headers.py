"""Kernel headers for BCC's compile when the node has none for its kernel.

BCC compiles the probes against ``/lib/modules/$(uname -r)/build`` (or the kernel's own
``/sys/kernel/kheaders.tar.xz``). GPU node images often have neither (COS, Bottlerocket,
Flatcar), and the agent then could not start. It needs no header of *this* kernel: the probes
read no kernel struct (``bpf/common.h`` includes only ``uapi/linux/ptrace.h`` besides BCC's
own helpers), so any kernel's headers compile them to the same programs. When the running
kernel's are missing, ``fallback`` picks the newest headers installed under ``/usr/src``, else
the agent image's own (Debian's ``linux-headers-<arch>``; ``scripts/setup.sh`` does the same on
a host by linking them), and points BCC at them with ``BCC_KERNEL_SOURCE``."""

from __future__ import annotations

import atexit
import glob
import os
import re
import shutil
import tempfile

#: Where kernel headers are looked for: the distribution's place (the host's, in a pod that
#: mounts it), then the agent image's own copy (deploy/docker/Dockerfile: Debian's, unpacked
#: there because the DaemonSet mounts the host's /usr/src over the image's).
HEADER_ROOTS = ("/usr/src", "/opt/otelbpf/kernel-headers/usr/src")
KHEADERS = "/sys/kernel/kheaders.tar.xz"


def _version_key(path: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", os.path.basename(path))]


def installed(*roots: str) -> tuple[str, str] | None:
    """The newest headers under the first of ``roots`` (default ``HEADER_ROOTS``) that has any:
    (build dir, source dir), the same dir when the package is not split (Debian splits
    ``-<arch>``, with ``include/generated``, from ``-common``)."""
    for root in roots or HEADER_ROOTS:
        builds = [
            d for d in glob.glob(os.path.join(root, "linux-headers-*")) if os.path.isdir(f"{d}/include/generated")
        ]
        if builds:
            break
    else:
        return None
    build = max(builds, key=_version_key)
    common = re.sub(r"-[^-]+$", "-common", build)
    return build, common if common != build and os.path.isdir(f"{common}/include") else build


def _merge(build: str, source: str, into: str) -> None:
    """One tree of links over a split headers package. BCC takes ``BCC_KERNEL_SOURCE`` as one
    tree (it splits ``build``/``source`` only under ``/lib/modules``), and Debian's ``-<arch>``
    package holds only the generated headers, ``-common`` the rest: where both have a folder,
    it is made here and its entries linked, else the entry is linked whole (a few hundred links)."""
    names = set(os.listdir(build)) | set(os.listdir(source))
    for name in sorted(names):
        b, s, here = os.path.join(build, name), os.path.join(source, name), os.path.join(into, name)
        if os.path.isdir(b) and os.path.isdir(s) and not os.path.islink(b):
            os.mkdir(here)
            _merge(b, s, here)
        else:
            os.symlink(b if os.path.lexists(b) else s, here)


def fallback(
    release: str | None = None,
    modules: str = "/lib/modules",
    roots: tuple[str, ...] = HEADER_ROOTS,
    kheaders: str = KHEADERS,
) -> str | None:
    """When BCC would find no headers for the running kernel, point it at the newest installed
    ones (``BCC_KERNEL_SOURCE``: them, or a private tree of links merging a split package's two
    halves, removed at exit) and return a sentence saying so; None when nothing was changed (headers
    there, ``BCC_KERNEL_SOURCE`` already set, or no headers at all: BCC's error then says so,
    and ``otelbpf doctor`` what to install)."""
    release = release or os.uname().release
    if os.environ.get("BCC_KERNEL_SOURCE") or os.path.isdir(f"{modules}/{release}/build/include"):
        return None
    if os.path.isfile(kheaders):
        return None  # BCC extracts the kernel's own headers by itself
    found = installed(*roots)
    if found is None:
        return None
    build, source = found
    if source == build:
        os.environ["BCC_KERNEL_SOURCE"] = build
    else:
        folder = tempfile.mkdtemp(prefix="otelbpf-kernel-")  # 0700, the agent's
        atexit.register(shutil.rmtree, folder, True)
        _merge(build, source, folder)
        os.environ["BCC_KERNEL_SOURCE"] = folder
    return (
        f"no kernel headers for {release} ({modules}/{release}/build, {kheaders}): compiling against "
        f"{build}; the probes read no kernel struct, so another release's headers do"
    )
