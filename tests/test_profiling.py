"""End to end: `otelbpf run` with the profiling receiver, real eBPF, real interpreters and
programs; every profile written is read back by `go tool pprof -raw`, and every profile sent
to Pyroscope is decoded by the receiver in harness/pyroscope.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from harness import pprof
from harness.agent import FAKE_CUDART, REPO, AgentProcess
from harness.pyroscope import PyroscopeReceiver

pytestmark = [pytest.mark.bpf, pytest.mark.usefixtures("built")]

EXAMPLES = REPO / "examples" / "profiling"
BUILT = REPO / "build" / "examples" / "profiling"
HOT = EXAMPLES / "hot.py"
PYENV = Path.home() / ".pyenv" / "versions"


def marked_line(path: Path, marker: str) -> int:
    """The line of ``path`` carrying the comment ``# HOT: marker`` (or ``# SITE: marker``)."""
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if re.search(rf"# (HOT|SITE): {re.escape(marker)}$", text):
            return number
    raise AssertionError(f"no marker {marker!r} in {path}")


def write_config(
    tmp: Path,
    *,
    exporters: dict | None = None,
    cuda: bool = False,
    interval: str = "1s",
    extra_receiver: dict | None = None,
) -> Path:
    exporters = exporters or {"file": {"directory": str(tmp / "out")}}
    doc: dict = {
        "receivers": {"profiling": {"interval": interval, "cuda_memory": cuda, **(extra_receiver or {})}},
        "exporters": exporters,
        "service": {
            "pipelines": {"profiles": {"receivers": ["profiling"], "exporters": list(exporters)}},
            "telemetry": {"drain_interval": "20ms", "log_level": "info"},
        },
    }
    if cuda:
        doc["receivers"]["cuda"] = {"search_paths": []}
        doc["exporters"]["file/otlp"] = {"directory": str(tmp / "otlp")}
        doc["service"]["pipelines"]["metrics"] = {"receivers": ["cuda"], "exporters": ["file/otlp"]}
    path = tmp / "otelbpf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_profiled(cfg: Path, command: list[str], env: dict | None = None) -> AgentProcess:
    with AgentProcess(["-c", str(cfg), "--", *command], env=env) as agent:
        rc = agent.wait(timeout=180)
    assert rc == 0, agent.output
    return agent


def profiles(tmp: Path, kind: str) -> list[pprof.RawProfile]:
    """Every pprof file of ``kind`` the file exporter wrote, oldest first, read by go tool pprof."""
    files = sorted((tmp / "out" / "profiles").glob(f"*-{kind}-*.pb.gz"), key=lambda p: int(p.name.split("-")[-1][:-6]))
    assert files, f"no {kind} profiles in {tmp / 'out'}"
    return [pprof.read(f) for f in files]


def merged(raws: list[pprof.RawProfile]) -> list[pprof.Sample]:
    return [s for r in raws for s in r.samples]


def share(samples: list[pprof.Sample], function: str, among: tuple[str, ...]) -> float:
    """Fraction of the samples in any of ``among`` whose stack holds ``function``."""
    relevant = [s for s in samples if any(f in s.functions() for f in among)]
    assert relevant, f"no samples in {among}"
    return sum(s.values[0] for s in relevant if function in s.functions()) / sum(s.values[0] for s in relevant)


def python_for(version: str) -> Path | None:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    return found[-1] if found else None


# --- CPU ---------------------------------------------------------------------------------------


