/*
 * A multi-rank NCCL "training job" for machines without a GPU: the parent makes an
 * ncclUniqueId, starts one process per rank (this program again, with --rank), and prints one
 * JSON line with what every rank did. Each rank, per iteration:
 *
 *   compute phase     --kernels launches on its compute stream, then cudaStreamSynchronize
 *                     on it (the stand-in runtime makes each kernel take --kernel-us);
 *   collective phase  the --ops on its communication stream (in one ncclGroupStart/End with
 *                     --group), then cudaStreamSynchronize on that stream, which returns
 *                     once every rank has entered the collective (see fakenccl.c).
 *
 * How a rank waits for its collectives (--completion), the ways PyTorch's ProcessGroupNCCL does:
 *   stream  cudaStreamSynchronize on the communication stream (the default);
 *   query   cudaEventRecord on the communication stream after the collectives, then
 *           cudaEventQuery every 100 us until it returns 0 (work.isCompleted() polling);
 *   sync    cudaEventRecord, then cudaEventSynchronize (work.synchronize() with blocking wait);
 *   wait    cudaEventRecord, then cudaStreamWaitEvent(compute stream, event) (work.wait()):
 *           the host does not block; a compute synchronize at the start of the next iteration
 *           (PyTorch's loss.item()) observes the collective, and that iteration's host work
 *           (a host-slow rank's gaps) follows it, so a slow host delays the next collective
 *           as it does in a training loop rather than hiding behind the one in flight;
 *   return  the collectives return at completion (FAKENCCL_BLOCKING=1 in every rank: a blocking
 *           wait, a CPU-side backend) and nothing is synchronized, recorded or queried.
 *
 * Each rank gets the environment a launcher gives it (--launcher): torchrun (RANK, LOCAL_RANK,
 * WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID, the
 * default), slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID), ompi
 * (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), bare (RANK and WORLD_SIZE only) or none. --job-id
 * sets the run or job id (default: from the unique id). --hold-ms X sleeps X ms after init,
 * before the first iteration (time for an agent started later to attach: it sees no init), or
 * until SIGUSR1 reaches the job's process group (kill -USR1 -PGID), whichever comes first: a
 * test releases the ranks once its agent is attached, however long its compile took.
 * --jitter-ms J: every rank sleeps a random 0..J ms before each iteration's collectives.
 *
 * One rank can be made slow, the way operators classify stragglers:
 *   --slow-kind compute  its kernels run longer: --slow-ms more GPU time per iteration;
 *   --slow-kind host     its launches are spread out: --slow-ms of host gaps per iteration,
 *                        slept (waiting, off-CPU) or, with --host-work spin, burnt on the CPU
 *                        in prepare_batch_on_host() (the frame a differential flame graph names;
 *                        with spin every rank also loads each batch on the CPU for 6 ms, in
 *                        load_batch(), so the healthy ranks have CPU profiles to compare with);
 *   --slow-kind comm     its side of each collective takes --slow-ms longer to complete.
 * And things can go wrong on purpose: --crash-rank/--crash-iter kills a rank inside its
 * collective call (SIGKILL); --end-rank/--end-iter/--end-how destroys or aborts a rank's
 * communicator while that iteration's collectives are still in flight. A rank whose
 * collective fails (a peer died or left) aborts its communicator and stops.
 *
 * Usage: nccl_job [--ranks N] [--iterations K] [--kernels M] [--kernel-us U] [--count C]
 *                 [--ops allreduce,allgather,reducescatter,broadcast,reduce,sendrecv] [--group]
 *                 [--split] [--slow-rank R --slow-kind compute|host|comm --slow-ms X]
 *                 [--crash-rank R --crash-iter I] [--end-rank R --end-iter I --end-how destroy|abort]
 *                 [--completion stream|query|sync|wait|return] [--launcher torchrun|slurm|ompi|bare|none]
 *                 [--job-id ID] [--hold-ms X] [--jitter-ms J] [--lib LIBNCCL] [--cudart LIBCUDART]
 *                 [--host-work sleep|spin]
 * Defaults: 4 ranks, 10 iterations, 8 kernels of 250 us, 1024 floats, allreduce; the stand-in
 * libraries built next to this program (fakenccl/libnccl.so.2, fakecudart/libcudart.so.12).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
#define MAX_OPS 8
#define OUT_BYTES 4096

typedef int ncclResult_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef void *ncclComm_t;
typedef void *cudaStream_t;
typedef struct {
    unsigned x, y, z;
} dim3;

enum op { ALLREDUCE, ALLGATHER, REDUCESCATTER, BROADCAST, REDUCE, SENDRECV };
static const char *const OP_NAMES[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "sendrecv"};
enum slow { SLOW_NONE, SLOW_COMPUTE, SLOW_HOST, SLOW_COMM };
static const char *const SLOW_NAMES[] = {"none", "compute", "host", "comm"};
static const char *const END_HOW[] = {"destroy", "abort"};
static const char *const HOST_WORK[] = {"sleep", "spin"};
enum completion { WAIT_STREAM, WAIT_QUERY, WAIT_SYNC, WAIT_EVENT, WAIT_RETURN };
static const char *const COMPLETION_NAMES[] = {"stream", "query", "sync", "wait", "return"};
enum launcher { LAUNCH_TORCHRUN, LAUNCH_SLURM, LAUNCH_OMPI, LAUNCH_BARE, LAUNCH_NONE };
static const char *const LAUNCHER_NAMES[] = {"torchrun", "slurm", "ompi", "bare", "none"};

struct opts {
    int ranks, iterations, kernels, kernel_us, group, split;
    long count;
    enum op ops[MAX_OPS];
    int nops;
    int slow_rank, slow_ms;
    enum slow slow_kind;
    int crash_rank, crash_iter;
    int end_rank, end_iter;
    const char *end_how;
    enum completion completion;
    enum launcher launcher;
    const char *job_id;
    int hold_ms, jitter_ms, host_spin;
    const char *lib, *cudart;
};

/* The library calls a rank makes, resolved with dlsym. */
static struct {
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, void *);
    ncclResult_t (*CommCount)(ncclComm_t, int *);
    ncclResult_t (*CommUserRank)(ncclComm_t, int *);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Reduce)(const void *, void *, size_t, int, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    int (*FakeInflight)(void);
    int (*Malloc)(void **, size_t);
    int (*LaunchKernel)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
    int (*StreamSynchronize)(cudaStream_t);
    int (*EventCreate)(void **);
    int (*EventRecord)(void *, cudaStream_t);
    int (*EventQuery)(void *);
    int (*EventSynchronize)(void *);
    int (*StreamWaitEvent)(cudaStream_t, void *, unsigned);
} api;

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "nccl_job: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(2);
}

