"""The standard environment variables (``OTEL_*``, ``PYROSCOPE_*``) laid over the raw config.

Where settings come from, highest precedence first (explicit configuration wins, as in the
OpenTelemetry SDKs where constructor arguments beat environment variables):

1. The config file (after ``${env:...}`` substitution). A mapping written in the file
   (``headers``, ``processors.resource.attributes``) keeps its keys; environment variables only
   add keys it lacks.
2. Signal-specific standard variables (``OTEL_EXPORTER_OTLP_TRACES_*``,
   ``OTEL_EXPORTER_OTLP_METRICS_*``), for an ``otlp``/``otlphttp`` exporter that only the
   pipeline of that signal uses; an ``otlphttp`` exporter also takes
   ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`` as its ``traces_endpoint`` /
   ``metrics_endpoint`` (full URLs, used as they are, as the spec says).
3. The generic ``OTEL_EXPORTER_OTLP_*`` variables: ``ENDPOINT``, ``HEADERS`` (``k=v,k2=v2``,
   percent-decoded), ``TIMEOUT`` (milliseconds), ``COMPRESSION`` (gzip | none), ``INSECURE``
   (true | false; gRPC, and as the spec says only for an endpoint without ``http(s)://``, whose
   scheme decides), ``CERTIFICATE``, ``CLIENT_CERTIFICATE``, ``CLIENT_KEY``.
4. Built-in defaults.

Without a config file the built-in default (``otelbpf/config/otelbpf.yaml``) is used; being
defaults, its values rank below the variables. If ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or a
signal-specific endpoint) is set, that signal's pipeline exports over OTLP instead of to local
files: gRPC (``otlp``) unless ``OTEL_EXPORTER_OTLP[_<SIGNAL>]_PROTOCOL`` is ``http/protobuf``
(``otlphttp``); ``http/json`` is refused. One exporter serves both signals where the variables
say the same for each, else there is one per signal (``otlp/traces``, ``otlp/metrics``). A
signal without any endpoint variable keeps the file exporter. With a config file the
``PROTOCOL`` variables are ignored: the file names the exporter type, and the endpoint
variables add no exporter. ``PYROSCOPE_SERVER_ADDRESS`` likewise sends the built-in profiles
pipeline to a ``pyroscope`` exporter; it, ``PYROSCOPE_BASIC_AUTH_USER`` / ``_PASSWORD`` and
``PYROSCOPE_TENANT_ID`` fill what pyroscope exporters leave unset.

Resource: ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,...``, percent-decoded) and
``OTEL_SERVICE_NAME`` (which wins for ``service.name``) add to the ``resource`` processor's
``attributes``; keys written in the file win over both. When either is set and the file
defines no ``resource`` processor, one is created, and ``resource`` is appended to every
pipeline that lacks it, so the variables always take effect as they do in an SDK.
``OTEL_METRIC_EXPORT_INTERVAL`` (milliseconds) fills ``service.telemetry.metrics_interval``.
As the spec says, an empty variable counts as unset.

Each value taken from a variable is recorded in ``Findings.origins``, so that an error about
it names the variable.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from otelbpf.config.errors import Findings, OptionPath
from otelbpf.config.exporters import endpoint_scheme
from otelbpf.config.model import component_type
from otelbpf.config.signals import SIGNALS, Signal


def overlay(data: dict[str, Any], env: Mapping[str, str], found: Findings, *, from_file: bool) -> None:
    """Lay the variables in ``env`` over the raw config ``data``, in place. ``from_file``:
    ``data`` was written by the user (it wins, and names its own exporters), not the
    built-in default (whose pipelines the endpoint variables may re-route)."""
    variables = {k: v for k, v in env.items() if k.startswith("OTEL_") and v != ""}
    if not from_file:
        _route_signals_to_otlp(data, variables, found)
    pyroscope = {k: v for k, v in env.items() if k.startswith("PYROSCOPE_") and v != ""}
    if not from_file:
        _route_profiles_to_pyroscope(data, pyroscope)
    _fill_pyroscope(data, pyroscope, found)
    _fill_exporters(data, variables, found)
    _fill_resource(data, variables, found)
    _fill_telemetry(data, variables, found, override=not from_file)


def _parse_pairs(variable: str, text: str) -> dict[str, str]:
    """``k=v,k2=v2`` with percent-encoded keys and values (the W3C baggage-like OTel format).
    A malformed item is named by its place, never shown: in ``OTEL_EXPORTER_OTLP_HEADERS`` an
    item without ``=`` is most likely a token whose name was left out."""
    pairs: dict[str, str] = {}
    for place, item in enumerate(text.split(","), 1):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = urllib.parse.unquote(key.strip())
        if not eq or not key:
            raise ValueError(
                f"{variable}: item {place} (of the comma-separated list) is not key=value; "
                f"write {variable}=key1=value1,key2=value2"
            )
        pairs[key] = urllib.parse.unquote(value.strip())
    return pairs


def _parse_millis(variable: str, text: str) -> str:
    if not text.strip().isdigit():
        raise ValueError(f"{variable}: {text!r} is not a whole number of milliseconds (e.g. {variable}=10000)")
    return f"{int(text)}ms"


def _parse_bool(variable: str, text: str) -> bool:
    if text.strip().lower() not in ("true", "false"):
        raise ValueError(f"{variable}: {text!r} is not true or false")
    return text.strip().lower() == "true"


def _as_is(variable: str, text: str) -> str:
    return text


Key: TypeAlias = tuple[str, ...]
Settings: TypeAlias = dict[Key, tuple[str, Any]]  # option key path -> (variable, value)

# (variable suffix, option key path in the exporter, parser, exporter types it applies to)
_EXPORTER_VARIABLES: tuple[tuple[str, Key, Callable[[str, str], Any], tuple[str, ...]], ...] = (
    ("HEADERS", ("headers",), _parse_pairs, ("otlp", "otlphttp")),
    ("TIMEOUT", ("timeout",), _parse_millis, ("otlp", "otlphttp")),
    ("COMPRESSION", ("compression",), _as_is, ("otlp", "otlphttp")),
    ("INSECURE", ("tls", "insecure"), _parse_bool, ("otlp",)),
    ("CERTIFICATE", ("tls", "ca_file"), _as_is, ("otlp", "otlphttp")),
    ("CLIENT_CERTIFICATE", ("tls", "cert_file"), _as_is, ("otlp", "otlphttp")),
    ("CLIENT_KEY", ("tls", "key_file"), _as_is, ("otlp", "otlphttp")),
)


def _variable(variables: Mapping[str, str], suffix: str, signals: set[str]) -> str | None:
    """The signal-specific variable for an exporter serving one signal, else the generic one."""
    if len(signals) == 1:
        specific = f"OTEL_EXPORTER_OTLP_{next(iter(signals)).upper()}_{suffix}"
        if specific in variables:
            return specific
    generic = f"OTEL_EXPORTER_OTLP_{suffix}"
    return generic if generic in variables else None


def _exporter_settings(type_: str, signals: set[str], variables: Mapping[str, str]) -> tuple[Settings, list[str]]:
    """What the OTEL_EXPORTER_OTLP_* variables say for one exporter, and the malformed ones."""
    settings: Settings = {}
    problems: list[str] = []
    if type_ == "otlp":
        name = _variable(variables, "ENDPOINT", signals)
        if name:
            settings[("endpoint",)] = (name, variables[name])
    else:
        if "OTEL_EXPORTER_OTLP_ENDPOINT" in variables:
            settings[("endpoint",)] = ("OTEL_EXPORTER_OTLP_ENDPOINT", variables["OTEL_EXPORTER_OTLP_ENDPOINT"])
        for signal in sorted(signals):
            name = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
            if name in variables:
                settings[(f"{signal}_endpoint",)] = (name, variables[name])
    for suffix, key, parse, types in _EXPORTER_VARIABLES:
        name = _variable(variables, suffix, signals)
        if name and type_ in types:
            try:
                settings[key] = (name, parse(name, variables[name]))
            except ValueError as exc:
                problems.append(str(exc))
    return settings, problems


def _route_signals_to_otlp(data: dict[str, Any], variables: Mapping[str, str], found: Findings) -> None:
    """Without a file: each signal with an endpoint variable exports to an OTLP exporter, one
    exporter for both signals where the variables say the same for each, else one per signal."""
    routes: dict[Signal, str] = {}
    for signal in SIGNALS:
        upper = signal.upper()
        if f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT" not in variables and "OTEL_EXPORTER_OTLP_ENDPOINT" not in variables:
            continue
        names = (f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        name = next((n for n in names if n in variables), None)
        protocol = variables[name] if name else "grpc"
        if protocol not in ("grpc", "http/protobuf"):
            why = "OTLP/JSON over HTTP is not supported" if protocol == "http/json" else "unknown protocol"
            found.issues.append((None, f"{name}={protocol}: {why}; use grpc or http/protobuf"))
            continue
        routes[signal] = "otlp" if protocol == "grpc" else "otlphttp"
    if not routes:
        return
    shared = (
        len(routes) == 2
        and routes["traces"] == routes["metrics"]
        and all(
            _shared_settings(routes[s], {s}, variables) == _shared_settings(routes[s], set(SIGNALS), variables)
            for s in SIGNALS
        )
    )
    pipelines = data["service"]["pipelines"]
    for signal, type_ in routes.items():
        name = type_ if shared or list(routes.values()).count(type_) == 1 else f"{type_}/{signal}"
        data["exporters"][name] = {}
        pipelines[signal]["exporters"] = [name]
    used = {n for p in pipelines.values() for n in p["exporters"]}
    data["exporters"] = {n: e for n, e in data["exporters"].items() if n in used}


def _route_profiles_to_pyroscope(data: dict[str, Any], variables: Mapping[str, str]) -> None:
    """Without a file: PYROSCOPE_SERVER_ADDRESS (what Pyroscope's own SDKs read) sends the
    profiles pipeline to a pyroscope exporter instead of files."""
    profiles = _pipelines(data).get("profiles")
    if "PYROSCOPE_SERVER_ADDRESS" not in variables or not isinstance(profiles, dict):
        return
    data["exporters"]["pyroscope"] = {}
    profiles["exporters"] = ["pyroscope"]


_PYROSCOPE_VARIABLES: tuple[tuple[str, Key], ...] = (
    ("PYROSCOPE_SERVER_ADDRESS", ("endpoint",)),
    ("PYROSCOPE_TENANT_ID", ("tenant_id",)),
)


def _fill_pyroscope(data: dict[str, Any], variables: Mapping[str, str], found: Findings) -> None:
    """PYROSCOPE_SERVER_ADDRESS, PYROSCOPE_BASIC_AUTH_USER / _PASSWORD and PYROSCOPE_TENANT_ID
    fill what pyroscope exporters leave unset."""
    exporters = data.get("exporters")
    if not isinstance(exporters, dict):
        return
    for name, body in list(exporters.items()):
        if not isinstance(name, str) or component_type(name) != "pyroscope":
            continue
        if body is None:
            body = exporters[name] = {}
        if not isinstance(body, dict):
            continue
        for variable, key in _PYROSCOPE_VARIABLES:
            if variable in variables:
                _fill(body, key, variables[variable], ("exporters", name, *key), variable, found)
        user = variables.get("PYROSCOPE_BASIC_AUTH_USER")
        if user and body.get("basic_auth") is None and body.get("bearer_token") is None:
            password = variables.get("PYROSCOPE_BASIC_AUTH_PASSWORD", "")
            _fill(
                body,
                ("basic_auth",),
                {"username": user, "password": password},
                ("exporters", name, "basic_auth"),
                "PYROSCOPE_BASIC_AUTH_USER",
                found,
            )


def _shared_settings(type_: str, signals: set[str], variables: Mapping[str, str]) -> dict[Key, Any]:
    """An exporter's settings less its per-signal URLs (one otlphttp exporter holds both)."""
    settings = _exporter_settings(type_, signals, variables)[0]
    return {k: v for k, (_, v) in settings.items() if k not in (("traces_endpoint",), ("metrics_endpoint",))}


def _pipelines(data: Mapping[str, Any]) -> dict[Any, Any]:
    """The raw ``service.pipelines`` mapping, or {} where the file has none or a malformed one."""
    service = data.get("service")
    pipelines = service.get("pipelines") if isinstance(service, dict) else None
    return pipelines if isinstance(pipelines, dict) else {}


def _fill_exporters(data: dict[str, Any], variables: Mapping[str, str], found: Findings) -> None:
    """Give otlp/otlphttp exporters what OTEL_EXPORTER_OTLP_* say, where the file is silent."""
    exporters = data.get("exporters")
    if not isinstance(exporters, dict):
        return
    served: dict[str, set[str]] = {}
    for signal, pipeline in _pipelines(data).items():
        names = pipeline.get("exporters") if isinstance(pipeline, dict) else None
        for name in names if isinstance(names, list) else ():
            if isinstance(name, str):
                served.setdefault(name, set()).add(str(signal))
    for name, body in list(exporters.items()):
        type_ = component_type(name) if isinstance(name, str) else None
        if type_ not in ("otlp", "otlphttp"):
            continue
        if body is None:
            body = exporters[name] = {}
        if not isinstance(body, dict):
            continue
        settings, problems = _exporter_settings(type_, served.get(name, set()), variables)
        found.issues.extend((None, p) for p in problems)
        for key, (variable, value) in settings.items():
            endpoint = body.get("endpoint")
            if key == ("tls", "insecure") and isinstance(endpoint, str) and endpoint_scheme(endpoint):
                continue  # the spec: INSECURE applies only to an endpoint without http(s)://
            _fill(body, key, value, ("exporters", name, *key), variable, found)


def _fill(body: dict[str, Any], key: Key, value: Any, path: OptionPath, variable: str, found: Findings) -> None:
    """Set ``body[key...] = value`` unless the file set it; a mapping gains only missing keys."""
    *parents, last = key
    for part in parents:
        if body.get(part) is None:
            body[part] = {}
        body = body[part]
        if not isinstance(body, dict):
            return
    current = body.get(last)
    if isinstance(value, dict):
        if current is None:
            current = body[last] = {}
        for k, v in value.items() if isinstance(current, dict) else ():
            if k not in current:
                current[k] = v
                found.origins[(*path, k)] = variable
    elif current is None:
        body[last] = value
        found.origins[path] = variable


def _fill_resource(data: dict[str, Any], variables: Mapping[str, str], found: Findings) -> None:
    """OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME into the ``resource`` processor, which
    every pipeline then runs."""
    attributes: dict[str, tuple[str, str]] = {}
    if "OTEL_RESOURCE_ATTRIBUTES" in variables:
        try:
            pairs = _parse_pairs("OTEL_RESOURCE_ATTRIBUTES", variables["OTEL_RESOURCE_ATTRIBUTES"])
        except ValueError as exc:
            found.issues.append((None, str(exc)))
            return
        attributes = {k: ("OTEL_RESOURCE_ATTRIBUTES", v) for k, v in pairs.items()}
    if "OTEL_SERVICE_NAME" in variables:
        attributes["service.name"] = ("OTEL_SERVICE_NAME", variables["OTEL_SERVICE_NAME"])
    if not attributes:
        return
    if data.get("processors") is None:
        data["processors"] = {}
    if not isinstance(data["processors"], dict):
        return
    path = ("processors", "resource", "attributes")
    for key, (variable, value) in attributes.items():
        _fill(data["processors"], path[1:], {key: value}, path, variable, found)
    for pipeline in _pipelines(data).values():
        if isinstance(pipeline, dict):
            names = pipeline.setdefault("processors", [])
            if isinstance(names, list) and "resource" not in names:
                names.append("resource")


def _fill_telemetry(data: dict[str, Any], variables: Mapping[str, str], found: Findings, *, override: bool) -> None:
    """OTEL_METRIC_EXPORT_INTERVAL (ms) into service.telemetry.metrics_interval: where the file
    leaves it unset, or always over the built-in default (``override``)."""
    variable = "OTEL_METRIC_EXPORT_INTERVAL"
    service = data.get("service")
    if variable not in variables or not isinstance(service, dict):
        return
    try:
        value = _parse_millis(variable, variables[variable])
    except ValueError as exc:
        found.issues.append((None, str(exc)))
        return
    if override and isinstance(service.get("telemetry"), dict):
        service["telemetry"].pop("metrics_interval", None)
    path = ("service", "telemetry", "metrics_interval")
    _fill(service, path[1:], value, path, variable, found)
