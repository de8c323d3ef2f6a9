"""An MCP client built on the official Python SDK (mcp on PyPI), run by
cmd/watcher's TestMCPClientsPython: it spawns `watcher mcp serve` over
stdio, lists the tools, calls them and prints one line per result, which
the test checks.

    python python_client.py WATCHER_BIN SOCKET_DIR SANDBOX
"""
import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(bin_, socket_dir, sandbox):
    params = StdioServerParameters(command=bin_, args=["mcp", "serve", "--socket-dir", socket_dir, "--sandbox", sandbox])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            print("tools: " + ",".join(sorted(t.name for t in tools.tools)))
            for name, args in [("read_file", {"path": "README"}), ("read_file", {"path": "/etc/shadow"}),
                               ("list_dir", {"path": "."}), ("shell", {"command": "cat /etc/shadow"})]:
                res = await session.call_tool(name, args)
                text = "".join(c.text for c in res.content if c.type == "text")
                print(f"{name}: isError={'true' if res.isError else 'false'} {json.dumps(text)}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