def check_hot_profile(samples: list[pprof.Sample]) -> None:
    a = share(samples, "hot_a", ("hot_a", "hot_b"))
    assert 0.60 <= a <= 0.80, f"hot_a has {a:.0%} of the hot samples, expected about 70%"
    spin_line, a_line, b_line = (marked_line(HOT, m) for m in ("spin", "hot_a", "hot_b"))
    frames = {(f.function, f.file, f.line) for s in samples for f in s.frames}
    assert ("hot_a", str(HOT), a_line) in frames
    assert ("hot_b", str(HOT), b_line) in frames
    assert ("spin", str(HOT), spin_line) in frames
    # Python frames stand where the interpreter's were: main above hot_a above spin.
    stack = next(s.functions() for s in samples if "hot_a" in s.functions())
    assert stack.index("spin") < stack.index("hot_a") < stack.index("main")
    # Samples with Python frames have no interpreter eval frames left (samples taken before the
    # agent had inspected the new process are native only, and keep theirs).
    merged_stacks = [s.functions() for s in samples if "main" in s.functions()]
    assert merged_stacks and not [f for f in merged_stacks if "_PyEval_EvalFrameDefault" in f]


def test_two_hot_functions_split_70_30_with_file_and_line(tmp_path):
    cfg = write_config(tmp_path)
    agent = run_profiled(cfg, [sys.executable, str(HOT), "5"])
    raws = profiles(tmp_path, "cpu")
    for r in raws:
        assert r.sample_types == ["samples/count", "cpu/nanoseconds"]
    samples = merged(raws)
    check_hot_profile(samples)
    assert {s.labels["service_name"] for s in samples} == {os.path.basename(os.path.realpath(sys.executable))}
    assert {s.labels["host_name"] for s in samples} and {s.labels["process_pid"] for s in samples}
    assert "profile" not in agent.output.lower() or "Traceback" not in agent.output


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_python_frames_in_other_interpreter_versions(tmp_path, version):
    python = python_for(version)
    if python is None:
        pytest.skip(f"no CPython {version} here (pyenv versions: {sorted(p.name for p in PYENV.glob('*'))})")
    cfg = write_config(tmp_path)
    run_profiled(cfg, [str(python), str(HOT), "5"])
    check_hot_profile(merged(profiles(tmp_path, "cpu")))


def test_c_extension_frames_sit_below_their_python_caller(tmp_path):
    cfg = write_config(tmp_path)
    run_profiled(cfg, [sys.executable, str(EXAMPLES / "native_hot.py"), "4", str(BUILT)])
    samples = merged(profiles(tmp_path, "cpu"))
    merged_samples = [s for s in samples if "main" in s.functions()]  # taken once the process was inspected
    native = [s.functions() for s in merged_samples if "crunch_inner" in s.functions()]
    assert len(native) >= 0.5 * len(merged_samples), "most time is in the C loop"
    line = marked_line(EXAMPLES / "native_hot.py", "call_native")
    for stack in native:
        assert stack.index("crunch_inner") < stack.index("crunch") < stack.index("call_native") < stack.index("main")
    frames = {(f.function, f.line) for s in samples for f in s.frames}
    assert ("call_native", line) in frames


def test_a_process_that_exits_before_symbolization_keeps_its_names(tmp_path):
    """The interval is longer than the program: everything is read after it exited."""
    cfg = write_config(tmp_path, interval="30s")
    run_profiled(cfg, [sys.executable, str(HOT), "2"])
    samples = merged(profiles(tmp_path, "cpu"))
    functions = {f for s in samples for f in s.functions()}
    assert {"hot_a", "hot_b", "spin", "main"} <= functions
    assert not [f for f in functions if f.startswith("[python code")]


def test_native_program_library_names_and_deleted_binary(tmp_path):
    """A program deleted from disk while it runs is still symbolized (through
    /proc/PID/map_files); its library's static function is named from .symtab."""
    work = tmp_path / "bin"
    work.mkdir()
    for name in ("spinner", "libspin.so"):
        shutil.copy(BUILT / name, work / name)
    proc_cfg = write_config(tmp_path, interval="1s")
    with AgentProcess(
        ["-c", str(proc_cfg), "--", "sh", "-c", f"(sleep 0.5; rm {work / 'spinner'}) & exec {work / 'spinner'} 4"]
    ) as agent:
        assert agent.wait(timeout=120) == 0, agent.output
    samples = merged(profiles_of_service(tmp_path, "spinner"))
    functions = {f for s in samples for f in s.functions()}
    assert {"spin_static", "spin_exported", "main"} <= functions, functions


