#!/usr/bin/env bash
# Builds the CUDA stand-in libraries, the workload and the benchmark drivers into build/.
# Idempotent and quick when nothing changed: a target is rebuilt only when missing or older
# than one of its sources (or this script). Each is written under a temporary name and then
# renamed, so a test running beside a rebuild never loads half a file.
#
#   build/examples/fakecudart/libcudart.so.12   stand-in CUDA 12 runtime (examples/cuda/fakecudart.c)
#   build/examples/fakecudart13/libcudart.so.13 stand-in CUDA 13 runtime (the same, -DFAKECUDART_CUDA13)
#   build/examples/fakecuda/libcuda.so.1        stand-in CUDA driver    (examples/cuda/fakecuda.c)
#   build/examples/cuda_workload                the workload            (examples/cuda/workload.cpp)
#   build/examples/nvcc/nvcc_launches[.stripped], nvcc_launches_static, libnvcc_kernels.so,
#     nvcc_dlopen_host                          real nvcc 13 programs   (examples/cuda/nvcc/; needs nvcc)
#   build/bench/launch_loop                     benchmark driver        (bench/launch_loop.c)
#   build/bench/libnopfunc.so                   prologue variants       (examples/cuda/nopfunc.c)
#   build/bench/http_server                     HTTP/1.1 bench server   (bench/http_server.c)
#   build/examples/fakenccl/libnccl.so.2        stand-in NCCL           (examples/nccl/fakenccl.c)
#   build/examples/nccl_job                     multi-rank NCCL job     (examples/nccl/nccl_job.c)
#   build/bench/nccl_loop                       NCCL benchmark driver   (bench/nccl_loop.c)
#   build/examples/ibverbs/libfakeverbs-rdmav34.so  RDMA provider for the real libibverbs
#                                                   (examples/ibverbs/fakeverbs.c; needs libibverbs-dev)
#   build/examples/ibverbs_workload             NCCL-like ibverbs driver (examples/ibverbs/workload.c)
#   build/examples/fakenvml/libnvidia-ml.so.1   stand-in NVML (driver) (examples/fakenvml/fakenvml.c)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$root/examples/cuda
out=$root/build

# stale TARGET SOURCE...: true when TARGET is missing or older than a source or this script.
stale() {
    local target=$1 dep
    shift
    [[ -e $target ]] || return 0
    for dep in "$@" "${BASH_SOURCE[0]}"; do
        [[ $dep -nt $target ]] && return 0
    done
    return 1
}

# publish TMP TARGET: puts a finished build in place.
publish() {
    mv -f "$1" "$2"
    echo "built ${2#"$root"/}"
}

warn=(-Wall -Wextra -Werror)
# The stand-ins are built with CET like most distribution libraries, so their functions start
# with endbr64; push %rbp (examples/cuda/README.md says why the first instruction matters).
lib=(-O2 -g -fPIC -shared -pthread -fcf-protection=full -fno-omit-frame-pointer -fno-shrink-wrap
     -fno-optimize-sibling-calls "${warn[@]}")

# The runtime stand-ins call the driver stand-in: they dlopen it by soname, else next to them
# (../fakecuda/), else at the path it is built to here (FAKECUDA_DRIVER_BUILT).
driver_built=$out/examples/fakecuda/libcuda.so.1
rt_deps=("$src"/{fakecudart.c,cudadrv.h,ptrmap.h})
t=$out/examples/fakecudart/libcudart.so.12
if stale "$t" "${rt_deps[@]}" "$src/fakecudart.map"; then
    mkdir -p "${t%/*}"
    gcc "${lib[@]}" -DFAKECUDA_DRIVER_BUILT="\"$driver_built\"" -Wl,-soname,libcudart.so.12 \
        -Wl,--version-script="$src/fakecudart.map" "$src/fakecudart.c" -o "$t.$$" -ldl
    publish "$t.$$" "$t"
fi

# The same source in CUDA 13 mode: kernel handles from __cudaGetKernel, the __cudaLaunchKernel thunks.
t=$out/examples/fakecudart13/libcudart.so.13
if stale "$t" "${rt_deps[@]}" "$src/fakecudart13.map"; then
    mkdir -p "${t%/*}"
    gcc "${lib[@]}" -DFAKECUDART_CUDA13 -DFAKECUDA_DRIVER_BUILT="\"$driver_built\"" -Wl,-soname,libcudart.so.13 \
        -Wl,--version-script="$src/fakecudart13.map" "$src/fakecudart.c" -o "$t.$$" -ldl
    publish "$t.$$" "$t"
fi

