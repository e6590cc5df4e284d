/*
 * Functions that differ only in their first instructions, built as build/bench/libnopfunc.so.
 *
 * A uprobe's cost depends on the instruction it replaces (DESIGN.md, "Platform facts"): the kernel
 * optimises a 5-byte nop, emulates `push %rbp` and a 1-byte nop, and single-steps the rest,
 * endbr64 included. Written in assembly so the compiler cannot change the prologues. Each
 * returns 0 and ignores its arguments, so bench/launch_loop can call any of them with
 * cudaLaunchKernel's argument list.
 */

#define FUNC(name, body)                                   \
    ".globl " #name "\n"                                   \
    ".type " #name ", @function\n"                         \
    ".p2align 4\n" #name ":\n" body ".size " #name ", .-" #name "\n"

__asm__(".text\n"
        /* nopl 0x0(%rax,%rax,1): the nop5 that optimised uprobes replace */
        FUNC(nop5_func, ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n xorl %eax, %eax\n ret\n")
        /* what GCC emits with -fcf-protection -fno-omit-frame-pointer */
        FUNC(endbr_push_func, "endbr64\n push %rbp\n mov %rsp, %rbp\n xorl %eax, %eax\n pop %rbp\n ret\n")
        /* what NVIDIA's libcudart.so.12 functions start with */
        FUNC(push_func, "push %rbp\n mov %rsp, %rbp\n xorl %eax, %eax\n pop %rbp\n ret\n")
        FUNC(nop1_func, "nop\n xorl %eax, %eax\n ret\n")
        /* an ordinary first instruction, which the kernel single-steps */
        FUNC(mov_func, "movl $0, %eax\n ret\n"));
