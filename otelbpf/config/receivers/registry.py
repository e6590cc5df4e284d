"""The receivers a config may name under ``receivers:``, as the config layer knows them:
``ReceiverTypes``, handed to the loader by the layer that knows the probe families
(``otelbpf/families/registry.py``, built from each family's factory).

Why handed in rather than imported: a family's factory builds its probes and its correlator,
which sit above this package and read its models, so the config package cannot import the
families without an import circle. The OpenTelemetry Collector solves the same problem the same
way: its distribution assembles the components' factories and hands them to the config
unmarshaller, which validates each ``receivers:`` entry against the factory its type names.
Here the loader puts the types into Pydantic's validation context, where ``Config`` reads them;
no module in this package names a family. Everything that depends on which receivers exist
(the models entries validate against, which feed the profiles pipeline, the names
``--receivers`` accepts, the "allowed types" and "did you mean" of errors) is derived from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationInfo

from otelbpf.config.receivers.base import ReceiverConfig

#: Where ``ReceiverTypes`` travels in Pydantic's validation context.
CONTEXT_KEY = "receiver_types"


@dataclass(frozen=True)
class ReceiverType:
    """One probe family's entry: its options' model, and which pipeline it feeds."""

    model: type[ReceiverConfig]
    #: Feeds the profiles pipeline, and only it (else the traces and metrics pipelines).
    profiles: bool = False


@dataclass(frozen=True)
class ReceiverTypes:
    """Receiver type -> entry, in the order ``--receivers`` lists them in its help and errors."""

    entries: Mapping[str, ReceiverType]

    def models(self) -> dict[str, type[ReceiverConfig]]:
        return {name: entry.model for name, entry in self.entries.items()}

    def names(self) -> tuple[str, ...]:
        """The receivers a ``--receivers`` list may name."""
        return tuple(self.entries)

    def feeds_profiles(self, name: str) -> bool:
        return self.entries[name].profiles

    def context(self) -> dict[str, ReceiverTypes]:
        """The validation context ``Config.model_validate`` reads the types from."""
        return {CONTEXT_KEY: self}


def from_context(info: ValidationInfo) -> ReceiverTypes:
    """The types the loader handed to this validation."""
    types = (info.context or {}).get(CONTEXT_KEY)
    if not isinstance(types, ReceiverTypes):
        raise TypeError("receivers are validated against the families' registry: load with otelbpf.families.registry")
    return types
