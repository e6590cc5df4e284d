"""The probe families, one folder each (``cuda``, ``http``, ``nccl``, ``ibverbs``, ``profiling``,
``sched``, ``torch``, ``gpu``) beside its ``bpf/<name>.c``: its options (``config.py``), its
sensor side (``probes.py``: the program, probes and map I/O), its correlator(s) and its
``factory.py``. ``factory.py`` here says what a factory is; ``registry.py`` lists them once.
Families import the shared layers (``correlate``, ``sensor``, ``config``, ``base``), never each
other; the agent knows them only through the registry (pyproject's import-linter contracts)."""
