/*
 * Stand-in for NVIDIA's CUDA runtime on machines without a GPU: libcudart.so.12, or with
 * -DFAKECUDART_CUDA13 libcudart.so.13.
 *
 * Exports the runtime calls the agent probes and those nvcc's generated code needs, with CUDA's
 * exact C signatures. Like the real runtime it is a layer over the driver API: every call that
 * does work calls the driver stand-in (libcuda.so.1, fakecuda.c) on the same thread, and without
 * a driver every such call returns 35 (cudaErrorInsufficientDriver). The driver holds the state
 * (memory, stream time, events); this layer keeps what a runtime keeps:
 *   - the kernels registered by nvcc's static constructors (__cudaRegisterFatBinary,
 *     __cudaRegisterFunction: host function -> mangled device name) and the driver handle of
 *     each; the <<<>>> launch configuration pushed and popped per thread;
 *   - CUDA 13 (FAKECUDART_CUDA13): kernel handles. __cudaGetKernel / cudaGetKernel hand out the
 *     driver's CUkernel (cuLibraryLoadData + cuLibraryGetKernel, one heap pointer per host
 *     function), cudaLaunchKernel takes that handle or a registered host function, anything
 *     else is 98; __cudaLaunchKernel is a thunk that jumps into cudaLaunchKernel.
 *   - CUDA 12: launches take host functions; one that was never registered (the C++ workload's
 *     stubs, libc's abs) is accepted and named after its symbol. The driver handle is a
 *     CUfunction from cuModuleGetFunction.
 * The driver is found (once, at the first call) at $FAKECUDA_DRIVER if that is set, else by its
 * soname libcuda.so.1 if the library found is the stand-in (it exports fakecuda_calls; a real
 * driver is left alone), else at ../fakecuda/libcuda.so.1 next to this library, else where the
 * build put it (FAKECUDA_DRIVER_BUILT).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"
#include "ptrmap.h"

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cudaKernel_t;
typedef struct {
    unsigned x, y, z;
} dim3;
typedef struct {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;
    unsigned numAttrs;
} cudaLaunchConfig_t;

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorMissingConfiguration = 52,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorSymbolNotFound = 500,
    cudaErrorNotReady = 600,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorNotSupported = 801,
};
enum { HostToHost, HostToDevice, DeviceToHost, DeviceToDevice, Default };

#define FATBIN_MAGIC 0x466243b1 /* __fatBinC_Wrapper_t.magic in nvcc's output */
#define CONFIG_DEPTH 16         /* nested <<<>>> configurations kept per thread */

/* ---- the driver */

#define RUNTIME_USES(X)                                                                                             \
    X(cuInit) X(cuModuleGetFunction) X(cuLibraryLoadData) X(cuLibraryGetKernel) X(cuLaunchKernel)                   \
    X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) X(cuLaunchHostFunc) X(cuGraphLaunch)        \
    X(cuStreamSynchronize) X(cuCtxSynchronize) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery)                    \
    X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy_v2) X(cuStreamWaitEvent) X(cuMemAlloc_v2)          \
    X(cuMemAllocAsync) X(cuMemFree_v2) X(cuMemFreeAsync) X(cuMemcpy) X(cuMemcpyAsync) X(cuMemcpyHtoD_v2)             \
    X(cuMemcpyDtoH_v2) X(cuMemcpyDtoD_v2) X(cuMemcpyHtoDAsync_v2) X(cuMemcpyDtoHAsync_v2) X(cuMemcpyDtoDAsync_v2)   \
    X(cuMemcpy2D_v2) X(cuMemHostRegister_v2) X(cuMemHostUnregister) X(cuMemAllocHost_v2) X(cuMemHostAlloc)          \
    X(cuMemFreeHost) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) X(cuGraphCreate) X(cuGraphAddKernelNode_v2)     \
    X(cuGraphInstantiateWithFlags) X(cuGraphInstantiateWithParams) X(cuGraphExecUpdate_v2) X(cuGraphExecDestroy)     \
    X(cuGraphDestroy) X(cuGraphExecKernelNodeSetParams_v2) X(cuGraphKernelNodeSetParams_v2) X(cuDeviceGetCount)    \
    X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent)

