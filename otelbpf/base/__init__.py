"""The neutral base every layer stands on: event kinds and layouts shared with the C
probes, self-telemetry counters, /proc reading, thread names, what counts as a secret in text
the agent shows (``secrets``). Imports nothing above it."""
