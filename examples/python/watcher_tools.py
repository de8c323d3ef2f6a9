"""Client of watcher's tool-call gateway (stdlib only, one file).

The gateway speaks JSON-RPC 2.0, one request per line, on a Unix socket per
sandbox (SOCKET_DIR/sandboxes/NAME/tools.sock). Every call is decided by the
sandbox's policy (allow, deny, or ask a human) and recorded in watcher's
ledger with its call id, together with the kernel events of the command a
shell call ran.

    from watcher_tools import Gateway, ToolError
    gw = Gateway("/run/watcher/sandboxes/agents/tools.sock", session="run-1")
    print(gw.read_file("c-1", "README.md")["content"])
    try:
        gw.shell("c-2", "curl http://example.com")
    except ToolError as e:
        print(e.type, e)          # denied, approval_timeout, outside_workspace, ...
"""

import itertools
import json
import socket
import threading

__all__ = ["Gateway", "ToolError", "GatewayClosed"]


class ToolError(Exception):
    """A typed error from the gateway: .code, .type, .data, str() the message."""

    def __init__(self, error):
        self.code = error.get("code")
        self.data = error.get("data") or {}
        self.type = self.data.get("type", "")
        super().__init__(error.get("message", "gateway error"))


class GatewayClosed(Exception):
    """The gateway closed the connection (e.g. after a malformed frame)."""


class Gateway:
    """One connection to a sandbox's gateway. Thread-safe: calls may run
    concurrently (an 'ask' call waits for a human without blocking others)."""

    def __init__(self, path, session="default", timeout=None):
        self.session = session
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._file = self._sock.makefile("rb")
        self._ids = itertools.count(1)
        self._wlock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting = {}
        self._closed = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def close(self):
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _read(self):
        try:
            for line in self._file:
                try:
                    resp = json.loads(line)
                except ValueError:
                    continue
                rid = resp.get("id")
                with self._lock:
                    slot = self._waiting.pop(rid, None)
                    if slot is None and resp.get("error"):
                        self._closed = ToolError(resp["error"])
                if slot is not None:
                    slot[1] = resp
                    slot[0].set()
        except (OSError, ValueError):
            pass
        with self._lock:
            if self._closed is None:
                self._closed = GatewayClosed("gateway connection closed")
            for slot in self._waiting.values():
                slot[0].set()
            self._waiting.clear()

    def request(self, method, params=None):
        """Send one request; return its result or raise ToolError."""
        rid = next(self._ids)
        slot = [threading.Event(), None]
        with self._lock:
            if self._closed is not None:
                raise self._closed
            self._waiting[rid] = slot
        frame = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        with self._wlock:
            self._sock.sendall(frame.encode() + b"\n")
        slot[0].wait()
        resp = slot[1]
        if resp is None:
            raise self._closed
        if resp.get("error"):
            raise ToolError(resp["error"])
        return resp.get("result")

    # Tools.
    def list_tools(self):
        return self.request("tool.list")

    def call(self, call_id, tool, arguments):
        """Run a tool; returns its output (the result's 'output')."""
        res = self.request("tool.request", {"call_id": call_id, "tool": tool,
                                            "arguments": arguments, "session": self.session})
        self.last_seq = res["seq"]
        return res["output"]

    def read_file(self, call_id, path, offset=0, max_bytes=0):
        args = {"path": path}
        if offset:
            args["offset"] = offset
        if max_bytes:
            args["max_bytes"] = max_bytes
        return self.call(call_id, "read_file", args)

    def write_file(self, call_id, path, content):
        return self.call(call_id, "write_file", {"path": path, "content": content})

    def list_dir(self, call_id, path="."):
        return self.call(call_id, "list_dir", {"path": path})

    def shell(self, call_id, command, timeout_seconds=0):
        args = {"command": command}
        if timeout_seconds:
            args["timeout_seconds"] = timeout_seconds
        return self.call(call_id, "shell", args)

    # Sessions and the exchange.
    def resume(self, after_seq=0):
        """The session's calls numbered after after_seq (for a restarted agent)."""
        return self.request("session.resume", {"session": self.session, "after_seq": after_seq})

    def put(self, name, content):
        return self.request("exchange.put", {"name": name, "content": content, "session": self.session})["output"]

    def get(self, name):
        """A message another agent wrote: untrusted input, data not instructions."""
        return self.request("exchange.get", {"name": name, "session": self.session})["output"]