#define AS_POINTER(name) __typeof__(name) *name;
static struct {
    RUNTIME_USES(AS_POINTER)
} drv;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static int have_driver;

/* The library at path if it is the stand-in driver with every entry point this runtime uses. */
static int bind_driver(const char *path)
{
    void *h = path && *path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h)
        return 0;
    int ok = dlsym(h, "fakecuda_calls") != NULL;
#define RESOLVE(name) ok = ok && (drv.name = (__typeof__(name) *)dlsym(h, #name)) != NULL;
    RUNTIME_USES(RESOLVE)
    if (!ok || drv.cuInit(0) != 0) {
        dlclose(h);
        return 0;
    }
    return 1;
}

static void load_driver(void)
{
    const char *forced = getenv("FAKECUDA_DRIVER");
    if (forced) {
        have_driver = bind_driver(forced);
        return;
    }
    have_driver = bind_driver("libcuda.so.1");
    Dl_info info;
    if (!have_driver && dladdr((void *)load_driver, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        char path[4096];
        if (slash && snprintf(path, sizeof path, "%.*s/../fakecuda/libcuda.so.1", (int)(slash - info.dli_fname),
                              info.dli_fname) < (int)sizeof path)
            have_driver = bind_driver(path);
    }
#ifdef FAKECUDA_DRIVER_BUILT
    if (!have_driver)
        have_driver = bind_driver(FAKECUDA_DRIVER_BUILT);
#endif
}

static __thread cudaError_t last_error;

static cudaError_t fail(cudaError_t rc)
{
    last_error = rc;
    return rc;
}

/* 0 once the driver is bound, else cudaErrorInsufficientDriver (recorded as the last error). */
static cudaError_t driver(void)
{
    pthread_once(&driver_once, load_driver);
    return have_driver ? cudaSuccess : fail(cudaErrorInsufficientDriver);
}

/* A driver result as the runtime's error: the codes this stand-in meets are numbered alike. */
static cudaError_t result(CUresult rc)
{
    return rc ? fail(rc == 3 ? cudaErrorInitializationError : rc) : cudaSuccess;
}

#define NEED_DRIVER()                                                                                               \
    do {                                                                                                            \
        cudaError_t rc_ = driver();                                                                                 \
        if (rc_)                                                                                                    \
            return rc_;                                                                                             \
    } while (0)

static cudaStream_t per_thread(cudaStream_t stream)
{
    return stream ? stream : CU_STREAM_PER_THREAD;
}

/* ---- devices
 *
 * As the real runtime: a thread's current device is 0 until it calls cudaSetDevice, which
 * retains the device's primary context (once per process) and makes it current on the calling
 * thread through the driver (cuDevicePrimaryCtxRetain, cuCtxSetCurrent). */

#define MAX_DEVICES 8
static __thread int current_device;
static CUcontext primary[MAX_DEVICES];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return fail(cudaErrorInvalidValue);
    NEED_DRIVER();
    return result(drv.cuDeviceGetCount(count));
}

cudaError_t cudaSetDevice(int device)
{
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc)
        return rc;
    if (device < 0 || device >= count || device >= MAX_DEVICES)
        return fail(cudaErrorInvalidDevice);
    pthread_mutex_lock(&primary_lock);
    CUresult drc = primary[device] ? 0 : drv.cuDevicePrimaryCtxRetain(&primary[device], device);
    CUcontext ctx = primary[device];
    pthread_mutex_unlock(&primary_lock);
    if (!drc)
        drc = drv.cuCtxSetCurrent(ctx);
    if (drc)
        return result(drc);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return fail(cudaErrorInvalidValue);
    NEED_DRIVER();
    *device = current_device;
    return cudaSuccess;
}

/* ---- registered kernels */

struct fatbin {
    void *wrapper; /* first, so a struct fatbin * is the void ** nvcc keeps */
    const void *image;
    CUlibrary library; /* loaded on the first use of one of its kernels */
};

