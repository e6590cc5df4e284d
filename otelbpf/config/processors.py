"""The processors' options: ``batch`` (groups telemetry before export) and ``resource``
(attributes added to every resource), as in the OpenTelemetry Collector."""

from __future__ import annotations

from typing import Annotated, Any, TypeAlias

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator

from otelbpf.config.fields import Section
from otelbpf.config.units import PositiveDuration


def _scalar_attribute(value: object) -> object:
    if isinstance(value, (str, bool, int, float)):
        return value
    raise ValueError(f"an attribute value must be a string, number or boolean, got {value!r}")


AttributeValue = Annotated[str | bool | int | float, BeforeValidator(_scalar_attribute)]


class BatchProcessorConfig(Section):
    """Groups telemetry before export, like the Collector's batch processor."""

    timeout: PositiveDuration = 1_000_000_000
    send_batch_size: int = Field(512, ge=1, le=1 << 16)
    max_queue_size: int = Field(8192, ge=1, le=1 << 22)

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> BatchProcessorConfig:
        if self.max_queue_size < self.send_batch_size:
            raise ValueError(
                f"max_queue_size ({self.max_queue_size}) must be at least send_batch_size ({self.send_batch_size})"
            )
        return self


class ResourceProcessorConfig(Section):
    """Attributes added to every resource; ``service.name`` overrides the per-process default."""

    attributes: dict[str, AttributeValue] = {}

    @field_validator("attributes")
    @classmethod
    def _keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "" in value:
            raise ValueError("attribute keys must not be empty")
        return value


ProcessorConfig: TypeAlias = BatchProcessorConfig | ResourceProcessorConfig
PROCESSOR_TYPES: dict[str, type[BaseModel]] = {"batch": BatchProcessorConfig, "resource": ResourceProcessorConfig}
