/*
 * cuda_workload: drives a CUDA runtime library (NVIDIA's real libcudart.so.12 or the
 * stand-in built from fakecudart.c) through a fixed, fully parameterised call sequence and
 * prints as one JSON line on stdout exactly what it called, so tests can compare that with
 * what the agent observed.
 *
 * The library is loaded with dlopen from --lib at run time, as frameworks do, so tests can
 * put it anywhere and load it late. Kernels are launched the way nvcc's host stubs launch
 * them: each "kernel" below is a C++ function that passes its own address as the `func`
 * argument of cudaLaunchKernel, so the agent must symbolise and demangle it as on a GPU host.
 */
#include <cxxabi.h>
#include <dlfcn.h>
#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

struct dim3 {
    unsigned x, y, z;
};
using cudaStream_t = void *;
struct cudaLaunchConfig_t {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;
    unsigned numAttrs;
};
using CUdeviceptr = unsigned long long;
using CUfunction = void *;
struct CUlaunchConfig {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned numAttrs;
};
enum { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };
struct CUDA_MEMCPY2D { // cuda.h's layout
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch, dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch, WidthInBytes, Height;
};
struct CUDA_MEMCPY3D {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray, *reserved0;
    size_t srcPitch, srcHeight, dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray, *reserved1;
    size_t dstPitch, dstHeight, WidthInBytes, Height, Depth;
};
struct CUmemAllocationProp { // cuda.h's layout: pinned device memory on device 0
    int type, requestedHandleTypes;
    struct {
        int type, id;
    } location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType, gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
};
struct CUmemAccessDesc {
    struct {
        int type, id;
    } location;
    int flags;
};
constexpr unsigned fatbin_magic = 0x466243b1; // __fatBinC_Wrapper_t, as nvcc emits it
struct FatbinWrapper {
    unsigned magic, version;
    const void *data;
    void *filename_or_fatbins;
};

static const char usage[] = R"(usage: cuda_workload --lib PATH [options]

Loads a CUDA runtime library with dlopen and runs, on each of --threads threads, --iterations
iterations of:
  cudaMalloc(alloc-bytes)
  cudaMemcpy H2D (h2d-bytes; skipped if 0)         --async: cudaMemcpyAsync on the thread's stream
  launches-per-iter kernel launches, cycling through vector_add, ml::softmax_forward and
    at::native::elementwise_kernel<128, 4> (cudaLaunchKernel, or cudaLaunchKernel_ptsz with
    --ptsz, or cudaLaunchKernelExC with --launch-ex)
  graph-launches x cudaGraphLaunch
  cudaMemcpy D2H (d2h-bytes; skipped if 0)         --async: cudaMemcpyAsync, then cudaStreamSynchronize
  cudaDeviceSynchronize
  cudaFree
  with --driver-lib, also cuMemAlloc_v2, launches-per-iter x cuLaunchKernel (cuLaunchKernelEx with
    --launch-ex) and cuMemFree_v2
then cudaGetLastError, and cudaGetErrorString once per distinct error code seen. Prints a JSON
summary (calls made, return codes, bytes copied, kernels launched) on stdout.

options:
  --lib PATH                    CUDA runtime library to dlopen (required)
  --driver-lib PATH             also dlopen this driver library (libcuda.so.1); calls cuInit(0) and
                                cuModuleGetFunction for two kernel names once, then the driver calls above
  --iterations N                iterations per thread (default 10)
  --launches-per-iter N         kernel launches per iteration (default 8)
  --alloc-bytes N               bytes per cudaMalloc (default 1048576)
  --h2d-bytes N                 bytes per host-to-device copy, at most alloc-bytes (default 1048576)
  --d2h-bytes N                 bytes per device-to-host copy, at most alloc-bytes (default 1048576)
  --async                       copy with cudaMemcpyAsync on a per-thread stream handle (0x5eed0001 for
                                thread 0, ...) and wait with cudaStreamSynchronize; launches use that stream
  --ptsz                        call the _ptsz (per-thread default stream) variants
  --launch-ex                   launch with cudaLaunchKernelExC / cuLaunchKernelEx (not with --ptsz)
  --graph-launches N            cudaGraphLaunch calls per iteration (default 0)
  --cuda13                      launch as nvcc 13's code does (the library must be a CUDA 13 runtime): register
                                the kernels at load (__cudaRegisterFatBinary, __cudaRegisterFunction with the
                                mangled names, __cudaRegisterFatBinaryEnd); each launch site calls
                                __cudaPushCallConfiguration, then the host function, whose __device_stub__
                                calls __cudaGetKernel once (first launch), __cudaPopCallConfiguration and
                                __cudaLaunchKernel (__cudaLaunchKernel_ptsz with --ptsz). With --launch-ex:
                                cudaLaunchKernelExC with the host function, as cudaLaunchKernelEx does
  --register-late               with --cuda13, register after --wait-for-file instead of right after loading
  --events                      per iteration after the launches: cudaEventRecord, cudaStreamWaitEvent,
                                cudaEventQuery, cudaEventSynchronize on one event per thread (cudaEventCreate
                                before, cudaEventDestroy after the iterations)
  --async-alloc                 cudaMallocAsync / cudaFreeAsync on the thread's stream instead of cudaMalloc /
                                cudaFree
  --host-memory KIND            the host buffers copies use: pageable (default), registered (cudaHostRegister
                                before, cudaHostUnregister after) or pinned (cudaMallocHost / cudaFreeHost)
  --driver-copies               (with --driver-lib) per iteration on the driver allocation, each of h2d-bytes:
                                cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemcpyDtoD_v2, cuMemcpy, cuMemcpyHtoDAsync_v2,
                                cuMemcpyDtoHAsync_v2, cuStreamSynchronize, cuMemcpy2D_v2 (4 rows), cuMemcpy3D_v2
                                (4 rows), cuCtxSynchronize
  --vmm                         (with --driver-lib) per iteration: cuMemGetAllocationGranularity,
                                cuMemAddressReserve (2 grains), cuMemCreate (1 grain), cuMemMap, cuMemSetAccess,
                                cuMemUnmap, cuMemRelease, cuMemAddressFree
  --driver-ptsz                 driver launches with cuLaunchKernel_ptsz / cuLaunchKernelEx_ptsz
  --driver-graph-launches N     (with --driver-lib) cuGraphLaunch calls per iteration (default 0)
  --threads N                   run the sequence on N threads; thread 0 is the main thread (default 1)
  --leak N                      before the iterations, cudaMalloc N buffers of alloc-bytes, never freed
  --exit-midway                 in iteration iterations/2 of thread 0, right after the H2D copy (its buffer
                                still allocated), start a helper thread that launches about 2 s of kernels
                                (at FAKECUDA_KERNEL_US each, default 50) on stream 0x5eedffff and calls
                                cudaStreamSynchronize on it; once it is inside that call, print the summary
                                and _exit(0). With the fake library the helper is then blocked in the sync.
  --delay-before-dlopen-ms N    sleep before loading the libraries
  --delay-after-dlopen-ms N     sleep after loading them
  --wait-for-file PATH          after loading, wait until PATH exists before the first CUDA call
  --delay-before-exit-ms N      sleep after printing the summary
  --help                        print this text

JSON: "driver_calls" is the stand-in driver's own count of each of its entry points called (nonzero
ones; null when no stand-in libcuda.so.1 is loaded): the runtime stand-in calls it for every call.
"calls" counts each function's calls at entry; "return_codes" counts the codes returned (a call
still running at an --exit-midway exit is in "calls" only); "memcpy" sums the bytes asked for per direction
whatever the call returned; "roundtrip" compares each iteration's D2H bytes with its H2D bytes when both
copies returned 0 (with a GPU-less real libcudart nothing is checked).
)";

