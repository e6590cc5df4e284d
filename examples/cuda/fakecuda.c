/*
 * Stand-in for NVIDIA's CUDA driver API (libcuda.so.1) on machines without a GPU.
 *
 * Exports the driver calls the agent probes, and those the stand-in runtime (fakecudart.c)
 * calls, with the driver's exact C signatures. What stands in for the device:
 *   - memory (devmem.c) is real host memory, so copies really copy; the virtual memory calls
 *     (cuMemAddressReserve/cuMemCreate/cuMemMap...) map memfd pages into reserved ranges;
 *   - time (streams.c): launches queue FAKECUDA_KERNEL_US microseconds of work on their stream,
 *     synchronising and events wait for it, host functions really run;
 *   - handles: a CUfunction (cuModuleGetFunction, one per kernel name) and a CUkernel
 *     (cuLibraryGetKernel, one per library and name) are heap pointers made here; a CUkernel
 *     may be passed where a CUfunction is expected, as in CUDA 12 and 13; any other non-NULL
 *     handle is CUDA_ERROR_INVALID_HANDLE.
 * Every entry point counts its calls; fakecuda_calls() (not a CUDA name) lets a program or a
 * test read the counts, so "the runtime called the driver" can be checked without probes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cudadrv.h"
#include "devmem.h"
#include "ptrmap.h"
#include "streams.h"

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
};
#define GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (1ULL << 1)
#define GRAPH_KERNELS 4     /* a graph launch queues as much work as this many kernels */
#define VMM_GRAIN (2ULL << 20) /* cuMemGetAllocationGranularity: 2 MiB, as on NVIDIA GPUs */

/* ---- call counters: one per entry point, counted at entry */

#define DRIVER_CALLS(X)                                                                                             \
    X(cuInit) X(cuDriverGetVersion) X(cuGetProcAddress_v2) X(cuModuleGetFunction) X(cuLibraryLoadData)              \
    X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuKernelGetFunction) X(cuKernelGetName) X(cuFuncGetName)             \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) X(cuLaunchHostFunc)       \
    X(cuGraphLaunch) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemcpy)               \
    X(cuMemcpyAsync) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuMemcpyDtoD_v2) X(cuMemcpyHtoDAsync_v2)               \
    X(cuMemcpyDtoHAsync_v2) X(cuMemcpyDtoDAsync_v2) X(cuMemcpy2D_v2) X(cuMemcpy2DAsync_v2) X(cuMemcpy3D_v2)         \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap)             \
    X(cuMemSetAccess) X(cuMemGetAllocationGranularity) X(cuMemHostRegister_v2) X(cuMemHostUnregister)               \
    X(cuMemAllocHost_v2) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuStreamSynchronize) X(cuCtxSynchronize)              \
    X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize)                    \
    X(cuEventElapsedTime) X(cuEventDestroy_v2) X(cuStreamBeginCapture) X(cuStreamBeginCapture_v2)                 \
    X(cuStreamBeginCapture_ptsz) X(cuStreamBeginCapture_v2_ptsz) X(cuStreamEndCapture) X(cuStreamEndCapture_ptsz)   \
    X(cuGraphCreate) X(cuGraphAddKernelNode) X(cuGraphAddKernelNode_v2) X(cuGraphInstantiate)                       \
    X(cuGraphInstantiate_v2) X(cuGraphInstantiateWithFlags) X(cuGraphInstantiateWithParams)                         \
    X(cuGraphInstantiateWithParams_ptsz) X(cuGraphExecUpdate) X(cuGraphExecUpdate_v2) X(cuGraphExecDestroy)          \
    X(cuGraphDestroy) X(cuGraphLaunch_ptsz) X(cuGraphExecKernelNodeSetParams_v2) X(cuGraphKernelNodeSetParams_v2)   \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2)                 \
    X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuCtxDestroy_v2) X(cuCtxSetCurrent) X(cuCtxGetCurrent)    \
    X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxGetDevice)

#define AS_ENUM(name) CALL_##name,
#define AS_NAME(name) #name,
enum { DRIVER_CALLS(AS_ENUM) CALL_COUNT };
static const char *const call_names[CALL_COUNT] = {DRIVER_CALLS(AS_NAME)};
static unsigned long long call_counts[CALL_COUNT];
#define COUNT(name) __atomic_fetch_add(&call_counts[CALL_##name], 1, __ATOMIC_RELAXED)

/* Fills up to max (name, calls) pairs, in a fixed order, and returns how many entry points
 * there are. Not part of CUDA: the stand-in's own test hook. */
size_t fakecuda_calls(const char **names, unsigned long long *counts, size_t max)
{
    for (size_t i = 0; i < CALL_COUNT && i < max; i++) {
        names[i] = call_names[i];
        counts[i] = __atomic_load_n(&call_counts[i], __ATOMIC_RELAXED);
    }
    return CALL_COUNT;
}

/* ---- state */

enum kind { KERNEL = 1, FUNCTION = 2 };

/* A CUkernel or a CUfunction. Never freed, so a handle stays valid for the process's life. */
struct handle {
    enum kind kind;
    char *name;
    struct library *library;  /* a kernel's library; NULL for module functions */
    struct handle *function;  /* a kernel's CUfunction, made by cuKernelGetFunction */
    struct handle *next;      /* the next kernel of the library, or module function */
};

struct library {
    const void *image;
    struct handle *kernels;
    int unloaded;
};

struct event {
    uint64_t done_ns; /* when the work recorded before it is done */
    int recorded;
};

struct physical { /* a cuMemCreate allocation: memfd pages */
    int fd;
    size_t size;
};

