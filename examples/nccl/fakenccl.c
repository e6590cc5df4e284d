/*
 * Stand-in for NVIDIA's NCCL (libnccl.so.2) on machines without a GPU.
 *
 * Exports the calls otelbpf probes with NCCL's exact C signatures, each as pnccl<Name> with a
 * weak alias nccl<Name> at the same address, as the real library does. The ranks of a
 * communicator are separate processes on this machine; they meet in POSIX shared memory named
 * after the ncclUniqueId, so a collective really waits for the last rank:
 *
 *   - each rank's call only *enqueues*: it records its arrival (a per-rank counter in shared
 *     memory, so a collective is identified by communicator + sequence number) and queues a
 *     host function on the caller's stream with the stand-in CUDA runtime's
 *     cudaLaunchHostFunc, then returns at once;
 *   - the host function waits until every rank has arrived at that sequence number (for
 *     ncclSend/ncclRecv: until the peer has posted the matching call), then spends the
 *     "transfer" time, FAKENCCL_LINK_US microseconds (default 10) plus bytes at
 *     FAKENCCL_GBPS (default 100) GB/s;
 *   - so completion is observed where a real program observes it: at the next
 *     cudaStreamSynchronize (or cudaDeviceSynchronize) on that stream.
 *
 * No data moves: buffers are checked, not read. A dead peer (its process gone or a zombie) or
 * a peer that aborted fails the waits with ncclRemoteError (the communicator's async error);
 * a wait longer than FAKENCCL_TIMEOUT_MS (default 30000) fails with ncclSystemError.
 * FAKENCCL_BLOCKING=1 makes every call return at completion instead (nothing on the stream).
 * FAKENCCL_CRASH_AT_CALL=n kills the process (SIGKILL) inside its n-th collective or
 * point-to-point call, before it arrives: a rank dying mid-collective.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef void *cudaStream_t;
extern int cudaLaunchHostFunc(cudaStream_t stream, void (*fn)(void *), void *userData);

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct ncclComm *ncclComm_t;
typedef int ncclDataType_t; /* ncclInt8 = 0 ... ncclFloat8e5m2 = 11 */
typedef int ncclRedOp_t;    /* ncclSum = 0, ncclProd, ncclMax, ncclMin, ncclAvg = 4 */

/* The leading fields of NCCL's ncclConfig_t (NCCL_CONFIG_INITIALIZER fills size and magic). */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
} ncclConfig_t;

#define FAKENCCL_VERSION 22105 /* reported as NCCL 2.21.5 */
#define MAX_RANKS 64
#define NUM_DATATYPES 12
#define NUM_OPS 5
#define SPLIT_NOCOLOR (-1)
static const char MAGIC[8] = {'f', 'a', 'k', 'e', 'n', 'c', 'c', 'l'};
static const size_t TYPE_SIZE[NUM_DATATYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

/* One per communicator, shared by its ranks. Only rank r writes arrived[r], sent[r][*] and
 * received[r][*]; every change bumps gen, the futex word waiters sleep on. */
struct shared {
    _Atomic uint32_t gen;
    _Atomic uint32_t nranks;
    _Atomic uint32_t joined;
    _Atomic int32_t failed;                 /* 0, or 1 + a rank that aborted or died */
    _Atomic int32_t pids[MAX_RANKS];
    _Atomic uint64_t arrived[MAX_RANKS];    /* collectives (and split steps) each rank entered */
    _Atomic uint64_t sent[MAX_RANKS][MAX_RANKS];     /* [src][dst] sends posted */
    _Atomic uint64_t received[MAX_RANKS][MAX_RANKS]; /* [dst][src] receives posted */
    int32_t split_color[MAX_RANKS];
    int32_t split_key[MAX_RANKS];
};

struct ncclComm {
    struct shared *sh;
    int rank, nranks;
    uint64_t seq;        /* arrivals so far: collective k waits for every arrived[] >= k */
    uint64_t splits;     /* ncclCommSplit calls so far (they derive the child's id) */
    unsigned char key[16]; /* the random part of the unique id; names the shared memory */
    _Atomic uint32_t refs;  /* the handle plus one per queued host function; futex word */
    _Atomic int aborted;
    _Atomic int async_error;
};

enum op_kind { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_BROADCAST, OP_REDUCE, OP_SEND, OP_RECV };

struct op {
    enum op_kind kind;
    ncclComm_t comm;
    cudaStream_t stream;
    size_t bytes;
    int peer;
};

/* An enqueued operation, handed to the host function that completes it. */
struct ticket {
    ncclComm_t comm;
    enum op_kind kind;
    uint64_t target; /* sequence number, or for send/recv the count the peer must reach */
    int peer;
    size_t bytes;
};

static __thread int group_depth;
static __thread struct op *group_ops;
static __thread size_t group_len, group_cap;
static __thread ncclResult_t group_error;
static _Atomic uint64_t calls; /* collective and point-to-point calls, for FAKENCCL_CRASH_AT_CALL */
static uint64_t link_ns = 10000, timeout_ns = 30000000000ULL, crash_at_call, blocking;
static double bytes_per_ns = 100.0;

static uint64_t env_u64(const char *name, uint64_t fallback, uint64_t max)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return fallback;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || *v == '-' || x > max) {
        fprintf(stderr, "fake libnccl: ignoring %s=%s (want a whole number up to %llu)\n", name, v,
                (unsigned long long)max);
        return fallback;
    }
    return x;
}

