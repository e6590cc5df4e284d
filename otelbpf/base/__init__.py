"""The neutral base every layer stands on: event kinds and layouts shared with the C
probes, self-telemetry counters, /proc reading, thread names. Imports nothing above it."""
