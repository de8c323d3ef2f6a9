// An MCP client built on the official TypeScript SDK
// (@modelcontextprotocol/sdk), run by cmd/watcher's TestMCPClientsNode:
// it spawns `watcher mcp serve` over stdio, lists the tools, calls them
// and prints one line per result, which the test checks.
//
//   node node_client.mjs WATCHER_BIN SOCKET_DIR SANDBOX
// NODE_PATH must name the node_modules holding the SDK.
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH || ".", "x.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");

const [bin, socketDir, sandbox] = process.argv.slice(2);
const transport = new StdioClientTransport({
  command: bin,
  args: ["mcp", "serve", "--socket-dir", socketDir, "--sandbox", sandbox],
  stderr: "inherit",
});
const client = new Client({ name: "watcher-test-node", version: "1.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
console.log("tools: " + tools.map((t) => t.name).sort().join(","));

async function call(name, args) {
  const res = await client.callTool({ name, arguments: args });
  const text = res.content.filter((c) => c.type === "text").map((c) => c.text).join("");
  console.log(`${name}: isError=${res.isError === true} ${JSON.stringify(text)}`);
}
await call("read_file", { path: "README" });
await call("read_file", { path: "/etc/shadow" });
await call("list_dir", { path: "." });
await call("shell", { command: "cat /etc/shadow" });
await client.close();
