"""Protocol parsers: bytes captured from sockets -> requests and responses (pure logic, no I/O)."""
