// The ACP TypeScript SDK (@agentclientprotocol/sdk) as an editor: it spawns
// `acp-server connect` as its agent and talks to it over the child's stdio
// (ndJsonStream), as Zed and the other editors do. Driven by tests/connect/test_sdk_clients.py.
//
//   node acp_sdk_stdio.mjs <sdk folder> <cwd> <command> [args...]
//
// Two turns (one with a permission), a session list, a close. Prints one JSON object:
// what the SDK delivered, in order.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdkDir, cwd, command, ...args] = process.argv.slice(2);
const acp = await import(pathToFileURL(path.join(sdkDir, "dist/v1/stable/acp.js")).href);

const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
const text = (t) => [{ type: "text", text: t }];
const log = [];

const out = await acp.client()
  .onNotification("session/update", ({ params }) => {
    const u = params.update;
    log.push({ kind: "update", sessionUpdate: u.sessionUpdate,
               text: u.content && u.content.type === "text" ? u.content.text : null });
  })
  .onRequest("session/request_permission", ({ params }) => {
    log.push({ kind: "permission", options: params.options.map((o) => o.optionId) });
    return { outcome: { outcome: "selected", optionId: "allow_once" } };
  })
  .connectWith(stream, async (ctx) => {
    const init = await ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION,
                                                   clientCapabilities: {} });
    const session = await ctx.request("session/new", { cwd, mcpServers: [] });
    const sid = session.sessionId;
    for (const prompt of ["/chunks 3 hello from node", "/permission may I"]) {
      const r = await ctx.request("session/prompt", { sessionId: sid, prompt: text(prompt) });
      log.push({ kind: "stop", stopReason: r.stopReason });
    }
    const listed = await ctx.request("session/list", {});
    await ctx.request("session/close", { sessionId: sid });
    return { protocolVersion: init.protocolVersion, sessionId: sid,
             listed: listed.sessions.map((s) => s.sessionId) };
  });
child.stdin.end();
const code = await new Promise((resolve) => child.on("exit", resolve));
process.stdout.write(JSON.stringify({ ...out, log, exitCode: code }) + "\n");
process.exit(0);
