"""CUDA Graphs in the correlator, on synthetic records laid out as bpf/cuda.c writes them:
captures and the launches they record, kernel nodes, instantiation, update, destruction and
launches; every count derived from what the records plant. Kernel "host stubs" are libc
functions of this process (named by their symbols), as in test_cuda.py."""

from __future__ import annotations

import re
from pathlib import Path

from families.cuda.test_cuda import ME, Events, Harness, fn_address, points
from otelbpf.base.events import FLAG_DRIVER, CudaFunc, Kind
from otelbpf.correlate.causality import Causality
from otelbpf.correlate.spans import new_context
from otelbpf.families.cuda.probes import GRAPH_CALLS, cuda_family

F = CudaFunc
G = Kind.CUDA_GRAPH
STREAM, SIDE, OTHER = 0x5000, 0x6000, 0x7000
GRAPH, EXEC = 0x6A00, 0xE000
A, B, C = fn_address("getuid"), fn_address("getgid"), fn_address("geteuid")


class GraphEvents(Events):
    def begin(self, stream: int = STREAM, ret: int = 0, func: int = F.cudaStreamBeginCapture) -> GraphEvents:
        self.add(G, func, a0=stream, a1=0, a3=1, ret=ret)
        return self

    def captured(self, fn: int, stream: int = STREAM, func: int = F.cudaLaunchKernel, **kw) -> GraphEvents:
        kw.setdefault("a1", 0)  # the return address, and its caller's (where it was launched from)
        kw.setdefault("a2", 0)
        self.add(Kind.CUDA_CAPTURED, func, a0=fn, a3=stream, dur=0, **kw)
        return self

    def end(self, graph: int = GRAPH, stream: int = STREAM, ret: int = 0) -> GraphEvents:
        self.add(G, F.cudaStreamEndCapture, a0=stream, a1=graph if ret == 0 else 0, a3=2, ret=ret)
        return self

    def instantiate(self, graph: int = GRAPH, exec_: int = EXEC, func: int = F.cudaGraphInstantiate) -> GraphEvents:
        self.add(G, func, a0=graph, a1=exec_)
        return self

    def graph_launch(self, exec_: int = EXEC, stream: int = STREAM, ret: int = 0, **kw) -> GraphEvents:
        self.add(G, F.cudaGraphLaunch, a0=exec_, a2=stream, ret=ret, **kw)
        return self


def graph_metrics(h: Harness) -> tuple[dict, dict, dict, dict]:
    """(cuda.kernel.launches by function, graph kernels in the top gauge by (name, graph id),
    cuda.graph.kernel.launches by function, anomalies by reason)"""
    m = h.collect()[ME]
    launches = {dict(k)["cuda.api.function"]: v for k, v in points(m["cuda.kernel.launches"]).items()}
    top = {
        (d["cuda.kernel.name"], d.get("cuda.graph.id")): v
        for d, v in ((dict(k), v) for k, v in points(m["cuda.kernel.launches.top"]).items())
    }
    ran = {dict(k)["cuda.api.function"]: v for k, v in points(m["cuda.graph.kernel.launches"]).items()}
    bad = (
        {dict(k)["reason"]: v for k, v in points(m["otelbpf.cuda.graph.anomalies"]).items()}
        if ("otelbpf.cuda.graph.anomalies" in m)
        else {}
    )
    return launches, top, ran, bad


def test_a_captured_graph_replayed_100_times_runs_each_kernel_100_times_per_node() -> None:
    h = Harness()
    ev = GraphEvents()
    ev.launch(C)  # before the capture: a launch
    ev.begin().captured(A).captured(B).captured(A, func=F.cudaLaunchKernelExC).end().instantiate()
    for _ in range(100):
        ev.graph_launch()
    h.correlator.on_events(ev.array())
    launches, top, ran, bad = graph_metrics(h)
    # the three recorded launches are not launches; the one before the capture is
    assert launches == {"cudaGraphLaunch": 100}  # (cudaLaunchKernel comes from the kernel's map)
    assert top == {("getuid", 1): 200, ("getgid", 1): 100}
    assert ran == {"cudaGraphLaunch": 300}
    assert bad == {}
    spans = [s for s in h.spans if s.name == "cudaGraphLaunch"]
    assert len(spans) == 100
    assert {(s.attributes["cuda.graph.id"], s.attributes["cuda.graph.kernel_count"]) for s in spans} == {(1, 3)}
    assert list(spans[0].attributes["cuda.graph.kernel_names"]) == ["getuid", "getgid"]
    assert spans[0].attributes["cuda.graph.exec"] == f"{EXEC:#x}"
    assert not [
        s for s in h.spans if s.name == "cudaLaunchKernel" and s.attributes.get("cuda.kernel.name") != "geteuid"
    ]