t=$driver_built
if stale "$t" "$src"/{fakecuda.c,fakecuda.map,cudadrv.h,ptrmap.h,devmem.c,devmem.h,streams.c,streams.h}; then
    mkdir -p "${t%/*}"
    gcc "${lib[@]}" -Wl,-soname,libcuda.so.1 -Wl,--version-script="$src/fakecuda.map" \
        "$src/fakecuda.c" "$src/devmem.c" "$src/streams.c" -o "$t.$$" -ldl
    publish "$t.$$" "$t"
fi

# -rdynamic puts the kernel stubs in the dynamic symbol table so the workload can name them
# with dladdr; -fno-ipa-icf keeps the compiler from merging look-alike stubs.
t=$out/examples/cuda_workload
if stale "$t" "$src/workload.cpp"; then
    mkdir -p "${t%/*}"
    g++ -std=c++17 -O2 -g -fno-omit-frame-pointer -fno-ipa-icf -rdynamic "${warn[@]}" \
        "$src/workload.cpp" -o "$t.$$" -ldl -lpthread
    publish "$t.$$" "$t"
fi

# Real nvcc 13 programs (examples/cuda/nvcc/): with the shared runtime (and a stripped copy), with
# nvcc's default static runtime, and a stripped nvcc-built library that a host program dlopens.
nvcc=/usr/local/cuda-13.0/bin/nvcc
[[ -x $nvcc ]] || nvcc=$(command -v nvcc || true)
nv=$src/nvcc
if [[ -n $nvcc ]]; then
    nvout=$out/examples/nvcc
    mkdir -p "$nvout"
    nvflags=(-O2 -g --extended-lambda -Xcompiler -fno-omit-frame-pointer)
    t=$nvout/nvcc_launches
    if stale "$t" "$nv"/{launches.cu,report.h}; then
        "$nvcc" "${nvflags[@]}" -cudart shared "$nv/launches.cu" -o "$t.$$"
        publish "$t.$$" "$t"
    fi
    if stale "$t.stripped" "$t"; then
        strip -o "$t.stripped.$$" "$t"
        publish "$t.stripped.$$" "$t.stripped"
    fi
    t=$nvout/nvcc_launches_static
    if stale "$t" "$nv"/{launches.cu,report.h}; then
        "$nvcc" "${nvflags[@]}" "$nv/launches.cu" -o "$t.$$" -ldl
        publish "$t.$$" "$t"
    fi
    t=$nvout/libnvcc_kernels.so
    if stale "$t" "$nv"/{kernels_lib.cu,report.h}; then
        "$nvcc" "${nvflags[@]}" -shared -Xcompiler -fPIC -cudart shared "$nv/kernels_lib.cu" -o "$t.$$"
        strip "$t.$$"
        publish "$t.$$" "$t"
    fi
    t=$nvout/nvcc_dlopen_host
    if stale "$t" "$nv/dlopen_host.c"; then
        gcc -O2 -g -fno-omit-frame-pointer "${warn[@]}" "$nv/dlopen_host.c" -o "$t.$$" -ldl
        publish "$t.$$" "$t"
    fi
elif [[ ${CI:-} == true ]]; then
    echo "build.sh: no nvcc (looked at /usr/local/cuda-13.0/bin/nvcc and PATH); CI needs the CUDA 13 toolkit" >&2
    exit 1
else
    echo "skipped the nvcc examples: no nvcc (/usr/local/cuda-13.0/bin/nvcc or on PATH)"
fi

t=$out/bench/launch_loop
if stale "$t" "$root/bench/launch_loop.c"; then
    mkdir -p "${t%/*}"
    gcc -O2 -g -fno-omit-frame-pointer "${warn[@]}" "$root/bench/launch_loop.c" -o "$t.$$" -ldl
    publish "$t.$$" "$t"
fi

# No -fcf-protection here: the prologues are hand-written and must stay exactly as written.
t=$out/bench/libnopfunc.so
if stale "$t" "$src/nopfunc.c"; then
    mkdir -p "${t%/*}"
    gcc -O2 -g -fPIC -shared "${warn[@]}" "$src/nopfunc.c" -o "$t.$$"
    publish "$t.$$" "$t"
fi

