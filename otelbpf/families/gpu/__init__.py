"""The ``gpu`` probe family.

The GPU's own account through NVML, no probes and no C file: hw.gpu.* metrics.
"""