def test_stripped_library_gives_exported_names_and_module_offsets(tmp_path):
    work = tmp_path / "bin"
    work.mkdir()
    shutil.copy(BUILT / "spinner", work / "spinner")
    subprocess.run(["strip", "--strip-all", "-o", str(work / "libspin.so"), str(BUILT / "libspin.so")], check=True)
    cfg = write_config(tmp_path)
    run_profiled(cfg, [str(work / "spinner"), "3"])
    samples = merged(profiles_of_service(tmp_path, "spinner"))
    functions = {f for s in samples for f in s.functions()}
    assert "spin_exported" in functions
    assert "spin_static" not in functions
    assert any(re.fullmatch(r"libspin\.so\+0x[0-9a-f]+", f) for f in functions), functions


def profiles_of_service(tmp: Path, service: str) -> list[pprof.RawProfile]:
    files = sorted((tmp / "out" / "profiles").glob(f"{service}-*-cpu-*.pb.gz"))
    assert files, sorted(p.name for p in (tmp / "out" / "profiles").glob("*"))
    return [pprof.read(f) for f in files]


def test_every_written_profile_reads_back_with_go_pprof(tmp_path):
    cfg = write_config(tmp_path)
    run_profiled(cfg, ["sh", "-c", f"{sys.executable} {HOT} 2 & {BUILT / 'spinner'} 2; wait"])
    read = pprof.read_all(tmp_path / "out")
    assert len(read) >= 2
    for path, raw in read.items():
        assert raw.samples, path


# --- CUDA memory --------------------------------------------------------------------------------


def test_cuda_memory_by_python_call_site_alloc_and_inuse(tmp_path):
    cfg = write_config(tmp_path, cuda=True)
    run_profiled(cfg, [sys.executable, str(EXAMPLES / "cuda_alloc.py"), str(FAKE_CUDART), "2.5"])
    raws = profiles(tmp_path, "cuda_memory")
    for r in raws:
        assert r.sample_types == [
            "alloc_objects/count",
            "alloc_space/bytes",
            "inuse_objects/count",
            "inuse_space/bytes",
        ]
    site = {"alloc_weights": "weights", "alloc_activations": "activations"}
    lines = {fn: marked_line(EXAMPLES / "cuda_alloc.py", m) for fn, m in site.items()}

    def by_site(raw: pprof.RawProfile, index: int) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for s in raw.samples:
            assert s.frames[0].function == "cudaMalloc"
            fn = next(f for f in s.functions() if f in site)
            assert (fn, lines[fn]) in {(f.function, f.line) for f in s.frames}
            out[fn] += s.values[index]
        return out

    mib = 1 << 20
    allocated: dict[str, int] = defaultdict(int)
    for r in raws:
        for fn, v in by_site(r, 1).items():
            allocated[fn] += v
    assert dict(allocated) == {"alloc_weights": 3 * mib, "alloc_activations": 4 * mib}
    inuse = [{k: v for k, v in by_site(r, 3).items() if v} for r in raws]
    inuse = [i for i in inuse if i]  # profiles read after the exit show none in use
    assert {"alloc_weights": 3 * mib, "alloc_activations": 4 * mib} in inuse
    assert inuse[-1] == {"alloc_activations": 4 * mib}  # the weights were freed


