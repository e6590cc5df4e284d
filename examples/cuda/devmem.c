/* devmem: see devmem.h. A mutex guards a small array of live allocations. */
#define _GNU_SOURCE
#include "devmem.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define DEVMEM_BASE 0x600000000000ULL  /* first "device" address tried */
#define DEVMEM_SPAN (1ULL << 44)       /* 16 TiB of addresses before wrapping */
#define DEVMEM_GRAIN (2ULL << 20)      /* 2 MiB: CUDA's allocation granularity */

struct block {
    uintptr_t addr;
    size_t size;   /* bytes the caller asked for */
    size_t mapped; /* bytes mapped: size rounded up to DEVMEM_GRAIN */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct block *blocks;
static size_t nblocks, capacity;
static uintptr_t next_addr = DEVMEM_BASE;

/* Maps len bytes at the next free "device" address, or anywhere if that is taken. */
static void *map_pages(size_t len)
{
    if (next_addr + len > DEVMEM_BASE + DEVMEM_SPAN)
        next_addr = DEVMEM_BASE;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *p = mmap((void *)next_addr, len, PROT_READ | PROT_WRITE, flags | MAP_FIXED_NOREPLACE, -1, 0);
    next_addr += len;
    if (p == MAP_FAILED)
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void *devmem_alloc(size_t size)
{
    if (size == 0 || size > DEVMEM_MAX_BYTES)
        return NULL;
    size_t mapped = (size + DEVMEM_GRAIN - 1) & ~(DEVMEM_GRAIN - 1);
    pthread_mutex_lock(&lock);
    void *p = NULL;
    if (nblocks == capacity) {
        size_t grown = capacity ? capacity * 2 : 64;
        struct block *b = realloc(blocks, grown * sizeof *b);
        if (!b)
            goto out;
        blocks = b;
        capacity = grown;
    }
    p = map_pages(mapped);
    if (p)
        blocks[nblocks++] = (struct block){(uintptr_t)p, size, mapped};
out:
    pthread_mutex_unlock(&lock);
    return p;
}

int devmem_free(void *ptr)
{
    int rc = -1;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nblocks; i++) {
        if (blocks[i].addr == (uintptr_t)ptr) {
            munmap(ptr, blocks[i].mapped);
            blocks[i] = blocks[--nblocks];
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int devmem_contains(const void *ptr, size_t count)
{
    uintptr_t p = (uintptr_t)ptr;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nblocks && !found; i++)
        found = p >= blocks[i].addr && count <= blocks[i].size && p - blocks[i].addr <= blocks[i].size - count;
    pthread_mutex_unlock(&lock);
    return found;
}
