"""The receivers' options: one module per probe family (``cuda.py``, ``http.py``, ...), their
base class (``base.py``) and the registry that names them (``registry.py``, which says how to
add a family). Import a family's model from its module."""

from otelbpf.config.receivers.base import Need, ReceiverConfig
from otelbpf.config.receivers.registry import (
    CHOOSABLE_RECEIVERS,
    PROFILE_RECEIVERS,
    RECEIVER_TYPES,
    REGISTRY,
    ReceiverType,
)

__all__ = [
    "CHOOSABLE_RECEIVERS",
    "PROFILE_RECEIVERS",
    "RECEIVER_TYPES",
    "REGISTRY",
    "Need",
    "ReceiverConfig",
    "ReceiverType",
]
