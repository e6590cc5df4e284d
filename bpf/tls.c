/* OpenSSL's plaintext (the tls family): SSL_read, SSL_write, SSL_read_ex, SSL_write_ex.
 *
 * An entry uprobe keeps the call's arguments in the thread's task storage; the return probe
 * (one program for the four) copies the bytes the call moved, at most TLS_PAYLOAD, into a
 * record laid out as the sockets family's (struct sock_rec: a 64-byte header, then the
 * payload, kind EV_SOCK_DATA, func 1 read / 2 write) on the `tlsdata` ring. The http
 * receiver parses it as it parses socket records (families/http/tls.py).
 *
 * Which connection: the SSL pointer says nothing user space can use, and where OpenSSL keeps
 * the fd (ssl->rbio->num) moves between versions (1.1, 3.0, 3.2's SSL_CONNECTION). So the fd
 * is taken from the socket syscall the thread makes *inside* the SSL call (a read, recv,
 * write or send entered while the call is open: `tls_sys_enter`, attached by user space to
 * the eight sys_enter tracepoints of the data syscalls) and remembered per (process, SSL) in
 * `tls_fds`, for the calls served from OpenSSL's own buffer with no syscall (a second record
 * already read). An SSL whose calls never make a syscall (a memory BIO: Python's asyncio,
 * SSLObject) has no fd: its records carry fd -1 and the SSL pointer (in `addr`), and user
 * space keys the connection by that pointer, with no addresses.
 *
 * Calls that move nothing (-1: would block, or a renegotiation/KeyUpdate handled inside;
 * _ex returning 0) are counted in `tls_stats`, not reported; an SSL_read returning 0 (the
 * peer's close_notify or EOF) is reported with ret 0 and no payload, and ends the exchange as
 * a socket EOF does. A call that re-enters the probes on its thread (a library whose
 * SSL_read_ex calls SSL_read) is taken once, at the outer call. */

#define TLS_F_READ 1   /* = SF_READ in sockets.c: ingress */
#define TLS_F_WRITE 2  /* = SF_WRITE: egress */

#define TLSF_FD_CACHED 1  /* the fd was remembered from an earlier call on this SSL */
#define TLSF_NO_FD 2      /* no syscall named it (memory BIO): addr holds the SSL pointer */

#define TLS_STAT_RECORDS 0     /* records emitted */
#define TLS_STAT_LOST 1        /* tlsdata ring full */
#define TLS_STAT_NO_DATA 2     /* calls that returned no data (-1, want read/write, renegotiation, _ex 0) */
#define TLS_STAT_NESTED 3      /* a call entered inside another one on its thread (taken once) */
#define TLS_STAT_MAP_FULL 4    /* task storage unavailable */
#define TLS_STAT_NO_FD 5       /* records without an fd (memory BIO) */
#define TLS_STAT_BAD_READ 6    /* the buffer or the _ex length could not be read */
#define TLS_STAT_STALE 7       /* a call whose return was never seen (longjmp, thread killed), replaced */
#define TLS_STAT_MAX 8

/* A call older than this still open on its thread was left without a return (internal). */
#define TLS_STALE_NS 60000000000ULL

struct tls_rec {
    u64 ts_ns;
    u64 duration_ns;
    u32 pid;
    u32 tid;
    s32 fd;
    s32 ret;
    u8  kind;
    u8  func;
    u16 cap;
    u32 flags;
    u16 family;
    u16 port;
    u16 local_port;
    u16 pad;
    u8  addr[16];   /* the SSL pointer (little-endian u64) in the first 8 bytes */
    u8  data[TLS_PAYLOAD];
};
_Static_assert(__builtin_offsetof(struct tls_rec, data) == 64, "tls_rec header size");

struct tls_call {
    u64 ts;
    u64 ssl;
    u64 buf;
    u64 outlen;  /* _ex: the size_t * of the bytes moved; 0 otherwise */
    s32 fd;      /* from a syscall inside the call; -1 until one */
    u8  func;
    u8  depth;   /* probed calls open on the thread */
    u8  ex;
    u8  pad;
};

struct tls_key {
    u32 tgid;
    u32 pad;
    u64 ssl;
};

BPF_RINGBUF_OUTPUT(tlsdata, TLS_RING_PAGES);
BPF_TASK_STORAGE(tls_calls, struct tls_call);
BPF_TABLE("lru_hash", struct tls_key, s32, tls_fds, TLS_FD_ENTRIES);
BPF_PERCPU_ARRAY(tls_scratch, struct tls_rec, 1);
BPF_PERCPU_ARRAY(tls_stats, u64, TLS_STAT_MAX);
BPF_ARRAY(tls_ring_written, u64, 1);

static __always_inline void tls_count(u32 slot)
{
    u64 *v = tls_stats.lookup(&slot);
    if (v)
        (*v)++;
}

