#!/usr/bin/env bash
# fakedev.sh COMMAND [ARG...]: run COMMAND where the real libibverbs finds one RDMA device,
# "fakeverbs0", served by the fakeverbs provider (examples/ibverbs/fakeverbs.c).
#
# libibverbs discovers devices in sysfs (SYSFS_PATH overrides /sys when netlink finds no RDMA
# subsystem, as on kernels without it), loads providers named in RDMAV_DRIVERS, and opens the
# device's character file /dev/infiniband/uverbsN. This script builds all three for one
# process tree only: a private mount namespace (unshare --mount) gets a tmpfs with the sysfs
# tree, an overlay on /dev holding infiniband/uverbs0 (a copy of /dev/null's device
# number: the provider never sends the kernel a command), and an empty /etc/libibverbs.d
# so no other provider is loaded. Nothing changes outside the namespace.
#
# COMMAND keeps this script's pid (each step execs the next), so a tracer watching the pid
# sees the program itself. Needs root (mount, mknod). Environment: FAKEVERBS_PROVIDER, the
# provider path without its -rdmav34.so suffix (default: build/examples/ibverbs/libfakeverbs
# under the repository); FAKEVERBS_* settings of the provider pass through.
set -euo pipefail

if [[ ${1:-} != --inside ]]; then
    [[ $# -gt 0 ]] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
    [[ $(id -u) -eq 0 ]] || { echo "$0: needs root (it mounts a private /dev overlay and tmpfs)" >&2; exit 2; }
    exec unshare --mount --propagation private -- "$0" --inside "$@"
fi
shift

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
provider=${FAKEVERBS_PROVIDER:-$root/build/examples/ibverbs/libfakeverbs}
[[ -e $provider-rdmav34.so ]] || {
    echo "$0: no provider at $provider-rdmav34.so (run examples/build.sh)" >&2
    exit 2
}

scratch=/run/otelbpf-fakeverbs  # an empty directory outside; a private tmpfs inside
mkdir -p "$scratch"
mount -t tmpfs fakeverbs "$scratch"

sys=$scratch/sys
verbs=$sys/class/infiniband_verbs
dev=$sys/class/infiniband/fakeverbs0
mkdir -p "$verbs/uverbs0" "$dev/ports/1/gids" "$dev/ports/1/gid_attrs/types"
echo 6 >"$verbs/abi_version"                 # uverbs ABI the library accepts (3..6)
echo fakeverbs0 >"$verbs/uverbs0/ibdev"
echo 1 >"$verbs/uverbs0/abi_version"         # the provider's device ABI
echo 1:3 >"$verbs/uverbs0/dev"               # matches the character file made below
echo "1: CA" >"$dev/node_type"
echo fe80:0000:0000:0000:0002:c903:00fa:0001 >"$dev/ports/1/gids/0"
echo "IB/RoCE v1" >"$dev/ports/1/gid_attrs/types/0"

# Only this provider: libibverbs would otherwise load every provider listed in
# /etc/libibverbs.d (ibverbs-providers), none of which has a device here.
if [[ -d /etc/libibverbs.d ]]; then
    mount -t tmpfs fakeverbs-conf /etc/libibverbs.d
fi

mkdir -p "$scratch/upper" "$scratch/work"
mount -t overlay fakeverbs-dev -o "lowerdir=/dev,upperdir=$scratch/upper,workdir=$scratch/work" /dev
mkdir -p /dev/infiniband
mknod /dev/infiniband/uverbs0 c 1 3

export SYSFS_PATH=$sys RDMAV_DRIVERS=$provider
exec "$@"