static void *symbol(void *lib, const char *path, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "nccl_job: %s has no %s\n", path, name);
        exit(2);
    }
    return p;
}

/* Loads the runtime first (RTLD_GLOBAL), so the stand-in NCCL finds the very same copy. */
static void load(const struct opts *o)
{
    void *rt = dlopen(o->cudart, RTLD_NOW | RTLD_GLOBAL);
    if (!rt)
        die("cannot load the CUDA runtime: %s", dlerror());
    void *nccl = dlopen(o->lib, RTLD_NOW | RTLD_GLOBAL);
    if (!nccl)
        die("cannot load NCCL: %s", dlerror());
#define NCCL(f) *(void **)&api.f = symbol(nccl, o->lib, "nccl" #f)
    NCCL(GetUniqueId); NCCL(CommInitRank); NCCL(CommSplit); NCCL(CommCount); NCCL(CommUserRank);
    NCCL(CommGetAsyncError); NCCL(CommDestroy); NCCL(CommAbort); NCCL(AllReduce); NCCL(AllGather);
    NCCL(ReduceScatter); NCCL(Broadcast); NCCL(Reduce); NCCL(Send); NCCL(Recv); NCCL(GroupStart);
    NCCL(GroupEnd); NCCL(FakeInflight);
#undef NCCL
    *(void **)&api.Malloc = symbol(rt, o->cudart, "cudaMalloc");
    *(void **)&api.LaunchKernel = symbol(rt, o->cudart, "cudaLaunchKernel");
    *(void **)&api.StreamSynchronize = symbol(rt, o->cudart, "cudaStreamSynchronize");
    *(void **)&api.EventCreate = symbol(rt, o->cudart, "cudaEventCreate");
    *(void **)&api.EventRecord = symbol(rt, o->cudart, "cudaEventRecord");
    *(void **)&api.EventQuery = symbol(rt, o->cudart, "cudaEventQuery");
    *(void **)&api.EventSynchronize = symbol(rt, o->cudart, "cudaEventSynchronize");
    *(void **)&api.StreamWaitEvent = symbol(rt, o->cudart, "cudaStreamWaitEvent");
}

