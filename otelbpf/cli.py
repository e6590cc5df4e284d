"""Command line: parse, load config, hand over. Exit codes: 0 ok, 1 cannot
run (privileges, BPF), 2 bad usage or configuration."""

from __future__ import annotations

import argparse
import os
import sys

from otelbpf.base.terminal import cleaned, log_to_stderr


def _duration(text: str) -> int:
    from otelbpf.config import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share from 0 to 1 (like 0.3)")
    return value


#: What every reader of a run's output takes as its ``directory`` argument.
_DIRECTORY_HELP = "the file exporter's output folder, as `otelbpf run` wrote it (default ./otelbpf-out)"


def _parser() -> argparse.ArgumentParser:
    from otelbpf import __version__

    p = argparse.ArgumentParser(prog="otelbpf", description="eBPF telemetry for AI workloads, as OpenTelemetry.")
    p.add_argument("--version", action="version", version=f"otelbpf {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser(
        "run",
        help="watch processes and export telemetry",
        usage="otelbpf run [-c CONFIG] [--pid PID ...] [--duration SECONDS] [-- COMMAND [ARGS...]]",
        description="Watch the whole host (default), some pids, or a command started by the agent.",
    )
    run.add_argument("-c", "--config", help="YAML config (default: the embedded default, or OTEL_EXPORTER_OTLP_* env)")
    run.add_argument(
        "--pid", type=int, action="append", default=[], help="watch this process and its children (repeatable)"
    )
    run.add_argument("--duration", type=float, help="stop after this many seconds")
    run.add_argument(
        "--receivers",
        metavar="LIST",
        help="comma-separated receivers for the pipelines, e.g. cuda,http,nccl (default: the config's; "
        "also OTELBPF_RECEIVERS)",
    )
    run.add_argument(
        "--print-config", action="store_true", help="print the effective configuration (secrets redacted) and exit"
    )
    run.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS: start it and watch it; stop when it exits"
    )
    doctor = sub.add_parser("doctor", help="what this host can do, and which processes use CUDA/NCCL/ibverbs")
    doctor.add_argument(
        "--live",
        action="store_true",
        help="instead: exit 0 when a running agent answers on its state socket, 1 otherwise "
        "(a container's readiness and liveness probe)",
    )
    doctor.add_argument(
        "--max-age",
        type=float,
        metavar="SECONDS",
        help="with --live: also fail when the agent's last metrics collection is older than this",
    )
    summ = sub.add_parser("summary", help="summarize the OTLP-JSON files the file exporter wrote")
    summ.add_argument("directory", nargs="?", default="./otelbpf-out", help=_DIRECTORY_HELP)
    diag = sub.add_parser(
        "diagnose",
        help="why the GPU sits idle: causes seen in the CUDA calls the file exporter wrote, costliest first",
        description="Why the GPU sits idle: causes seen in what the file exporter wrote, costliest first, "
        "each with its evidence and a fix.",
        epilog="Exit status: 0 no finding, 1 findings printed (a script can test for them), "
        "2 the folder is missing or unreadable.",
    )
    diag.add_argument("directory", nargs="?", default="./otelbpf-out", help=_DIRECTORY_HELP)
    diag.add_argument("--json", action="store_true", help="print the findings as JSON")
    rep = sub.add_parser(
        "report",
        help="one self-contained HTML page: findings, per-process summary, CUDA API "
        "time per call, timelines, flame graphs (CPU, off-CPU, CUDA memory, AI); otelbpf run "
        "writes it into the file exporter's folder as it ends",
    )
    rep.add_argument("directory", nargs="?", default="./otelbpf-out", help=_DIRECTORY_HELP)
    rep.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default report.html)")
    strag = sub.add_parser(
        "stragglers",
        help="name the NCCL ranks that hold the others back, and why, from every rank's exported spans",
        description="Reads the NCCL spans of all ranks (the file exporter's directories, or OTLP-JSON files), "
        "removes clock offsets between hosts, and ranks the ranks that enter collectives last: compute-slow, "
        "host-slow or communication-slow.",
    )
    strag.add_argument("paths", nargs="+", metavar="DIR", help="a directory of OTLP-JSON trace files, or one file")
    strag.add_argument(
        "--threshold",
        type=_duration,
        default="1ms",
        help="the adaptive test's floor: late also means beyond 3x the other ranks' spread and "
        "a tenth of the collective's duration (default 1ms)",
    )
    strag.add_argument(
        "--min-share",
        type=_share,
        default=0.3,
        help="persistent: late in at least this share of its collectives (0..1, default 0.3)",
    )
    strag.add_argument("--json", action="store_true", help="print the report as JSON")
    strag.add_argument(
        "--no-clock-correction",
        action="store_true",
        help="compare timestamps as exported (hosts' clocks assumed in sync)",
    )
    strag.add_argument(
        "--diff-profiles",
        metavar="OUT_DIR",
        help="write each straggler's CPU profile and the healthy ranks' mean as pprof pairs "
        "for `go tool pprof -diff_base` (needs the profiling receiver's CPU profiles in DIR)",
    )
    mcp = sub.add_parser(
        "mcp",
        help="serve the diagnosis of an output folder as read-only MCP tools (stdio, or HTTP with a token)",
        description="An MCP server over what `otelbpf run` wrote (spans, metrics, profiles). HTTP needs a bearer "
        "token (OTELBPF_MCP_TOKEN or --token-file) and binds to 127.0.0.1 unless --host says otherwise.",
    )
    mcp.add_argument("directory", nargs="?", default="./otelbpf-out", help=_DIRECTORY_HELP)
    mcp.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP: the address to bind (default 127.0.0.1)")
    mcp.add_argument("--port", type=int, default=8765, help="HTTP: the port (default 8765)")
    mcp.add_argument("--token-file", help="HTTP: a file (mode 0600) holding the bearer token")
    mcp.add_argument("--max-bytes", type=int, default=1 << 30, help="refuse folders with more telemetry than this")
    mcp.add_argument(
        "--live",
        action="store_true",
        help="answer from a running agent's live state instead of a folder (see `otelbpf top`)",
    )
    mcp.add_argument("--socket", help="with --live: the agent's state socket (default: the newest in the run dir)")
    top = sub.add_parser(
        "top",
        help="a live terminal view of what an agent sees (keys: s sort, p pid filter, f freeze, q quit)",
        description="Reads a running agent's live state over its local socket (the newest one in the run "
        "directory, or --socket), or, with --pid, starts an agent in this process.",
    )
    top.add_argument("--socket", help="the agent's state socket (default: the newest in the run directory)")
    top.add_argument(
        "--agent",
        type=int,
        metavar="PID",
        help="the running agent to read, by pid (with several running, top lists them and asks)",
    )
    top.add_argument(
        "--pid",
        type=int,
        action="append",
        default=[],
        help="watch this process with an agent of its own, in this process (repeatable; needs root)",
    )
    top.add_argument("-c", "--config", help="with --pid: the agent's config (default: the embedded one)")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    val = sub.add_parser("validate", help="check a config file and print the effective pipelines")
    val.add_argument("-c", "--config", required=False)
    return p


