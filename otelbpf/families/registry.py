"""The one registry of probe families: every family's factory, listed once.

Everything that depends on which families exist is derived from ``FACTORIES``: the receiver
types the config layer validates against (``RECEIVER_TYPES``, handed to the loader because the
config package sits below the families and cannot import them; see
``otelbpf/config/receivers/registry.py``), the names ``--receivers`` accepts, and the builder the
agent calls for each receiver a pipeline names. ``load_config`` and ``load_config_text`` are the
config loader bound to these types: what the rest of the program calls.

Adding a family ``foo``: its folder ``otelbpf/families/foo/`` (``config.py``, ``probes.py``,
a correlator, ``factory.py`` with ``FACTORY``), ``bpf/foo.c``, and one line below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from otelbpf.config import Config, ReceiverConfig, ReceiverTypes
from otelbpf.config import loader as _loader
from otelbpf.families.cuda.factory import FACTORY as CUDA
from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.gpu.factory import FACTORY as GPU
from otelbpf.families.http.factory import FACTORY as HTTP
from otelbpf.families.ibverbs.factory import FACTORY as IBVERBS
from otelbpf.families.nccl.factory import FACTORY as NCCL
from otelbpf.families.profiling.factory import FACTORY as PROFILING
from otelbpf.families.sched.factory import FACTORY as SCHED
from otelbpf.families.tls.factory import FACTORY as TLS
from otelbpf.families.torch.factory import FACTORY as TORCH

#: In the order ``--receivers`` lists them in its help and errors. Each factory takes the config
#: class it names (a dependency Python's types cannot spell across the tuple: Any).
FACTORIES: tuple[Factory[Any], ...] = (CUDA, HTTP, NCCL, IBVERBS, PROFILING, SCHED, TORCH, GPU, TLS)

_BY_NAME: dict[str, Factory[Any]] = {f.name: f for f in FACTORIES}
_BY_MODEL: dict[type[ReceiverConfig], Factory[Any]] = {f.config: f for f in FACTORIES}

#: What the config layer validates ``receivers:`` against.
RECEIVER_TYPES = ReceiverTypes({f.name: f.receiver_type() for f in FACTORIES})


def factory(name: str) -> Factory[Any]:
    """The factory of receiver type ``name``."""
    return _BY_NAME[name]


def build(name: str, cfg: ReceiverConfig, ctx: Context) -> Receiver:
    """The receiver for config entry ``name``, built by the factory of its model."""
    return _BY_MODEL[type(cfg)].build(name, cfg, ctx)


def load_config(
    path: str | os.PathLike[str] | None, env: Mapping[str, str] = os.environ, receivers: str | None = None
) -> Config:
    """``otelbpf.config.loader.load_config`` with the families' receiver types."""
    return _loader.load_config(path, RECEIVER_TYPES, env, receivers)


def load_config_text(text: str, *, source: str = "<string>", env: Mapping[str, str] = os.environ) -> Config:
    """``otelbpf.config.loader.load_config_text`` with the families' receiver types."""
    return _loader.load_config_text(text, RECEIVER_TYPES, source=source, env=env)
