#!/bin/bash
# The oracle has no agent to call MCP tools for it: it posts the tool call to the server itself.
set -e
curl -sf -X POST http://mcp-server:8000/mcp -H 'content-type: application/json' \
  -H 'accept: application/json, text/event-stream' \
  -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sign_guestbook","arguments":{"name":"harbor"}}}'
