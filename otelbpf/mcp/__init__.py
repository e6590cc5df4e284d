"""``otelbpf mcp``: an MCP server whose read-only tools answer from what the agent wrote."""
