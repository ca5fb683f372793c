"""The client side: OpenCodeEnv (an OpenEnv MCP client), its WebSocket session and sync view; it runs
nothing and imports only the wire types."""
