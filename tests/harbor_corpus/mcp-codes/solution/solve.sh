#!/bin/bash
# The oracle has no agent to call MCP tools for it: it speaks the server's stdio protocol itself.
set -e
cd /app
printf '%s\n' \
  '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"oracle","version":"1"}}}' \
  '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
  '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"issue_code","arguments":{"key":"harbor","path":"code.txt"}}}' \
  | python3 /opt/mcp/codes_server.py
