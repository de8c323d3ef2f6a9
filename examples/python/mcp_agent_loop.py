#!/usr/bin/env python3
"""Example agent loop over MCP, with nothing but Python's standard library.

watcher serves each sandbox's tools over the Model Context Protocol
(docs/concepts/mcp.md). An agent built on an MCP SDK (`pip install mcp`) spawns
`watcher mcp serve` and speaks to it; this example does the same by hand
(JSON-RPC 2.0, one message per line on stdio), so it runs where the SDK
is not installed. A real agent asks its model for the next call; this one
replays a fixed plan and prints one line per result, refusals included:
a refusal is a tool result with isError whose text tells the model what
was refused, by which rule, and which policy line would allow it.

    python3 mcp_agent_loop.py WATCHER_BIN SOCKET_DIR SANDBOX
"""

import json
import subprocess
import sys

PROTOCOL = "2025-11-25"

PLAN = [
    ("read_file", {"path": "README"}),
    ("read_file", {"path": "/etc/shadow"}),
    ("list_dir", {"path": "."}),
    ("shell", {"command": "cat /etc/shadow"}),
]


class MCPError(Exception):
    """A JSON-RPC error answer (a protocol error, not a refused tool call)."""


class Client:
    """A minimal MCP client over a server's stdio."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8")
        self.next_id = 0

    def send(self, msg):
        self.proc.stdin.write(json.dumps(msg, separators=(",", ":")) + "\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise MCPError(f"{method}: the server closed its output (exit {self.proc.wait()})")
            msg = json.loads(line)
            if msg.get("id") != self.next_id or "method" in msg:
                continue  # a notification or a server request: not ours to answer here
            if "error" in msg:
                raise MCPError(f"{method}: {msg['error'].get('message')} ({msg['error'].get('code')})")
            return msg["result"]

    def initialize(self):
        res = self.request("initialize", {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "watcher-python-example", "version": "1"},
        })
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return res

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def main(watcher, socket_dir, sandbox):
    c = Client([watcher, "mcp", "serve", "--socket-dir", socket_dir, "--sandbox", sandbox])
    try:
        c.initialize()
        tools = c.request("tools/list", {})["tools"]
        print("tools: " + ",".join(sorted(t["name"] for t in tools)))
        for name, args in PLAN:
            res = c.request("tools/call", {"name": name, "arguments": args})
            text = "".join(part.get("text", "") for part in res.get("content", []) if part.get("type") == "text")
            print(f"{name}: isError={'true' if res.get('isError') else 'false'} {json.dumps(text)}")
    finally:
        c.close()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:4])