def _unrunnable(command: list[str]) -> tuple[int, str] | None:
    """Why ``run -- COMMAND`` could not start its command, with the shell's status for it
    (127 not found, 126 not executable), or None. Checked before the agent compiles its
    programs, which takes seconds, only for the command to fail at its exec."""
    import shutil

    name = command[0]
    if "/" in name:
        if not os.path.exists(name):
            return 127, f"{name}: no such file"
        if os.path.isdir(name):
            return 126, f"{name}: is a directory"
        if not os.access(name, os.X_OK):
            return 126, f"{name}: not executable (chmod +x {name}, or name its interpreter: -- python3 {name})"
        return None
    if shutil.which(name) is None:
        return 127, f"{name}: command not found on PATH ({os.environ.get('PATH', '')})"
    return None


def _import_numpy_single_threaded() -> None:
    """Import numpy with its OpenBLAS asked for one thread, then take the request back out.

    OpenBLAS starts a thread per core when numpy is imported (up to 63 on a large GPU node),
    and the agent never multiplies a matrix. It reads ``OPENBLAS_NUM_THREADS`` only while it
    loads, so the variable is removed at once: a command the agent starts, or a subprocess
    of its own, inherits the caller's environment unchanged. A value the caller set is kept."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401  (for its side effect: OpenBLAS loads now, with one thread)
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # What the commands print holds names, paths and command lines from the traced processes:
    # their control characters are written as visible escapes, never sent to the terminal.
    out, err = cleaned(sys.stdout), cleaned(sys.stderr)
    if args.cmd in ("summary", "diagnose", "report"):  # a folder holds one run, and earlier ones: say which
        from otelbpf.export.runs import which_run

        if (which := which_run(args.directory)) is not None:
            print(f"otelbpf {args.cmd}: reading {which}", file=err)
    if args.cmd == "doctor" and args.live:
        from otelbpf.live.agents import check_live

        return check_live(out, args.max_age)
    if args.cmd == "doctor":
        from otelbpf.doctor import run_doctor

        return run_doctor(out)
    if args.cmd == "stragglers":
        from otelbpf.analyze.stragglers import run as stragglers

        return stragglers(
            args.paths,
            threshold_ns=args.threshold,
            min_share=args.min_share,
            as_json=args.json,
            correct_clocks=not args.no_clock_correction,
            out=out,
            err=err,
            diff_dir=args.diff_profiles,
        )
    if args.cmd == "diagnose":
        from otelbpf.analyze.diagnose import run as diagnose

        return diagnose(args.directory, out, err, as_json=args.json)
    if args.cmd == "report":
        from otelbpf.analyze.report import run as report

        return report(args.directory, args.output, out, err)
    if args.cmd == "mcp":
        try:
            from otelbpf.mcp.server import TokenError, serve
        except ModuleNotFoundError as exc:
            # otelbpf is not on PyPI, so `pip install 'otelbpf[mcp]'` finds nothing: name the extra's
            # one package, for the interpreter that runs this (a venv's, or pipx's)
            print(
                f"otelbpf mcp: {exc.name} is not installed: {sys.executable} -m pip install 'mcp>=2.3,<3' "
                "(the `mcp` extra; in a clone: pip install -e '.[mcp]')",
                file=sys.stderr,
            )
            return 1
        log_to_stderr("WARNING", "%(levelname)s %(name)s: %(message)s")  # before the SDK's own, which then keeps it
        try:
            serve(
                None if args.live else args.directory,
                transport=args.transport,
                host=args.host,
                port=args.port,
                token_file=args.token_file,
                max_bytes=args.max_bytes,
                live_socket=args.socket,
            )
        except TokenError as exc:
            print(f"otelbpf mcp: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "top" and not args.pid:
        from otelbpf import top
        from otelbpf.live.agents import choose

        if (chosen := choose(args.socket, args.agent, sys.stdin, err)) is None:
            return 2
        return top.run(top.Viewer(top.socket_source(chosen)), args.interval)
    if args.cmd == "top":  # standalone: metrics as often as the view refreshes, unless configured
        os.environ.setdefault("OTEL_METRIC_EXPORT_INTERVAL", str(max(100, int(args.interval * 1000))))
    if args.cmd == "summary":
        from otelbpf.analyze.summary import summarize

        return summarize(args.directory, out)

    from otelbpf.config import ConfigError, printable
    from otelbpf.families.registry import load_config

    try:
        config = load_config(args.config, receivers=getattr(args, "receivers", None))
    except ConfigError as exc:
        print(f"otelbpf: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "print_config", False):
        print(printable(config), end="")
        return 0
    if args.cmd == "validate":
        for name in config.pipeline_signals():
            pipe = config.pipeline(name)
            assert pipe is not None  # pipeline_signals lists the signals that have one
            print(f"{name}: receivers={pipe.receivers} processors={pipe.processors} exporters={pipe.exporters}")
        return 0

    if args.cmd == "top":
        from otelbpf import top
        from otelbpf.base.privileges import drop_unneeded
        from otelbpf.sensor import uprobe_links
        from otelbpf.sensor.sensor import SensorError

        drop_unneeded(command=False, receivers=config.enabled_receivers(), uprobe_links=uprobe_links.supported())
        try:
            return top.standalone(config, args.pid, args.interval)
        except SensorError as exc:
            print(f"otelbpf top: {exc}", file=err)  # it can name a path or a process
            return 1
    log_to_stderr(config.service.telemetry.log_level.upper(), "%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command and args.pid:
        print("otelbpf: give either --pid or -- COMMAND, not both", file=sys.stderr)
        return 2
    if command and (unrunnable := _unrunnable(command)) is not None:
        print(f"otelbpf: {unrunnable[1]}", file=sys.stderr)
        return unrunnable[0]
    # The command's guard starts with the privileges the agent has, then the agent drops
    # what it never needs, while it is one thread: before the agent's imports start any.
    from otelbpf.base.privileges import drop_unneeded
    from otelbpf.jobguard import Job
    from otelbpf.sensor import uprobe_links

    job = Job(command) if command else None
    # CAP_KILL is kept where the agent resumes what its pause stopped: a command, or in host
    # mode any process that opened a library not attached yet (service.host_pause)
    resumes = job is not None or (not (args.pid or config.targets.pids) and config.service.host_pause.on())
    drop_unneeded(command=resumes, receivers=config.enabled_receivers(), uprobe_links=uprobe_links.supported())
    _import_numpy_single_threaded()
    from otelbpf.agent import run
    from otelbpf.base.safe_files import UnsafeOutput
    from otelbpf.sensor.sensor import SensorError

    try:
        rc = run(config, pids=args.pid, job=job, duration_s=args.duration)
    except (SensorError, UnsafeOutput) as exc:
        if job is not None:
            job.close()
        print(f"otelbpf: {exc}", file=err)  # it can name a path in a folder another user writes
        return 2 if isinstance(exc, UnsafeOutput) else 1  # an output path refused: the configuration's to fix
    import signal

    from otelbpf.analyze.report import after_run

    for sig in (signal.SIGINT, signal.SIGTERM):  # the run is over: a signal now ends the report, not ignored
        signal.signal(sig, signal.SIG_DFL)
    after_run(config, err)  # report.html beside the file exporter's output (its `report` option)
    return rc


def entry() -> None:
    """Console-script entry: quiet on a closed pipe (`otelbpf doctor | head`)."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    entry()
