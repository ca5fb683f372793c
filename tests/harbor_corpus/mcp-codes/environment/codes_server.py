"""A stdio MCP server (newline-delimited JSON-RPC, the standard library only) with one tool, issue_code."""

import hashlib
import json
import os
import sys

TOOL = {
    "name": "issue_code",
    "description": "Issue the code for a key and write it to a file (a path relative to the work dir).",
    "inputSchema": {
        "type": "object",
        "properties": {"key": {"type": "string"}, "path": {"type": "string"}},
        "required": ["key", "path"],
    },
}


def issue(key, path):
    code = "HBR-" + hashlib.sha256(("codes:" + key).encode()).hexdigest()[:10].upper()
    with open(path, "w") as out:
        out.write(code + "\n")
    return f"issued {code} to {os.path.abspath(path)}"


def answer(message):
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "codes", "version": "1.0"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call" and params.get("name") == "issue_code":
        arguments = params.get("arguments") or {}
        try:
            text, failed = issue(str(arguments["key"]), str(arguments["path"])), False
        except (KeyError, OSError) as error:
            text, failed = f"could not issue: {error}", True
        return {"content": [{"type": "text", "text": text}], "isError": failed}
    if method == "ping":
        return {}
    raise LookupError(method)


for line in sys.stdin:
    if not line.strip():
        continue
    message = json.loads(line)
    if "id" not in message:
        continue
    try:
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
    except LookupError as error:
        reply = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": f"no method {error}"}}
    print(json.dumps(reply), flush=True)