def test_cuda_copies_and_synchronizes_by_python_call_site(tmp_path):
    """The AI flame graphs' code frames: every copy and synchronize on the Python line that made
    it, with its bytes and the time the thread spent in it; one launch in 64 on the line that
    launched it, counted 64 times, the kernel on top (issue 32, item 5)."""
    cfg = write_config(tmp_path, cuda=True)
    run_profiled(cfg, [sys.executable, str(EXAMPLES / "cuda_copy.py"), str(FAKE_CUDART), "1.5"])
    raws = profiles(tmp_path, "cuda_calls")
    assert all(
        r.sample_types == ["cuda_calls/count", "cuda_wait/nanoseconds", "cuda_copy/bytes", "cuda_launches/count"]
        for r in raws
    )
    sites = {
        "cudaMemcpy": ("copy_batch", marked_line(EXAMPLES / "cuda_copy.py", "copy")),
        "cudaDeviceSynchronize": ("wait_step", marked_line(EXAMPLES / "cuda_copy.py", "sync")),
        "abs": ("run_layers", marked_line(EXAMPLES / "cuda_copy.py", "launch")),  # the kernel, on top
    }
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for s in merged(raws):
        leaf = s.frames[0].function
        if leaf not in sites:
            continue  # the stand-in's own calls (cudaMalloc is no copy)
        assert sites[leaf] in {(f.function, f.line) for f in s.frames}, s.functions()
        totals[leaf] = [a + b for a, b in zip(totals[leaf], s.values)]
    copies, syncs = totals["cudaMemcpy"], totals["cudaDeviceSynchronize"]
    assert copies[0] == 8 and copies[2] == 8 << 20 and copies[1] > 0
    assert syncs[0] == 12 and syncs[2] == 0 and syncs[1] > 0 and syncs[3] == 0
    assert totals["abs"] == [640, 0, 0, 640], dict(totals)  # 10 sampled, 64 each


def test_cuda_memory_survives_a_burst_of_thousands_of_allocations(tmp_path):
    cfg = write_config(tmp_path, cuda=True)
    count = 5000
    run_profiled(cfg, [sys.executable, str(EXAMPLES / "cuda_alloc.py"), str(FAKE_CUDART), "1.5", str(count)])
    raws = profiles(tmp_path, "cuda_memory")
    line = marked_line(EXAMPLES / "cuda_alloc.py", "burst")

    def burst_values(raw: pprof.RawProfile) -> list[int]:
        totals = [0, 0, 0, 0]
        for s in raw.samples:
            assert ("burst", line) in {(f.function, f.line) for f in s.frames}, s.functions()
            totals = [a + b for a, b in zip(totals, s.values)]
        return totals

    values = [burst_values(r) for r in raws]
    assert sum(v[0] for v in values) == count and sum(v[1] for v in values) == count * 4096
    kept = count - count * 4 // 10
    in_use = [v[2:] for v in values if v[2]]  # profiles read after the exit show none in use
    assert in_use[-1] == [kept, kept * 4096]


# --- module-level code ---------------------------------------------------------------------------

MODULE_SCRIPT = EXAMPLES / "module_alloc.py"
MODULE_IMPORT = EXAMPLES / "module_alloc_import.py"
MODULE_INTERPRETERS = {
    "venv": Path(sys.executable),
    "debian": Path("/usr/bin/python3"),  # another build of 3.11 (no frame pointers, libpython linked in)
    **{v: python_for(v) for v in ("3.10", "3.12", "3.13")},
}


def unknown_python_share(samples: list[pprof.Sample], index: int) -> float:
    """The share of the value in samples whose stack holds a Python frame not named by
    function, file and line (a code object never captured reads `[python code 0x…]`; a line
    table not copied, line 0)."""

    def python(f: pprof.Loc) -> bool:
        return bool(f.file) or f.function.startswith("[python code")

    def unknown(f: pprof.Loc) -> bool:
        return f.function.startswith("[python code") or not f.file or f.line <= 0

    total = sum(s.values[index] for s in samples if any(python(f) for f in s.frames))
    assert total, "no samples with Python frames"
    return sum(s.values[index] for s in samples if any(python(f) and unknown(f) for f in s.frames)) / total