struct range {
    uintptr_t addr;
    size_t size;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static struct handle *module_functions;
static struct ptrmap handles;      /* CUkernel / CUfunction -> itself */
static struct ptrmap libraries;    /* CUlibrary -> itself */
static struct ptrmap events;       /* CUevent -> itself */
static struct ptrmap physicals;    /* CUmemGenericAllocationHandle -> itself */
static struct ptrmap reservations; /* start address -> struct range (cuMemAddressReserve) */
static struct ptrmap mappings;     /* start address -> struct range (cuMemMap) */
static struct ptrmap host_pinned;  /* start address -> struct range (registered or allocated) */
static struct ptrmap host_alloced; /* start address -> itself (cuMemAllocHost_v2/cuMemHostAlloc) */

/* Devices: FAKECUDA_DEVICES of them (1 to MAX_DEVICES, 2 by default), so that a job can drive
 * several. They share one memory and one set of streams: only who asks for which is told. */
#define MAX_DEVICES 8
static int device_count = 2;

__attribute__((constructor)) static void read_settings(void)
{
    streams_read_settings();
    const char *devices = getenv("FAKECUDA_DEVICES");
    if (devices && atoi(devices) >= 1 && atoi(devices) <= MAX_DEVICES)
        device_count = atoi(devices);
}

CUresult cuInit(unsigned flags)
{
    COUNT(cuInit);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE; /* the driver defines no flags */
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

static int ready(void)
{
    return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE);
}

CUresult cuDriverGetVersion(int *version)
{
    COUNT(cuDriverGetVersion);
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}

/* Like the real one, finds an entry point by its base name ("cuMemAlloc" gives cuMemAlloc_v2,
 * "cuLaunchKernel" with the per-thread flag gives cuLaunchKernel_ptsz) — here only this
 * library's own functions. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
                             int *symbolStatus)
{
    COUNT(cuGetProcAddress_v2);
    (void)cudaVersion;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    static void *self;
    Dl_info info;
    if (!__atomic_load_n(&self, __ATOMIC_ACQUIRE) && dladdr((void *)cuInit, &info))
        __atomic_store_n(&self, dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD), __ATOMIC_RELEASE);
    static const char *const ptsz_suffixes[] = {"_v2_ptsz", "_ptsz", "_v2", ""}, *const plain_suffixes[] = {"_v2", ""};
    int ptsz = (flags & GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const char *const *suffixes = ptsz ? ptsz_suffixes : plain_suffixes;
    size_t n = ptsz ? 4 : 2;
    *pfn = NULL;
    char name[256];
    for (size_t i = 0; i < n && self && !*pfn; i++)
        if ((size_t)snprintf(name, sizeof name, "%s%s", symbol, suffixes[i]) < sizeof name)
            *pfn = dlsym(self, name);
    if (symbolStatus)
        *symbolStatus = *pfn ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / _SYMBOL_NOT_FOUND */
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* ---- kernels and functions */

static struct handle *new_handle(enum kind kind, const char *name, struct library *library)
{
    struct handle *h = calloc(1, sizeof *h);
    if (!h || !(h->name = strdup(name)) || ptrmap_put(&handles, h, h)) {
        if (h)
            free(h->name);
        free(h);
        return NULL;
    }
    h->kind = kind;
    h->library = library;
    return h;
}

/* The handle for name in the list, made on first request; NULL if out of memory. Caller holds lock. */
static struct handle *intern(struct handle **list, enum kind kind, const char *name, struct library *library)
{
    for (struct handle *h = *list; h; h = h->next)
        if (strcmp(h->name, name) == 0)
            return h;
    struct handle *h = new_handle(kind, name, library);
    if (h) {
        h->next = *list;
        *list = h;
    }
    return h;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    COUNT(cuModuleGetFunction);
    (void)hmod;
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!hfunc || !name || !*name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct handle *f = intern(&module_functions, FUNCTION, name, NULL);
    pthread_mutex_unlock(&lock);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *hfunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

/* The image is kept by address only: nothing here reads a fatbin. */
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jitOptions, void **jitOptionsValues,
                           unsigned numJitOptions, void *libraryOptions, void **libraryOptionValues,
                           unsigned numLibraryOptions)
{
    COUNT(cuLibraryLoadData);
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!library || !code)
        return CUDA_ERROR_INVALID_VALUE;
    struct library *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->image = code;
    pthread_mutex_lock(&lock);
    int rc = ptrmap_put(&libraries, l, l);
    pthread_mutex_unlock(&lock);
    if (rc) {
        free(l);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *library = (CUlibrary)l;
    return CUDA_SUCCESS;
}

/* Its kernels stay valid handles (launches of them still work): the stand-in frees nothing. */
CUresult cuLibraryUnload(CUlibrary library)
{
    COUNT(cuLibraryUnload);
    pthread_mutex_lock(&lock);
    struct library *l = ptrmap_get(&libraries, library);
    CUresult rc = !l || l->unloaded ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    if (l)
        l->unloaded = 1;
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    COUNT(cuLibraryGetKernel);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pKernel || !name || !*name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct library *l = ptrmap_get(&libraries, library);
    struct handle *k = l && !l->unloaded ? intern(&l->kernels, KERNEL, name, l) : NULL;
    pthread_mutex_unlock(&lock);
    if (!l || l->unloaded)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!k)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pKernel = (CUkernel)k;
    return CUDA_SUCCESS;
}

/* The handle if it is one of ours of the wanted kinds, else NULL. */
static struct handle *lookup(const void *p, int kinds)
{
    pthread_mutex_lock(&lock);
    struct handle *h = ptrmap_get(&handles, p);
    pthread_mutex_unlock(&lock);
    return h && (h->kind & kinds) ? h : NULL;
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    COUNT(cuKernelGetFunction);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    struct handle *k = lookup(kernel, KERNEL);
    if (!k)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    if (!k->function)
        k->function = new_handle(FUNCTION, k->name, k->library);
    struct handle *f = k->function;
    pthread_mutex_unlock(&lock);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pFunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

static CUresult name_of(const char **name, const void *handle, int kinds)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    struct handle *h = lookup(handle, kinds);
    if (!h)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = h->name;
    return CUDA_SUCCESS;
}

CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    COUNT(cuKernelGetName);
    return name_of(name, hfunc, KERNEL);
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    COUNT(cuFuncGetName);
    return name_of(name, hfunc, KERNEL | FUNCTION); /* a CUkernel passes for a CUfunction */
}

/* ---- graphs
 *
 * As NVIDIA's: a stream captures (cuStreamBeginCapture) until cuStreamEndCapture hands over the
 * graph it recorded; a kernel launched on it meanwhile is a node of that graph, not work. A
 * synchronize of a capturing stream (or of the context during a capture) is refused (900) and
 * invalidates the capture: its end returns 901 and no graph. Graphs are also built node by node
 * (cuGraphCreate, cuGraphAddKernelNode[_v2]: a CUfunction, or with the v2 parameters a CUkernel);
 * an instantiation copies its graph's kernels into an executable graph, an update that keeps the
 * node count replaces them (else 910), and a launch queues its kernels' time on the stream. An
 * executable graph may be destroyed while its launches run (their time stays queued); launching
 * it afterwards is 400. Any other non-NULL executable graph (one this driver never made, as the
 * C++ workload's made-up handle) is accepted as before: GRAPH_KERNELS kernels' time. */

struct graph {
    size_t n, cap;
    void **kernels;     /* CUfunction / CUkernel per kernel node, in order */
    unsigned long long id; /* tells a graph from a later one at the same address */
};

struct graph_exec {
    size_t n;
    void **kernels;
    unsigned long long graph_id; /* the graph it was instantiated from: its nodes name its nodes */
};

struct graph_node { /* a CUgraphNode from cuGraphAddKernelNode; never freed */
    struct graph *graph;
    unsigned long long graph_id;
    size_t index;
};

struct capture {
    CUstream stream; /* NULL: a free slot */
    struct graph *graph;
    int invalidated;
};

#define CAPTURES 64
static struct capture captures[CAPTURES];
static int capturing; /* captures open, read without the lock first: launches pay nothing */
static struct ptrmap graphs;     /* CUgraph -> itself */
static struct ptrmap execs;      /* CUgraphExec -> itself */
static struct ptrmap dead_execs; /* destroyed CUgraphExec -> itself, until the address is reused */
static struct ptrmap graph_nodes; /* CUgraphNode -> itself */
static unsigned long long graphs_made;

static int graph_add(struct graph *g, void *kernel)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 8;
        void **k = realloc(g->kernels, cap * sizeof *k);
        if (!k)
            return -1;
        g->kernels = k;
        g->cap = cap;
    }
    g->kernels[g->n++] = kernel;
    return 0;
}

/* Under the lock: the capture of stream, or NULL. */
static struct capture *capture_of(CUstream stream)
{
    for (int i = 0; i < CAPTURES; i++)
        if (captures[i].stream && captures[i].stream == stream)
            return &captures[i];
    return NULL;
}

/* -1: stream does not capture (run the kernel); 0: recorded; 1: out of memory. */
static int capture_launch(CUstream stream, void *kernel)
{
    if (!__atomic_load_n(&capturing, __ATOMIC_ACQUIRE))
        return -1;
    pthread_mutex_lock(&lock);
    struct capture *c = capture_of(stream);
    int rc = c ? (c->invalidated ? 0 : graph_add(c->graph, kernel) != 0) : -1;
    pthread_mutex_unlock(&lock);
    return rc;
}

/* A synchronize of stream (NULL: the context): refused, and the captures it meets invalidated. */
static int capture_refuses_sync(CUstream stream)
{
    if (!__atomic_load_n(&capturing, __ATOMIC_ACQUIRE))
        return 0;
    int refused = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < CAPTURES; i++)
        if (captures[i].stream && (!stream || captures[i].stream == stream)) {
            captures[i].invalidated = 1;
            refused = 1;
        }
    pthread_mutex_unlock(&lock);
    return refused;
}

static CUresult begin_capture(CUstream stream)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!stream || stream == STREAM_LEGACY)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    struct graph *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->id = __atomic_add_fetch(&graphs_made, 1, __ATOMIC_RELAXED);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (capture_of(stream)) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        for (int i = 0; i < CAPTURES; i++)
            if (!captures[i].stream) {
                captures[i] = (struct capture){stream, g, 0};
                __atomic_add_fetch(&capturing, 1, __ATOMIC_RELEASE);
                rc = CUDA_SUCCESS;
                break;
            }
    }
    pthread_mutex_unlock(&lock);
    if (rc)
        free(g);
    return rc;
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    COUNT(cuStreamBeginCapture);
    return begin_capture(hStream);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    COUNT(cuStreamBeginCapture_ptsz);
    return begin_capture(hStream ? hStream : STREAM_PER_THREAD);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode)
{
    COUNT(cuStreamBeginCapture_v2);
    (void)mode;
    return begin_capture(hStream);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode)
{
    COUNT(cuStreamBeginCapture_v2_ptsz);
    (void)mode;
    return begin_capture(hStream ? hStream : STREAM_PER_THREAD);
}

