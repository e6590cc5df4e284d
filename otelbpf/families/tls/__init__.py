"""The ``tls`` probe family.

OpenSSL's plaintext (uprobes on ``SSL_read``, ``SSL_write``, ``SSL_read_ex``, ``SSL_write_ex``
in any ``libssl.so*``, 1.1 or 3, system or bundled by a wheel; bpf/tls.c), handed to the http
receiver, which parses it as it parses socket payloads: HTTPS, HTTP/2 over TLS and gRPC with
TLS become the same spans and metrics as their plain forms.
"""
