// The ACP TypeScript SDK (@agentclientprotocol/sdk) as a client of our /acp whose
// permission dialog is answered elsewhere. Driven by tests/clients/test_acp_sdk.py.
//
//   node acp_sdk_withdrawn.mjs <sdk folder> <base url> <http|ws> <workspace>
//
// The client's session/request_permission handler waits, as a person at a dialog
// would, until the SDK aborts it: the server's $/cancel_request once another client
// (the test, over REST) has answered. Prints one JSON object: what the SDK reported.
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdkDir, baseUrl, transport, cwd] = process.argv.slice(2);
const load = (rel) => import(pathToFileURL(path.join(sdkDir, rel)).href);
const acp = await load("dist/v1/stable/acp.js");
const { createHttpStream } = await load("dist/transports/http-stream.js");
const { createWebSocketStream } = await load("dist/transports/ws-stream.js");

const stream = transport === "ws"
  ? createWebSocketStream(baseUrl.replace(/^http/, "ws") + "/acp",
                          { WebSocket: globalThis.WebSocket })
  : createHttpStream(baseUrl + "/acp");

const log = [];
const client = acp.client()
  .onNotification("session/update", ({ params }) => {
    const u = params.update;
    if (u.sessionUpdate === "agent_message_chunk" && u.content.type === "text") {
      log.push({ kind: "chunk", text: u.content.text });
    }
  })
  .onRequest("session/request_permission", async ({ params, signal }) => {
    log.push({ kind: "asked", title: params.toolCall && params.toolCall.title });
    await new Promise((resolve) => {
      if (signal.aborted) resolve();
      else signal.addEventListener("abort", resolve, { once: true });
    });
    const reason = signal.reason;
    log.push({ kind: "withdrawn", code: reason && reason.code });
    return { outcome: { outcome: "cancelled" } };
  });

const out = { transport };
out.sessionId = await client.connectWith(stream, async (ctx) => {
  await ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION,
                                    clientCapabilities: {} });
  const { sessionId } = await ctx.request("session/new", { cwd, mcpServers: [] });
  process.stderr.write(`session ${sessionId}\n`);
  const r = await ctx.request("session/prompt", {
    sessionId, prompt: [{ type: "text", text: "/permission answered elsewhere" }] });
  log.push({ kind: "stop", stopReason: r.stopReason });
  await ctx.notify("session/cancel", { sessionId });   // (settles the HTTP client's POSTs)
  return sessionId;
});
out.log = log;
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