struct Options {
    std::string lib, driver_lib, wait_for_file;
    uint64_t iterations = 10, launches_per_iter = 8, graph_launches = 0, threads = 1, leak = 0;
    uint64_t alloc_bytes = 1 << 20, h2d_bytes = 1 << 20, d2h_bytes = 1 << 20;
    uint64_t delay_before_dlopen_ms = 0, delay_after_dlopen_ms = 0, delay_before_exit_ms = 0;
    uint64_t driver_graph_launches = 0;
    bool async = false, ptsz = false, launch_ex = false, exit_midway = false;
    bool cuda13 = false, register_late = false, events = false, async_alloc = false;
    bool driver_copies = false, vmm = false, driver_ptsz = false;
    std::string host_memory = "pageable";
};
static Options opt;

// Every function the workload calls, in the order the summary lists them.
enum Fn {
    Malloc, Free, Memcpy, MemcpyAsync, MemcpyAsyncPtsz, StreamSync, StreamSyncPtsz, DeviceSync, LaunchKernel,
    LaunchKernelPtsz, LaunchKernelExC, GraphLaunch, GetLastError, GetErrorString,
    RegisterFatBinary, RegisterFunction, RegisterFatBinaryEnd, PushCallConfiguration, PopCallConfiguration,
    GetKernel, LaunchKernelThunk, LaunchKernelThunkPtsz, MallocAsync, FreeAsync, EventCreate, EventRecord,
    EventQuery, EventSynchronize, EventDestroy, StreamWaitEvent, HostRegister, HostUnregister, MallocHost, FreeHost,
    CuInit, CuModuleGetFunction, CuMemAlloc, CuMemFree, CuLaunchKernel, CuLaunchKernelEx, CuLaunchKernelPtsz,
    CuLaunchKernelExPtsz, CuGraphLaunch, CuMemcpyHtoD, CuMemcpyDtoH, CuMemcpyDtoD, CuMemcpy, CuMemcpyHtoDAsync,
    CuMemcpyDtoHAsync, CuMemcpy2D, CuMemcpy3D, CuStreamSynchronize, CuCtxSynchronize, CuMemGetAllocationGranularity,
    CuMemAddressReserve, CuMemCreate, CuMemMap, CuMemSetAccess, CuMemUnmap, CuMemRelease, CuMemAddressFree, FnCount
};
static const char *const fn_names[FnCount] = {
    "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpyAsync_ptsz", "cudaStreamSynchronize",
    "cudaStreamSynchronize_ptsz", "cudaDeviceSynchronize", "cudaLaunchKernel", "cudaLaunchKernel_ptsz",
    "cudaLaunchKernelExC", "cudaGraphLaunch", "cudaGetLastError", "cudaGetErrorString",
    "__cudaRegisterFatBinary", "__cudaRegisterFunction", "__cudaRegisterFatBinaryEnd", "__cudaPushCallConfiguration",
    "__cudaPopCallConfiguration", "__cudaGetKernel", "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz",
    "cudaMallocAsync", "cudaFreeAsync", "cudaEventCreate", "cudaEventRecord", "cudaEventQuery", "cudaEventSynchronize",
    "cudaEventDestroy", "cudaStreamWaitEvent", "cudaHostRegister", "cudaHostUnregister", "cudaMallocHost",
    "cudaFreeHost",
    "cuInit", "cuModuleGetFunction", "cuMemAlloc_v2", "cuMemFree_v2", "cuLaunchKernel", "cuLaunchKernelEx",
    "cuLaunchKernel_ptsz", "cuLaunchKernelEx_ptsz", "cuGraphLaunch", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2", "cuMemcpy", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpy2D_v2", "cuMemcpy3D_v2",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemCreate",
    "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "cuMemAddressFree",
};

