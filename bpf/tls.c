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
 * `tls_conns`, for the calls served from OpenSSL's own buffer with no syscall (a second record
 * already read). An SSL whose calls never make a syscall (a memory BIO: Python's asyncio,
 * SSLObject) has no fd: its records carry fd -1 and the SSL pointer (in `addr`), and user
 * space keys the connection by that pointer, with no addresses.
 *
 * Calls that move nothing (-1: would block, or a renegotiation/KeyUpdate handled inside;
 * _ex returning 0) are counted in `tls_stats`, not reported; an SSL_read returning 0 (the
 * peer's close_notify or EOF) is reported with ret 0 and no payload, and ends the exchange as
 * a socket EOF does. A call that re-enters the probes on its thread (a library whose
 * SSL_read_ex calls SSL_read) is taken once, at the outer call.
 *
 * HTTP/1 head sampling, as sockets.c's (`http_gate`) on the plaintext, with the same shift,
 * decision counts and RED counts (this file follows sockets.c in the program: ProbeFamily.after):
 * a request is decided at its first plaintext bytes (a server's SSL_read, a client's SSL_write
 * that starts with an HTTP/1 method; which end an SSL is, is learnt from the first of them),
 * kept with probability 2^-shift, or shed whatever the draw while user space is more than
 * TLS_BACKLOG_BYTES of *this* ring behind (tls_ring_written minus the stamp of the last record
 * it processed, which it writes to tls_processed). A shed request puts nothing on the ring
 * (its reads, its response); its status is read from the response's first plaintext bytes, the
 * response followed to its last bytes (a chunked body's last chunk, the SSL's next request, the
 * peer's close, its socket's close(): tls_sys_close, or SSL_free: a probe of its own, for memory
 * BIOs), and the request counted in sockets.c's
 * http_red (red_finish) under the same key as a plain one, so user space adds it to the same
 * series (url.scheme is on spans only, not in the series).
 * A client request made while its thread serves a request, plain or TLS, inherits that
 * request's fate (the thread's sock_args.serving, shared with sockets.c). An SSL whose first
 * plaintext is not an HTTP/1 request line (HTTP/2's preface, an h2 server's SETTINGS, a
 * partial read of a few bytes) is never sampled: all its records go to the ring.
 * A data record's addr holds the SSL pointer (48 bits of user address) with the request's
 * shift in its top byte (addr[7]), then its stamp (addr[8..16]: this ring's bytes written up
 * to and including it). Its port and local_port hold the connection's id (low and high 16
 * bits; 0: unknown), new for each (process, SSL) entry and each new socket under one: user
 * space keys a connection by its fd, and a closed fd comes back for the next connection
 * before the socket ring has told of the close (tls.py). */

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
#define TLS_STAT_SHED 8        /* records of shed HTTP/1 requests, not put on the ring (counted as requests in http_red) */
#define TLS_STAT_MAX 9

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
/* Per (process, SSL): its fd, and the HTTP/1 request in progress on it (sockets.c's struct:
 * role, req, shift, method, req_ts, answered; seq and state unused). */
struct tls_conn {
    s32 fd;  /* from a syscall inside a call on this SSL; -1 until one */
    u32 id;  /* this connection's, from tls_ids: told apart from the fd's earlier ones */
    struct sk_state st;
};
BPF_TABLE("lru_hash", struct tls_key, struct tls_conn, tls_conns, TLS_FD_ENTRIES);
/* (process << 32 | fd) -> the SSL whose calls last used that socket: its close() ends the SSL's
 * connection (tls_sys_close). */
BPF_TABLE("lru_hash", u64, u64, tls_by_fd, TLS_FD_ENTRIES);
/* The last connection id given (tls_conn.id). */
BPF_ARRAY(tls_ids, u64, 1);
BPF_PERCPU_ARRAY(tls_scratch, struct tls_rec, 1);
BPF_PERCPU_ARRAY(tls_stats, u64, TLS_STAT_MAX);
BPF_ARRAY(tls_ring_written, u64, 1);
/* Written by user space: the stamp of the last tlsdata record it processed. */
BPF_ARRAY(tls_processed, u64, 1);

