"""What the config layer knows of receivers: their base class (``base.py``) and the types the
loader is handed (``registry.py``, which says why they are handed in). Each probe family's own
model lives in its folder, ``otelbpf/families/<name>/config.py``."""

from otelbpf.config.receivers.base import Need, ReceiverConfig
from otelbpf.config.receivers.registry import ReceiverType, ReceiverTypes

__all__ = ["Need", "ReceiverConfig", "ReceiverType", "ReceiverTypes"]