static CUresult end_capture(CUstream stream, CUgraph *phGraph)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct capture *c = capture_of(stream);
    struct capture done = c ? *c : (struct capture){0};
    if (c) {
        c->stream = NULL;
        __atomic_sub_fetch(&capturing, 1, __ATOMIC_RELEASE);
        if (!done.invalidated)
            ptrmap_put(&graphs, done.graph, done.graph);
    }
    pthread_mutex_unlock(&lock);
    *phGraph = NULL;
    if (!c)
        return CUDA_ERROR_ILLEGAL_STATE; /* not capturing */
    if (done.invalidated) {
        free(done.graph->kernels);
        free(done.graph);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *phGraph = (CUgraph)done.graph;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    COUNT(cuStreamEndCapture);
    return end_capture(hStream, phGraph);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    COUNT(cuStreamEndCapture_ptsz);
    return end_capture(hStream ? hStream : STREAM_PER_THREAD, phGraph);
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned flags)
{
    COUNT(cuGraphCreate);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct graph *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->id = __atomic_add_fetch(&graphs_made, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    int rc = ptrmap_put(&graphs, g, g);
    pthread_mutex_unlock(&lock);
    if (rc) {
        free(g);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph, void *kernel)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraphNode || !kernel)
        return CUDA_ERROR_INVALID_VALUE;
    if (!lookup(kernel, KERNEL | FUNCTION))
        return CUDA_ERROR_INVALID_HANDLE;
    struct graph_node *node = malloc(sizeof *node);
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    struct graph *g = ptrmap_get(&graphs, hGraph);
    int rc = !g ? CUDA_ERROR_INVALID_VALUE : graph_add(g, kernel) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    if (!rc) {
        *node = (struct graph_node){g, g->id, g->n - 1};
        if (ptrmap_put(&graph_nodes, node, node))
            rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    if (rc)
        free(node);
    else
        *phGraphNode = (CUgraphNode)node;
    return rc;
}

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                              size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    COUNT(cuGraphAddKernelNode);
    (void)dependencies, (void)numDependencies;
    return add_kernel_node(phGraphNode, hGraph, nodeParams ? (void *)nodeParams->func : NULL);
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    COUNT(cuGraphAddKernelNode_v2);
    (void)dependencies, (void)numDependencies;
    void *kernel = !nodeParams ? NULL : nodeParams->func ? (void *)nodeParams->func : (void *)nodeParams->kern;
    return add_kernel_node(phGraphNode, hGraph, kernel);
}

static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    struct graph_exec *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    struct graph *g = ptrmap_get(&graphs, hGraph);
    if (!g) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (g->n && !(e->kernels = malloc(g->n * sizeof *e->kernels))) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        e->n = g->n;
        e->graph_id = g->id;
        if (g->n)
            memcpy(e->kernels, g->kernels, g->n * sizeof *e->kernels);
        ptrmap_remove(&dead_execs, e);
        if (ptrmap_put(&execs, e, e))
            rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    if (rc) {
        free(e->kernels);
        free(e);
        return rc;
    }
    *phGraphExec = (CUgraphExec)e;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize)
{
    COUNT(cuGraphInstantiate);
    (void)phErrorNode, (void)logBuffer, (void)bufferSize;
    return instantiate(phGraphExec, hGraph);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize)
{
    COUNT(cuGraphInstantiate_v2);
    (void)phErrorNode, (void)logBuffer, (void)bufferSize;
    return instantiate(phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    COUNT(cuGraphInstantiateWithFlags);
    (void)flags;
    return instantiate(phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph, void *instantiateParams)
{
    COUNT(cuGraphInstantiateWithParams);
    (void)instantiateParams;
    return instantiate(phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph, void *instantiateParams)
{
    COUNT(cuGraphInstantiateWithParams_ptsz);
    (void)instantiateParams;
    return instantiate(phGraphExec, hGraph);
}

static CUresult exec_update(CUgraphExec hGraphExec, CUgraph hGraph)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    struct graph_exec *e = ptrmap_get(&execs, hGraphExec);
    struct graph *g = ptrmap_get(&graphs, hGraph);
    if (!e || !g)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (g->n != e->n)
        rc = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE; /* another topology */
    else if (g->n)
        memcpy(e->kernels, g->kernels, g->n * sizeof *e->kernels);
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out, int *updateResult_out)
{
    COUNT(cuGraphExecUpdate);
    CUresult rc = exec_update(hGraphExec, hGraph);
    if (hErrorNode_out)
        *hErrorNode_out = NULL;
    if (updateResult_out)
        *updateResult_out = rc == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE ? 2 /* topology changed */ : 0;
    return rc;
}

CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, void *resultInfo)
{
    COUNT(cuGraphExecUpdate_v2);
    if (resultInfo)
        memset(resultInfo, 0, 24); /* CUgraphExecUpdateResultInfo: result, errorNode, errorFromNode */
    CUresult rc = exec_update(hGraphExec, hGraph);
    if (resultInfo && rc == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
        *(int *)resultInfo = 2;
    return rc;
}

/* Under the lock: the node if it is one of a live graph's. */
static struct graph_node *node_of(CUgraphNode hNode)
{
    struct graph_node *n = ptrmap_get(&graph_nodes, hNode);
    struct graph *g = n ? ptrmap_get(&graphs, n->graph) : NULL;
    return g && g->id == n->graph_id && n->index < g->n ? n : NULL;
}

static void *node_kernel(const CUDA_KERNEL_NODE_PARAMS *p)
{
    return !p ? NULL : p->func ? (void *)p->func : (void *)p->kern;
}

/* The kernel of one node of an executable graph: the graph it was made from is left as it is. */
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                           const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    COUNT(cuGraphExecKernelNodeSetParams_v2);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    void *kernel = node_kernel(nodeParams);
    if (!kernel)
        return CUDA_ERROR_INVALID_VALUE;
    if (!lookup(kernel, KERNEL | FUNCTION))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct graph_exec *e = ptrmap_get(&execs, hGraphExec);
    struct graph_node *n = ptrmap_get(&graph_nodes, hNode);
    if (e && n && n->graph_id == e->graph_id && n->index < e->n) {
        e->kernels[n->index] = kernel;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    COUNT(cuGraphKernelNodeSetParams_v2);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    void *kernel = node_kernel(nodeParams);
    if (!kernel)
        return CUDA_ERROR_INVALID_VALUE;
    if (!lookup(kernel, KERNEL | FUNCTION))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    struct graph_node *n = node_of(hNode);
    if (n)
        n->graph->kernels[n->index] = kernel;
    pthread_mutex_unlock(&lock);
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    COUNT(cuGraphExecDestroy);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct graph_exec *e = ptrmap_get(&execs, hGraphExec);
    if (e) {
        ptrmap_remove(&execs, e);
        ptrmap_put(&dead_execs, e, e);
    }
    pthread_mutex_unlock(&lock);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    free(e->kernels);
    free(e); /* queued launches keep their time: nothing refers to it */
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    COUNT(cuGraphDestroy);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct graph *g = ptrmap_get(&graphs, hGraph);
    if (g)
        ptrmap_remove(&graphs, g);
    pthread_mutex_unlock(&lock);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    free(g->kernels);
    free(g);
    return CUDA_SUCCESS;
}

/* ---- launches */

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       CUstream stream, void **kernelParams, void **extra)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!f || (kernelParams && extra) || !gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 ||
        gx > 0x7fffffffU || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (!lookup(f, KERNEL | FUNCTION))
        return CUDA_ERROR_INVALID_HANDLE;
    int captured = capture_launch(stream, f);
    if (captured >= 0)
        return captured ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS; /* recorded, not run */
    return streams_enqueue(stream, 1) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

static CUstream per_thread(CUstream stream)
{
    return stream ? stream : STREAM_PER_THREAD;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY, unsigned gridDimZ, unsigned blockDimX,
                        unsigned blockDimY, unsigned blockDimZ, unsigned sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra)
{
    COUNT(cuLaunchKernel);
    (void)sharedMemBytes;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gridDimX, unsigned gridDimY, unsigned gridDimZ,
                             unsigned blockDimX, unsigned blockDimY, unsigned blockDimZ, unsigned sharedMemBytes,
                             CUstream hStream, void **kernelParams, void **extra)
{
    COUNT(cuLaunchKernel_ptsz);
    (void)sharedMemBytes;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, per_thread(hStream),
                  kernelParams, extra);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **kernelParams, void **extra, int ptsz)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                  ptsz ? per_thread(c->hStream) : c->hStream, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    COUNT(cuLaunchKernelEx);
    return launch_ex(config, f, kernelParams, extra, 0);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    COUNT(cuLaunchKernelEx_ptsz);
    return launch_ex(config, f, kernelParams, extra, 1);
}

