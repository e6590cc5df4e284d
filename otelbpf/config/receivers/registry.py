"""The receivers a config may name under ``receivers:``, one entry per probe family.

Everything in ``otelbpf.config`` that depends on which receivers exist is derived from
``REGISTRY``: the models ``Config.receivers`` validates against (``RECEIVER_TYPES``), the
receivers that feed the profiles pipeline (``PROFILE_RECEIVERS``), the names ``--receivers`` /
``OTELBPF_RECEIVERS`` accept (``CHOOSABLE_RECEIVERS``), and the "allowed types" and "did you
mean" of error messages.

Adding a probe family's options (family ``foo``):

1. ``otelbpf/config/receivers/foo.py``: ``class FooReceiverConfig(ReceiverConfig)`` with one
   field per option and its default (types from ``units.py`` and ``fields.py``). Settings that
   rely on another receiver's probes say so in ``needs()`` (see ``profiling.py``).
2. One entry below: ``"foo": ReceiverType(FooReceiverConfig)`` (``profiles=True`` if it feeds
   the profiles pipeline, and only it).
3. Document each option with its default under ``receivers.foo`` in ``otelbpf/config/otelbpf.yaml``
   (and name ``foo`` in the pipelines it belongs to by default): ``tests/config/test_default_file.py``
   fails until the file and the model agree.

Nothing else in the config package changes; the agent side is ``otelbpf/receivers.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.receivers.cuda import CudaReceiverConfig
from otelbpf.config.receivers.gpu import GpuReceiverConfig
from otelbpf.config.receivers.http import HttpReceiverConfig
from otelbpf.config.receivers.ibverbs import IbverbsReceiverConfig
from otelbpf.config.receivers.nccl import NcclReceiverConfig
from otelbpf.config.receivers.profiling import ProfilingReceiverConfig
from otelbpf.config.receivers.sched import SchedReceiverConfig
from otelbpf.config.receivers.torch import TorchReceiverConfig


@dataclass(frozen=True)
class ReceiverType:
    """One probe family's entry: its options' model, and which pipeline it feeds."""

    model: type[ReceiverConfig]
    #: Feeds the profiles pipeline, and only it (else the traces and metrics pipelines).
    profiles: bool = False


#: Receiver type -> entry, in the order ``--receivers`` lists them in its help and errors.
REGISTRY: dict[str, ReceiverType] = {
    "cuda": ReceiverType(CudaReceiverConfig),
    "http": ReceiverType(HttpReceiverConfig),
    "nccl": ReceiverType(NcclReceiverConfig),
    "ibverbs": ReceiverType(IbverbsReceiverConfig),
    "profiling": ReceiverType(ProfilingReceiverConfig, profiles=True),
    "sched": ReceiverType(SchedReceiverConfig),
    "torch": ReceiverType(TorchReceiverConfig),
    "gpu": ReceiverType(GpuReceiverConfig),
}

RECEIVER_TYPES: dict[str, type[ReceiverConfig]] = {name: entry.model for name, entry in REGISTRY.items()}
#: Receivers that feed the profiles pipeline (and only it).
PROFILE_RECEIVERS: tuple[type[ReceiverConfig], ...] = tuple(e.model for e in REGISTRY.values() if e.profiles)
#: Receivers a ``--receivers`` list may name.
CHOOSABLE_RECEIVERS: tuple[str, ...] = tuple(REGISTRY)
