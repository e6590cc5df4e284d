"""Protobuf modules generated from official protos: pprof's ``profile.proto`` (google/pprof)
and Pyroscope's ``push.v1`` / ``types.v1`` API (grafana/pyroscope ``api/``, Apache-2.0).

The ``.proto`` files here are the upstream files, unmodified; ``scripts/gen_protos.py``
regenerates the ``*_pb2.py`` modules from them (and says which mechanical steps it takes).
"""
