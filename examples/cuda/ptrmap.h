/*
 * ptrmap: a pointer -> pointer hash map (open addressing, never shrinks), for the stand-ins'
 * handle tables, which are looked up on every launch. Keys are non-NULL; callers lock.
 * Header-only so that each stand-in library gets its own private copy.
 */
#ifndef PTRMAP_H
#define PTRMAP_H

#include <stdint.h>
#include <stdlib.h>

struct ptrmap {
    uintptr_t *keys; /* 0: empty slot */
    void **values;
    size_t capacity, count; /* capacity is 0 or a power of two */
};

static inline size_t ptrmap_slot(const struct ptrmap *m, uintptr_t key)
{
    uint64_t h = (uint64_t)key * 0x9e3779b97f4a7c15ULL;
    size_t i = (size_t)(h >> 17) & (m->capacity - 1);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->capacity - 1);
    return i;
}

/* The value stored for key, or NULL. */
static inline void *ptrmap_get(const struct ptrmap *m, const void *key)
{
    if (!m->capacity || !key)
        return NULL;
    size_t i = ptrmap_slot(m, (uintptr_t)key);
    return m->keys[i] ? m->values[i] : NULL;
}

/* Stores key -> value (replacing any); -1 if out of memory or key is NULL. */
static inline int ptrmap_put(struct ptrmap *m, const void *key, void *value)
{
    if (!key)
        return -1;
    if (2 * (m->count + 1) > m->capacity) {
        struct ptrmap grown = {calloc(m->capacity ? 2 * m->capacity : 64, sizeof(uintptr_t)),
                               calloc(m->capacity ? 2 * m->capacity : 64, sizeof(void *)),
                               m->capacity ? 2 * m->capacity : 64, m->count};
        if (!grown.keys || !grown.values) {
            free(grown.keys);
            free(grown.values);
            return -1;
        }
        for (size_t i = 0; i < m->capacity; i++) {
            if (m->keys[i]) {
                size_t j = ptrmap_slot(&grown, m->keys[i]);
                grown.keys[j] = m->keys[i];
                grown.values[j] = m->values[i];
            }
        }
        free(m->keys);
        free(m->values);
        *m = grown;
    }
    size_t i = ptrmap_slot(m, (uintptr_t)key);
    if (!m->keys[i])
        m->count++;
    m->keys[i] = (uintptr_t)key;
    m->values[i] = value;
    return 0;
}

/* Removes key if present (backward-shift deletion keeps every probe chain intact). */
static inline void ptrmap_remove(struct ptrmap *m, const void *key)
{
    if (!m->capacity || !key)
        return;
    size_t i = ptrmap_slot(m, (uintptr_t)key);
    if (!m->keys[i])
        return;
    m->keys[i] = 0;
    m->count--;
    for (size_t j = (i + 1) & (m->capacity - 1); m->keys[j]; j = (j + 1) & (m->capacity - 1)) {
        uintptr_t k = m->keys[j];
        void *v = m->values[j];
        m->keys[j] = 0;
        size_t home = ptrmap_slot(m, k);
        m->keys[home] = k;
        m->values[home] = v;
    }
}

#endif