/* common.h's ring_wake, on a counter of this ring's own. */
static __always_inline u64 tls_wake(u64 bytes)
{
    int zero = 0;
    u64 *written = tls_ring_written.lookup(&zero);
    if (!written)
        return BPF_RB_NO_WAKEUP;
    u64 before = *written;
    __sync_fetch_and_add(written, bytes);
    u64 part = TLS_RING_PAGES * 4096ULL / RING_WAKE_PARTS;
    return ((before + bytes) ^ before) >= part ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

static __always_inline int tls_ignored_pid(u32 tgid)
{
#if defined(TLS_LIB_USERS_ONLY) && !defined(FILTER_PIDS)
    if (!lib_users.lookup(&tgid))
        return 1;
#endif
    return is_agent(tgid) || !is_watched(tgid);
}

static __always_inline int tls_enter(struct pt_regs *ctx, u8 func, u8 ex)
{
    u64 id = bpf_get_current_pid_tgid();
    if (tls_ignored_pid(id >> 32))
        return 0;
    struct tls_call *c = tls_calls.task_storage_get(bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!c) {
        tls_count(TLS_STAT_MAP_FULL);
        return 0;
    }
    u64 now = bpf_ktime_get_ns();
    if (c->depth) {
        if (now - c->ts < TLS_STALE_NS) {
            tls_count(TLS_STAT_NESTED);
            if (c->depth < 255)
                c->depth++;
            return 0;
        }
        tls_count(TLS_STAT_STALE);
    }
    c->ts = now;
    c->ssl = PT_REGS_PARM1(ctx);
    c->buf = PT_REGS_PARM2(ctx);
    c->outlen = ex ? PT_REGS_PARM4(ctx) : 0;
    c->fd = -1;
    c->func = func;
    c->depth = 1;
    c->ex = ex;
    return 0;
}

int uprobe_ssl_read(struct pt_regs *ctx) { return tls_enter(ctx, TLS_F_READ, 0); }
int uprobe_ssl_write(struct pt_regs *ctx) { return tls_enter(ctx, TLS_F_WRITE, 0); }
int uprobe_ssl_read_ex(struct pt_regs *ctx) { return tls_enter(ctx, TLS_F_READ, 1); }
int uprobe_ssl_write_ex(struct pt_regs *ctx) { return tls_enter(ctx, TLS_F_WRITE, 1); }

/* sys_enter of read, write, readv, writev, recvfrom, sendto, recvmsg, sendmsg (attached by
 * user space: the sockets family owns the TRACEPOINT_PROBE names): the fd, first argument,
 * of the first such syscall inside an open SSL call. The tracepoint's record: 8 bytes of
 * common fields, the syscall number (padded to 8), then the arguments, 8 bytes each. */
int tls_sys_enter(void *ctx)
{
    struct tls_call *c = tls_calls.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!c || !c->depth || c->fd >= 0)
        return 0;
    c->fd = (s32)((u64 *)ctx)[2];
    return 0;
}

/* min(len, limit), in a form the verifier can bound (sockets.c's clamp_payload). */
static __always_inline u64 tls_clamp(s64 len, u64 limit)
{
    u64 n = len > 0 ? (u64)len : 0;
    asm volatile("" : "+r"(n));
    if (n > limit)
        n = limit;
    asm volatile("" : "+r"(n));
    return n;
}

int uretprobe_ssl(struct pt_regs *ctx)
{
    struct tls_call *c = tls_calls.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!c || !c->depth)
        return 0;
    if (--c->depth)
        return 0;  /* an inner call returning */
    u64 id = bpf_get_current_pid_tgid();
    u64 now = bpf_ktime_get_ns();
    s64 rc = (s32)PT_REGS_RC(ctx);
    s64 moved = rc;
    if (c->ex) {
        moved = 0;
        if (rc == 1) {
            u64 n = 0;
            if (read_user(&n, sizeof(n), (void *)c->outlen) != 0) {
                tls_count(TLS_STAT_BAD_READ);
                return 0;
            }
            moved = n > 0x7fffffff ? 0x7fffffff : (s64)n;
        }
        if (moved <= 0) {
            tls_count(TLS_STAT_NO_DATA);
            return 0;
        }
    } else if (rc < 0 || (rc == 0 && c->func == TLS_F_WRITE)) {
        tls_count(TLS_STAT_NO_DATA);
        return 0;
    }
    struct tls_key key = {.tgid = id >> 32, .ssl = c->ssl};
    u32 flags = 0;
    s32 fd = c->fd;
    if (fd >= 0) {
        s32 *known = tls_fds.lookup(&key);
        if (!known || *known != fd)
            tls_fds.update(&key, &fd);
    } else {
        s32 *known = tls_fds.lookup(&key);
        if (known) {
            fd = *known;
            flags |= TLSF_FD_CACHED;
        } else {
            flags |= TLSF_NO_FD;
            tls_count(TLS_STAT_NO_FD);
        }
    }
    u32 zero = 0;
    struct tls_rec *r = tls_scratch.lookup(&zero);
    if (!r)
        return 0;
    r->ts_ns = c->ts;
    r->duration_ns = now - c->ts;
    r->pid = id >> 32;
    r->tid = (u32)id;
    r->fd = fd;
    r->ret = (s32)moved;
    r->kind = EV_SOCK_DATA;
    r->func = c->func;
    r->flags = flags;
    r->family = 0;
    r->port = 0;
    r->local_port = 0;
    r->pad = 0;
    __builtin_memset(r->addr, 0, sizeof(r->addr));
    __builtin_memcpy(r->addr, &c->ssl, sizeof(c->ssl));
    u64 n = tls_clamp(moved, TLS_PAYLOAD);
    if (n && read_user(r->data, n, (void *)c->buf) != 0) {
        tls_count(TLS_STAT_BAD_READ);
        n = 0;
    }
    n = tls_clamp(n, TLS_PAYLOAD);
    r->cap = n;
    if (tlsdata.ringbuf_output(r, 64 + n, tls_wake(64 + n)) != 0) {
        tls_count(TLS_STAT_LOST);
        return 0;
    }
    tls_count(TLS_STAT_RECORDS);
    return 0;
}
