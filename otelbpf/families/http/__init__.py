"""The ``http`` probe family.

HTTP/1.x, HTTP/2 and gRPC from socket syscalls (tracepoints, bpf/sockets.c): server and client
spans, RED metrics.
"""