static long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

/* cudaStreamSynchronize, timed into *total_us. */
static void sync_stream(cudaStream_t stream, long *total_us)
{
    long t0 = now_us();
    api.StreamSynchronize(stream);
    *total_us += now_us() - t0;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static void spin_us(long us)
{
    long until = now_us() + us;
    volatile unsigned long mix = 0;
    do {
        for (unsigned i = 0; i < 2000; i++)
            mix += i * 2654435761u;
    } while (now_us() < until);
}

/* Every rank's host work per batch with --host-work spin (noipa: a frame of its own, never folded into the next one). */
static __attribute__((noipa)) void load_batch(long us)
{
    spin_us(us);
}

/* A host-slow rank's extra host work, on the CPU: its own frame (noipa) in CPU profiles. */
static __attribute__((noipa)) void prepare_batch_on_host(long us)
{
    spin_us(us);
}

static long number(const char *flag, const char *v, long min, long max)
{
    char *end;
    errno = 0;
    long x = strtol(v ? v : "", &end, 10);
    if (!v || errno || *end || x < min || x > max) {
        fprintf(stderr, "nccl_job: %s wants a whole number from %ld to %ld, got %s\n", flag, min, max, v ? v : "nothing");
        exit(2);
    }
    return x;
}

static int pick(const char *flag, const char *v, const char *const *names, int n)
{
    for (int i = 0; v && i < n; i++)
        if (strcmp(v, names[i]) == 0)
            return i;
    fprintf(stderr, "nccl_job: %s: unknown value %s\n", flag, v ? v : "(none)");
    exit(2);
}

static volatile sig_atomic_t released; /* SIGUSR1 came: --hold-ms ends now */

static void on_release(int sig)
{
    (void)sig;
    released = 1;
}

/* ---- one rank ------------------------------------------------------------------------ */

struct rank_state {
    int rank;
    long calls, errors;
    long compute_sync_us, comm_sync_us; /* time spent in cudaStreamSynchronize on each stream */
    ncclResult_t first_error;
    const char *first_error_call;
};

static void note(struct rank_state *st, const char *call, ncclResult_t rc)
{
    st->calls++;
    if (rc != 0) {
        if (!st->errors++) {
            st->first_error = rc;
            st->first_error_call = call;
        }
    }
}

static __attribute__((noinline)) void compute_kernel(void) {}

static void issue(const struct opts *o, struct rank_state *st, enum op op, ncclComm_t comm, cudaStream_t stream,
                  void *send, void *recv)
{
    size_t n = (size_t)o->count;
    const int f32 = 7, sum = 0;
    switch (op) {
    case ALLREDUCE: note(st, "ncclAllReduce", api.AllReduce(send, recv, n, f32, sum, comm, stream)); break;
    case ALLGATHER: note(st, "ncclAllGather", api.AllGather(send, recv, n, f32, comm, stream)); break;
    case REDUCESCATTER: note(st, "ncclReduceScatter", api.ReduceScatter(send, recv, n, f32, sum, comm, stream)); break;
    case BROADCAST: note(st, "ncclBroadcast", api.Broadcast(send, recv, n, f32, 0, comm, stream)); break;
    case REDUCE: note(st, "ncclReduce", api.Reduce(send, recv, n, f32, sum, 0, comm, stream)); break;
    case SENDRECV: {
        int next = (st->rank + 1) % o->ranks, prev = (st->rank + o->ranks - 1) % o->ranks;
        note(st, "ncclGroupStart", api.GroupStart());
        note(st, "ncclSend", api.Send(send, n, f32, next, comm, stream));
        note(st, "ncclRecv", api.Recv(recv, n, f32, prev, comm, stream));
        note(st, "ncclGroupEnd", api.GroupEnd());
        break;
    }
    }
}

/* The stand-in runtime's events do not wait for the stand-in NCCL's host functions (see
 * ncclFakeInflight in fakenccl.c): wait, unseen by the agent, until this process's collectives
 * have completed, so the event calls after it observe what they would on a GPU. */
static void until_collectives_done(void)
{
    while (api.FakeInflight() > 0)
        sleep_us(50);
}

/* Waits for the collectives just enqueued on comm_stream the way --completion says; time the
 * host blocked goes into *total_us. Returns nonzero when the event reported an error. */
static int await_collectives(const struct opts *o, void *event, cudaStream_t comm_stream, cudaStream_t compute,
                             long *total_us)
{
    if (o->completion == WAIT_STREAM) {
        sync_stream(comm_stream, total_us);
        return 0;
    }
    if (o->completion == WAIT_RETURN)
        return 0; /* the calls returned at completion */
    api.EventRecord(event, comm_stream);
    long t0 = now_us();
    int rc = 0;
    if (o->completion == WAIT_QUERY) {
        /* Poll as ProcessGroupNCCL does. The stand-in's event reads complete at once, so a
         * query is only made while the collectives really are in flight (answered "not
         * ready" here, as a GPU would) or once they are done. */
        const int not_ready = 600;
        while (api.FakeInflight() > 0) {
            rc = not_ready;
            sleep_us(100);
        }
        rc = api.EventQuery(event);
    } else if (o->completion == WAIT_SYNC) {
        until_collectives_done();
        rc = api.EventSynchronize(event);
    } else {
        rc = api.StreamWaitEvent(compute, event, 0);
    }
    *total_us += now_us() - t0;
    return rc;
}

static int run_rank(const struct opts *o, int rank, const char *uid_hex)
{
    load(o);
    ncclUniqueId id;
    for (int i = 0; i < 128; i++)
        if (sscanf(uid_hex + 2 * i, "%2hhx", (unsigned char *)&id.internal[i]) != 1)
            die("bad --unique-id %s", uid_hex);
    struct rank_state st = {.rank = rank};
    ncclComm_t comm = NULL, sub = NULL;
    int sub_rank = -1, sub_count = -1, iterations = 0;
    const char *ended = "completed";
    ncclResult_t async = 0, init = api.CommInitRank(&comm, o->ranks, id, rank);
    note(&st, "ncclCommInitRank", init);
    if (init != 0) {
        ended = "init_failed";
        goto report;
    }
    if (o->split) {
        note(&st, "ncclCommSplit", api.CommSplit(comm, rank % 2, rank, &sub, NULL));
        if (sub) {
            note(&st, "ncclCommCount", api.CommCount(sub, &sub_count));
            note(&st, "ncclCommUserRank", api.CommUserRank(sub, &sub_rank));
        }
    }
    size_t bytes = (size_t)o->count * 4 * (size_t)o->ranks;
    void *send = NULL, *recv = NULL;
    if (api.Malloc(&send, bytes) || api.Malloc(&recv, bytes))
        die("cudaMalloc of %s failed", "the buffers");
    cudaStream_t compute = (cudaStream_t)0x5000, comm_stream = (cudaStream_t)0x6000;
    void *event = NULL;
    if (o->completion != WAIT_STREAM && o->completion != WAIT_RETURN && api.EventCreate(&event) != 0)
        die("cudaEventCreate failed in %s", o->cudart);
    for (long until = now_us() + (long)o->hold_ms * 1000; !released && now_us() < until;)
        sleep_us(1000);
    unsigned seed = (unsigned)getpid();
    dim3 grid = {64, 1, 1}, block = {256, 1, 1};
    long gap_us = o->slow_kind == SLOW_HOST && rank == o->slow_rank ? (long)o->slow_ms * 1000 / o->kernels : 0;
    for (int it = 0; it < o->iterations; it++) {
        if (o->completion == WAIT_EVENT && it > 0) {
            /* loss.item(): the compute stream waited on the previous collective's event, so this
             * synchronize is where the host learns that collective completed; the next step's
             * host work (a host-slow rank's gaps) comes after it, as in a PyTorch training loop. */
            until_collectives_done();
            sync_stream(compute, &st.compute_sync_us);
        }
        if (o->host_spin)
            load_batch(6000);  /* ~10 CPU samples over 16 steps at 99 Hz: never none (2 ms left none in ~4% of runs) */
        for (int k = 0; k < o->kernels; k++) {
            api.LaunchKernel((const void *)compute_kernel, grid, block, NULL, 0, compute);
            if (gap_us && o->host_spin)
                prepare_batch_on_host(gap_us);
            else if (gap_us)
                sleep_us(gap_us);
        }
        sync_stream(compute, &st.compute_sync_us);
        if (o->jitter_ms)
            sleep_us((long)(rand_r(&seed) % (o->jitter_ms * 1000 + 1)));
        if (o->group)
            note(&st, "ncclGroupStart", api.GroupStart());
        for (int i = 0; i < o->nops; i++)
            issue(o, &st, o->ops[i], comm, comm_stream, send, recv);
        if (sub)
            issue(o, &st, ALLREDUCE, sub, comm_stream, send, recv);
        if (o->group)
            note(&st, "ncclGroupEnd", api.GroupEnd());
        if (rank == o->end_rank && it == o->end_iter) {
            /* The collectives just enqueued are still in flight. */
            int abort = strcmp(o->end_how, "abort") == 0;
            if (sub)
                note(&st, abort ? "ncclCommAbort" : "ncclCommDestroy", abort ? api.CommAbort(sub) : api.CommDestroy(sub));
            note(&st, abort ? "ncclCommAbort" : "ncclCommDestroy", abort ? api.CommAbort(comm) : api.CommDestroy(comm));
            await_collectives(o, event, comm_stream, compute, &st.comm_sync_us);
            iterations++;
            ended = abort ? "aborted" : "destroyed";
            goto report;
        }
        await_collectives(o, event, comm_stream, compute, &st.comm_sync_us);
        iterations++;
        api.CommGetAsyncError(comm, &async);
        if (async != 0) {
            ended = "peer_failed";
            if (sub)
                note(&st, "ncclCommAbort", api.CommAbort(sub));
            note(&st, "ncclCommAbort", api.CommAbort(comm));
            goto report;
        }
    }
    if (o->completion == WAIT_EVENT) { /* the last collective, behind the event wait */
        until_collectives_done();
        sync_stream(compute, &st.compute_sync_us);
    }
    if (sub)
        note(&st, "ncclCommDestroy", api.CommDestroy(sub));
    note(&st, "ncclCommDestroy", api.CommDestroy(comm));
report:
    printf("{\"rank\":%d,\"pid\":%d,\"iterations\":%d,\"calls\":%ld,\"errors\":%ld,\"first_error\":%d,"
           "\"first_error_call\":\"%s\",\"async_error\":%d,\"ended\":\"%s\",\"split_rank\":%d,\"split_nranks\":%d,"
           "\"compute_sync_us\":%ld,\"comm_sync_us\":%ld}\n",
           rank, (int)getpid(), iterations, st.calls, st.errors, st.first_error,
           st.first_error_call ? st.first_error_call : "", async, ended, sub_rank, sub_count, st.compute_sync_us,
           st.comm_sync_us);
    fflush(stdout);
    return 0;
}

/* ---- the parent ---------------------------------------------------------------------- */

/* Collective and point-to-point calls a rank makes per iteration (FAKENCCL_CRASH_AT_CALL counts these). */
static int calls_per_iteration(const struct opts *o)
{
    int n = o->split && o->ranks > 1 ? 1 : 0;
    for (int i = 0; i < o->nops; i++)
        n += o->ops[i] == SENDRECV ? 2 : 1;
    return n;
}

static void setenv_long(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

/* The variables a launcher gives each rank (one node: local rank = rank). */
static void set_launcher_env(const struct opts *o, int rank, const char *uid_hex)
{
    char job[40];
    snprintf(job, sizeof job, "%.32s", o->job_id ? o->job_id : uid_hex + 16); /* past the magic */
    switch (o->launcher) {
    case LAUNCH_TORCHRUN:
        setenv_long("LOCAL_RANK", rank);
        setenv_long("LOCAL_WORLD_SIZE", o->ranks);
        setenv_long("GROUP_RANK", 0);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", "29500", 1);
        setenv("TORCHELASTIC_RUN_ID", job, 1);
        /* fall through */
    case LAUNCH_BARE:
        setenv_long("RANK", rank);
        setenv_long("WORLD_SIZE", o->ranks);
        break;
    case LAUNCH_SLURM:
        setenv_long("SLURM_PROCID", rank);
        setenv_long("SLURM_NTASKS", o->ranks);
        setenv_long("SLURM_LOCALID", rank);
        setenv("SLURM_JOB_ID", job, 1);
        break;
    case LAUNCH_OMPI:
        setenv_long("OMPI_COMM_WORLD_RANK", rank);
        setenv_long("OMPI_COMM_WORLD_SIZE", o->ranks);
        setenv_long("OMPI_COMM_WORLD_LOCAL_RANK", rank);
        break;
    case LAUNCH_NONE:
        break;
    }
}

static pid_t start_rank(const struct opts *o, char **argv, int argc, int rank, const char *uid_hex, int *out_fd)
{
    int fds[2];
    if (pipe(fds) != 0)
        die("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid > 0) {
        close(fds[1]);
        *out_fd = fds[0];
        return pid;
    }
    close(fds[0]);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[1]);
    long kernel_us = o->kernel_us;
    if (rank == o->slow_rank && o->slow_kind == SLOW_COMPUTE)
        kernel_us += (long)o->slow_ms * 1000 / o->kernels;
    setenv_long("FAKECUDA_KERNEL_US", kernel_us);
    if (rank == o->slow_rank && o->slow_kind == SLOW_COMM)
        setenv_long("FAKENCCL_LINK_US", 10 + (long)o->slow_ms * 1000);
    if (rank == o->crash_rank)
        setenv_long("FAKENCCL_CRASH_AT_CALL", (long)o->crash_iter * calls_per_iteration(o) + 1);
    if (o->completion == WAIT_RETURN)
        setenv("FAKENCCL_BLOCKING", "1", 1);
    set_launcher_env(o, rank, uid_hex);
    char rank_arg[16];
    snprintf(rank_arg, sizeof rank_arg, "%d", rank);
    char **args = calloc((size_t)argc + 5, sizeof *args);
    for (int i = 0; i < argc; i++)
        args[i] = argv[i];
    args[argc] = "--rank";
    args[argc + 1] = rank_arg;
    args[argc + 2] = "--unique-id";
    args[argc + 3] = (char *)uid_hex;
    execv("/proc/self/exe", args);
    fprintf(stderr, "nccl_job: exec: %s\n", strerror(errno));
    _exit(127);
}

static int run_job(const struct opts *o, char **argv, int argc)
{
    load(o);
    ncclUniqueId id;
    if (api.GetUniqueId(&id) != 0)
        die("ncclGetUniqueId failed in %s", o->lib);
    char uid_hex[257];
    for (int i = 0; i < 128; i++)
        snprintf(uid_hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
    pid_t pids[MAX_RANKS];
    int fds[MAX_RANKS];
    static char out[MAX_RANKS][OUT_BYTES];
    size_t used[MAX_RANKS] = {0};
    for (int r = 0; r < o->ranks; r++)
        pids[r] = start_rank(o, argv, argc, r, uid_hex, &fds[r]);
    for (int open_fds = o->ranks; open_fds > 0;) {
        struct pollfd p[MAX_RANKS];
        for (int r = 0; r < o->ranks; r++)
            p[r] = (struct pollfd){fds[r], POLLIN, 0};
        if (poll(p, (nfds_t)o->ranks, -1) < 0 && errno != EINTR)
            die("poll: %s", strerror(errno));
        for (int r = 0; r < o->ranks; r++) {
            if (fds[r] < 0 || !(p[r].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = read(fds[r], out[r] + used[r], OUT_BYTES - 1 - used[r]);
            if (n > 0) {
                used[r] += (size_t)n;
                continue;
            }
            close(fds[r]);
            fds[r] = -1;
            open_fds--;
        }
    }
    printf("{\"workload\":\"nccl_job\",\"pid\":%d,\"lib\":\"%s\",\"unique_id\":\"%s\",\"nranks\":%d,"
           "\"iterations\":%d,\"kernels\":%d,\"kernel_us\":%d,\"count\":%ld,\"group\":%s,\"split\":%s,"
           "\"completion\":\"%s\",\"launcher\":\"%s\",\"ops\":[",
           (int)getpid(), o->lib, uid_hex, o->ranks, o->iterations, o->kernels, o->kernel_us, o->count,
           o->group ? "true" : "false", o->split ? "true" : "false", COMPLETION_NAMES[o->completion],
           LAUNCHER_NAMES[o->launcher]);
    for (int i = 0; i < o->nops; i++)
        printf("%s\"%s\"", i ? "," : "", OP_NAMES[o->ops[i]]);
    printf("],\"slow\":{\"rank\":%d,\"kind\":\"%s\",\"ms\":%d},\"ranks\":[", o->slow_rank, SLOW_NAMES[o->slow_kind],
           o->slow_ms);
    int failed = 0;
    for (int r = 0; r < o->ranks; r++) {
        int status = 0;
        while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR)
            ;
        out[r][used[r]] = 0;
        char *line = strrchr(out[r], '{');
        char *nl = line ? strchr(line, '\n') : NULL;
        if (nl)
            *nl = 0;
        int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0, code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        failed |= sig || code;
        if (line && !sig)
            printf("%s{\"exit\":%d,\"signal\":0,%s", r ? "," : "", code, line + 1);
        else
            printf("%s{\"exit\":%d,\"signal\":%d,\"rank\":%d,\"pid\":%d}", r ? "," : "", code, sig, r, (int)pids[r]);
    }
    printf("]}\n");
    return failed && o->crash_rank < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
    struct sigaction release = {.sa_handler = on_release};
    sigaction(SIGUSR1, &release, NULL); /* first: the parent and every rank ignore it but for --hold-ms */
    static char self_dir[PATH_MAX], lib[PATH_MAX + 32], cudart[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self_dir, sizeof self_dir - 1);
    if (n > 0) {
        self_dir[n] = 0;
        *strrchr(self_dir, '/') = 0;
    }
    snprintf(lib, sizeof lib, "%s/fakenccl/libnccl.so.2", self_dir);
    snprintf(cudart, sizeof cudart, "%s/fakecudart/libcudart.so.12", self_dir);
    struct opts o = {.ranks = 4, .iterations = 10, .kernels = 8, .kernel_us = 250, .count = 1024,
                     .ops = {ALLREDUCE}, .nops = 1, .slow_rank = -1, .crash_rank = -1, .crash_iter = -1,
                     .end_rank = -1, .end_iter = -1, .end_how = "destroy", .lib = lib, .cudart = cudart};
    int rank = -1;
    const char *uid_hex = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--group")) { o.group = 1; continue; }
        if (!strcmp(a, "--split")) { o.split = 1; continue; }
        i++;
        if (!strcmp(a, "--ranks")) o.ranks = (int)number(a, v, 1, MAX_RANKS);
        else if (!strcmp(a, "--iterations")) o.iterations = (int)number(a, v, 0, 10000000);
        else if (!strcmp(a, "--kernels")) o.kernels = (int)number(a, v, 1, 100000);
        else if (!strcmp(a, "--kernel-us")) o.kernel_us = (int)number(a, v, 0, 10000000);
        else if (!strcmp(a, "--count")) o.count = number(a, v, 0, 1L << 30);
        else if (!strcmp(a, "--slow-rank")) o.slow_rank = (int)number(a, v, 0, MAX_RANKS - 1);
        else if (!strcmp(a, "--slow-ms")) o.slow_ms = (int)number(a, v, 0, 3600000);
        else if (!strcmp(a, "--slow-kind")) o.slow_kind = (enum slow)pick(a, v, SLOW_NAMES, 4);
        else if (!strcmp(a, "--crash-rank")) o.crash_rank = (int)number(a, v, 0, MAX_RANKS - 1);
        else if (!strcmp(a, "--crash-iter")) o.crash_iter = (int)number(a, v, 0, 10000000);
        else if (!strcmp(a, "--end-rank")) o.end_rank = (int)number(a, v, 0, MAX_RANKS - 1);
        else if (!strcmp(a, "--end-iter")) o.end_iter = (int)number(a, v, 0, 10000000);
        else if (!strcmp(a, "--end-how")) o.end_how = END_HOW[pick(a, v, END_HOW, 2)];
        else if (!strcmp(a, "--completion")) o.completion = (enum completion)pick(a, v, COMPLETION_NAMES, 5);
        else if (!strcmp(a, "--launcher")) o.launcher = (enum launcher)pick(a, v, LAUNCHER_NAMES, 5);
        else if (!strcmp(a, "--job-id") && v) o.job_id = v;
        else if (!strcmp(a, "--hold-ms")) o.hold_ms = (int)number(a, v, 0, 3600000);
        else if (!strcmp(a, "--jitter-ms")) o.jitter_ms = (int)number(a, v, 0, 3600000);
        else if (!strcmp(a, "--host-work")) o.host_spin = pick(a, v, HOST_WORK, 2);
        else if (!strcmp(a, "--lib") && v) o.lib = v;
        else if (!strcmp(a, "--cudart") && v) o.cudart = v;
        else if (!strcmp(a, "--rank")) rank = (int)number(a, v, 0, MAX_RANKS - 1);
        else if (!strcmp(a, "--unique-id") && v && strlen(v) == 256) uid_hex = v;
        else if (!strcmp(a, "--ops") && v) {
            char *copy = strdup(v), *save = NULL;
            o.nops = 0;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o.nops == MAX_OPS)
                    die("at most 8 --ops, got %s", v);
                o.ops[o.nops++] = (enum op)pick("--ops", t, OP_NAMES, 6);
            }
            free(copy);
            if (!o.nops)
                die("--ops lists no operation: %s", v);
        } else die("unknown or incomplete option %s (see the comment at the top of nccl_job.c)", a);
    }
    if ((o.slow_rank >= 0) != (o.slow_kind != SLOW_NONE) || (o.slow_rank >= 0 && o.slow_rank >= o.ranks))
        die("give --slow-rank (below --ranks) and --slow-kind together%s", "");
    if ((o.crash_rank >= 0) != (o.crash_iter >= 0) || (o.end_rank >= 0) != (o.end_iter >= 0))
        die("give --crash-rank with --crash-iter, and --end-rank with --end-iter%s", "");
    if (rank >= 0) {
        if (!uid_hex)
            die("--rank needs --unique-id (128 bytes in hex)%s", "");
        return run_rank(&o, rank, uid_hex);
    }
    return run_job(&o, argv, argc);
}
