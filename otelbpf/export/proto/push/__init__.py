"""Generated protobuf package (see otelbpf/export/proto/__init__.py)."""
