/*
 * Stand-in for NVIDIA's CUDA driver API (libcuda.so.1) on machines without a GPU.
 *
 * Exports the driver calls the agent probes, with the driver's exact C signatures. Memory
 * is real host memory (devmem.c); a function handle from cuModuleGetFunction is a stable
 * pointer per kernel name (the module handle is not checked), so launches of the same
 * kernel carry the same handle, as on a real device. Launches only check their arguments:
 * nothing runs and no time is queued.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUfunc_st *CUfunction;
typedef void *CUmodule;
typedef void *CUstream;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ;
    unsigned blockDimX, blockDimY, blockDimZ;
    unsigned sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
};

/* One per kernel name ever asked for; never freed, so handles stay valid. */
struct CUfunc_st {
    char *name;
    struct CUfunc_st *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUfunc_st *functions;
static int initialized;

CUresult cuInit(unsigned flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE; /* the driver defines no flags */
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

static int ready(void)
{
    return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE);
}

/* The handle for name, made on first request; NULL if out of memory. Caller holds lock. */
static struct CUfunc_st *intern(const char *name)
{
    for (struct CUfunc_st *f = functions; f; f = f->next)
        if (strcmp(f->name, name) == 0)
            return f;
    struct CUfunc_st *f = malloc(sizeof *f);
    if (!f || !(f->name = strdup(name))) {
        free(f);
        return NULL;
    }
    f->next = functions;
    functions = f;
    return f;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    (void)hmod;
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!hfunc || !name || !*name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct CUfunc_st *f = intern(name);
    pthread_mutex_unlock(&lock);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *hfunc = f;
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       void **kernelParams, void **extra)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!f || (kernelParams && extra) || !gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 ||
        gx > 0x7fffffffU || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY, unsigned gridDimZ, unsigned blockDimX,
                        unsigned blockDimY, unsigned blockDimZ, unsigned sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra)
{
    (void)sharedMemBytes, (void)hStream;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                  config->blockDimZ, kernelParams, extra);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
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

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    return devmem_free((void *)(uintptr_t)dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
