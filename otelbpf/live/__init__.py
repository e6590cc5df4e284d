"""The agent's live state for `otelbpf top`: what it holds (state.py), the local socket that
serves it (endpoint.py), and the tables a viewer makes of it (model.py)."""
