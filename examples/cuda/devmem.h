/*
 * devmem: host memory that plays the part of GPU memory in the stand-in CUDA libraries.
 *
 * Allocations are separate anonymous mappings placed, when the address is free, in a
 * range no heap or shared library uses (from 0x600000000000), so a "device pointer" is
 * recognisable in a trace and really readable and writable, which lets cudaMemcpy copy.
 * Compiled into both libcudart.so.12 and libcuda.so.1; the version scripts keep it private.
 */
#ifndef DEVMEM_H
#define DEVMEM_H

#include <stddef.h>

/* Largest single allocation the stand-ins grant, like a small GPU's free memory. */
#define DEVMEM_MAX_BYTES (1ULL << 30)

/* A new zero-filled allocation of size bytes (1..DEVMEM_MAX_BYTES), or NULL. */
void *devmem_alloc(size_t size);

/* Releases an allocation; -1 if ptr is not the start of a live allocation. */
int devmem_free(void *ptr);

/* 1 if [ptr, ptr + count) lies inside one live allocation, else 0. */
int devmem_contains(const void *ptr, size_t count);

#endif