struct kernel {
    const void *host_fun;
    char *name; /* the mangled device name, or for an unregistered CUDA 12 host function its symbol */
    struct fatbin *fatbin;
    void *handle; /* the driver's CUkernel (CUDA 13) or CUfunction (CUDA 12); NULL until first needed */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct ptrmap by_host;   /* host function -> struct kernel */
static struct ptrmap by_handle; /* CUDA 13: handle handed out -> struct kernel */

void **__cudaRegisterFatBinary(void *fatCubin)
{
    struct fatbin *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    const struct {
        int magic, version;
        const void *data;
    } *wrapper = fatCubin;
    f->wrapper = fatCubin;
    f->image = wrapper && wrapper->magic == FATBIN_MAGIC ? wrapper->data : fatCubin;
    return (void **)f;
}

void __cudaRegisterFatBinaryEnd(void **fatCubinHandle)
{
    (void)fatCubinHandle;
}

/* Forgets the binary's kernels (a dlclosed library's host functions may be reused); the driver's
 * handles stay valid. */
void __cudaUnregisterFatBinary(void **fatCubinHandle)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < by_host.capacity; i++) {
        struct kernel *k = by_host.keys[i] ? by_host.values[i] : NULL;
        if (k && k->fatbin == (struct fatbin *)fatCubinHandle) {
            ptrmap_remove(&by_host, k->host_fun);
            ptrmap_remove(&by_handle, k->handle);
            i--; /* removal shifted a later entry into this slot */
        }
    }
    pthread_mutex_unlock(&lock);
}

static struct kernel *new_kernel(const void *host_fun, const char *name, struct fatbin *fatbin)
{
    struct kernel *k = calloc(1, sizeof *k);
    if (!k || !(k->name = strdup(name)) || ptrmap_put(&by_host, host_fun, k)) {
        if (k)
            free(k->name);
        free(k);
        return NULL;
    }
    k->host_fun = host_fun;
    k->fatbin = fatbin;
    return k;
}

void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
                            int thread_limit, void *tid, void *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim, (void)wSize;
    if (!hostFun || !deviceName)
        return;
    pthread_mutex_lock(&lock);
    new_kernel(hostFun, deviceName, (struct fatbin *)fatCubinHandle);
    pthread_mutex_unlock(&lock);
}

/* Variables live in host memory here: nothing to register. */
void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress, const char *deviceName, int ext,
                       size_t size, int constant, int global)
{
    (void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)ext, (void)size;
    (void)constant, (void)global;
}

void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress, char *deviceAddress,
                              const char *deviceName, int ext, size_t size, int constant, int global)
{
    (void)fatCubinHandle, (void)hostVarPtrAddress, (void)deviceAddress, (void)deviceName, (void)ext, (void)size;
    (void)constant, (void)global;
}

char __cudaInitModule(void **fatCubinHandle)
{
    return fatCubinHandle != NULL;
}

/* The kernel's driver handle, asked for on first need. Caller holds lock and has the driver. */
static CUresult bind_kernel(struct kernel *k)
{
    if (k->handle)
        return 0;
#ifdef FAKECUDART_CUDA13
    if (!k->fatbin->library) {
        CUresult rc = drv.cuLibraryLoadData(&k->fatbin->library, k->fatbin->image, NULL, NULL, 0, NULL, NULL, 0);
        if (rc)
            return rc;
    }
    CUkernel handle;
    CUresult rc = drv.cuLibraryGetKernel(&handle, k->fatbin->library, k->name);
    if (!rc && ptrmap_put(&by_handle, handle, k))
        rc = cudaErrorMemoryAllocation;
#else
    CUfunction handle;
    CUresult rc = drv.cuModuleGetFunction(&handle, k->fatbin ? (CUmodule)k->fatbin->image : NULL, k->name);
#endif
    if (!rc)
        k->handle = handle;
    return rc;
}

/* The kernel that func names, bound to its driver handle: *k, or an error to return. */
static cudaError_t kernel_of(const void *func, struct kernel **k)
{
    if (!func)
        return cudaErrorInvalidDeviceFunction;
    pthread_mutex_lock(&lock);
    *k = ptrmap_get(&by_handle, func);
    if (!*k)
        *k = ptrmap_get(&by_host, func);
#ifndef FAKECUDART_CUDA13
    if (!*k) { /* CUDA 12 here: any host function goes, named after its symbol if it has one */
        Dl_info info = {0};
        char name[32];
        if (!dladdr(func, &info) || info.dli_saddr != func || !info.dli_sname)
            snprintf(name, sizeof name, "%p", func);
        *k = new_kernel(func, info.dli_saddr == func && info.dli_sname ? info.dli_sname : name, NULL);
    }
#endif
    CUresult rc = *k ? bind_kernel(*k) : (CUresult)cudaErrorInvalidDeviceFunction;
    pthread_mutex_unlock(&lock);
    return rc;
}