def test_a_built_graph_its_nodes_named_and_a_second_graph_numbered_apart() -> None:
    h = Harness()
    ev = GraphEvents()
    ev.add(G, F.cudaGraphCreate, a1=GRAPH)
    for fn, node in ((A, 0x1), (B, 0x2), (B, 0x3)):
        ev.add(G, F.cudaGraphAddKernelNode, a0=GRAPH, a1=node, a2=fn)
    ev.instantiate(func=F.cudaGraphInstantiateWithFlags)
    ev.add(G, F.cuGraphCreate, flags=FLAG_DRIVER, a1=GRAPH + 1)
    ev.add(G, F.cuGraphAddKernelNode_v2, flags=FLAG_DRIVER, a0=GRAPH + 1, a1=0x4, a2=C)
    ev.add(G, F.cuGraphInstantiateWithFlags, flags=FLAG_DRIVER, a0=GRAPH + 1, a1=EXEC + 1)
    ev.graph_launch().graph_launch()
    ev.add(G, F.cuGraphLaunch, flags=FLAG_DRIVER, a0=EXEC + 1, a2=STREAM)
    h.correlator.on_events(ev.array())
    launches, top, ran, bad = graph_metrics(h)
    assert launches == {"cudaGraphLaunch": 2, "cuGraphLaunch": 1}
    assert top == {("getuid", 1): 2, ("getgid", 1): 4, ("geteuid", 2): 1}
    assert ran == {"cudaGraphLaunch": 6, "cuGraphLaunch": 1}
    assert bad == {}
    m = h.collect()[ME]
    calls = {dict(k)["cuda.api.function"]: v for k, v in points(m["cuda.api.calls"]).items()}
    assert calls["cudaGraphAddKernelNode"] == 3 and "cudaGraphLaunch" not in calls  # launches are not API calls
    node = next(s for s in h.spans if s.name == "cudaGraphAddKernelNode")
    assert node.attributes["cuda.graph.node.kernel_name"] == "getuid"
    assert "cuda.kernel.name" not in node.attributes  # not a launch (report_ai.py counts those)
    inst = next(s for s in h.spans if s.name == "cudaGraphInstantiateWithFlags")
    assert inst.attributes["cuda.graph.exec_handle"] == f"{EXEC:#x}" and "cuda.graph.exec" not in inst.attributes


def test_a_fork_joined_stream_is_captured_a_foreign_one_runs() -> None:
    h = Harness()
    ev = GraphEvents()
    ev.begin().captured(A)
    ev.add(Kind.CUDA_CALL, F.cudaEventRecord, a0=0xE1, a2=STREAM)
    ev.add(Kind.CUDA_CALL, F.cudaStreamWaitEvent, a0=0xE1, a2=SIDE)  # SIDE joins the capture
    ev.captured(B, stream=SIDE)
    ev.captured(C, stream=OTHER)  # not captured: it ran
    ev.end().instantiate().graph_launch()
    h.correlator.on_events(ev.array())
    launches, top, ran, bad = graph_metrics(h)
    assert launches == {"cudaGraphLaunch": 1, "cudaLaunchKernel": 1}
    assert top == {("getuid", 1): 1, ("getgid", 1): 1, ("geteuid", None): 1}
    assert ran == {"cudaGraphLaunch": 2}