def unknown_python_frames(samples: list[pprof.Sample]) -> list[tuple[str, str, int]]:
    """The unnamed Python frames, for a failure's message."""
    return sorted(
        {
            (f.function, f.file, f.line)
            for s in samples
            for f in s.frames
            if f.function.startswith("[python code") or (f.file and f.line <= 0)
        }
    )


@pytest.mark.parametrize("interpreter", sorted(MODULE_INTERPRETERS))
def test_module_level_code_is_named_by_file_and_line_in_cpu_and_memory_profiles(tmp_path, interpreter):
    """`<module>` frames of a script's top level, of a module's import-time code (freed once
    imported) and of code made by compile() (each at the freed one's address) carry their
    own file and line, in CPU samples and in the stacks that allocated device memory."""
    python = MODULE_INTERPRETERS[interpreter]
    if python is None or not python.exists():
        pytest.skip(f"no {interpreter} interpreter here")
    cfg = write_config(tmp_path, cuda=True)
    agent = run_profiled(cfg, [str(python), str(MODULE_SCRIPT), str(FAKE_CUDART), "1"])
    generated = [EXAMPLES / f"generated_{n}.py" for n in range(3)]
    script, imported = str(MODULE_SCRIPT), str(MODULE_IMPORT)

    cpu = merged(profiles(tmp_path, "cpu"))
    frames = {(f.function, f.file, f.line) for s in cpu for f in s.frames}
    assert ("<module>", script, marked_line(MODULE_SCRIPT, "script_spin")) in frames
    assert ("<module>", imported, marked_line(MODULE_IMPORT, "import_spin")) in frames
    for n, path in enumerate(generated):
        assert ("<module>", str(path), 4 + n) in frames, (n, sorted(f for f in frames if f[0] == "<module>"))
    # A CPU sample is taken at any instant, also inside the short life of a compile()d code
    # object the agent reads from the process after the sample: a rare one may find it gone
    # (0.2% once in a loaded CI run). Allocations are named at their call: none may be unknown.
    assert unknown_python_share(cpu, 0) <= 0.01, unknown_python_frames(cpu)

    memory = profiles(tmp_path, "cuda_memory")
    mib = 1 << 20
    site = {
        (script, marked_line(MODULE_SCRIPT, "script_alloc")): 4 * mib,
        (imported, marked_line(MODULE_IMPORT, "import_alloc")): 2 * mib,
        **{(str(path), 5 + n): mib // 2 for n, path in enumerate(generated)},
    }
    below = {
        imported: marked_line(MODULE_SCRIPT, "script_import"),
        **{str(path): marked_line(MODULE_SCRIPT, "script_exec") for path in generated},
    }
    allocated: dict[tuple[str, int], int] = defaultdict(int)
    for s in merged(memory):
        modules = [(f.file, f.line) for f in s.frames if f.function == "<module>"]
        assert modules[0] in site, (s.functions(), modules)
        if modules[0][0] in below:  # the script's top level, at the import or the exec
            assert modules[1] == (script, below[modules[0][0]]), modules
        allocated[modules[0]] += s.values[1]
    assert dict(allocated) == site
    in_use = [r for r in memory if r.total(3)]
    assert in_use and in_use[-1].total(3) == sum(site.values())  # nothing was freed
    assert unknown_python_share(merged(memory), 1) == 0
    assert unknown_python_share(in_use[-1].samples, 3) == 0
    assert "Traceback" not in agent.output


# --- Pyroscope ----------------------------------------------------------------------------------


def test_pyroscope_server_address_alone_sends_the_cpu_profile(tmp_path):
    receiver = PyroscopeReceiver()
    try:
        env = {
            "PYROSCOPE_SERVER_ADDRESS": receiver.endpoint,
            "PYROSCOPE_BASIC_AUTH_USER": "u1",
            "PYROSCOPE_BASIC_AUTH_PASSWORD": "secret",
            "PYROSCOPE_TENANT_ID": "team-a",
        }
        with AgentProcess(["--", sys.executable, str(HOT), "3"], env={**env, "OTEL_SERVICE_NAME": ""}) as agent:
            assert agent.wait(timeout=180) == 0, agent.output
        got = receiver.wait_for(
            lambda r: [p for p in r.profiles if p.labels["__name__"] == "process_cpu"], what="a CPU profile"
        )
        assert not receiver.errors
        p = got[0]
        assert p.api == "push"
        assert p.headers["X-Scope-OrgID"] == "team-a"
        assert p.headers["Authorization"] == "Basic dTE6c2VjcmV0"
        assert p.sample_types == [("samples", "count"), ("cpu", "nanoseconds")]
        names = {p.profile.string_table[fn.name] for p in got for fn in p.profile.function}
        assert {"hot_a", "hot_b"} <= names
        for i, p in enumerate(receiver.profiles):  # every profile sent, read by go tool pprof too
            path = tmp_path / f"sent-{i}.pb.gz"
            path.write_bytes(p.raw)
            assert pprof.read(path).sample_types
    finally:
        receiver.close()


def test_pyroscope_5xx_and_429_are_retried(tmp_path):
    receiver = PyroscopeReceiver()
    try:
        receiver.fail_next(2, 503)
        receiver.fail_next(1, 429, retry_after="0")
        exporters = {
            "pyroscope": {
                "endpoint": receiver.endpoint,
                "protocol": "ingest",
                "retry": {"initial_interval": "100ms", "max_interval": "200ms"},
            }
        }
        cfg = write_config(tmp_path, exporters=exporters)
        run_profiled(cfg, [sys.executable, str(HOT), "2"])
        receiver.wait_for(lambda r: r.profiles, what="a profile after the failures")
        statuses = [s for _, s in receiver.requests]
        assert statuses[:3] == [503, 503, 429] and 200 in statuses
        assert not receiver.errors
        assert all(p.api == "ingest" and p.query["spyName"] == "otelbpf" for p in receiver.profiles)
        for i, p in enumerate(receiver.profiles):
            path = tmp_path / f"sent-{i}.pb.gz"
            path.write_bytes(p.raw)
            assert pprof.read(path).samples
    finally:
        receiver.close()


def test_drain_takes_every_entry_once_and_leaves_the_map_empty():
    """The profiler reads its maps with batched lookup-and-delete, a chunk per syscall: every
    entry comes back once, with its key and value, across more chunks than one, and the map
    is empty after (stacks left in the kernel's map filled it up over long runs)."""
    from bcc import BPF

    from otelbpf.families.profiling.probes import drain

    bpf = BPF(text=b"struct v { u64 a; u32 b; u32 c; }; BPF_HASH(h, u64, struct v, 4096);")
    try:
        table = bpf[b"h"]
        for i in range(1, 3001):
            table[table.Key(i)] = table.Leaf(i * 3, i, 7)
        keys, values = drain(table, chunk=256)
        assert sorted(keys.tolist()) == list(range(1, 3001))
        assert (values["a"] == keys * 3).all() and (values["b"] == keys).all() and (values["c"] == 7).all()
        assert not list(table.keys())
        assert len(drain(table)[0]) == 0
    finally:
        bpf.cleanup()


def test_drain_keep_reads_every_entry_and_leaves_the_map_as_it_was():
    """``keep``: batched lookups without deletes (the bytes-in-use balance, read every round)."""
    from bcc import BPF

    from otelbpf.families.profiling.probes import drain

    bpf = BPF(text=b"BPF_HASH(h, u64, u64, 4096);")
    try:
        table = bpf[b"h"]
        for i in range(1, 1001):
            table[table.Key(i)] = table.Leaf(i * 5)
        keys, values = drain(table, chunk=128, keep=True)
        assert sorted(keys.tolist()) == list(range(1, 1001)) and (values == keys * 5).all()
        assert len(list(table.keys())) == 1000
    finally:
        bpf.cleanup()
