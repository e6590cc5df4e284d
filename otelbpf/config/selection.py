"""``--receivers`` / ``OTELBPF_RECEIVERS``: a comma-separated choice of receivers that
replaces the ones the config's pipelines name."""

from __future__ import annotations

from typing import Any

from otelbpf.config.errors import Findings
from otelbpf.config.receivers import ReceiverTypes


def choose_receivers(data: dict[str, Any], chosen: str, found: Findings, types: ReceiverTypes) -> None:
    """``--receivers cuda,http`` / ``OTELBPF_RECEIVERS``: the traces and metrics pipelines
    take the chosen receivers but the profile receivers (``profiling``); the profiles pipeline
    exists only when a profile receiver is chosen (exporting to the file exporter when the
    config has no profiles pipeline). A chosen receiver the config does not define runs with
    its defaults."""
    names = [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in names if n not in types.entries]
    if unknown or not names:
        found.issues.append(
            (
                None,
                f"--receivers / OTELBPF_RECEIVERS: {', '.join(map(repr, unknown)) or 'empty'}: "
                f"name some of {', '.join(types.names())}",
            )
        )
        return
    names = list(dict.fromkeys(names))
    receivers = data.setdefault("receivers", {}) or {}
    data["receivers"] = receivers
    for n in names:
        receivers.setdefault(n, {})
    pipelines = data.setdefault("service", {}).setdefault("pipelines", {})
    signal_receivers = [n for n in names if not types.feeds_profiles(n)]
    profile_receivers = [n for n in names if types.feeds_profiles(n)]
    for signal in ("traces", "metrics"):
        if signal_receivers and signal in pipelines:
            pipelines[signal]["receivers"] = signal_receivers
        elif not signal_receivers:
            pipelines.pop(signal, None)
    if profile_receivers:
        if "profiles" not in pipelines:
            data.setdefault("exporters", {}).setdefault("file", {})
            pipelines["profiles"] = {"receivers": profile_receivers, "exporters": ["file"]}
    else:
        pipelines.pop("profiles", None)