#ifdef FAKECUDART_CUDA13
/* Stores hostFun first, as the real one does: without a driver the handle stays equal to it. */
static cudaError_t get_kernel(cudaKernel_t *out, const void *hostFun)
{
    if (!out)
        return fail(cudaErrorInvalidValue);
    *out = (cudaKernel_t)hostFun;
    NEED_DRIVER();
    pthread_mutex_lock(&lock);
    struct kernel *k = ptrmap_get(&by_host, hostFun);
    cudaError_t rc = k ? bind_kernel(k) : cudaErrorInvalidDeviceFunction;
    pthread_mutex_unlock(&lock);
    if (rc)
        return fail(rc);
    *out = k->handle;
    return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr)
{
    return get_kernel(kernelPtr, entryFuncAddr);
}

cudaError_t cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr)
{
    return get_kernel(kernelPtr, entryFuncAddr);
}
#endif

/* ---- launches */

struct call_config {
    dim3 grid, block;
    size_t shared_mem;
    cudaStream_t stream;
};
static __thread struct call_config configs[CONFIG_DEPTH];
static __thread unsigned config_depth;

unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, void *stream)
{
    if (config_depth == CONFIG_DEPTH)
        return 1;
    configs[config_depth++] = (struct call_config){gridDim, blockDim, sharedMem, stream};
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem, void *stream)
{
    if (!config_depth)
        return fail(cudaErrorMissingConfiguration);
    const struct call_config *c = &configs[--config_depth];
    *gridDim = c->grid;
    *blockDim = c->block;
    *sharedMem = c->shared_mem;
    *(cudaStream_t *)stream = c->stream;
    return cudaSuccess;
}

static int bad_config(dim3 grid, dim3 block)
{
    return !grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || grid.y > 65535 || grid.z > 65535 ||
           grid.x > 0x7fffffffU || (uint64_t)block.x * block.y * block.z > 1024;
}

/* Checks what the runtime checks itself, then names the kernel's driver handle in *k. */
static cudaError_t prepare_launch(const void *func, dim3 grid, dim3 block, struct kernel **k)
{
    NEED_DRIVER();
    if (!func)
        return fail(cudaErrorInvalidDeviceFunction);
    if (bad_config(grid, block))
        return fail(cudaErrorInvalidConfiguration);
    cudaError_t rc = kernel_of(func, k);
    return rc ? fail(rc) : cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream)
{
    struct kernel *k;
    cudaError_t rc = prepare_launch(func, gridDim, blockDim, &k);
    if (rc)
        return rc;
    return result(drv.cuLaunchKernel((CUfunction)k->handle, gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y,
                                     blockDim.z, (unsigned)sharedMem, stream, args, NULL));
}

cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                  cudaStream_t stream)
{
    struct kernel *k;
    cudaError_t rc = prepare_launch(func, gridDim, blockDim, &k);
    if (rc)
        return rc;
    return result(drv.cuLaunchKernel_ptsz((CUfunction)k->handle, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
                                          blockDim.y, blockDim.z, (unsigned)sharedMem, stream, args, NULL));
}

/* Launch attributes are not passed on: the stand-in driver has none. */
static cudaError_t launch_ex(const cudaLaunchConfig_t *config, const void *func, void **args, int ptsz)
{
    NEED_DRIVER();
    if (!config)
        return fail(cudaErrorInvalidValue);
    struct kernel *k;
    cudaError_t rc = prepare_launch(func, config->gridDim, config->blockDim, &k);
    if (rc)
        return rc;
    CUlaunchConfig c = {config->gridDim.x, config->gridDim.y, config->gridDim.z, config->blockDim.x,
                        config->blockDim.y, config->blockDim.z, (unsigned)config->dynamicSmemBytes, config->stream,
                        NULL, 0};
    return result(ptsz ? drv.cuLaunchKernelEx_ptsz(&c, (CUfunction)k->handle, args, NULL)
                       : drv.cuLaunchKernelEx(&c, (CUfunction)k->handle, args, NULL));
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    return launch_ex(config, func, args, 0);
}

cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    return launch_ex(config, func, args, 1);
}

#ifdef FAKECUDART_CUDA13
/* nvcc 13's stubs call these; like NVIDIA's they are thunks that jump (not call) into
 * cudaLaunchKernel, so at its entry the return address is in the caller's __device_stub__. The
 * hidden aliases keep the jump direct, not through the PLT. */
extern __typeof__(cudaLaunchKernel) fakecudart_launch_kernel __attribute__((alias("cudaLaunchKernel"), visibility("hidden")));
extern __typeof__(cudaLaunchKernel_ptsz) fakecudart_launch_kernel_ptsz
    __attribute__((alias("cudaLaunchKernel_ptsz"), visibility("hidden")));
#define THUNK(name, target)                                                                                         \
    __asm__(".text\n.globl " #name "\n.type " #name ", @function\n.p2align 4\n" #name ":\n"                        \
            "\tendbr64\n\tpush %rbp\n\tmov %rsp, %rbp\n\tpop %rbp\n\tjmp " #target "\n.size " #name ", .-" #name "\n")
THUNK(__cudaLaunchKernel, fakecudart_launch_kernel);
THUNK(__cudaLaunchKernel_ptsz, fakecudart_launch_kernel_ptsz);
#endif

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, void (*fn)(void *), void *userData)
{
    NEED_DRIVER();
    return result(drv.cuLaunchHostFunc(stream, fn, userData));
}

cudaError_t cudaGraphLaunch(void *graphExec, cudaStream_t stream)
{
    NEED_DRIVER();
    return result(drv.cuGraphLaunch(graphExec, stream));
}

cudaError_t cudaGraphLaunch_ptsz(void *graphExec, cudaStream_t stream)
{
    NEED_DRIVER();
    return result(drv.cuGraphLaunch(graphExec, per_thread(stream)));
}

/* ---- graphs: each call is the driver's (fakecuda.c says what a graph does) */

struct cudaKernelNodeParams {
    void *func; /* a registered host function, or (CUDA 13) a kernel handle */
    dim3 gridDim;
    dim3 blockDim;
    unsigned sharedMemBytes;
    void **kernelParams;
    void **extra;
};

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode)
{
    NEED_DRIVER();
    return result(drv.cuStreamBeginCapture_v2(stream, mode));
}

cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, int mode)
{
    NEED_DRIVER();
    return result(drv.cuStreamBeginCapture_v2(per_thread(stream), mode));
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, void **pGraph)
{
    NEED_DRIVER();
    return result(drv.cuStreamEndCapture(stream, pGraph));
}

cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, void **pGraph)
{
    NEED_DRIVER();
    return result(drv.cuStreamEndCapture(per_thread(stream), pGraph));
}

cudaError_t cudaGraphCreate(void **pGraph, unsigned flags)
{
    NEED_DRIVER();
    return result(drv.cuGraphCreate(pGraph, flags));
}

/* A node's kernel goes to the driver as its handle: a CUkernel in kern (CUDA 13, as the real
 * runtime's cudaKernel_t), a CUfunction in func (CUDA 12). */
static cudaError_t node_params(const struct cudaKernelNodeParams *in, CUDA_KERNEL_NODE_PARAMS *out)
{
    if (!in)
        return fail(cudaErrorInvalidValue);
    struct kernel *k;
    cudaError_t rc = kernel_of(in->func, &k);
    if (rc)
        return fail(rc);
    const dim3 g = in->gridDim, b = in->blockDim;
    *out = (CUDA_KERNEL_NODE_PARAMS){NULL, g.x, g.y, g.z, b.x, b.y, b.z, in->sharedMemBytes, in->kernelParams,
                                     in->extra, NULL, NULL};
#ifdef FAKECUDART_CUDA13
    out->kern = (CUkernel)k->handle;
#else
    out->func = (CUfunction)k->handle;
#endif
    return cudaSuccess;
}

cudaError_t cudaGraphAddKernelNode(void **pGraphNode, void *graph, void *const *pDependencies, size_t numDependencies,
                                   const struct cudaKernelNodeParams *pNodeParams)
{
    NEED_DRIVER();
    CUDA_KERNEL_NODE_PARAMS p;
    cudaError_t rc = node_params(pNodeParams, &p);
    return rc ? rc : result(drv.cuGraphAddKernelNode_v2(pGraphNode, graph, pDependencies, numDependencies, &p));
}