__attribute__((constructor)) static void read_settings(void)
{
    link_ns = env_u64("FAKENCCL_LINK_US", 10, 3600000000ULL) * 1000;
    timeout_ns = env_u64("FAKENCCL_TIMEOUT_MS", 30000, 86400000ULL) * 1000000;
    uint64_t gbps = env_u64("FAKENCCL_GBPS", 100, 1000000);
    bytes_per_ns = gbps ? (double)gbps : 100.0;
    crash_at_call = env_u64("FAKENCCL_CRASH_AT_CALL", 0, UINT64_MAX);
    blocking = env_u64("FAKENCCL_BLOCKING", 0, 1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expected, int shared, uint64_t max_ns)
{
    struct timespec ts = {(time_t)(max_ns / 1000000000), (long)(max_ns % 1000000000)};
    syscall(SYS_futex, word, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, expected, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word, int shared)
{
    syscall(SYS_futex, word, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void bump(struct shared *sh)
{
    atomic_fetch_add(&sh->gen, 1);
    futex_wake(&sh->gen, 1);
}

/* Gone, or a zombie nobody has reaped yet: either way it will never arrive. */
static int process_dead(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 1;
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* the name may contain spaces and ')' */
    return paren && (paren[2] == 'Z' || paren[2] == 'X');
}

static void shm_name(const unsigned char key[16], char out[64])
{
    int n = snprintf(out, 64, "/fakenccl-");
    for (int i = 0; i < 16; i++)
        n += snprintf(out + n, 64 - n, "%02x", key[i]);
}

static int peers_failed(ncclComm_t c)
{
    struct shared *sh = c->sh;
    if (atomic_load(&sh->failed))
        return 1;
    for (int r = 0; r < c->nranks; r++) {
        int32_t pid = atomic_load(&sh->pids[r]);
        if (r != c->rank && pid > 0 && process_dead(pid)) {
            int32_t none = 0;
            atomic_compare_exchange_strong(&sh->failed, &none, r + 1);
            bump(sh);
            return 1;
        }
    }
    return 0;
}

/* Waits until done(c, arg) holds; fails when a peer died or aborted, or on timeout. */
static ncclResult_t wait_for(ncclComm_t c, int (*done)(ncclComm_t, uint64_t, int), uint64_t arg, int peer)
{
    uint64_t deadline = now_ns() + timeout_ns;
    for (;;) {
        uint32_t gen = atomic_load(&c->sh->gen);
        if (done(c, arg, peer))
            return ncclSuccess;
        if (atomic_load(&c->aborted) || peers_failed(c))
            return ncclRemoteError;
        uint64_t now = now_ns();
        if (now >= deadline) {
            fprintf(stderr, "fake libnccl: rank %d waited %llu ms for its peers; giving up\n", c->rank,
                    (unsigned long long)(timeout_ns / 1000000));
            return ncclSystemError;
        }
        uint64_t left = deadline - now;
        futex_wait(&c->sh->gen, gen, 1, left < 100000000 ? left : 100000000); /* recheck peers at 10 Hz */
    }
}

static int all_arrived(ncclComm_t c, uint64_t seq, int peer)
{
    (void)peer;
    for (int r = 0; r < c->nranks; r++)
        if (atomic_load(&c->sh->arrived[r]) < seq)
            return 0;
    return 1;
}

static int peer_received(ncclComm_t c, uint64_t n, int peer)
{
    return atomic_load(&c->sh->received[peer][c->rank]) >= n;
}

static int peer_sent(ncclComm_t c, uint64_t n, int peer)
{
    return atomic_load(&c->sh->sent[peer][c->rank]) >= n;
}

static int all_joined(ncclComm_t c, uint64_t n, int peer)
{
    (void)peer;
    return atomic_load(&c->sh->joined) >= n;
}

/* Operations of this process queued and not yet completed (ncclFakeInflight). */
static _Atomic int inflight;

/* Not NCCL: the stand-in's own hook. The stand-in runtime's events complete when the kernels
 * queued before them do, not when a host function (a collective here) has run, so a job that
 * waits on an event after a collective first waits for this to reach 0 (nccl_job.c). */
int ncclFakeInflight(void)
{
    return atomic_load(&inflight);
}

static void release(ncclComm_t c)
{
    atomic_fetch_sub(&c->refs, 1);
    futex_wake(&c->refs, 0);
}

/* Host function: the operation completes once its peers are there, plus the transfer time. */
static void complete(void *arg)
{
    struct ticket *t = arg;
    ncclComm_t c = t->comm;
    ncclResult_t rc;
    if (t->kind == OP_SEND)
        rc = wait_for(c, peer_received, t->target, t->peer);
    else if (t->kind == OP_RECV)
        rc = wait_for(c, peer_sent, t->target, t->peer);
    else
        rc = wait_for(c, all_arrived, t->target, 0);
    if (rc == ncclSuccess)
        sleep_ns(link_ns + (uint64_t)((double)t->bytes / bytes_per_ns));
    else
        atomic_store(&c->async_error, rc);
    release(c);
    free(t);
    atomic_fetch_sub(&inflight, 1);
}

static ncclResult_t arrive(ncclComm_t c)
{
    atomic_store(&c->sh->arrived[c->rank], ++c->seq);
    bump(c->sh);
    return ncclSuccess;
}

/* FAKENCCL_BLOCKING=1: the call (a group: its outermost ncclGroupEnd) returns at completion, as a
 * blocking wait or a CPU-side backend does; the caller never synchronizes. Every operation of
 * the call is issued (arrived) before the first is waited for, so a ring of send/recv in one
 * group cannot deadlock. */
static ncclResult_t issue(const struct op *o, struct ticket **out)
{
    ncclComm_t c = o->comm;
    if (atomic_load(&c->async_error))
        return atomic_load(&c->async_error);
    struct ticket *t = calloc(1, sizeof *t);
    if (!t)
        return ncclSystemError;
    *t = (struct ticket){c, o->kind, 0, o->peer, o->bytes};
    struct shared *sh = c->sh;
    if (o->kind == OP_SEND) {
        t->target = atomic_fetch_add(&sh->sent[c->rank][o->peer], 1) + 1;
        bump(sh);
    } else if (o->kind == OP_RECV) {
        t->target = atomic_fetch_add(&sh->received[c->rank][o->peer], 1) + 1;
        bump(sh);
    } else {
        arrive(c);
        t->target = c->seq;
    }
    atomic_fetch_add(&c->refs, 1);
    atomic_fetch_add(&inflight, 1);
    if (blocking) {
        *out = t;
        return ncclSuccess;
    }
    if (cudaLaunchHostFunc(o->stream, complete, t) != 0) {
        atomic_fetch_sub(&inflight, 1);
        release(c);
        free(t);
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

static ncclResult_t enqueue(enum op_kind kind, const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, int op, int root_or_peer, ncclComm_t comm, cudaStream_t stream)
{
    if (crash_at_call && atomic_fetch_add(&calls, 1) + 1 == crash_at_call)
        raise(SIGKILL);
    if (!comm || datatype < 0 || datatype >= NUM_DATATYPES)
        return ncclInvalidArgument;
    int reduces = kind == OP_ALLREDUCE || kind == OP_REDUCESCATTER || kind == OP_REDUCE;
    if (reduces && (op < 0 || op >= NUM_OPS))
        return ncclInvalidArgument;
    int rooted = kind == OP_BROADCAST || kind == OP_REDUCE || kind == OP_SEND || kind == OP_RECV;
    if (rooted && (root_or_peer < 0 || root_or_peer >= comm->nranks))
        return ncclInvalidArgument;
    if ((kind == OP_SEND || kind == OP_RECV) && root_or_peer == comm->rank)
        return ncclInvalidArgument;
    if (count && ((kind != OP_RECV && !sendbuff) || (kind != OP_SEND && !recvbuff)))
        return ncclInvalidArgument;
    if (atomic_load(&comm->aborted))
        return ncclInvalidUsage;
    size_t bytes = count * TYPE_SIZE[datatype];
    if (kind == OP_ALLGATHER || kind == OP_REDUCESCATTER)
        bytes *= (size_t)comm->nranks;
    struct op o = {kind, comm, stream, bytes, root_or_peer};
    if (group_depth == 0) {
        struct ticket *t = NULL;
        ncclResult_t rc = issue(&o, &t);
        if (t) {
            complete(t);
            rc = atomic_load(&comm->async_error);
        }
        return rc;
    }
    if (group_len == group_cap) {
        size_t cap = group_cap ? group_cap * 2 : 16;
        struct op *grown = realloc(group_ops, cap * sizeof *grown);
        if (!grown)
            return ncclSystemError;
        group_ops = grown;
        group_cap = cap;
    }
    group_ops[group_len++] = o;
    return ncclSuccess;
}

/* Joins rank `rank` of the communicator named by `key`; waits for all ranks unless told not to. */
static ncclResult_t join(ncclComm_t *out, int nranks, const unsigned char key[16], int rank, int wait)
{
    char name[64];
    shm_name(key, name);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return ncclSystemError;
    if (ftruncate(fd, sizeof(struct shared)) != 0) {
        close(fd);
        return ncclSystemError;
    }
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (sh == MAP_FAILED)
        return ncclSystemError;
    uint32_t unset = 0;
    int32_t nobody = 0;
    if ((!atomic_compare_exchange_strong(&sh->nranks, &unset, (uint32_t)nranks) && unset != (uint32_t)nranks) ||
        !atomic_compare_exchange_strong(&sh->pids[rank], &nobody, (int32_t)getpid())) {
        munmap(sh, sizeof *sh);
        return ncclInvalidUsage; /* ranks disagree on the size, or two processes claim one rank */
    }
    atomic_fetch_add(&sh->joined, 1);
    bump(sh);
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) {
        munmap(sh, sizeof *sh);
        return ncclSystemError;
    }
    c->sh = sh;
    c->rank = rank;
    c->nranks = nranks;
    memcpy(c->key, key, 16);
    atomic_store(&c->refs, 1);
    if (wait) {
        ncclResult_t rc = wait_for(c, all_joined, (uint64_t)nranks, 0);
        shm_unlink(name); /* all ranks have it mapped (or never will): the name is not needed */
        if (rc != ncclSuccess) {
            munmap(sh, sizeof *sh);
            free(c);
            return rc;
        }
    }
    *out = c;
    return ncclSuccess;
}

static int valid_id(const ncclUniqueId *id)
{
    return memcmp(id->internal, MAGIC, sizeof MAGIC) == 0;
}

/* Frees the communicator once no queued host function uses it any more. */
static void finish(ncclComm_t c)
{
    for (;;) {
        uint32_t refs = atomic_load(&c->refs);
        if (refs <= 1)
            break;
        futex_wait(&c->refs, refs, 0, 100000000);
    }
    munmap(c->sh, sizeof *c->sh);
    free(c);
}

/* Shared by the two entry points: neither calls the other, so a probe sees each call once. */
static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank)
{
    if (!comm || nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks || !valid_id(id))
        return ncclInvalidArgument;
    return join(comm, nranks, (const unsigned char *)id->internal + sizeof MAGIC, rank, 1);
}

static ncclResult_t unique_id(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    memcpy(id->internal, MAGIC, sizeof MAGIC);
    return getrandom(id->internal + sizeof MAGIC, 16, 0) == 16 ? ncclSuccess : ncclSystemError;
}

/* ---- the API ------------------------------------------------------------------------- */

#define NCCL_API(ret, name, ...)                                                                 \
    ret name(__VA_ARGS__) __attribute__((weak, alias("p" #name)));                               \
    ret p##name(__VA_ARGS__)

NCCL_API(ncclResult_t, ncclGetVersion, int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = FAKENCCL_VERSION;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return ncclInvalidArgument;
    return unique_id(uniqueId);
}

NCCL_API(const char *, ncclGetErrorString, ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return init_rank(comm, nranks, &commId, rank);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t *config)
{
    if (config && config->size != sizeof(ncclConfig_t) && config->size < 4 * sizeof(int))
        return ncclInvalidArgument;
    return init_rank(comm, nranks, &commId, rank);
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comms, int ndev, const int *devlist)
{
    (void)devlist;
    if (!comms || ndev < 1 || ndev > MAX_RANKS)
        return ncclInvalidArgument;
    ncclUniqueId id;
    ncclResult_t rc = unique_id(&id);
    for (int r = 0; rc == ncclSuccess && r < ndev; r++)
        rc = join(&comms[r], ndev, (const unsigned char *)id.internal + sizeof MAGIC, r, 0);
    char name[64];
    shm_name((const unsigned char *)id.internal + sizeof MAGIC, name);
    shm_unlink(name);
    return rc;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config)
{
    (void)config;
    if (!comm || !newcomm || (color < 0 && color != SPLIT_NOCOLOR))
        return ncclInvalidArgument;
    struct shared *sh = comm->sh;
    sh->split_color[comm->rank] = color;
    sh->split_key[comm->rank] = key;
    arrive(comm); /* step 1: everyone has written color and key */
    ncclResult_t rc = wait_for(comm, all_arrived, comm->seq, 0);
    int rank = 0, nranks = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (sh->split_color[r] != color)
            continue;
        nranks++;
        if (sh->split_key[r] < key || (sh->split_key[r] == key && r < comm->rank))
            rank++;
    }
    arrive(comm); /* step 2: everyone has read them; the next split may overwrite */
    if (rc == ncclSuccess)
        rc = wait_for(comm, all_arrived, comm->seq, 0);
    uint64_t split = comm->splits++;
    if (rc != ncclSuccess)
        return rc;
    if (color == SPLIT_NOCOLOR) {
        *newcomm = NULL;
        return ncclSuccess;
    }
    unsigned char child[16];
    memcpy(child, comm->key, 16);
    uint64_t mix = (split + 1) * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(uint32_t)color << 32);
    for (int i = 0; i < 8; i++)
        child[i] ^= (unsigned char)(mix >> (8 * i));
    return join(newcomm, nranks, child, rank, 1);
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    /* Like NCCL's finalize: operations already enqueued finish first (or fail with a peer). */
    finish(comm);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    atomic_store(&comm->aborted, 1);
    int32_t none = 0;
    atomic_compare_exchange_strong(&comm->sh->failed, &none, comm->rank + 1);
    bump(comm->sh); /* queued host functions here and at every peer stop waiting */
    finish(comm);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError)
        return ncclInvalidArgument;
    *asyncError = atomic_load(&comm->async_error);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_BROADCAST, sendbuff, recvbuff, count, datatype, 0, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_SEND, sendbuff, NULL, count, datatype, 0, peer, comm, stream);
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream)
{
    return enqueue(OP_RECV, NULL, recvbuff, count, datatype, 0, peer, comm, stream);
}

NCCL_API(ncclResult_t, ncclGroupStart, void)
{
    if (group_depth++ == 0)
        group_error = ncclSuccess;
    return ncclSuccess;
}

/* The outermost ncclGroupEnd issues what the group collected, in call order. */
NCCL_API(ncclResult_t, ncclGroupEnd, void)
{
    if (group_depth == 0)
        return ncclInvalidUsage;
    if (--group_depth > 0)
        return ncclSuccess;
    struct ticket **tickets = blocking && group_len ? calloc(group_len, sizeof *tickets) : NULL;
    if (blocking && group_len && !tickets)
        group_error = ncclSystemError;
    for (size_t i = 0; i < group_len && group_error == ncclSuccess; i++)
        group_error = issue(&group_ops[i], tickets ? &tickets[i] : &(struct ticket *){NULL});
    for (size_t i = 0; tickets && i < group_len; i++) {
        if (!tickets[i])
            continue;
        ncclComm_t c = tickets[i]->comm;
        complete(tickets[i]);
        if (group_error == ncclSuccess)
            group_error = atomic_load(&c->async_error);
    }
    free(tickets);
    group_len = 0;
    return group_error;
}
