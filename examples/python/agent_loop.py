#!/usr/bin/env python3
"""Example agent loop over watcher's tool gateway, in its own line protocol.

For MCP (what agent frameworks speak) see mcp_agent_loop.py: the same
decision path; this protocol adds session resume after a crash.

A real agent asks its model for the next tool call; this one replays a fixed
plan so it runs anywhere: it lists the workspace, reads a file, writes one,
runs a shell command, and shows what a refused call looks like. It resumes
where it left off after a crash (session.resume).

    python3 agent_loop.py /run/watcher/sandboxes/agents/tools.sock [session]
"""

import json
import sys

from watcher_tools import Gateway, ToolError

PLAN = [
    ("list_dir", {"path": "."}),
    ("read_file", {"path": "README"}),
    ("write_file", {"path": "notes.txt", "content": "summary: the README says hello\n"}),
    ("shell", {"command": "wc -c notes.txt && cat /etc/shadow"}),
    ("read_file", {"path": "../../etc/passwd"}),
    ("http_fetch", {"url": "https://example.com"}),
]


def main():
    sock = sys.argv[1]
    session = sys.argv[2] if len(sys.argv) > 2 else "example"
    with Gateway(sock, session=session) as gw:
        tools = [t["tool"] + ":" + t["action"] for t in gw.list_tools()["tools"]]
        print("tools:", ", ".join(tools))
        done = {a["call_id"] for a in gw.resume(0)["actions"]}
        for i, (tool, args) in enumerate(PLAN, 1):
            call_id = "%s-%d" % (session, i)
            if call_id in done:
                print(f"{call_id} {tool}: done before the restart, skipped")
                continue
            try:
                out = gw.call(call_id, tool, args)
            except ToolError as e:
                # Tell the model what was refused and why, so it can try a
                # legitimate route instead of failing blindly.
                print(f"{call_id} {tool}: REFUSED {e.type}: {e}")
                continue
            if tool == "shell":
                print(f"{call_id} shell: exit {out['exit_code']} stdout {out['stdout'].strip()!r}")
                if out.get("refusal_summary"):
                    print(f"    refused by the kernel: {out['refusal_summary']}")
            elif tool == "read_file":
                print(f"{call_id} read_file: {out['content']!r}")
            elif tool == "list_dir":
                print(f"{call_id} list_dir: {[e['name'] for e in out['entries']]}")
            else:
                print(f"{call_id} {tool}: {json.dumps(out)}")


if __name__ == "__main__":
    main()