cudaError_t cudaGraphKernelNodeSetParams(void *node, const struct cudaKernelNodeParams *pNodeParams)
{
    NEED_DRIVER();
    CUDA_KERNEL_NODE_PARAMS p;
    cudaError_t rc = node_params(pNodeParams, &p);
    return rc ? rc : result(drv.cuGraphKernelNodeSetParams_v2(node, &p));
}

cudaError_t cudaGraphExecKernelNodeSetParams(void *graphExec, void *node, const struct cudaKernelNodeParams *pNodeParams)
{
    NEED_DRIVER();
    CUDA_KERNEL_NODE_PARAMS p;
    cudaError_t rc = node_params(pNodeParams, &p);
    return rc ? rc : result(drv.cuGraphExecKernelNodeSetParams_v2(graphExec, node, &p));
}

cudaError_t cudaGraphInstantiate(void **pGraphExec, void *graph, unsigned long long flags)
{
    NEED_DRIVER();
    return result(drv.cuGraphInstantiateWithFlags(pGraphExec, graph, flags));
}

cudaError_t cudaGraphInstantiateWithFlags(void **pGraphExec, void *graph, unsigned long long flags)
{
    NEED_DRIVER();
    return result(drv.cuGraphInstantiateWithFlags(pGraphExec, graph, flags));
}

cudaError_t cudaGraphInstantiateWithParams(void **pGraphExec, void *graph, void *instantiateParams)
{
    NEED_DRIVER();
    return result(drv.cuGraphInstantiateWithParams(pGraphExec, graph, instantiateParams));
}

cudaError_t cudaGraphInstantiateWithParams_ptsz(void **pGraphExec, void *graph, void *instantiateParams)
{
    NEED_DRIVER();
    return result(drv.cuGraphInstantiateWithParams(pGraphExec, graph, instantiateParams));
}

cudaError_t cudaGraphExecUpdate(void *graphExec, void *graph, void *resultInfo)
{
    NEED_DRIVER();
    return result(drv.cuGraphExecUpdate_v2(graphExec, graph, resultInfo));
}

cudaError_t cudaGraphExecDestroy(void *graphExec)
{
    NEED_DRIVER();
    return result(drv.cuGraphExecDestroy(graphExec));
}

cudaError_t cudaGraphDestroy(void *graph)
{
    NEED_DRIVER();
    return result(drv.cuGraphDestroy(graph));
}

/* ---- memory */

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    NEED_DRIVER();
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    CUresult rc = drv.cuMemAlloc_v2(&p, size);
    *devPtr = (void *)(uintptr_t)p;
    return rc ? fail(cudaErrorMemoryAllocation) : cudaSuccess; /* 0 bytes, too many bytes: out of memory */
}

cudaError_t cudaFree(void *devPtr)
{
    NEED_DRIVER();
    if (!devPtr)
        return cudaSuccess; /* like CUDA: freeing NULL is allowed */
    return result(drv.cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr));
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    NEED_DRIVER();
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    CUresult rc = drv.cuMemAllocAsync(&p, size, stream);
    *devPtr = (void *)(uintptr_t)p;
    return rc ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    NEED_DRIVER();
    return result(drv.cuMemFreeAsync((CUdeviceptr)(uintptr_t)devPtr, stream));
}

#define DEV(p) ((CUdeviceptr)(uintptr_t)(p))

/* A copy in the driver call that matches its direction; stream NULL with sync set: a
 * synchronous copy. noinline keeps it a local symbol that tests can find in .symtab. */