static __always_inline void tls_count(u32 slot)
{
    u64 *v = tls_stats.lookup(&slot);
    if (v)
        (*v)++;
}

/* A new connection id: never 0, which says none (the map full); wraps after 2^32. */
static __always_inline u32 tls_new_id(void)
{
    u32 zero = 0;
    u64 *last = tls_ids.lookup(&zero);
    if (!last)
        return 0;
    u32 id = (u32)(__sync_fetch_and_add(last, 1) + 1);
    return id ? id : 1;
}

/* common.h's ring_wake, on a counter of this ring's own; *stamp: the bytes written up to and
 * including this record. */
static __always_inline u64 tls_wake(u64 bytes, u64 *stamp)
{
    int zero = 0;
    u64 *written = tls_ring_written.lookup(&zero);
    if (!written) {
        *stamp = 0;
        return BPF_RB_NO_WAKEUP;
    }
    u64 before = *written;
    __sync_fetch_and_add(written, bytes);
    *stamp = before + bytes;
    u64 part = TLS_RING_PAGES * 4096ULL / RING_WAKE_PARTS;
    return ((before + bytes) ^ before) >= part ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* Bytes of this ring not yet processed by user space (sockets.c's sock_backlog, for tlsdata). */
static __always_inline u64 tls_backlog(void)
{
    int zero = 0;
    u64 *written = tls_ring_written.lookup(&zero);
    u64 *done = tls_processed.lookup(&zero);
    u64 d = done ? *done : 0;
    return written && *written > d ? *written - d : 0;
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

/* Whether a call's plaintext ends with a chunked body's last chunk ("0\r\n\r\n"): sockets.c's
 * last_chunk, on an SSL call's buffer. */
static __always_inline int tls_last_chunk(struct tls_call *c, s64 moved)
{
    if (moved < 5)
        return 0;
    u8 t[6] = {};
    if (moved == 5) {
        if (read_user(&t[1], 5, (void *)c->buf) != 0)
            return 0;
        t[0] = '\n';
    } else if (read_user(t, 6, (void *)(c->buf + moved - 6)) != 0) {
        return 0;
    }
    return t[0] == '\n' && t[1] == '0' && t[2] == '\r' && t[3] == '\n' && t[4] == '\r' && t[5] == '\n';
}

/* The sampling of an HTTP/1 request on this SSL (see the top): GATE_SHED when this call's
 * plaintext belongs to a shed request and goes nowhere; else GATE_EMIT, or GATE_STARTED for a
 * kept request's first bytes; *shift: the request's sampling shift. sockets.c's http_gate on
 * plaintext: the same decisions, counts (a shed request timed to its response's last bytes:
 * red_finish) and thread inheritance. ``moved`` 0: the peer closed (an SSL_read of 0). */
static __always_inline int tls_gate(struct tls_call *c, struct sk_state *st, s64 moved, u64 id, u8 *shift)
{
    *shift = 0;
    if (st->req == REQ_OTHER)
        return GATE_EMIT;
    u64 now = bpf_ktime_get_ns();
    int ingress = c->func == TLS_F_READ;
    if (moved <= 0) {
        /* the peer closed: a shed request is over, but a server's that has no response yet
         * (the server may still answer what it read: its response, or SSL_free, counts it) */
        if (st->role == SK_ROLE_CLIENT || st->answered == ANS_PENDING)
            red_finish(id >> 32, st, now);
        return GATE_EMIT;
    }
    u8 h[16] = {};
    u64 n = tls_clamp(moved, 16);
    if (n < 4 || read_user(h, n, (void *)c->buf) != 0)
        n = 0;
    u8 m = n ? http_method(h, n) : 0;
    if (!st->role) {
        if (!m) {
            st->req = REQ_OTHER;  /* not HTTP/1: never sampled */
            return GATE_EMIT;
        }
        st->role = ingress ? SK_ROLE_SERVER : SK_ROLE_CLIENT;
    }
    if ((st->role == SK_ROLE_SERVER) == ingress) {
        if (m) {
            red_finish(id >> 32, st, now);
            struct sock_args *thread = thread_args(1);
            u64 sh = sampling(SAMPLING_SHIFT);
            if (sh < SAMPLING_MIN_SHIFT)
                sh = SAMPLING_MIN_SHIFT;
            if (sh > 20)
                sh = 20;
            u8 req = REQ_KEPT;
            u32 why = DECISION_KEPT;
            u8 inherited = st->role == SK_ROLE_CLIENT && thread ? thread->serving : 0;
            if (thread && (inherited == REQ_KEPT || inherited == REQ_SHED)) {
                req = inherited;
                sh = thread->serving_shift;
                why = req == REQ_KEPT ? DECISION_KEPT : DECISION_PARENT;
            } else if (sh && (bpf_get_prandom_u32() & ((1U << sh) - 1)) != 0) {
                req = REQ_SHED;
                why = DECISION_PROBABILITY;
            } else if (tls_backlog() > TLS_BACKLOG_BYTES) {
                req = REQ_SHED;
                why = DECISION_BACKLOG;
            }
            st->req = req;
            st->shift = sh;
            st->method = m;
            st->answered = ANS_NONE;
            st->req_ts = st->role == SK_ROLE_SERVER ? now : c->ts;
            count_decision(why);
            if (st->role == SK_ROLE_SERVER && thread) {
                thread->serving = req;
                thread->serving_shift = sh;
            }
            *shift = sh;
            return req == REQ_SHED ? GATE_SHED : GATE_STARTED;
        }
    } else if (n >= 12 && has(h, "HTTP/1.", 7) && h[8] == ' ' && digit(h[9]) && digit(h[10]) && digit(h[11])) {
        /* a response's status line (1xx interim ones wait for the final): a server's thread is
         * done with the request; a shed request's response is followed to its end, but one with
         * no body to wait for (101, 204, 304, the answer to a HEAD) */
        u16 status = (h[9] - '0') * 100 + (h[10] - '0') * 10 + (h[11] - '0');
        if (status >= 200 || status == 101) {
            if (st->role == SK_ROLE_SERVER) {
                struct sock_args *thread = thread_args(0);
                if (thread)
                    thread->serving = 0;
            }
            if (st->req == REQ_SHED && st->answered == ANS_NONE) {
                st->answered = ANS_PENDING;
                st->status = status;
                st->minor = h[7] - '0';
                st->resp_end = now;
                if (status == 101 || status == 204 || status == 304 || st->method == HM_HEAD ||
                    tls_last_chunk(c, moved))
                    red_finish(id >> 32, st, now);
            }
        }
    } else if (st->req == REQ_SHED && st->answered == ANS_PENDING) {
        /* more of a shed request's response: its end moves; a chunked body's last chunk ends it */
        st->resp_end = now;
        if (tls_last_chunk(c, moved))
            red_finish(id >> 32, st, now);
    }
    *shift = st->req == REQ_KEPT ? st->shift : 0;
    return st->req == REQ_SHED ? GATE_SHED : GATE_EMIT;
}

/* sys_enter_close (attached by user space, as tls_sys_enter): a socket an SSL used is closed,
 * so that SSL's connection is over: a shed request still open is counted and the SSL's entry
 * goes. The end a server's last shed request on a kept-alive connection waits for: SSL_free
 * may come much later (a garbage collector's, after the socket's close). One hash lookup per
 * close() on the host. */
int tls_sys_close(void *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    s32 fd = (s32)((u64 *)ctx)[2];
    u64 fkey = (id & 0xffffffff00000000ULL) | (u32)fd;
    u64 *ssl = tls_by_fd.lookup(&fkey);
    if (!ssl)
        return 0;
    struct tls_key key = {.tgid = id >> 32, .ssl = *ssl};
    tls_by_fd.delete(&fkey);
    struct tls_conn *conn = tls_conns.lookup(&key);
    if (conn && conn->fd == fd) {
        red_finish(id >> 32, &conn->st, bpf_ktime_get_ns());
        tls_conns.delete(&key);
    }
    return 0;
}

/* SSL_free: the connection is over. A shed request still open is counted (timed to its
 * response's last bytes, or with no status at all if it had none), and the SSL's entry goes,
 * so that a new SSL allocated at the same address starts fresh (its role and requests its own). */
int uprobe_ssl_free(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (tls_ignored_pid(id >> 32))
        return 0;
    struct tls_key key = {.tgid = id >> 32, .ssl = PT_REGS_PARM1(ctx)};
    struct tls_conn *conn = tls_conns.lookup(&key);
    if (!conn)
        return 0;
    red_finish(id >> 32, &conn->st, bpf_ktime_get_ns());
    tls_conns.delete(&key);
    return 0;
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
    struct tls_conn *conn = tls_conns.lookup(&key);
    if (!conn) {
        struct tls_conn fresh = {.fd = -1, .id = tls_new_id()};
        tls_conns.update(&key, &fresh);
        conn = tls_conns.lookup(&key);
    }
    u32 flags = 0;
    s32 fd = c->fd;
    if (fd >= 0) {
        if (conn && conn->fd != fd) {
            if (conn->fd >= 0) {
                /* another socket under this SSL pointer (SSL_set_fd again, or an end not
                 * seen): a new connection, whose role and requests are its own */
                red_finish(id >> 32, &conn->st, bpf_ktime_get_ns());
                __builtin_memset(&conn->st, 0, sizeof(conn->st));
                conn->id = tls_new_id();
            }
            conn->fd = fd;
            u64 fkey = (id & 0xffffffff00000000ULL) | (u32)fd;
            u64 ssl = c->ssl;
            tls_by_fd.update(&fkey, &ssl);
        }
    } else if (conn && conn->fd >= 0) {
        fd = conn->fd;
        flags |= TLSF_FD_CACHED;
    } else {
        flags |= TLSF_NO_FD;
        tls_count(TLS_STAT_NO_FD);
    }
    u8 shift = 0;
    int gate = conn ? tls_gate(c, &conn->st, moved, id, &shift) : GATE_EMIT;
    if (gate == GATE_SHED) {
        tls_count(TLS_STAT_SHED);
        return 0;
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
    u32 conn_id = conn ? conn->id : 0;
    r->port = (u16)conn_id;
    r->local_port = (u16)(conn_id >> 16);
    r->pad = 0;
    u64 ssl_shift = (c->ssl & 0x00ffffffffffffffULL) | ((u64)shift << 56);
    __builtin_memcpy(r->addr, &ssl_shift, sizeof(ssl_shift));
    u64 n = tls_clamp(moved, TLS_PAYLOAD);
    if (n && read_user(r->data, n, (void *)c->buf) != 0) {
        tls_count(TLS_STAT_BAD_READ);
        n = 0;
    }
    n = tls_clamp(n, TLS_PAYLOAD);
    r->cap = n;
    u64 stamp = 0;
    u64 wake = tls_wake(64 + n, &stamp);
    __builtin_memcpy(&r->addr[8], &stamp, sizeof(stamp));
    if (tlsdata.ringbuf_output(r, 64 + n, wake) != 0) {
        tls_count(TLS_STAT_LOST);
        if (gate == GATE_STARTED && conn) {
            /* a kept request whose first bytes found the ring full: user space has seen
             * nothing of it, so it is shed from here on and counted here, not lost */
            conn->st.req = REQ_SHED;
            count_decision(DECISION_RING_FULL);
        }
        return 0;
    }
    tls_count(TLS_STAT_RECORDS);
    return 0;
}
