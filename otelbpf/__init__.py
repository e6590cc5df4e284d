"""otelbpf: watch AI workloads from the kernel and emit OpenTelemetry telemetry."""

__version__ = "0.1.0"
