// The ACP TypeScript SDK (@agentclientprotocol/sdk) across a restart of the server.
// Driven by tests/clients/test_acp_sdk_restart.py.
//
//   node acp_sdk_reload.mjs <sdk folder> <base url> <http|ws> <workspace> make
//       a session with two turns; prints {"sessionId": ...} and keeps its connection
//       open (a session goes when the last connection that made it does) until killed
//   node acp_sdk_reload.mjs <sdk folder> <base url> <http|ws> <workspace> load <sessionId>
//       the reconnect recipe (a new connection, initialize, session/load), then one
//       more turn; prints {"log": [...]}: what the SDK delivered, in order.
import { loadSdk } from "./acp_sdk_common.mjs";

const [sdkDir, baseUrl, transport, cwd, mode, loadId] = process.argv.slice(2);
const { acp, stream } = await loadSdk(sdkDir, baseUrl, transport);
const text = (t) => [{ type: "text", text: t }];

function app(log) {
  return acp.client().onNotification("session/update", ({ params }) => {
    const u = params.update;
    log.push({ kind: "update", sessionUpdate: u.sessionUpdate,
               text: u.content && u.content.type === "text" ? u.content.text : null });
  });
}

const log = [];
const out = await app(log).connectWith(stream(), async (ctx) => {
  await ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION,
                                    clientCapabilities: {} });
  let sessionId = loadId;
  if (mode === "make") {
    sessionId = (await ctx.request("session/new", { cwd, mcpServers: [] })).sessionId;
    for (const prompt of ["/chunks 2 before one", "before two"]) {
      await ctx.request("session/prompt", { sessionId, prompt: text(prompt) });
    }
    await ctx.notify("session/cancel", { sessionId });   // every POST done
    process.stdout.write(JSON.stringify({ sessionId }) + "\n");
    await new Promise(() => {});   // until the test kills us (after the server)
  } else {
    await ctx.request("session/load", { sessionId, cwd, mcpServers: [] });
    log.push({ kind: "load_result" });
    const after = await ctx.request("session/prompt", { sessionId, prompt: text("after") });
    log.push({ kind: "stop", stopReason: after.stopReason });
  }
  // Every POST done before the connection closes (see acp_sdk.mjs).
  await ctx.notify("session/cancel", { sessionId });
  return { log };
});
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