def test_bad_input_is_counted_never_raised() -> None:
    h = Harness()
    ev = GraphEvents()
    # invalidated: cudaStreamEndCapture returns 901; what it recorded never runs
    ev.begin().captured(A).end(ret=901)
    # abandoned: begun again before it ended, and one left open at exit (below)
    ev.begin(stream=SIDE).captured(B, stream=SIDE).begin(stream=SIDE)
    ev.end(stream=SIDE, graph=GRAPH)
    ev.instantiate().graph_launch()  # the restarted capture's graph: B was recorded before the restart
    # an update that fails keeps the kernels; one that succeeds replaces them
    ev.add(G, F.cudaGraphCreate, a1=GRAPH + 1)
    ev.add(G, F.cudaGraphAddKernelNode, a0=GRAPH + 1, a1=0x9, a2=C)
    ev.add(G, F.cudaGraphExecUpdate, a0=EXEC, a2=GRAPH + 1, ret=910)
    ev.add(G, F.cudaGraphExecUpdate, a0=EXEC, a2=GRAPH + 1)
    ev.graph_launch().graph_launch()
    # destroyed while launched (no synchronize since), then launched again: 400, runs nothing
    ev.add(G, F.cudaGraphExecDestroy, a0=EXEC)
    ev.graph_launch(ret=400)
    # destroyed after a synchronize of its stream: fine
    ev.instantiate(graph=GRAPH + 1, exec_=EXEC + 1).graph_launch(exec_=EXEC + 1)
    ev.sync(stream=STREAM)
    ev.add(G, F.cudaGraphExecDestroy, a0=EXEC + 1)
    ev.add(G, F.cudaGraphDestroy, a0=GRAPH + 1)
    ev.add(G, F.cudaGraphLaunch, a0=0xBAD, a2=STREAM, ret=400)  # never instantiated
    ev.begin(stream=OTHER).captured(A, stream=OTHER)  # left open
    ev.exit()
    h.correlator.on_events(ev.array())
    launches, top, ran, bad = graph_metrics(h)
    assert bad == {
        "capture_invalidated": 1,
        "capture_abandoned": 2,
        "update_failed": 1,
        "destroyed_in_flight": 1,
        "unknown_exec": 2,
    }
    assert launches == {"cudaGraphLaunch": 6}
    assert top == {("geteuid", 1): 2, ("geteuid", 2): 1}  # graph 1 ran nothing before its update
    assert ran == {"cudaGraphLaunch": 3}
    m = h.collect()
    assert not m or "cuda.api.errors" in m[ME]  # exported once more at most, and nothing raised


def test_graph_probes_read_what_the_headers_lay_out() -> None:
    """The offsets kernel_node_fn reads (bpf/cuda.c) against CUDA 13's headers, where installed:
    cudaKernelNodeParams.func and CUDA_KERNEL_NODE_PARAMS.func first, the v2 struct's kern at 56."""
    cuda_h = Path("/usr/local/cuda-13.0/include/cuda.h")
    code = cuda_family(["cudart", "cuda"]).generated_c
    for func in GRAPH_CALLS:
        assert f"int uprobe_{func.name}(" in code
    assert "kernel_node_fn(PT_REGS_PARM5(ctx), 1)" in code
    if not cuda_h.exists():
        return
    text = cuda_h.read_text()
    v2 = re.search(r"typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st \{(.*?)\}", text, re.S)
    assert v2 is not None
    fields = re.findall(r"^\s*([\w ]+?\**)\s*(\w+);", v2.group(1), re.M)
    sizes = {"CUfunction": 8, "unsigned int": 4, "void **": 8, "CUkernel": 8, "CUcontext": 8}
    offset = 0
    for ctype, name in fields:
        size = sizes[ctype.strip()]
        offset = (offset + size - 1) // size * size
        if name == "kern":
            assert offset == 56
        offset += size
    assert fields[0][1] == "func"


def test_a_graph_launch_is_a_child_of_the_request_its_thread_serves() -> None:
    """Causality as for any CUDA call (causality.py): the launch made on the thread while it
    serves the request nests under it; the same graph launched after the request ended does not."""
    causality = Causality()
    h = Harness(parent_of=causality.parent)
    ev = GraphEvents(tid=ME + 1)
    ev.begin().captured(A).end().instantiate()
    request = new_context()
    interval = causality.open(ME, ME + 1, ev.ts + 5_000, request)
    ev.graph_launch()
    causality.close(ME, ME + 1, interval, ev.ts + 5_000)
    ev.graph_launch()
    h.correlator.on_events(ev.array())
    inside, after = [s for s in h.spans if s.name == "cudaGraphLaunch"]
    assert inside.parent == request and inside.context.trace_id == request.trace_id
    assert inside.attributes["otelbpf.causality"] == "thread"
    assert after.parent is None
    assert inside.attributes["cuda.graph.kernel_count"] == after.attributes["cuda.graph.kernel_count"] == 1


def test_an_executable_graph_updated_at_every_step_keeps_one_version() -> None:
    """What a replaced version ran is folded by kernel once: state stays bounded however often an
    executable graph is updated, and the counts stay exact."""
    h = Harness()
    ev = GraphEvents()
    for g, fn in ((GRAPH, A), (GRAPH + 1, B)):
        ev.add(G, F.cudaGraphCreate, a1=g)
        ev.add(G, F.cudaGraphAddKernelNode, a0=g, a1=g + 0x10, a2=fn)
    ev.instantiate()
    for step in range(200):
        ev.graph_launch()
        ev.add(G, F.cudaGraphExecUpdate, a0=EXEC, a2=GRAPH + (step + 1) % 2)
    h.correlator.on_events(ev.array())
    graphs = h.correlator._procs[ME].graphs
    assert graphs is not None and len(graphs.versions) == 1 and len(graphs.runs) == 0
    _launches, top, ran, bad = graph_metrics(h)
    assert top == {("getuid", 1): 100, ("getgid", 1): 100} and ran == {"cudaGraphLaunch": 200} and bad == {}