CUresult cuLaunchHostFunc(CUstream hStream, void (*fn)(void *), void *userData)
{
    COUNT(cuLaunchHostFunc);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    return streams_host_func(hStream, fn, userData) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

/* An executable graph made here queues its kernels' time; a destroyed one is 400; any other
 * non-NULL handle GRAPH_KERNELS kernels' time (see graphs above). */
static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!hGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct graph_exec *e = ptrmap_get(&execs, hGraphExec);
    int dead = !e && ptrmap_get(&dead_execs, hGraphExec);
    unsigned kernels = e ? (unsigned)e->n : GRAPH_KERNELS;
    pthread_mutex_unlock(&lock);
    if (dead)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!kernels)
        return CUDA_SUCCESS;
    return streams_enqueue(hStream, kernels) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    COUNT(cuGraphLaunch);
    return graph_launch(hGraphExec, hStream);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    COUNT(cuGraphLaunch_ptsz);
    return graph_launch(hGraphExec, per_thread(hStream));
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    COUNT(cuStreamSynchronize);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (capture_refuses_sync(hStream))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    streams_drain(hStream, 0);
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    COUNT(cuCtxSynchronize);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (capture_refuses_sync(NULL))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    streams_drain(NULL, 1);
    return CUDA_SUCCESS;
}

/* ---- events */

