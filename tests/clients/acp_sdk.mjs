// The ACP TypeScript SDK (@agentclientprotocol/sdk) as a client of our /acp, over its
// Streamable HTTP client or its WebSocket client. Driven by tests/clients/test_acp_sdk.py.
//
//   node acp_sdk.mjs <sdk folder> <base url> <http|ws> <workspace>
//
// Runs two turns, a permission, a cancel, then, while that connection is still open,
// the reconnect recipe (a new connection, initialize, session/load) on the live session
// and, after session/close, on the cold one. Prints one JSON object: what the SDK
// reported, in the order it reported it.
import { loadSdk } from "./acp_sdk_common.mjs";

const [sdkDir, baseUrl, transport, cwd] = process.argv.slice(2);
const { acp, stream } = await loadSdk(sdkDir, baseUrl, transport);

const text = (t) => [{ type: "text", text: t }];

// One client app: every session/update and permission request lands in `log`, so the
// test sees the order the SDK delivered them in relative to the request results.
function app(log, { onUpdate } = {}) {
  return acp.client()
    .onNotification("session/update", ({ params }) => {
      const u = params.update;
      log.push({ kind: "update", sessionUpdate: u.sessionUpdate,
                 text: u.content && u.content.type === "text" ? u.content.text : null });
      if (onUpdate) onUpdate(params);
    })
    .onRequest("session/request_permission", ({ params }) => {
      log.push({ kind: "permission", options: params.options.map((o) => o.optionId),
                 title: params.toolCall && params.toolCall.title });
      return { outcome: { outcome: "selected", optionId: "allow_once" } };
    });
}

// The SDK's HTTP client writes one POST at a time and aborts a POST still in flight
// when the connection closes (an unhandled AbortError). A reply can arrive on its
// stream before its POST's 202, so each connection ends with a notification, whose
// write resolves only once every earlier POST has finished. (On the WebSocket it is
// one frame.)
async function settle(ctx, sessionId) {
  await ctx.notify("session/cancel", { sessionId });
}

async function initialize(ctx) {
  return ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION,
                                     clientCapabilities: {} });
}

async function reconnectAndLoad(sessionId) {
  const log = [];
  const result = await app(log).connectWith(stream(), async (ctx) => {
    const init = await initialize(ctx);
    log.push({ kind: "initialized", loadSession: init.agentCapabilities.loadSession === true });
    const loaded = await ctx.request("session/load", { sessionId, cwd, mcpServers: [] });
    log.push({ kind: "load_result", keys: Object.keys(loaded) });
    const after = await ctx.request("session/prompt", { sessionId, prompt: text("after load") });
    log.push({ kind: "stop", stopReason: after.stopReason });
    await settle(ctx, sessionId);
    return loaded;
  });
  return { log, result };
}

const out = { transport };
const log = [];
let cancelFor = null;
let ctxRef = null;
const sessionId = await app(log, {
  onUpdate: (params) => {
    const u = params.update;
    if (cancelFor && u.sessionUpdate === "user_message_chunk" && u.content.text === cancelFor) {
      cancelFor = null;
      ctxRef.notify("session/cancel", { sessionId: params.sessionId });
    }
  },
}).connectWith(stream(), async (ctx) => {
  ctxRef = ctx;
  const init = await initialize(ctx);
  out.protocolVersion = init.protocolVersion;
  const session = await ctx.request("session/new", { cwd, mcpServers: [] });
  const sid = session.sessionId;
  for (const prompt of ["/chunks 3 first turn", "second turn", "/permission third turn"]) {
    const r = await ctx.request("session/prompt", { sessionId: sid, prompt: text(prompt) });
    log.push({ kind: "stop", stopReason: r.stopReason });
  }
  cancelFor = "/sleep 30s cancel me";
  const r = await ctx.request("session/prompt", { sessionId: sid, prompt: text(cancelFor) });
  log.push({ kind: "stop", stopReason: r.stopReason });
  await settle(ctx, sid);
  out.first = [...log];
  // The reconnect recipe while this connection is still there (as after a network
  // drop, before the server reaps the old connection): the session is live. (A
  // session is closed when the last connection that made or attached it goes away.)
  out.live = await reconnectAndLoad(sid);
  // Cold: close the session on a connection of its own, then the recipe again.
  await app([]).connectWith(stream(), async (other) => {
    await initialize(other);
    await other.request("session/close", { sessionId: sid });
    await settle(other, sid);
  });
  out.cold = await reconnectAndLoad(sid);
  return sid;
});
out.sessionId = sessionId;
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