__attribute__((noinline)) static cudaError_t copy(void *dst, const void *src, size_t count, int kind,
                                                  cudaStream_t stream, int sync)
{
    NEED_DRIVER();
    if (kind < HostToHost || kind > Default)
        return fail(cudaErrorInvalidValue);
    CUresult rc;
    switch (kind) {
    case HostToDevice:
        rc = sync ? drv.cuMemcpyHtoD_v2(DEV(dst), src, count) : drv.cuMemcpyHtoDAsync_v2(DEV(dst), src, count, stream);
        break;
    case DeviceToHost:
        rc = sync ? drv.cuMemcpyDtoH_v2(dst, DEV(src), count) : drv.cuMemcpyDtoHAsync_v2(dst, DEV(src), count, stream);
        break;
    case DeviceToDevice:
        rc = sync ? drv.cuMemcpyDtoD_v2(DEV(dst), DEV(src), count)
                  : drv.cuMemcpyDtoDAsync_v2(DEV(dst), DEV(src), count, stream);
        break;
    default: /* host to host, or inferred from the pointers: unified addressing */
        rc = sync ? drv.cuMemcpy(DEV(dst), DEV(src), count) : drv.cuMemcpyAsync(DEV(dst), DEV(src), count, stream);
    }
    return result(rc);
}

/* A synchronous copy waits for all queued work first (the driver's does), as on CUDA's legacy
 * default stream. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind)
{
    return copy(dst, src, count, kind, NULL, 1);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t stream)
{
    return copy(dst, src, count, kind, stream, 0);
}

cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, int kind, cudaStream_t stream)
{
    return copy(dst, src, count, kind, per_thread(stream), 0);
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         int kind)
{
    NEED_DRIVER();
    if (kind < HostToHost || kind > Default)
        return fail(cudaErrorInvalidValue);
    int src_type = kind == DeviceToHost || kind == DeviceToDevice ? CU_MEMORYTYPE_DEVICE
                   : kind == Default                              ? CU_MEMORYTYPE_UNIFIED
                                                                  : CU_MEMORYTYPE_HOST;
    int dst_type = kind == HostToDevice || kind == DeviceToDevice ? CU_MEMORYTYPE_DEVICE
                   : kind == Default                              ? CU_MEMORYTYPE_UNIFIED
                                                                  : CU_MEMORYTYPE_HOST;
    CUDA_MEMCPY2D c = {
        .srcMemoryType = src_type, .srcHost = src, .srcDevice = DEV(src), .srcPitch = spitch,
        .dstMemoryType = dst_type, .dstHost = dst, .dstDevice = DEV(dst), .dstPitch = dpitch,
        .WidthInBytes = width, .Height = height,
    };
    return result(drv.cuMemcpy2D_v2(&c));
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned flags)
{
    NEED_DRIVER();
    return result(drv.cuMemHostRegister_v2(ptr, size, flags));
}

cudaError_t cudaHostUnregister(void *ptr)
{
    NEED_DRIVER();
    return result(drv.cuMemHostUnregister(ptr));
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    NEED_DRIVER();
    return result(drv.cuMemAllocHost_v2(ptr, size));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned flags)
{
    NEED_DRIVER();
    return result(drv.cuMemHostAlloc(pHost, size, flags));
}

cudaError_t cudaFreeHost(void *ptr)
{
    NEED_DRIVER();
    return result(drv.cuMemFreeHost(ptr));
}

/* ---- synchronisation and events */

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    NEED_DRIVER();
    return result(drv.cuStreamSynchronize(stream));
}

cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
    NEED_DRIVER();
    return result(drv.cuStreamSynchronize(per_thread(stream)));
}

cudaError_t cudaDeviceSynchronize(void)
{
    NEED_DRIVER();
    return result(drv.cuCtxSynchronize());
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
    NEED_DRIVER();
    return result(drv.cuEventCreate((CUevent *)event, flags));
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    NEED_DRIVER();
    return result(drv.cuEventCreate((CUevent *)event, 0));
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    NEED_DRIVER();
    return result(drv.cuEventRecord(event, stream));
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    NEED_DRIVER();
    CUresult rc = drv.cuEventQuery(event);
    return rc == cudaErrorNotReady ? rc : result(rc); /* not ready is no error to remember */
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    NEED_DRIVER();
    return result(drv.cuEventSynchronize(event));
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    NEED_DRIVER();
    return result(drv.cuEventElapsedTime(ms, start, end));
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    NEED_DRIVER();
    return result(drv.cuEventDestroy_v2(event));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
    NEED_DRIVER();
    return result(drv.cuStreamWaitEvent(stream, event, flags));
}

/* ---- errors: answered without the driver, as the real runtime does */

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorMissingConfiguration: return "__global__ function call is not configured";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unrecognized error code";
    }
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t rc = last_error;
    last_error = cudaSuccess;
    return rc;
}

cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}
