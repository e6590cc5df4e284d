"""The ``profiling`` receiver's factory.

CPU samples and CUDA memory by stack (perf events and uprobes, bpf/profile.c): pprof profiles.
The probes and the correlator are imported when a config enables the family, not before:
validating a config (``otelbpf validate``) loads every factory and should not pay for BCC."""

from __future__ import annotations

from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.profiling.config import ProfilingReceiverConfig


def build(name: str, cfg: ProfilingReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.config import to_seconds
    from otelbpf.families.profiling.probes import profile_family
    from otelbpf.families.profiling.profiler import CacheSizes, Profiler

    profiler = Profiler(
        ctx.process_info,
        ctx.health,
        ctx.export_profiles,
        sample_hz=cfg.sample_rate,
        interval_s=to_seconds(cfg.interval),
        cuda_memory=cfg.cuda_memory,
        python=cfg.python,
        labels=ctx.profile_attributes,
        caches=CacheSizes(
            stacks=cfg.cached_stacks,
            python_stacks=cfg.cached_python_stacks,
            resolved_stacks=cfg.cached_resolved_stacks,
            frames=cfg.cached_frames,
            code_objects=cfg.cached_code_objects,
        ),
    )
    profiler.run_locked = lambda fn: ctx.maps.with_bpf(fn)
    family = profile_family(
        python=cfg.python,
        cuda_memory=cfg.cuda_memory,
        max_python_frames=cfg.max_python_frames,
        stack_entries=cfg.stack_map_entries,
        sample_entries=cfg.sample_map_entries,
        code_entries=cfg.code_map_entries,
        live_entries=cfg.live_allocations,
        launch_stack_every=cfg.launch_stack_every,
        on_load=profiler.on_load,
        on_unload=profiler.on_unload,
    )
    return Receiver(name, family, profiler, [], 1 << 20)


FACTORY = Factory("profiling", ProfilingReceiverConfig, ("profiles",), build)