struct Runtime {
    int (*cudaMalloc)(void **, size_t);
    int (*cudaFree)(void *);
    int (*cudaMemcpy)(void *, const void *, size_t, int);
    int (*cudaMemcpyAsync)(void *, const void *, size_t, int, cudaStream_t);
    int (*cudaMemcpyAsync_ptsz)(void *, const void *, size_t, int, cudaStream_t);
    int (*cudaStreamSynchronize)(cudaStream_t);
    int (*cudaStreamSynchronize_ptsz)(cudaStream_t);
    int (*cudaDeviceSynchronize)();
    int (*cudaLaunchKernel)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
    int (*cudaLaunchKernel_ptsz)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
    int (*cudaLaunchKernelExC)(const cudaLaunchConfig_t *, const void *, void **);
    int (*cudaGraphLaunch)(void *, cudaStream_t);
    int (*cudaGetLastError)();
    const char *(*cudaGetErrorString)(int);
    // --cuda13
    void **(*__cudaRegisterFatBinary)(void *);
    void (*__cudaRegisterFunction)(void **, const char *, char *, const char *, int, void *, void *, void *, void *,
                                   int *);
    void (*__cudaRegisterFatBinaryEnd)(void **);
    unsigned (*__cudaPushCallConfiguration)(dim3, dim3, size_t, void *);
    int (*__cudaPopCallConfiguration)(dim3 *, dim3 *, size_t *, void *);
    int (*__cudaGetKernel)(void **, const void *);
    int (*__cudaLaunchKernel)(void *, dim3, dim3, void **, size_t, cudaStream_t);
    int (*__cudaLaunchKernel_ptsz)(void *, dim3, dim3, void **, size_t, cudaStream_t);
    // --async-alloc, --events, --host-memory
    int (*cudaMallocAsync)(void **, size_t, cudaStream_t);
    int (*cudaFreeAsync)(void *, cudaStream_t);
    int (*cudaEventCreate)(void **);
    int (*cudaEventRecord)(void *, cudaStream_t);
    int (*cudaEventQuery)(void *);
    int (*cudaEventSynchronize)(void *);
    int (*cudaEventDestroy)(void *);
    int (*cudaStreamWaitEvent)(cudaStream_t, void *, unsigned);
    int (*cudaHostRegister)(void *, size_t, unsigned);
    int (*cudaHostUnregister)(void *);
    int (*cudaMallocHost)(void **, size_t);
    int (*cudaFreeHost)(void *);
};
struct Driver {
    int (*cuInit)(unsigned);
    int (*cuModuleGetFunction)(CUfunction *, void *, const char *);
    int (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
    int (*cuMemFree_v2)(CUdeviceptr);
    int (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                          void **, void **);
    int (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    int (*cuLaunchKernel_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               void *, void **, void **);
    int (*cuLaunchKernelEx_ptsz)(const CUlaunchConfig *, CUfunction, void **, void **);
    int (*cuGraphLaunch)(void *, void *);
    int (*cuMemcpyHtoD_v2)(CUdeviceptr, const void *, size_t);
    int (*cuMemcpyDtoH_v2)(void *, CUdeviceptr, size_t);
    int (*cuMemcpyDtoD_v2)(CUdeviceptr, CUdeviceptr, size_t);
    int (*cuMemcpy)(CUdeviceptr, CUdeviceptr, size_t);
    int (*cuMemcpyHtoDAsync_v2)(CUdeviceptr, const void *, size_t, void *);
    int (*cuMemcpyDtoHAsync_v2)(void *, CUdeviceptr, size_t, void *);
    int (*cuMemcpy2D_v2)(const CUDA_MEMCPY2D *);
    int (*cuMemcpy3D_v2)(const CUDA_MEMCPY3D *);
    int (*cuStreamSynchronize)(void *);
    int (*cuCtxSynchronize)();
    int (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
    int (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    int (*cuMemCreate)(unsigned long long *, size_t, const CUmemAllocationProp *, unsigned long long);
    int (*cuMemMap)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
    int (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    int (*cuMemUnmap)(CUdeviceptr, size_t);
    int (*cuMemRelease)(unsigned long long);
    int (*cuMemAddressFree)(CUdeviceptr, size_t);
};
static Runtime rt;
static Driver drv;

struct Stats {
    std::atomic<uint64_t> calls[FnCount]{};
    std::mutex mu;
    std::map<int, uint64_t> return_codes[FnCount]; // guarded by mu
    std::vector<long> tids;                        // by thread index; guarded by mu
    std::atomic<uint64_t> h2d_calls{0}, h2d_bytes{0}, d2h_calls{0}, d2h_bytes{0};
    std::atomic<uint64_t> roundtrip_checked{0}, roundtrip_mismatched{0};
    std::map<std::string, std::pair<uint64_t, uint64_t>> driver_memcpy; // function -> calls, bytes; guarded by mu
    struct HostBuffers {
        const void *in, *out;
    };
    std::vector<HostBuffers> host_buffers; // by thread index; guarded by mu
};
static Stats stats;

static void record(Fn fn, int rc)
{
    std::lock_guard<std::mutex> g(stats.mu);
    stats.return_codes[fn][rc]++;
}

// Calls f, counting the call before it starts and its return code after it returns.
template <typename R, typename... P, typename... A> static R call(Fn fn, R (*f)(P...), A... args)
{
    stats.calls[fn]++;
    if constexpr (std::is_void_v<R>) {
        f(args...);
    } else {
        R rc = f(args...);
        if constexpr (std::is_same_v<R, int>)
            record(fn, rc);
        return rc;
    }
}

// ---- kernels: host stubs launched the way nvcc's generated code launches them

struct LaunchConfig {
    dim3 grid, block;
    size_t shared_mem;
    cudaStream_t stream;
};
static thread_local LaunchConfig next_launch; // what nvcc's <<<...>>> pushes before calling the stub

static void launch_stub(const void *func, void **args)
{
    const LaunchConfig &c = next_launch;
    if (opt.launch_ex) {
        cudaLaunchConfig_t config{c.grid, c.block, c.shared_mem, c.stream, nullptr, 0};
        call(LaunchKernelExC, rt.cudaLaunchKernelExC, (const cudaLaunchConfig_t *)&config, func, args);
    } else if (opt.ptsz) {
        call(LaunchKernelPtsz, rt.cudaLaunchKernel_ptsz, func, c.grid, c.block, args, c.shared_mem, c.stream);
    } else {
        call(LaunchKernel, rt.cudaLaunchKernel, func, c.grid, c.block, args, c.shared_mem, c.stream);
    }
}

// --cuda13: what nvcc 13 puts in each __device_stub__ (crt/host_runtime.h's __cudaLaunch): the handle
// from __cudaGetKernel once per call site (a static guard; the first launch of that kernel), then
// __cudaPopCallConfiguration and __cudaLaunchKernel. Inlined, so the thunk is called from the stub
// itself and cudaLaunchKernel's return address lies in the stub, as in nvcc's code.
static void *kernel_handles[3];
static int get_kernel_rc[3] = {-1, -1, -1}; // -1: __cudaGetKernel not called
template <int K> __attribute__((always_inline)) inline void cuda13_launch(const void *host_fun, void **args)
{
    static const bool got = (get_kernel_rc[K] = call(GetKernel, rt.__cudaGetKernel, &kernel_handles[K], host_fun), true);
    (void)got;
    dim3 grid, block;
    size_t shared_mem;
    cudaStream_t stream;
    if (call(PopCallConfiguration, rt.__cudaPopCallConfiguration, &grid, &block, &shared_mem, (void *)&stream) != 0)
        return;
    Fn fn = opt.ptsz ? LaunchKernelThunkPtsz : LaunchKernelThunk;
    stats.calls[fn]++;
    int rc = opt.ptsz ? rt.__cudaLaunchKernel_ptsz(kernel_handles[K], grid, block, args, shared_mem, stream)
                      : rt.__cudaLaunchKernel(kernel_handles[K], grid, block, args, shared_mem, stream);
    record(fn, rc);
}
static bool nvcc13_stubs() { return opt.cuda13 && !opt.launch_ex; }

void vector_add(float *a, float *b, float *c, int n);
__attribute__((noinline)) void __device_stub__Z10vector_addPfS_S_i(float *a, float *b, float *c, int n)
{
    void *args[] = {&a, &b, &c, &n};
    cuda13_launch<0>(reinterpret_cast<const void *>(&vector_add), args);
}
__attribute__((noinline)) void vector_add(float *a, float *b, float *c, int n)
{
    if (nvcc13_stubs())
        return __device_stub__Z10vector_addPfS_S_i(a, b, c, n);
    void *args[] = {&a, &b, &c, &n};
    launch_stub(reinterpret_cast<const void *>(&vector_add), args);
}

namespace ml {
void softmax_forward(float *out, const float *in, int rows);
}
__attribute__((noinline)) void __device_stub__ZN2ml15softmax_forwardEPfPKfi(float *out, const float *in, int rows)
{
    void *args[] = {&out, &in, &rows};
    cuda13_launch<1>(reinterpret_cast<const void *>(&ml::softmax_forward), args);
}
namespace ml {
__attribute__((noinline)) void softmax_forward(float *out, const float *in, int rows)
{
    if (nvcc13_stubs())
        return __device_stub__ZN2ml15softmax_forwardEPfPKfi(out, in, rows);
    void *args[] = {&out, &in, &rows};
    launch_stub(reinterpret_cast<const void *>(&softmax_forward), args);
}
} // namespace ml

namespace at::native {
template <int block_threads, int items_per_thread> void elementwise_kernel(int n, float *data);
}
__attribute__((noinline)) void __device_stub__ZN2at6native18elementwise_kernelILi128ELi4EEEviPf(int n, float *data)
{
    void *args[] = {&n, &data};
    cuda13_launch<2>(reinterpret_cast<const void *>(&at::native::elementwise_kernel<128, 4>), args);
}
namespace at::native {
template <int block_threads, int items_per_thread> __attribute__((noinline)) void elementwise_kernel(int n, float *data)
{
    if (nvcc13_stubs())
        return __device_stub__ZN2at6native18elementwise_kernelILi128ELi4EEEviPf(n, data);
    void *args[] = {&n, &data};
    launch_stub(reinterpret_cast<const void *>(&elementwise_kernel<block_threads, items_per_thread>), args);
}
template void elementwise_kernel<128, 4>(int, float *);
} // namespace at::native
static const void *const device_stubs[] = {
    reinterpret_cast<const void *>(&__device_stub__Z10vector_addPfS_S_i),
    reinterpret_cast<const void *>(&__device_stub__ZN2ml15softmax_forwardEPfPKfi),
    reinterpret_cast<const void *>(&__device_stub__ZN2at6native18elementwise_kernelILi128ELi4EEEviPf),
};

struct Kernel {
    const void *address;
    dim3 block;
    unsigned items_per_block; // grid.x = ceil(elements / items_per_block)
    unsigned grid_y;
    size_t shared_mem;
    void (*stub)(float *dev, int elements); // calls the host stub with the kernel's own arguments
    std::atomic<uint64_t> launches{0};
    dim3 grid(int elements) const
    {
        return {std::max(1u, (unsigned)((elements + (uint64_t)items_per_block - 1) / items_per_block)), grid_y, 1};
    }
};
static Kernel kernels[] = {
    {reinterpret_cast<const void *>(&vector_add), {256, 1, 1}, 256, 1, 0,
     [](float *d, int n) { vector_add(d, d, d, n); }},
    {reinterpret_cast<const void *>(&ml::softmax_forward), {128, 1, 1}, 512, 4, 1024,
     [](float *d, int n) { ml::softmax_forward(d, d, n); }},
    {reinterpret_cast<const void *>(&at::native::elementwise_kernel<128, 4>), {128, 1, 1}, 512, 1, 0,
     [](float *d, int n) { at::native::elementwise_kernel<128, 4>(n, d); }},
};
constexpr size_t kernel_count = sizeof kernels / sizeof kernels[0];

// With --cuda13 the launch site pushes the configuration (nvcc's <<<>>>), then calls the host function.
static void launch(Kernel &k, float *dev, int elements, cudaStream_t stream)
{
    k.launches++;
    next_launch = {k.grid(elements), k.block, k.shared_mem, stream};
    if (nvcc13_stubs() && call(PushCallConfiguration, rt.__cudaPushCallConfiguration, k.grid(elements), k.block,
                               k.shared_mem, (void *)stream) != 0)
        return;
    k.stub(dev, elements);
}

// --cuda13: what nvcc's static constructor does; the device names are the kernels' mangled names.
static std::string device_names[kernel_count];
static const unsigned long long fake_fatbin_image[4] = {0xba55ed50ULL, 1, 2, 3};
static FatbinWrapper fatbin_wrapper{fatbin_magic, 1, fake_fatbin_image, nullptr};
static std::string symbol_of(const void *address, bool demangle);
static void register_kernels()
{
    void **handle = call(RegisterFatBinary, rt.__cudaRegisterFatBinary, (void *)&fatbin_wrapper);
    for (size_t i = 0; i < kernel_count; i++) {
        device_names[i] = symbol_of(kernels[i].address, false);
        call(RegisterFunction, rt.__cudaRegisterFunction, handle, (const char *)kernels[i].address,
             (char *)device_names[i].c_str(), device_names[i].c_str(), -1, (void *)nullptr, (void *)nullptr,
             (void *)nullptr, (void *)nullptr, (int *)nullptr);
    }
    call(RegisterFatBinaryEnd, rt.__cudaRegisterFatBinaryEnd, handle);
}

// Driver-API kernels are looked up by their name in the module, as Triton and PyTorch do.
struct DriverKernel {
    const char *name;
    CUfunction handle;
    std::atomic<uint64_t> launches{0};
};
static DriverKernel driver_kernels[] = {{"triton_poi_fused_add_mul_0", nullptr}, {"_Z10vector_addPfS_S_i", nullptr}};
static void *const fake_module = reinterpret_cast<void *>(0xc0de0000);
static void *const fake_graph = reinterpret_cast<void *>(0x9a0f0000);
static cudaStream_t const helper_stream = reinterpret_cast<cudaStream_t>(0x5eedffff);

static cudaStream_t stream_of(uint64_t thread) { return reinterpret_cast<cudaStream_t>(0x5eed0001 + thread); }

// ---- the sequence

struct Midway {
    uint64_t iteration = 0;
    void *unfreed = nullptr;
    long helper_tid = 0;
    uint64_t helper_launches = 0;
};
static std::vector<void *> leaked;
static void print_summary(const Midway *midway);

static void sleep_ms(uint64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

static int copy_async(void *dst, const void *src, size_t n, int kind, cudaStream_t s)
{
    return opt.ptsz ? call(MemcpyAsyncPtsz, rt.cudaMemcpyAsync_ptsz, dst, src, n, kind, s)
                    : call(MemcpyAsync, rt.cudaMemcpyAsync, dst, src, n, kind, s);
}

static int copy(void *dst, const void *src, size_t n, int kind, cudaStream_t s)
{
    (kind == cudaMemcpyHostToDevice ? stats.h2d_calls : stats.d2h_calls)++;
    (kind == cudaMemcpyHostToDevice ? stats.h2d_bytes : stats.d2h_bytes) += n;
    return opt.async ? copy_async(dst, src, n, kind, s) : call(Memcpy, rt.cudaMemcpy, dst, src, n, kind);
}

static int stream_sync(cudaStream_t s)
{
    return opt.ptsz ? call(StreamSyncPtsz, rt.cudaStreamSynchronize_ptsz, s)
                    : call(StreamSync, rt.cudaStreamSynchronize, s);
}

// Launches enough kernels that a fake device is busy for about 2 s, then waits on them.
static uint64_t helper_launch_count()
{
    const char *v = getenv("FAKECUDA_KERNEL_US");
    char *end = nullptr;
    unsigned long long us = v && *v ? strtoull(v, &end, 10) : 50;
    if (end && *end)
        us = 50; // the fake library ignores such a value too
    return std::max(1ULL, 2000000ULL / std::max(1ULL, us));
}

[[noreturn]] static void exit_midway(void *unfreed, uint64_t iteration, float *dev, int elements)
{
    static Midway midway;
    midway = {iteration, unfreed, 0, helper_launch_count()};
    std::atomic<bool> entering_sync{false};
    std::thread([&] {
        midway.helper_tid = gettid();
        for (uint64_t i = 0; i < midway.helper_launches; i++)
            launch(kernels[0], dev, elements, helper_stream);
        entering_sync = true;
        stream_sync(helper_stream);
        for (;;)
            pause();
    }).detach();
    while (!entering_sync)
        sleep_ms(1);
    sleep_ms(5);
    print_summary(&midway);
    fflush(stdout);
    _exit(0);
}

// Counts a driver copy's call and bytes, then makes it.
template <typename... P, typename... A> static int driver_copy(Fn fn, int (*f)(P...), size_t bytes, A... args)
{
    {
        std::lock_guard<std::mutex> g(stats.mu);
        auto &[calls, total] = stats.driver_memcpy[fn_names[fn]];
        calls++;
        total += bytes;
    }
    return call(fn, f, args...);
}

// --driver-copies: each copy family of the driver once, n bytes each, on the driver allocation.
static void driver_copies(CUdeviceptr dptr, unsigned char *in, unsigned char *out, size_t n, cudaStream_t stream)
{
    driver_copy(CuMemcpyHtoD, drv.cuMemcpyHtoD_v2, n, dptr, (const void *)in, n);
    driver_copy(CuMemcpyDtoH, drv.cuMemcpyDtoH_v2, n, (void *)out, dptr, n);
    driver_copy(CuMemcpyDtoD, drv.cuMemcpyDtoD_v2, n, dptr, dptr, n);
    driver_copy(CuMemcpy, drv.cuMemcpy, n, dptr, (CUdeviceptr)(uintptr_t)in, n);
    driver_copy(CuMemcpyHtoDAsync, drv.cuMemcpyHtoDAsync_v2, n, dptr, (const void *)in, n, (void *)stream);
    driver_copy(CuMemcpyDtoHAsync, drv.cuMemcpyDtoHAsync_v2, n, (void *)out, dptr, n, (void *)stream);
    call(CuStreamSynchronize, drv.cuStreamSynchronize, (void *)stream);
    size_t row = n / 4;
    CUDA_MEMCPY2D c2{};
    c2.srcMemoryType = CU_MEMORYTYPE_HOST, c2.srcHost = in, c2.srcPitch = row;
    c2.dstMemoryType = CU_MEMORYTYPE_DEVICE, c2.dstDevice = dptr, c2.dstPitch = row;
    c2.WidthInBytes = row, c2.Height = 4;
    driver_copy(CuMemcpy2D, drv.cuMemcpy2D_v2, 4 * row, (const CUDA_MEMCPY2D *)&c2);
    CUDA_MEMCPY3D c3{};
    c3.srcMemoryType = CU_MEMORYTYPE_DEVICE, c3.srcDevice = dptr, c3.srcPitch = row, c3.srcHeight = 4;
    c3.dstMemoryType = CU_MEMORYTYPE_HOST, c3.dstHost = out, c3.dstPitch = row, c3.dstHeight = 4;
    c3.WidthInBytes = row, c3.Height = 4, c3.Depth = 1;
    driver_copy(CuMemcpy3D, drv.cuMemcpy3D_v2, 4 * row, (const CUDA_MEMCPY3D *)&c3);
    call(CuCtxSynchronize, drv.cuCtxSynchronize);
}

// --vmm: reserve two grains of addresses, back the first with one grain, and take it all down again.
static void vmm_iteration()
{
    CUmemAllocationProp prop{};
    prop.type = 1;          // CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = 1; // CU_MEM_LOCATION_TYPE_DEVICE, device 0
    size_t grain = 0;
    call(CuMemGetAllocationGranularity, drv.cuMemGetAllocationGranularity, &grain, (const CUmemAllocationProp *)&prop, 0);
    CUdeviceptr base = 0;
    unsigned long long handle = 0;
    call(CuMemAddressReserve, drv.cuMemAddressReserve, &base, 2 * grain, (size_t)0, (CUdeviceptr)0, 0ULL);
    call(CuMemCreate, drv.cuMemCreate, &handle, grain, (const CUmemAllocationProp *)&prop, 0ULL);
    call(CuMemMap, drv.cuMemMap, base, grain, (size_t)0, handle, 0ULL);
    CUmemAccessDesc access{{1, 0}, 3}; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    call(CuMemSetAccess, drv.cuMemSetAccess, base, grain, (const CUmemAccessDesc *)&access, (size_t)1);
    call(CuMemUnmap, drv.cuMemUnmap, base, grain);
    call(CuMemRelease, drv.cuMemRelease, handle);
    call(CuMemAddressFree, drv.cuMemAddressFree, base, 2 * grain);
}

static void driver_iteration(int elements, cudaStream_t stream, unsigned char *in, unsigned char *out)
{
    CUdeviceptr dptr = 0;
    call(CuMemAlloc, drv.cuMemAlloc_v2, &dptr, (size_t)opt.alloc_bytes);
    unsigned grid = std::max(1u, (unsigned)((elements + 127u) / 128u));
    for (uint64_t j = 0; j < opt.launches_per_iter; j++) {
        DriverKernel &k = driver_kernels[j % 2];
        k.launches++;
        void *params[] = {&dptr, &elements};
        if (opt.launch_ex) {
            CUlaunchConfig config{grid, 1, 1, 128, 1, 1, 0, stream, nullptr, 0};
            if (opt.driver_ptsz)
                call(CuLaunchKernelExPtsz, drv.cuLaunchKernelEx_ptsz, (const CUlaunchConfig *)&config, k.handle,
                     (void **)params, (void **)nullptr);
            else
                call(CuLaunchKernelEx, drv.cuLaunchKernelEx, (const CUlaunchConfig *)&config, k.handle,
                     (void **)params, (void **)nullptr);
        } else if (opt.driver_ptsz) {
            call(CuLaunchKernelPtsz, drv.cuLaunchKernel_ptsz, k.handle, grid, 1u, 1u, 128u, 1u, 1u, 0u, stream,
                 (void **)params, (void **)nullptr);
        } else {
            call(CuLaunchKernel, drv.cuLaunchKernel, k.handle, grid, 1u, 1u, 128u, 1u, 1u, 0u, stream,
                 (void **)params, (void **)nullptr);
        }
    }
    for (uint64_t j = 0; j < opt.driver_graph_launches; j++)
        call(CuGraphLaunch, drv.cuGraphLaunch, fake_graph, (void *)stream);
    if (opt.driver_copies)
        driver_copies(dptr, in, out, std::min(opt.h2d_bytes, opt.alloc_bytes), stream);
    if (opt.vmm)
        vmm_iteration();
    call(CuMemFree, drv.cuMemFree_v2, dptr);
}

// The thread's host buffers, as --host-memory asks; size 0 gets none.
static void host_buffers(uint64_t thread, size_t size, std::vector<unsigned char> &in_vec,
                         std::vector<unsigned char> &out_vec, unsigned char *&in, unsigned char *&out)
{
    in_vec.resize(size);
    out_vec.resize(size);
    in = in_vec.data();
    out = out_vec.data();
    if (size && opt.host_memory == "pinned") {
        void *a = nullptr, *b = nullptr;
        if (call(MallocHost, rt.cudaMallocHost, &a, size) == 0 && call(MallocHost, rt.cudaMallocHost, &b, size) == 0)
            in = (unsigned char *)a, out = (unsigned char *)b;
    } else if (size && opt.host_memory == "registered") {
        call(HostRegister, rt.cudaHostRegister, (void *)in, size, 0u);
        call(HostRegister, rt.cudaHostRegister, (void *)out, size, 0u);
    }
    std::lock_guard<std::mutex> g(stats.mu);
    stats.host_buffers.resize(opt.threads);
    stats.host_buffers[thread] = {in, out};
}

static void release_host_buffers(size_t size, unsigned char *in, unsigned char *out, const unsigned char *in_vec)
{
    if (size && opt.host_memory == "pinned" && in != in_vec) {
        call(FreeHost, rt.cudaFreeHost, (void *)in);
        call(FreeHost, rt.cudaFreeHost, (void *)out);
    } else if (size && opt.host_memory == "registered") {
        call(HostUnregister, rt.cudaHostUnregister, (void *)in);
        call(HostUnregister, rt.cudaHostUnregister, (void *)out);
    }
}

static void run_sequence(uint64_t thread)
{
    {
        std::lock_guard<std::mutex> g(stats.mu);
        stats.tids.resize(opt.threads);
        stats.tids[thread] = gettid();
    }
    cudaStream_t stream = opt.async ? stream_of(thread) : nullptr;
    int elements = (int)std::min<uint64_t>(opt.alloc_bytes / sizeof(float), INT_MAX);
    size_t size = std::max(opt.h2d_bytes, opt.d2h_bytes);
    std::vector<unsigned char> in_vec, out_vec;
    unsigned char *in, *out;
    host_buffers(thread, size, in_vec, out_vec, in, out);
    for (size_t i = 0; i < size; i++)
        in[i] = (unsigned char)(i * 131 + thread * 7 + 1);
    void *event = nullptr;
    if (opt.events)
        call(EventCreate, rt.cudaEventCreate, &event);
    for (uint64_t it = 0; it < opt.iterations; it++) {
        void *dev = nullptr;
        if (opt.async_alloc)
            call(MallocAsync, rt.cudaMallocAsync, &dev, (size_t)opt.alloc_bytes, stream);
        else
            call(Malloc, rt.cudaMalloc, &dev, (size_t)opt.alloc_bytes);
        int h2d_rc = opt.h2d_bytes ? copy(dev, in, opt.h2d_bytes, cudaMemcpyHostToDevice, stream) : -1;
        if (opt.exit_midway && thread == 0 && it == opt.iterations / 2)
            exit_midway(dev, it, (float *)dev, elements);
        for (uint64_t j = 0; j < opt.launches_per_iter; j++)
            launch(kernels[j % kernel_count], (float *)dev, elements, stream);
        for (uint64_t j = 0; j < opt.graph_launches; j++)
            call(GraphLaunch, rt.cudaGraphLaunch, fake_graph, stream);
        if (opt.events) {
            call(EventRecord, rt.cudaEventRecord, event, stream);
            call(StreamWaitEvent, rt.cudaStreamWaitEvent, stream, event, 0u);
            call(EventQuery, rt.cudaEventQuery, event);
            call(EventSynchronize, rt.cudaEventSynchronize, event);
        }
        std::fill(out, out + size, 0);
        int d2h_rc = opt.d2h_bytes ? copy(out, dev, opt.d2h_bytes, cudaMemcpyDeviceToHost, stream) : -1;
        if (opt.async)
            stream_sync(stream);
        if (h2d_rc == 0 && d2h_rc == 0) {
            stats.roundtrip_checked++;
            if (memcmp(in, out, std::min(opt.h2d_bytes, opt.d2h_bytes)) != 0)
                stats.roundtrip_mismatched++;
        }
        call(DeviceSync, rt.cudaDeviceSynchronize);
        if (opt.async_alloc)
            call(FreeAsync, rt.cudaFreeAsync, dev, stream);
        else
            call(Free, rt.cudaFree, dev);
        if (!opt.driver_lib.empty())
            driver_iteration(elements, stream, in, out);
    }
    if (opt.events)
        call(EventDestroy, rt.cudaEventDestroy, event);
    release_host_buffers(size, in, out, in_vec.data());
}

// ---- loading, options, output

static void *load(const std::string &path, const char *option)
{
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cuda_workload: cannot load %s %s: %s\n", option, path.c_str(), dlerror());
        exit(1);
    }
    return h;
}

template <typename F> static void resolve(void *lib, const std::string &path, const char *name, F &f)
{
    f = reinterpret_cast<F>(dlsym(lib, name));
    if (!f) {
        const char *what = strncmp(name, "__cuda", 6) == 0 ? "13 runtime" : name[2] == 'd' ? "runtime" : "driver";
        fprintf(stderr, "cuda_workload: %s does not export %s; is it a CUDA %s library?\n", path.c_str(), name, what);
        exit(1);
    }
}

static void load_libraries()
{
    void *h = load(opt.lib, "--lib");
    resolve(h, opt.lib, "cudaMalloc", rt.cudaMalloc);
    resolve(h, opt.lib, "cudaFree", rt.cudaFree);
    resolve(h, opt.lib, "cudaMemcpy", rt.cudaMemcpy);
    resolve(h, opt.lib, "cudaMemcpyAsync", rt.cudaMemcpyAsync);
    resolve(h, opt.lib, "cudaMemcpyAsync_ptsz", rt.cudaMemcpyAsync_ptsz);
    resolve(h, opt.lib, "cudaStreamSynchronize", rt.cudaStreamSynchronize);
    resolve(h, opt.lib, "cudaStreamSynchronize_ptsz", rt.cudaStreamSynchronize_ptsz);
    resolve(h, opt.lib, "cudaDeviceSynchronize", rt.cudaDeviceSynchronize);
    resolve(h, opt.lib, "cudaLaunchKernel", rt.cudaLaunchKernel);
    resolve(h, opt.lib, "cudaLaunchKernel_ptsz", rt.cudaLaunchKernel_ptsz);
    resolve(h, opt.lib, "cudaLaunchKernelExC", rt.cudaLaunchKernelExC);
    resolve(h, opt.lib, "cudaGraphLaunch", rt.cudaGraphLaunch);
    resolve(h, opt.lib, "cudaGetLastError", rt.cudaGetLastError);
    resolve(h, opt.lib, "cudaGetErrorString", rt.cudaGetErrorString);
    if (opt.cuda13) {
        resolve(h, opt.lib, "__cudaRegisterFatBinary", rt.__cudaRegisterFatBinary);
        resolve(h, opt.lib, "__cudaRegisterFunction", rt.__cudaRegisterFunction);
        resolve(h, opt.lib, "__cudaRegisterFatBinaryEnd", rt.__cudaRegisterFatBinaryEnd);
        resolve(h, opt.lib, "__cudaPushCallConfiguration", rt.__cudaPushCallConfiguration);
        resolve(h, opt.lib, "__cudaPopCallConfiguration", rt.__cudaPopCallConfiguration);
        resolve(h, opt.lib, "__cudaGetKernel", rt.__cudaGetKernel);
        resolve(h, opt.lib, "__cudaLaunchKernel", rt.__cudaLaunchKernel);
        resolve(h, opt.lib, "__cudaLaunchKernel_ptsz", rt.__cudaLaunchKernel_ptsz);
    }
    if (opt.async_alloc) {
        resolve(h, opt.lib, "cudaMallocAsync", rt.cudaMallocAsync);
        resolve(h, opt.lib, "cudaFreeAsync", rt.cudaFreeAsync);
    }
    if (opt.events) {
        resolve(h, opt.lib, "cudaEventCreate", rt.cudaEventCreate);
        resolve(h, opt.lib, "cudaEventRecord", rt.cudaEventRecord);
        resolve(h, opt.lib, "cudaEventQuery", rt.cudaEventQuery);
        resolve(h, opt.lib, "cudaEventSynchronize", rt.cudaEventSynchronize);
        resolve(h, opt.lib, "cudaEventDestroy", rt.cudaEventDestroy);
        resolve(h, opt.lib, "cudaStreamWaitEvent", rt.cudaStreamWaitEvent);
    }
    if (opt.host_memory == "registered") {
        resolve(h, opt.lib, "cudaHostRegister", rt.cudaHostRegister);
        resolve(h, opt.lib, "cudaHostUnregister", rt.cudaHostUnregister);
    } else if (opt.host_memory == "pinned") {
        resolve(h, opt.lib, "cudaMallocHost", rt.cudaMallocHost);
        resolve(h, opt.lib, "cudaFreeHost", rt.cudaFreeHost);
    }
    if (opt.driver_lib.empty())
        return;
    void *d = load(opt.driver_lib, "--driver-lib");
    resolve(d, opt.driver_lib, "cuInit", drv.cuInit);
    resolve(d, opt.driver_lib, "cuModuleGetFunction", drv.cuModuleGetFunction);
    resolve(d, opt.driver_lib, "cuMemAlloc_v2", drv.cuMemAlloc_v2);
    resolve(d, opt.driver_lib, "cuMemFree_v2", drv.cuMemFree_v2);
    resolve(d, opt.driver_lib, "cuLaunchKernel", drv.cuLaunchKernel);
    resolve(d, opt.driver_lib, "cuLaunchKernelEx", drv.cuLaunchKernelEx);
    if (opt.driver_ptsz) {
        resolve(d, opt.driver_lib, "cuLaunchKernel_ptsz", drv.cuLaunchKernel_ptsz);
        resolve(d, opt.driver_lib, "cuLaunchKernelEx_ptsz", drv.cuLaunchKernelEx_ptsz);
    }
    if (opt.driver_graph_launches)
        resolve(d, opt.driver_lib, "cuGraphLaunch", drv.cuGraphLaunch);
    if (opt.driver_copies) {
        resolve(d, opt.driver_lib, "cuMemcpyHtoD_v2", drv.cuMemcpyHtoD_v2);
        resolve(d, opt.driver_lib, "cuMemcpyDtoH_v2", drv.cuMemcpyDtoH_v2);
        resolve(d, opt.driver_lib, "cuMemcpyDtoD_v2", drv.cuMemcpyDtoD_v2);
        resolve(d, opt.driver_lib, "cuMemcpy", drv.cuMemcpy);
        resolve(d, opt.driver_lib, "cuMemcpyHtoDAsync_v2", drv.cuMemcpyHtoDAsync_v2);
        resolve(d, opt.driver_lib, "cuMemcpyDtoHAsync_v2", drv.cuMemcpyDtoHAsync_v2);
        resolve(d, opt.driver_lib, "cuMemcpy2D_v2", drv.cuMemcpy2D_v2);
        resolve(d, opt.driver_lib, "cuMemcpy3D_v2", drv.cuMemcpy3D_v2);
        resolve(d, opt.driver_lib, "cuStreamSynchronize", drv.cuStreamSynchronize);
        resolve(d, opt.driver_lib, "cuCtxSynchronize", drv.cuCtxSynchronize);
    }
    if (opt.vmm) {
        resolve(d, opt.driver_lib, "cuMemGetAllocationGranularity", drv.cuMemGetAllocationGranularity);
        resolve(d, opt.driver_lib, "cuMemAddressReserve", drv.cuMemAddressReserve);
        resolve(d, opt.driver_lib, "cuMemCreate", drv.cuMemCreate);
        resolve(d, opt.driver_lib, "cuMemMap", drv.cuMemMap);
        resolve(d, opt.driver_lib, "cuMemSetAccess", drv.cuMemSetAccess);
        resolve(d, opt.driver_lib, "cuMemUnmap", drv.cuMemUnmap);
        resolve(d, opt.driver_lib, "cuMemRelease", drv.cuMemRelease);
        resolve(d, opt.driver_lib, "cuMemAddressFree", drv.cuMemAddressFree);
    }
}

static uint64_t parse_count(const char *option, const char *text)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || *text == '-') {
        fprintf(stderr, "cuda_workload: %s wants a whole number, got '%s'\n", option, text);
        exit(2);
    }
    return v;
}

static void parse_options(int argc, char **argv)
{
    static const option options[] = {
        {"lib", required_argument, nullptr, 'l'},
        {"driver-lib", required_argument, nullptr, 'D'},
        {"iterations", required_argument, nullptr, 'i'},
        {"launches-per-iter", required_argument, nullptr, 'k'},
        {"alloc-bytes", required_argument, nullptr, 'a'},
        {"h2d-bytes", required_argument, nullptr, 'H'},
        {"d2h-bytes", required_argument, nullptr, 'd'},
        {"async", no_argument, nullptr, 'A'},
        {"ptsz", no_argument, nullptr, 'p'},
        {"launch-ex", no_argument, nullptr, 'x'},
        {"graph-launches", required_argument, nullptr, 'g'},
        {"threads", required_argument, nullptr, 't'},
        {"leak", required_argument, nullptr, 'L'},
        {"exit-midway", no_argument, nullptr, 'e'},
        {"delay-before-dlopen-ms", required_argument, nullptr, '1'},
        {"delay-after-dlopen-ms", required_argument, nullptr, '2'},
        {"delay-before-exit-ms", required_argument, nullptr, '3'},
        {"wait-for-file", required_argument, nullptr, 'w'},
        {"cuda13", no_argument, nullptr, 'C'},
        {"register-late", no_argument, nullptr, 'R'},
        {"events", no_argument, nullptr, 'E'},
        {"async-alloc", no_argument, nullptr, 'M'},
        {"host-memory", required_argument, nullptr, 'P'},
        {"driver-copies", no_argument, nullptr, 'c'},
        {"vmm", no_argument, nullptr, 'V'},
        {"driver-ptsz", no_argument, nullptr, 'z'},
        {"driver-graph-launches", required_argument, nullptr, 'G'},
        {"help", no_argument, nullptr, 'h'},
        {nullptr, 0, nullptr, 0},
    };
    int c, index;
    while ((c = getopt_long(argc, argv, "", options, &index)) != -1) {
        std::string option_name = c == '?' ? "" : std::string("--") + options[index].name;
        const char *name = option_name.c_str();
        switch (c) {
        case 'l': opt.lib = optarg; break;
        case 'D': opt.driver_lib = optarg; break;
        case 'i': opt.iterations = parse_count(name, optarg); break;
        case 'k': opt.launches_per_iter = parse_count(name, optarg); break;
        case 'a': opt.alloc_bytes = parse_count(name, optarg); break;
        case 'H': opt.h2d_bytes = parse_count(name, optarg); break;
        case 'd': opt.d2h_bytes = parse_count(name, optarg); break;
        case 'A': opt.async = true; break;
        case 'p': opt.ptsz = true; break;
        case 'x': opt.launch_ex = true; break;
        case 'g': opt.graph_launches = parse_count(name, optarg); break;
        case 't': opt.threads = parse_count(name, optarg); break;
        case 'L': opt.leak = parse_count(name, optarg); break;
        case 'e': opt.exit_midway = true; break;
        case '1': opt.delay_before_dlopen_ms = parse_count(name, optarg); break;
        case '2': opt.delay_after_dlopen_ms = parse_count(name, optarg); break;
        case '3': opt.delay_before_exit_ms = parse_count(name, optarg); break;
        case 'w': opt.wait_for_file = optarg; break;
        case 'C': opt.cuda13 = true; break;
        case 'R': opt.register_late = true; break;
        case 'E': opt.events = true; break;
        case 'M': opt.async_alloc = true; break;
        case 'P': opt.host_memory = optarg; break;
        case 'c': opt.driver_copies = true; break;
        case 'V': opt.vmm = true; break;
        case 'z': opt.driver_ptsz = true; break;
        case 'G': opt.driver_graph_launches = parse_count(name, optarg); break;
        case 'h': fputs(usage, stdout); exit(0);
        default: fputs("cuda_workload: see --help\n", stderr); exit(2);
        }
    }
    const char *error = nullptr;
    if (opt.lib.empty())
        error = "--lib PATH is required (the CUDA runtime library to load)";
    else if (optind != argc)
        error = "unexpected argument; every option starts with --";
    else if (opt.h2d_bytes > opt.alloc_bytes || opt.d2h_bytes > opt.alloc_bytes)
        error = "--h2d-bytes and --d2h-bytes must not exceed --alloc-bytes (the copies use that buffer)";
    else if (opt.threads == 0)
        error = "--threads must be at least 1";
    else if (opt.launch_ex && opt.ptsz)
        error = "--launch-ex has no _ptsz variant here; use one or the other";
    else if (opt.host_memory != "pageable" && opt.host_memory != "registered" && opt.host_memory != "pinned")
        error = "--host-memory is pageable, registered or pinned";
    else if (opt.register_late && !opt.cuda13)
        error = "--register-late goes with --cuda13";
    else if (opt.driver_lib.empty() && (opt.driver_copies || opt.vmm || opt.driver_ptsz || opt.driver_graph_launches))
        error = "--driver-copies, --vmm, --driver-ptsz and --driver-graph-launches need --driver-lib";
    if (error) {
        fprintf(stderr, "cuda_workload: %s\n", error);
        exit(2);
    }
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static void json_dim3(const dim3 &d) { printf("[%u, %u, %u]", d.x, d.y, d.z); }

// A pointer as a JSON string, "0x0" for NULL (printf's %p would write "(nil)").
static void json_pointer(const void *p) { printf("\"0x%llx\"", (unsigned long long)(uintptr_t)p); }

// The kernel's symbol as the dynamic linker sees it (the binary is linked with -rdynamic).
static std::string symbol_of(const void *address, bool demangle)
{
    Dl_info info{};
    if (!dladdr(address, &info) || !info.dli_sname)
        return "";
    if (!demangle)
        return info.dli_sname;
    int status;
    char *name = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string result = status == 0 ? name : info.dli_sname;
    free(name);
    return result;
}

static std::map<int, const char *> error_strings;

// The stand-in driver's own counts (its fakecuda_calls hook), when one is loaded: proof that the
// runtime stand-in called into it. null when there is no stand-in libcuda.so.1 in the process.
static void print_driver_calls()
{
    void *d = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    using Counts = size_t (*)(const char **, unsigned long long *, size_t);
    auto counts = d ? reinterpret_cast<Counts>(dlsym(d, "fakecuda_calls")) : nullptr;
    if (!counts) {
        printf("null");
        return;
    }
    const char *names[256];
    unsigned long long n[256];
    size_t total = std::min<size_t>(counts(names, n, 256), 256);
    printf("{");
    const char *sep = "";
    for (size_t i = 0; i < total; i++) {
        if (n[i]) {
            printf("%s\"%s\": %llu", sep, names[i], n[i]);
            sep = ", ";
        }
    }
    printf("}");
}

static void print_summary(const Midway *midway)
{
    std::lock_guard<std::mutex> g(stats.mu);
    printf("{\"workload\": \"cuda_workload\", \"pid\": %d, \"lib\": ", getpid());
    json_string(opt.lib.c_str());
    printf(", \"driver_lib\": ");
    if (opt.driver_lib.empty())
        printf("null");
    else
        json_string(opt.driver_lib.c_str());
    printf(", \"options\": {\"iterations\": %llu, \"launches_per_iter\": %llu, \"alloc_bytes\": %llu, "
           "\"h2d_bytes\": %llu, \"d2h_bytes\": %llu, \"async\": %s, \"ptsz\": %s, \"launch_ex\": %s, "
           "\"graph_launches\": %llu, \"threads\": %llu, \"leak\": %llu, \"exit_midway\": %s, \"cuda13\": %s, "
           "\"register_late\": %s, \"events\": %s, \"async_alloc\": %s, \"host_memory\": \"%s\", "
           "\"driver_copies\": %s, \"vmm\": %s, \"driver_ptsz\": %s, \"driver_graph_launches\": %llu}",
           (unsigned long long)opt.iterations, (unsigned long long)opt.launches_per_iter,
           (unsigned long long)opt.alloc_bytes, (unsigned long long)opt.h2d_bytes,
           (unsigned long long)opt.d2h_bytes, opt.async ? "true" : "false", opt.ptsz ? "true" : "false",
           opt.launch_ex ? "true" : "false", (unsigned long long)opt.graph_launches,
           (unsigned long long)opt.threads, (unsigned long long)opt.leak, opt.exit_midway ? "true" : "false",
           opt.cuda13 ? "true" : "false", opt.register_late ? "true" : "false", opt.events ? "true" : "false",
           opt.async_alloc ? "true" : "false", opt.host_memory.c_str(), opt.driver_copies ? "true" : "false",
           opt.vmm ? "true" : "false", opt.driver_ptsz ? "true" : "false",
           (unsigned long long)opt.driver_graph_launches);
    printf(", \"tids\": [");
    for (size_t i = 0; i < stats.tids.size(); i++)
        printf("%s%ld", i ? ", " : "", stats.tids[i]);
    printf("], \"streams\": [");
    for (uint64_t t = 0; t < opt.threads; t++)
    {
        printf("%s", t ? ", " : "");
        json_pointer(opt.async ? stream_of(t) : nullptr);
    }
    printf("], \"calls\": {");
    for (int f = 0; f < FnCount; f++)
        printf("%s\"%s\": %llu", f ? ", " : "", fn_names[f], (unsigned long long)stats.calls[f].load());
    printf("}, \"return_codes\": {");
    for (int f = 0; f < FnCount; f++) {
        printf("%s\"%s\": {", f ? ", " : "", fn_names[f]);
        const char *sep = "";
        for (auto &[rc, n] : stats.return_codes[f]) {
            printf("%s\"%d\": %llu", sep, rc, (unsigned long long)n);
            sep = ", ";
        }
        printf("}");
    }
    printf("}, \"memcpy\": {\"h2d\": {\"calls\": %llu, \"bytes\": %llu}, \"d2h\": {\"calls\": %llu, \"bytes\": %llu}}",
           (unsigned long long)stats.h2d_calls.load(), (unsigned long long)stats.h2d_bytes.load(),
           (unsigned long long)stats.d2h_calls.load(), (unsigned long long)stats.d2h_bytes.load());
    printf(", \"roundtrip\": {\"checked\": %llu, \"mismatched\": %llu}",
           (unsigned long long)stats.roundtrip_checked.load(), (unsigned long long)stats.roundtrip_mismatched.load());
    printf(", \"kernels\": [");
    for (size_t i = 0; i < kernel_count; i++) {
        const Kernel &k = kernels[i];
        printf("%s{\"name\": ", i ? ", " : "");
        json_string(symbol_of(k.address, true).c_str());
        printf(", \"symbol\": ");
        json_string(symbol_of(k.address, false).c_str());
        int elements = (int)std::min<uint64_t>(opt.alloc_bytes / sizeof(float), INT_MAX);
        printf(", \"address\": ");
        json_pointer(k.address);
        printf(", \"grid\": ");
        json_dim3(k.grid(elements));
        printf(", \"block\": ");
        json_dim3(k.block);
        printf(", \"shared_mem\": %zu, \"launches\": %llu", k.shared_mem, (unsigned long long)k.launches.load());
        printf(", \"host_stub\": ");
        json_pointer(k.address);
        printf(", \"device_stub\": ");
        json_pointer(device_stubs[i]);
        printf(", \"device_stub_symbol\": ");
        json_string(symbol_of(device_stubs[i], false).c_str());
        printf(", \"device_name\": ");
        json_string(device_names[i].c_str());
        printf(", \"handle\": ");
        if (get_kernel_rc[i] == -1)
            printf("null");
        else
            json_pointer(kernel_handles[i]);
        printf(", \"get_kernel_rc\": ");
        if (get_kernel_rc[i] == -1)
            printf("null}");
        else
            printf("%d}", get_kernel_rc[i]);
    }
    printf("], \"driver_kernels\": [");
    for (size_t i = 0; i < 2 && !opt.driver_lib.empty(); i++) {
        printf("%s{\"name\": \"%s\", \"handle\": ", i ? ", " : "", driver_kernels[i].name);
        json_pointer(driver_kernels[i].handle);
        printf(", \"launches\": %llu}", (unsigned long long)driver_kernels[i].launches.load());
    }
    printf("], \"driver_memcpy\": {");
    const char *comma = "";
    for (auto &[name, cb] : stats.driver_memcpy) {
        printf("%s\"%s\": {\"calls\": %llu, \"bytes\": %llu}", comma, name.c_str(), (unsigned long long)cb.first,
               (unsigned long long)cb.second);
        comma = ", ";
    }
    printf("}, \"host_buffers\": [");
    for (size_t i = 0; i < stats.host_buffers.size(); i++) {
        printf("%s{\"in\": ", i ? ", " : "");
        json_pointer(stats.host_buffers[i].in);
        printf(", \"out\": ");
        json_pointer(stats.host_buffers[i].out);
        printf("}");
    }
    printf("], \"driver_calls\": ");
    print_driver_calls();
    printf(", \"leaked\": [");
    for (size_t i = 0; i < leaked.size(); i++) {
        printf("%s", i ? ", " : "");
        json_pointer(leaked[i]);
    }
    printf("], \"error_strings\": {");
    const char *sep = "";
    for (auto &[rc, text] : error_strings) {
        printf("%s\"%d\": ", sep, rc);
        json_string(text ? text : "(null)");
        sep = ", ";
    }
    printf("}, \"exited_midway\": ");
    if (midway) {
        printf("{\"thread\": 0, \"iteration\": %llu, \"unfreed\": ", (unsigned long long)midway->iteration);
        json_pointer(midway->unfreed);
        printf(", \"helper_tid\": %ld, \"helper_stream\": ", midway->helper_tid);
        json_pointer(helper_stream);
        printf(", \"helper_launches\": %llu}", (unsigned long long)midway->helper_launches);
    } else
        printf("null");
    printf("}\n");
}

static void wait_for_file(const std::string &path)
{
    fprintf(stderr, "cuda_workload: pid %d waiting for %s\n", getpid(), path.c_str());
    struct stat st;
    while (stat(path.c_str(), &st) != 0)
        sleep_ms(1);
}

int main(int argc, char **argv)
{
    parse_options(argc, argv);
    sleep_ms(opt.delay_before_dlopen_ms);
    load_libraries();
    if (opt.cuda13 && !opt.register_late)
        register_kernels(); // as a library's static constructors do, right at load
    sleep_ms(opt.delay_after_dlopen_ms);
    if (!opt.wait_for_file.empty())
        wait_for_file(opt.wait_for_file);
    if (opt.cuda13 && opt.register_late)
        register_kernels();

    if (!opt.driver_lib.empty()) {
        call(CuInit, drv.cuInit, 0u);
        for (DriverKernel &k : driver_kernels)
            call(CuModuleGetFunction, drv.cuModuleGetFunction, &k.handle, fake_module, k.name);
    }
    for (uint64_t i = 0; i < opt.leak; i++) {
        void *p = nullptr;
        call(Malloc, rt.cudaMalloc, &p, (size_t)opt.alloc_bytes);
        leaked.push_back(p);
    }
    std::vector<std::thread> workers;
    for (uint64_t t = 1; t < opt.threads; t++)
        workers.emplace_back(run_sequence, t);
    run_sequence(0);
    for (std::thread &w : workers)
        w.join();

    call(GetLastError, rt.cudaGetLastError);
    std::set<int> failures;
    for (int f = 0; f < CuInit; f++) // the runtime's calls
        for (auto &[rc, n] : stats.return_codes[f])
            if (rc != 0)
                failures.insert(rc);
    for (int rc : failures)
        error_strings[rc] = call(GetErrorString, rt.cudaGetErrorString, rc);

    print_summary(nullptr);
    fflush(stdout);
    sleep_ms(opt.delay_before_exit_ms);
    return 0;
}