static struct event *find_event(CUevent e)
{
    pthread_mutex_lock(&lock);
    struct event *found = ptrmap_get(&events, e);
    pthread_mutex_unlock(&lock);
    return found;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned Flags)
{
    COUNT(cuEventCreate);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phEvent || Flags > 0xf)
        return CUDA_ERROR_INVALID_VALUE;
    struct event *e = calloc(1, sizeof *e);
    pthread_mutex_lock(&lock);
    int rc = e ? ptrmap_put(&events, e, e) : -1;
    pthread_mutex_unlock(&lock);
    if (rc) {
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    COUNT(cuEventRecord);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct event *e = find_event(hEvent);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t t;
    if (streams_ready_at(hStream, &t))
        return CUDA_ERROR_OUT_OF_MEMORY;
    __atomic_store_n(&e->done_ns, t, __ATOMIC_RELAXED);
    __atomic_store_n(&e->recorded, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

/* An event never recorded counts as complete, as in CUDA. */
CUresult cuEventQuery(CUevent hEvent)
{
    COUNT(cuEventQuery);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct event *e = find_event(hEvent);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!__atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    return __atomic_load_n(&e->done_ns, __ATOMIC_RELAXED) <= streams_now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    COUNT(cuEventSynchronize);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct event *e = find_event(hEvent);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (__atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE))
        streams_sleep_until(__atomic_load_n(&e->done_ns, __ATOMIC_RELAXED));
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    COUNT(cuEventElapsedTime);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct event *a = find_event(hStart), *b = find_event(hEnd);
    if (!a || !b)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pMilliseconds || !a->recorded || !b->recorded)
        return CUDA_ERROR_INVALID_VALUE; /* CUDA: CUDA_ERROR_INVALID_HANDLE for an unrecorded one */
    uint64_t now = streams_now_ns();
    if (a->done_ns > now || b->done_ns > now)
        return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)((double)((int64_t)b->done_ns - (int64_t)a->done_ns) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    COUNT(cuEventDestroy_v2);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct event *e = ptrmap_get(&events, hEvent);
    ptrmap_remove(&events, e);
    pthread_mutex_unlock(&lock);
    free(e);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned Flags)
{
    COUNT(cuStreamWaitEvent);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct event *e = find_event(hEvent);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (Flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (!__atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    return streams_wait_until(hStream, e->done_ns) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

/* ---- memory */

static CUresult alloc(CUdeviceptr *dptr, size_t bytesize)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = devmem_alloc(bytesize);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    COUNT(cuMemAlloc_v2);
    return alloc(dptr, bytesize);
}

/* Stream-ordered in CUDA; here the memory is there at once. */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    COUNT(cuMemAllocAsync);
    (void)hStream;
    return alloc(dptr, bytesize);
}

/* Freeing waits for the device, as cuMemFree does. */
CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    COUNT(cuMemFree_v2);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    streams_drain(NULL, 1);
    return devmem_free((void *)(uintptr_t)dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Stream-ordered: nothing waits. */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    COUNT(cuMemFreeAsync);
    (void)hStream;
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    return devmem_free((void *)(uintptr_t)dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* 1 if [p, p + n) is inside a range of the map (keyed by start address). Caller holds lock. */
static int in_ranges(const struct ptrmap *m, uintptr_t p, size_t n)
{
    for (size_t i = 0; i < m->capacity; i++) {
        const struct range *r = m->keys[i] ? m->values[i] : NULL;
        if (r && p >= r->addr && n <= r->size && p - r->addr <= r->size - n)
            return 1;
    }
    return 0;
}

/* 1 if [p, p + n) is device memory: one cuMemAlloc allocation or one cuMemMap mapping. */
static int on_device(CUdeviceptr p, size_t n)
{
    if (devmem_contains((void *)(uintptr_t)p, n))
        return 1;
    pthread_mutex_lock(&lock);
    int found = in_ranges(&mappings, (uintptr_t)p, n);
    pthread_mutex_unlock(&lock);
    return found;
}

/* Checks each device side, then copies at once; sync copies first wait for the device, as on
 * the legacy default stream. */
static CUresult copy(void *dst, int dst_device, const void *src, int src_device, size_t n, int sync)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src || (dst_device && !on_device((uintptr_t)dst, n)) || (src_device && !on_device((uintptr_t)src, n)))
        return CUDA_ERROR_INVALID_VALUE;
    if (sync)
        streams_drain(NULL, 1);
    memmove(dst, src, n);
    return CUDA_SUCCESS;
}

#define DEV(p) ((void *)(uintptr_t)(p))

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    COUNT(cuMemcpy);
    return copy(DEV(dst), 0, DEV(src), 0, ByteCount, 1); /* unified addressing: either side may be either */
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    COUNT(cuMemcpyAsync);
    (void)hStream;
    return copy(DEV(dst), 0, DEV(src), 0, ByteCount, 0);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    COUNT(cuMemcpyHtoD_v2);
    return copy(DEV(dstDevice), 1, srcHost, 0, ByteCount, 1);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    COUNT(cuMemcpyDtoH_v2);
    return copy(dstHost, 0, DEV(srcDevice), 1, ByteCount, 1);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    COUNT(cuMemcpyDtoD_v2);
    return copy(DEV(dstDevice), 1, DEV(srcDevice), 1, ByteCount, 1);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    COUNT(cuMemcpyHtoDAsync_v2);
    (void)hStream;
    return copy(DEV(dstDevice), 1, srcHost, 0, ByteCount, 0);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    COUNT(cuMemcpyDtoHAsync_v2);
    (void)hStream;
    return copy(dstHost, 0, DEV(srcDevice), 1, ByteCount, 0);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    COUNT(cuMemcpyDtoDAsync_v2);
    (void)hStream;
    return copy(DEV(dstDevice), 1, DEV(srcDevice), 1, ByteCount, 0);
}

/* One side of a 2D/3D copy: where row (y, z) starts. Arrays are not supported. */
static CUresult side(int type, const void *host, CUdeviceptr device, size_t x, size_t y, size_t z, size_t pitch,
                     size_t height, const char **at, int *on_dev)
{
    if (type != CU_MEMORYTYPE_HOST && type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED)
        return type == CU_MEMORYTYPE_ARRAY ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    const char *base = type == CU_MEMORYTYPE_HOST ? host : (const char *)DEV(device);
    *at = base + x + pitch * (y + height * z);
    *on_dev = type == CU_MEMORYTYPE_DEVICE;
    return base ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult copy3d(const CUDA_MEMCPY3D *c, int sync)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!c || (c->Height > 1 && (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes)) ||
        (c->Depth > 1 && (c->srcHeight < c->Height || c->dstHeight < c->Height)))
        return CUDA_ERROR_INVALID_VALUE;
    if (sync)
        streams_drain(NULL, 1);
    for (size_t z = 0; z < c->Depth; z++) {
        for (size_t y = 0; y < c->Height; y++) {
            const char *s, *d;
            int s_dev, d_dev;
            CUresult rc = side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY + y, c->srcZ + z,
                               c->srcPitch, c->srcHeight, &s, &s_dev);
            if (!rc)
                rc = side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY + y, c->dstZ + z,
                          c->dstPitch, c->dstHeight, &d, &d_dev);
            if (!rc)
                rc = copy((void *)d, d_dev, s, s_dev, c->WidthInBytes, 0);
            if (rc)
                return rc;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult copy2d(const CUDA_MEMCPY2D *c, int sync)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_MEMCPY3D d = {
        .srcXInBytes = c->srcXInBytes, .srcY = c->srcY, .srcMemoryType = c->srcMemoryType, .srcHost = c->srcHost,
        .srcDevice = c->srcDevice, .srcArray = c->srcArray, .srcPitch = c->srcPitch, .srcHeight = c->Height,
        .dstXInBytes = c->dstXInBytes, .dstY = c->dstY, .dstMemoryType = c->dstMemoryType, .dstHost = c->dstHost,
        .dstDevice = c->dstDevice, .dstArray = c->dstArray, .dstPitch = c->dstPitch, .dstHeight = c->Height,
        .WidthInBytes = c->WidthInBytes, .Height = c->Height, .Depth = 1,
    };
    return copy3d(&d, sync);
}

CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy)
{
    COUNT(cuMemcpy2D_v2);
    return copy2d(pCopy, 1);
}

CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    COUNT(cuMemcpy2DAsync_v2);
    (void)hStream;
    return copy2d(pCopy, 0);
}

CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy)
{
    COUNT(cuMemcpy3D_v2);
    return copy3d(pCopy, 1);
}

/* ---- virtual memory management (what PyTorch's expandable segments use) */

static struct range *new_range(uintptr_t addr, size_t size)
{
    struct range *r = malloc(sizeof *r);
    if (r)
        *r = (struct range){addr, size};
    return r;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const void *prop, int option)
{
    COUNT(cuMemGetAllocationGranularity);
    (void)option;
    if (!granularity || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRAIN;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    COUNT(cuMemAddressReserve);
    (void)addr, (void)flags;
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr || !size || size % VMM_GRAIN || (alignment & (alignment - 1)) || alignment > VMM_GRAIN)
        return CUDA_ERROR_INVALID_VALUE;
    /* Over-reserve by one grain so the start can be aligned to it. */
    char *p = mmap(NULL, size + VMM_GRAIN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    char *start = (char *)(((uintptr_t)p + VMM_GRAIN - 1) & ~(uintptr_t)(VMM_GRAIN - 1));
    if (start > p)
        munmap(p, start - p);
    munmap(start + size, p + size + VMM_GRAIN - (start + size));
    struct range *r = new_range((uintptr_t)start, size);
    pthread_mutex_lock(&lock);
    int rc = r ? ptrmap_put(&reservations, start, r) : -1;
    pthread_mutex_unlock(&lock);
    if (rc) {
        free(r);
        munmap(start, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (CUdeviceptr)(uintptr_t)start;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    COUNT(cuMemAddressFree);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct range *r = ptrmap_get(&reservations, DEV(ptr));
    int ok = r && r->size == size && !in_ranges(&mappings, r->addr, 1);
    if (ok)
        ptrmap_remove(&reservations, DEV(ptr));
    pthread_mutex_unlock(&lock);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(DEV(ptr), size);
    free(r);
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop, unsigned long long flags)
{
    COUNT(cuMemCreate);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle || !prop || flags || !size || size % VMM_GRAIN || size > DEVMEM_MAX_BYTES)
        return CUDA_ERROR_INVALID_VALUE;
    struct physical *m = malloc(sizeof *m);
    int fd = m ? memfd_create("fakecuda-vmm", MFD_CLOEXEC) : -1;
    if (fd < 0 || ftruncate(fd, (off_t)size)) {
        if (fd >= 0)
            close(fd);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *m = (struct physical){fd, size};
    pthread_mutex_lock(&lock);
    int rc = ptrmap_put(&physicals, m, m);
    pthread_mutex_unlock(&lock);
    if (rc) {
        close(fd);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)m;
    return CUDA_SUCCESS;
}

/* Mappings keep the pages alive: releasing a mapped allocation is allowed, as in CUDA. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    COUNT(cuMemRelease);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct physical *m = ptrmap_get(&physicals, DEV(handle));
    ptrmap_remove(&physicals, m);
    pthread_mutex_unlock(&lock);
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    close(m->fd);
    free(m);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    COUNT(cuMemMap);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct physical *m = ptrmap_get(&physicals, DEV(handle));
    CUresult rc = CUDA_SUCCESS;
    if (!m || flags || !size || size % VMM_GRAIN || offset % VMM_GRAIN || offset > m->size ||
        size > m->size - offset || !in_ranges(&reservations, (uintptr_t)ptr, size) ||
        in_ranges(&mappings, (uintptr_t)ptr, 1) || in_ranges(&mappings, (uintptr_t)ptr + size - 1, 1))
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (mmap(DEV(ptr), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m->fd, (off_t)offset) == MAP_FAILED)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    struct range *r = rc ? NULL : new_range((uintptr_t)ptr, size);
    if (!rc && (!r || ptrmap_put(&mappings, DEV(ptr), r))) {
        free(r);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Access is read-write from the start here; the call only checks that the range is mapped. */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count)
{
    COUNT(cuMemSetAccess);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!desc || !count || !on_device(ptr, size))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Unmaps exactly one earlier cuMemMap range; the reservation stays. */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    COUNT(cuMemUnmap);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    streams_drain(NULL, 1); /* as CUDA's does */
    pthread_mutex_lock(&lock);
    struct range *r = ptrmap_get(&mappings, DEV(ptr));
    int ok = r && r->size == size;
    if (ok) {
        ptrmap_remove(&mappings, DEV(ptr));
        mmap(DEV(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    }
    pthread_mutex_unlock(&lock);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    free(r);
    return CUDA_SUCCESS;
}

/* ---- page-locked host memory: tracked, so pinned and pageable copies can be told apart */

static CUresult pin(void *p, size_t bytesize)
{
    struct range *r = new_range((uintptr_t)p, bytesize);
    pthread_mutex_lock(&lock);
    CUresult rc = CUDA_SUCCESS;
    if (in_ranges(&host_pinned, (uintptr_t)p, 1) || in_ranges(&host_pinned, (uintptr_t)p + bytesize - 1, 1))
        rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (!r || ptrmap_put(&host_pinned, p, r))
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&lock);
    if (rc)
        free(r);
    return rc;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned Flags)
{
    COUNT(cuMemHostRegister_v2);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || !bytesize || Flags > 0xf)
        return CUDA_ERROR_INVALID_VALUE;
    return pin(p, bytesize);
}

CUresult cuMemHostUnregister(void *p)
{
    COUNT(cuMemHostUnregister);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct range *r = ptrmap_get(&host_pinned, p);
    int ok = r && !ptrmap_get(&host_alloced, p);
    if (ok)
        ptrmap_remove(&host_pinned, p);
    pthread_mutex_unlock(&lock);
    if (!ok)
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    free(r);
    return CUDA_SUCCESS;
}

static CUresult host_alloc(void **pp, size_t bytesize)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pp || !bytesize || bytesize > DEVMEM_MAX_BYTES)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = pin(p, bytesize);
    pthread_mutex_lock(&lock);
    if (!rc && ptrmap_put(&host_alloced, p, p))
        rc = CUDA_ERROR_OUT_OF_MEMORY; /* the pin stays; the pages are lost: out of memory anyway */
    pthread_mutex_unlock(&lock);
    if (rc) {
        munmap(p, bytesize);
        return rc;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    COUNT(cuMemAllocHost_v2);
    return host_alloc(pp, bytesize);
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned Flags)
{
    COUNT(cuMemHostAlloc);
    if (Flags > 0xf)
        return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, bytesize);
}

