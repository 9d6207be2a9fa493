// The ACP TypeScript SDK (@agentclientprotocol/sdk) finds a session whose agent died in
// session/list and loads it. Driven by tests/clients/test_agent_death.py.
//
//   node acp_sdk_ended.mjs <sdk folder> <base url> <http|ws> <workspace>
//       one connection makes a session, runs a turn, then "/crash" (the agent dies
//       mid-turn); a second connection walks session/list until the session is there,
//       session/loads it and runs one more turn. Prints {"crash", "listed", "log"}.
import { loadSdk } from "./acp_sdk_common.mjs";

const [sdkDir, baseUrl, transport, cwd] = process.argv.slice(2);
const { acp, stream } = await loadSdk(sdkDir, baseUrl, transport);
const text = (t) => [{ type: "text", text: t }];
const init = (ctx) => ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION,
                                                  clientCapabilities: {} });

function app(log) {
  return acp.client().onNotification("session/update", ({ params }) => {
    const u = params.update;
    log.push({ kind: "update", sessionUpdate: u.sessionUpdate,
               text: u.content && u.content.type === "text" ? u.content.text : null });
  });
}

async function listAll(ctx) {
  const rows = [];
  let cursor = null;
  do {
    const page = await ctx.request("session/list", cursor ? { cursor } : {});
    rows.push(...page.sessions);
    cursor = page.nextCursor || null;
  } while (cursor);
  return rows;
}

const made = await app([]).connectWith(stream(), async (ctx) => {
  await init(ctx);
  const { sessionId } = await ctx.request("session/new", { cwd, mcpServers: [] });
  await ctx.request("session/prompt", { sessionId, prompt: text("before it died") });
  let crash;
  try {
    crash = { result: await ctx.request("session/prompt", { sessionId, prompt: text("/crash") }) };
  } catch (error) {
    crash = { error: { code: error.code, message: error.message } };
  }
  return { sessionId, crash };
});

const log = [];
const out = await app(log).connectWith(stream(), async (ctx) => {
  await init(ctx);
  let listed = null;
  for (let tries = 0; tries < 1000 && !listed; tries += 1) {   // the end commits behind
    listed = (await listAll(ctx)).find((s) => s.sessionId === made.sessionId) || null;
    if (!listed) await new Promise((resolve) => setTimeout(resolve, 20));
  }
  await ctx.request("session/load", { sessionId: made.sessionId, cwd, mcpServers: [] });
  log.push({ kind: "load_result" });
  const after = await ctx.request("session/prompt", { sessionId: made.sessionId,
                                                     prompt: text("after") });
  log.push({ kind: "stop", stopReason: after.stopReason });
  await ctx.notify("session/cancel", { sessionId: made.sessionId });   // every POST done
  return { crash: made.crash, listed, log };
});
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
