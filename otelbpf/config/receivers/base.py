"""What every receiver's options share: the ``ReceiverConfig`` base class, and ``Need``, the
way one receiver's settings say they rely on another receiver's probes."""

from __future__ import annotations

from dataclasses import dataclass

from otelbpf.config.fields import Section


@dataclass(frozen=True)
class Need:
    """``option`` (set as it is) relies on the probes of the receiver ``receiver``, which must
    then be in a pipeline too; ``why`` is the error shown when it is not."""

    receiver: str
    option: str
    why: str


class ReceiverConfig(Section):
    """The options of one probe family (each family's ``otelbpf/families/<name>/config.py``)."""

    def needs(self) -> list[Need]:
        """The other receivers these settings rely on (checked across the whole config)."""
        return []