CUresult cuMemFreeHost(void *p)
{
    COUNT(cuMemFreeHost);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct range *r = ptrmap_get(&host_alloced, p) ? ptrmap_get(&host_pinned, p) : NULL;
    if (r) {
        ptrmap_remove(&host_alloced, p);
        ptrmap_remove(&host_pinned, p);
    }
    pthread_mutex_unlock(&lock);
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, r->size);
    free(r);
    return CUDA_SUCCESS;
}

/* ---- devices and contexts
 *
 * As the driver keeps them: each device has a primary context (cuDevicePrimaryCtxRetain, what the
 * runtime's cudaSetDevice makes current), cuCtxCreate makes others (pushed onto the calling
 * thread's stack), and each thread has its own context stack: cuCtxSetCurrent replaces its top
 * (NULL pops it), cuCtxPushCurrent and cuCtxPopCurrent push and pop. A context is a struct
 * context; any other non-NULL handle is CUDA_ERROR_INVALID_CONTEXT. */

#define CTX_STACK 16

struct context {
    CUdevice device;
};

static struct context primaries[MAX_DEVICES];
static struct ptrmap created; /* cuCtxCreate's contexts -> themselves */
static __thread CUcontext ctx_stack[CTX_STACK];
static __thread int ctx_depth;

/* Not inlined, so that the entry points below are no leaf functions: GCC gives them a frame
 * (endbr64; push %rbp) as the other entry points have, where the agent's probes go. */
static __attribute__((noinline)) int unready(void)
{
    return !ready();
}

static int valid_device(CUdevice dev)
{
    return dev >= 0 && dev < device_count;
}

static int valid_context(CUcontext ctx)
{
    struct context *c = ctx;
    if (c >= primaries && c < primaries + device_count)
        return 1;
    pthread_mutex_lock(&lock);
    int known = ptrmap_get(&created, ctx) != NULL;
    pthread_mutex_unlock(&lock);
    return known;
}

CUresult cuDeviceGetCount(int *count)
{
    COUNT(cuDeviceGetCount);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    COUNT(cuDeviceGet);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRetain);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    primaries[dev].device = dev;
    *pctx = &primaries[dev];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRelease_v2);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    return valid_device(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* cuCtxCreate_v2/v3/v4's work: a context of dev, pushed onto the calling thread's stack. */
static CUresult create_context(CUcontext *pctx, CUdevice dev)
{
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct context *c = malloc(sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->device = dev;
    pthread_mutex_lock(&lock);
    int err = ptrmap_put(&created, c, c);
    pthread_mutex_unlock(&lock);
    if (err) {
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ctx_stack[ctx_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    COUNT(cuCtxCreate_v2);
    (void)flags;
    return create_context(pctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams, unsigned flags, CUdevice dev)
{
    COUNT(cuCtxCreate_v3);
    (void)paramsArray;
    (void)numParams;
    (void)flags;
    return create_context(pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned flags, CUdevice dev)
{
    COUNT(cuCtxCreate_v4);
    (void)ctxCreateParams;
    (void)flags;
    return create_context(pctx, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    COUNT(cuCtxDestroy_v2);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int known = ctx && ptrmap_get(&created, ctx) != NULL;
    if (known)
        ptrmap_remove(&created, ctx);
    pthread_mutex_unlock(&lock);
    if (!known)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth && ctx_stack[ctx_depth - 1] == ctx)
        ctx_depth--; /* current on this thread: popped, as the driver does */
    free(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    COUNT(cuCtxSetCurrent);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx) {
        if (ctx_depth)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx_depth)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    COUNT(cuCtxGetCurrent);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    COUNT(cuCtxPushCurrent_v2);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx || !valid_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    COUNT(cuCtxPopCurrent_v2);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext top = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = top;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    COUNT(cuCtxGetDevice);
    if (unready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = ((struct context *)ctx_stack[ctx_depth - 1])->device;
    return CUDA_SUCCESS;
}
