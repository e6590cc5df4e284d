/* PyTorch operators: at::_ops::<op>::call in libtorch_cpu (families/torch/probes.py picks
 * the operators and their sites).
 *
 * No uretprobe: a C++ exception thrown through a frame whose return address a uretprobe
 * replaced cannot be unwound (no unwind information for the kernel's trampoline) and the
 * program dies in std::terminate. So an operator has a uprobe at its entry and one on every
 * `ret` of its body, and the two are paired here by stack pointer: at entry [sp] holds the
 * return address, and at the `ret` that leaves the frame sp is the same again.
 *
 * Operators nest (matmul calls mm, layer_norm calls native_layer_norm) and CUDA calls run
 * inside them on the same thread, which is why the per-call `inflight` map (one open call
 * per thread) is not used: each thread keeps its own stack of open operator frames in task
 * storage. A frame whose stack pointer lies at or below the current one when a new entry
 * arrives, or below it at a `ret`, was left by an exception (its `ret` never ran): it is
 * dropped and counted (STAT_TORCH_UNWOUND). A `ret` whose frame was never entered (the
 * probes were attached mid-call) matches nothing and is ignored.
 *
 * One record per operator call, at its return (EV_TORCH_OP): ts_ns entry time, duration_ns,
 * a0 the entry address (user space names the operator from it), a1 the number of probed
 * operators open around it on the thread, a2 the exit address; flags EVF_SHED when the thread
 * serves an HTTP request head sampling shed (sockets.c, when the http receiver runs): the
 * operator belongs to no span a backend gets, and neither do the CUDA calls inside it. */

#ifdef SOCK_PAYLOAD
/* In sockets.c (the http family, after this file): whether this thread is serving an HTTP/1
 * request that head sampling shed. */
static __always_inline int serving_shed(void);
#endif

#define TORCH_MASK (TORCH_DEPTH - 1)

/* A frame's slot. The barrier keeps clang from dropping the mask where it knows the index
 * is in range already: the verifier does not always know it and refuses the access. */
static __always_inline u32 torch_slot(u32 d)
{
    asm volatile("" : "+r"(d));
    return d & TORCH_MASK;
}

struct torch_frame {
    u64 ts;
    u64 sp;   /* at entry: where the return address is */
    u64 ip;   /* the entry probe's address */
};

struct torch_stack {
    u32 depth;
    u32 pad;
    struct torch_frame f[TORCH_DEPTH];
};
BPF_TASK_STORAGE(torch_stacks, struct torch_stack);

/* Drop the frames an exception left above `sp`: at an entry (`entry` 1) every frame at or
 * below sp is gone; at a `ret` every frame below sp. Returns the depth left. */
static __always_inline u32 torch_unwind(struct torch_stack *s, u64 sp, int entry)
{
    u32 d = s->depth;
    if (d > TORCH_DEPTH)
        d = TORCH_DEPTH;
#pragma unroll
    for (int i = 0; i < TORCH_DEPTH; i++) {
        if (d == 0)
            break;
        u64 top = s->f[torch_slot(d - 1)].sp;
        if (top > sp || (!entry && top == sp))
            break;
        d--;
        count_stat(STAT_TORCH_UNWOUND);
    }
    return d;
}

int uprobe_torch_enter(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_watched(id >> 32))
        return 0;
    struct torch_stack *s = torch_stacks.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0,
                                                          BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!s)
        return 0;
    u64 sp = PT_REGS_SP(ctx);
    u32 d = torch_unwind(s, sp, 1);
    if (d >= TORCH_DEPTH) {
        s->depth = d;
        count_stat(STAT_TORCH_DEPTH);
        return 0;
    }
    struct torch_frame *f = &s->f[torch_slot(d)];
    f->ts = bpf_ktime_get_ns();
    f->sp = sp;
    f->ip = PT_REGS_IP(ctx);
    s->depth = d + 1;
    return 0;
}

int uprobe_torch_exit(struct pt_regs *ctx)
{
    struct torch_stack *s = torch_stacks.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, 0);
    if (!s || !s->depth)
        return 0;
    u64 sp = PT_REGS_SP(ctx);
    u32 d = torch_unwind(s, sp, 0);
    s->depth = d;
    if (d == 0)
        return 0;
    struct torch_frame *f = &s->f[torch_slot(d - 1)];
    if (f->sp != sp)
        return 0;  /* entered before the probes were attached */
    struct event e = {};
    new_event(&e, bpf_get_current_pid_tgid(), EV_TORCH_OP, 0);
    e.duration_ns = e.ts_ns - f->ts;
    e.ts_ns = f->ts;
    e.a0 = f->ip;
    e.a1 = d - 1;
    e.a2 = PT_REGS_IP(ctx);
#ifdef SOCK_PAYLOAD
    if (serving_shed())
        e.flags = EVF_SHED;
#endif
    s->depth = d - 1;
    emit(&e);
    return 0;
}