# The stand-in NCCL queues its completions on the stand-in runtime's streams, so it links
# against that copy (found next to it through the RUNPATH).
nccl=$root/examples/nccl
t=$out/examples/fakenccl/libnccl.so.2
if stale "$t" "$nccl"/{fakenccl.c,fakenccl.map} "$out/examples/fakecudart/libcudart.so.12"; then
    mkdir -p "${t%/*}"
    gcc "${lib[@]}" -Wl,-soname,libnccl.so.2 -Wl,--version-script="$nccl/fakenccl.map" "$nccl/fakenccl.c" \
        -L"$out/examples/fakecudart" -l:libcudart.so.12 -Wl,-rpath,'$ORIGIN/../fakecudart' -o "$t.$$"
    publish "$t.$$" "$t"
fi

t=$out/examples/nccl_job
if stale "$t" "$nccl/nccl_job.c"; then
    mkdir -p "${t%/*}"
    gcc -O2 -g -fno-omit-frame-pointer "${warn[@]}" "$nccl/nccl_job.c" -o "$t.$$" -ldl
    publish "$t.$$" "$t"
fi

t=$out/bench/nccl_loop
if stale "$t" "$root/bench/nccl_loop.c"; then
    mkdir -p "${t%/*}"
    gcc -O2 -g -fno-omit-frame-pointer "${warn[@]}" "$root/bench/nccl_loop.c" -o "$t.$$" -ldl
    publish "$t.$$" "$t"
fi

# ibverbs: built against the real <infiniband/verbs.h> (libibverbs-dev, scripts/setup.sh --test installs it).
ibv=$root/examples/ibverbs
if [[ -e /usr/include/infiniband/verbs.h ]]; then
    t=$out/examples/ibverbs/libfakeverbs-rdmav34.so
    if stale "$t" "$ibv"/{fakeverbs.c,fakeverbs.map,verbs_private.h}; then
        mkdir -p "${t%/*}"
        gcc "${lib[@]}" -Wl,--version-script="$ibv/fakeverbs.map" "$ibv/fakeverbs.c" -o "$t.$$" -libverbs
        publish "$t.$$" "$t"
    fi
    t=$out/examples/ibverbs_workload
    if stale "$t" "$ibv/workload.c"; then
        mkdir -p "${t%/*}"
        gcc -O2 -g -fno-omit-frame-pointer "${warn[@]}" "$ibv/workload.c" -o "$t.$$" -ldl
        publish "$t.$$" "$t"
    fi
else
    echo "skipped the ibverbs examples: no /usr/include/infiniband/verbs.h (apt-get install libibverbs-dev, or run scripts/setup.sh --test)"
fi

t=$out/bench/http_server
if stale "$t" "$root/bench/http_server.c"; then
    mkdir -p "${t%/*}"
    gcc -O2 -g "${warn[@]}" "$root/bench/http_server.c" -o "$t.$$"
    publish "$t.$$" "$t"
fi

# Profiling workloads (examples/profiling/): a CPython extension with a hot C function, and a
# native program spinning in a library of its own; all with frame pointers, so their native
# frames chain.
prof=$root/examples/profiling
py=$root/.venv/bin/python
t=$out/examples/profiling/hotext.so
if [[ -x $py ]] && stale "$t" "$prof/hotext.c"; then
    mkdir -p "${t%/*}"
    inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    gcc -O2 -g -fPIC -shared -fno-omit-frame-pointer -I"$inc" "${warn[@]}" "$prof/hotext.c" -o "$t.$$"
    publish "$t.$$" "$t"
fi

t=$out/examples/profiling/libspin.so
if stale "$t" "$prof/libspin.c"; then
    mkdir -p "${t%/*}"
    gcc -O2 -g -fPIC -shared -fno-omit-frame-pointer "${warn[@]}" "$prof/libspin.c" -o "$t.$$"
    publish "$t.$$" "$t"
fi

t=$out/examples/profiling/spinner
if stale "$t" "$prof/spinner.c" "$out/examples/profiling/libspin.so"; then
    gcc -O2 -g -fno-omit-frame-pointer "${warn[@]}" "$prof/spinner.c" -o "$t.$$" \
        -L"$out/examples/profiling" -lspin -Wl,-rpath,'$ORIGIN'
    publish "$t.$$" "$t"
fi

# A stand-in for the driver's NVML (examples/fakenvml/fakenvml.c): the gpu receiver's tests put
# its folder on LD_LIBRARY_PATH, where pynvml's CDLL("libnvidia-ml.so.1") finds it.
t=$out/examples/fakenvml/libnvidia-ml.so.1
if stale "$t" "$root/examples/fakenvml/fakenvml.c"; then
    mkdir -p "${t%/*}"
    gcc "${lib[@]}" -Wl,-soname,libnvidia-ml.so.1 "$root/examples/fakenvml/fakenvml.c" -o "$t.$$"
    publish "$t.$$" "$t"
fi