def test_a_kernel_node_given_another_kernel_in_the_graph_or_the_executable_graph() -> None:
    h = Harness()
    ev = GraphEvents()
    ev.add(G, F.cudaGraphCreate, a1=GRAPH)
    ev.add(G, F.cudaGraphAddKernelNode, a0=GRAPH, a1=0x1, a2=A)
    ev.add(G, F.cudaGraphAddKernelNode, a0=GRAPH, a1=0x2, a2=A)
    ev.add(G, F.cudaGraphKernelNodeSetParams, a1=0x2, a2=B)  # the graph's: later instantiations
    ev.instantiate().graph_launch()  # A, B
    ev.add(G, F.cudaGraphExecKernelNodeSetParams, a0=EXEC, a1=0x1, a2=C)  # this executable graph only
    ev.graph_launch()  # C, B
    ev.add(G, F.cudaGraphExecKernelNodeSetParams, a0=EXEC, a1=0x77, a2=C)  # a node it does not have
    ev.begin().captured(A).end(graph=GRAPH + 1).instantiate(graph=GRAPH + 1, exec_=EXEC + 1)
    ev.add(G, F.cudaGraphExecKernelNodeSetParams, a0=EXEC + 1, a1=0x99, a2=B)  # a captured node: unknown
    h.correlator.on_events(ev.array())
    _launches, top, ran, bad = graph_metrics(h)
    assert top == {("getuid", 1): 1, ("getgid", 1): 2, ("geteuid", 1): 1}
    assert ran == {"cudaGraphLaunch": 4}
    assert bad == {"unknown_node": 2}
    node = next(s for s in h.spans if s.name == "cudaGraphExecKernelNodeSetParams")
    assert node.attributes["cuda.graph.node.kernel_name"] == "geteuid" and node.attributes["cuda.graph.node"] == "0x1"


def test_a_kernel_only_ever_captured_is_named_by_where_it_was_launched_from() -> None:
    """Attached late (registration and handle look-ups long past): a kernel launched only inside
    captures is named from the captured launch's return address, as a first launch's site names
    an ordinary one."""
    h = Harness()
    ev = GraphEvents()
    handle = 0x7F00DEAD0000  # a driver-made handle: no symbol, nothing registered while watched
    ev.begin().captured(handle, a1=fn_address("getuid") + 4).end().instantiate().graph_launch()
    h.correlator.on_events(ev.array())
    [name] = [n for n, _gid in graph_metrics(h)[1]]
    assert name.startswith("[launched at libc.so.6+0x"), name


def test_any_order_of_graph_calls_is_taken_without_raising() -> None:
    """Bad input at large: graph calls, captured launches, stream events and syncs in random
    order, with random return codes and handles drawn from a few (reused, unknown, destroyed):
    every batch is taken, every collect answers, and no count goes negative."""
    import random

    from otelbpf.families.cuda.probes import GRAPH_CALLS

    rng = random.Random(37)
    funcs = list(GRAPH_CALLS)
    handles = [0, STREAM, SIDE, GRAPH, GRAPH + 1, EXEC, EXEC + 1, 0x1, 0x2, A, B]
    h = Harness()
    for _batch in range(20):
        ev = GraphEvents(tid=ME + rng.randrange(3))
        for _ in range(200):
            r = rng.random()
            kw = {f"a{i}": rng.choice(handles) for i in range(4)}
            if r < 0.6:
                f = rng.choice(funcs)
                ev.add(G, f, ret=rng.choice([0, 0, 0, 35, 400, 901, 910]), flags=FLAG_DRIVER if f >= 64 else 0, **kw)
            elif r < 0.8:
                ev.add(Kind.CUDA_CAPTURED, F.cudaLaunchKernel, dur=0, **kw)
            elif r < 0.9:
                ev.add(Kind.CUDA_CALL, rng.choice([F.cudaEventRecord, F.cudaStreamWaitEvent, F.cudaEventQuery]), **kw)
            else:
                ev.sync(func=rng.choice([F.cudaStreamSynchronize, F.cudaDeviceSynchronize]), stream=kw["a0"])
        h.correlator.on_events(ev.array())
        m = h.collect()[ME]
        assert all(v >= 0 for metric in m.values() for v in points(metric).values())
