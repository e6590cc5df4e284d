"""The skeleton keeps declarations and empties what BCC would compile into programs."""

from __future__ import annotations

from otelbpf.sensor import program
from otelbpf.sensor.skeleton import skeleton

SOURCE = r"""
#define BODY(x) { return x; }   /* a brace in a macro: a preprocessor line, kept */
#define LONG(a) \
    do { a; } while (0)
struct rec { u64 ts; char s[16]; };   // a struct keeps its fields
BPF_HASH(calls, u32, struct rec, 1024);
static __always_inline int helper(struct rec *r)
{
    if (r->ts) { return 1; }
    return 0;
}
static void touch(void) { }
int uprobe_thing(struct pt_regs *ctx)
{
    char *s = "}{";   /* braces in a string */
    char c = '}';
    struct rec r = {};
    return helper(&r) + (s[0] == c);
}
void not_a_program(int x) { x++; }
TRACEPOINT_PROBE(sched, sched_switch)
{
    if (args->prev_pid) { return 1; }
    return 0;
}
u64 table[2] = { 1, 2 };
"""


def test_programs_are_emptied_statics_become_declarations_the_rest_is_kept() -> None:
    out = skeleton(SOURCE)
    assert "int uprobe_thing(struct pt_regs *ctx)\n{ return 0; }" in out
    assert "TRACEPOINT_PROBE(sched, sched_switch)\n{ return 0; }" in out
    assert "void not_a_program(int x) { }" in out
    assert "static __always_inline int helper(struct rec *r)\n;" in out
    assert "static void touch(void) ;" in out
    for kept in (
        "#define BODY(x) { return x; }   /* a brace in a macro: a preprocessor line, kept */",
        "#define LONG(a) \\\n    do { a; } while (0)",
        "struct rec { u64 ts; char s[16]; };   // a struct keeps its fields",
        "BPF_HASH(calls, u32, struct rec, 1024);",
        "u64 table[2] = { 1, 2 };",
    ):
        assert kept in out
    for gone in ('"}{"', "helper(&r)", "args->prev_pid", "r->ts"):
        assert gone not in out


def test_the_agents_program_keeps_every_declaration_line() -> None:
    """Every map declaration, include and macro of the assembled program survives, and no
    program body does (each ends in `return 0;`, BCC's rewriting of map calls gone)."""
    from otelbpf.families.cuda.probes import cuda_family
    from otelbpf.families.http.probes import socket_family

    text, _ = program.build(
        [cuda_family(["cudart"], launch_errors=True), socket_family([8080], payload_bytes=256, ring_bytes=1 << 20)],
        filter_pids=False,
        events_ring_bytes=1 << 20,
    )
    out = skeleton(text)
    declared = [ln for ln in text.splitlines() if ln.startswith(("BPF_", "#include", "#define"))]
    assert len(declared) > 30
    assert [ln for ln in out.splitlines() if ln.startswith(("BPF_", "#include", "#define"))] == declared
    assert ".lookup(" not in out and ".ringbuf_" not in out
    assert len(out) < len(text) * 0.6
