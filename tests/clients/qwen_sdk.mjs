// qwen's SDK (@qwen-code/sdk) as a client of our server, as a qwen serve user runs it.
// Driven by tests/clients/test_qwen_sdk.py.
//
//   node qwen_sdk.mjs <sdk folder> <base url> rest
//   node qwen_sdk.mjs <sdk folder> <base url> acp-http|acp-ws
//
// `rest`: DaemonClient; DaemonSessionClient createOrAttach / load (live and cold) /
// resume, event replay after a dropped stream, the local prompt cap.
// `acp-http` / `acp-ws`: DaemonClient over AcpHttpTransport / AcpWsTransport: create,
// prompt, cancel, a permission. Prints one JSON object of what the SDK reported.
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdkDir, baseUrl, mode, ...flags] = process.argv.slice(2);
// `fleet`: through a round-robin balancer in front of several instances; a session
// closed by DELETE has no journal left, so its cold load is left out there (only the
// instance whose in-process agent remembers it could answer).
const fleet = flags.includes("fleet");
const load = (rel) => import(pathToFileURL(path.join(sdkDir, rel)).href);
const daemon = await load("dist/daemon/index.js");
const transports = await load("dist/daemon/transports.js");
const { DaemonClient, DaemonSessionClient } = daemon;

const text = (t) => ({ prompt: [{ type: "text", text: t }] });
const brief = (ev) => {
  const d = ev.data || {};
  const u = d.update || d;
  const t = u.content && typeof u.content.text === "string" ? u.content.text : undefined;
  return { id: ev.id, type: ev.type, kind: u.sessionUpdate, text: t, promptId: ev.promptId };
};
const errorOf = (e) => ({ name: e.name, status: e.status, limit: e.limit,
                          pendingCount: e.pendingCount, message: String(e.message) });

// Reads a DaemonSessionClient's events() until `stop(ev)`, then drops the stream.
async function readUntil(iterable, stop) {
  const seen = [];
  for await (const ev of iterable) {
    seen.push(ev);
    if (stop(ev)) break;
  }
  return seen;
}

async function rest() {
  const out = {};
  const client = new DaemonClient({ baseUrl });
  out.health = await client.health();
  const caps = await client.capabilities();
  out.capabilities = { transports: caps.transports, features: caps.features,
                       limits: caps.limits, workspaceCwd: caps.workspaceCwd };
  // negotiateTransport picks the best transport /capabilities lists (acp-ws first)
  const negotiated = await transports.negotiateTransport(baseUrl);
  out.negotiated = negotiated.type;
  negotiated.dispose();
  // DaemonClient: create/attach, a blocking prompt, the event stream from 0
  const attached = await client.createOrAttachSession({});
  out.attach = { attached: attached.attached, clientId: typeof attached.clientId };
  out.prompt = await client.prompt(attached.sessionId, text("hello daemon"));
  out.events = (await readUntil(client.subscribeEvents(attached.sessionId, { lastEventId: 0 }),
                                (ev) => ev.type === "turn_complete")).map(brief);

  // DaemonSessionClient: a thread session with one turn
  const s = await DaemonSessionClient.createOrAttach(client, { sessionScope: "thread" });
  out.created = { attached: s.attached, lastEventId: s.lastEventId };
  out.turn = await s.prompt(text("/chunks 3 say pong"));
  const other = new DaemonClient({ baseUrl });
  const live = await DaemonSessionClient.load(other, s.sessionId);
  out.loadLive = {
    attached: live.attached, hasActivePrompt: live.hasActivePrompt,
    lastEventId: live.lastEventId, eventEpoch: live.eventEpoch,
    complete: live.replaySnapshotComplete,
    compactedReplay: live.replaySnapshot.compactedReplay.map(brief),
    liveJournal: live.replaySnapshot.liveJournal.map(brief),
  };
  // the first events after load: the next turn, nothing of the history again
  const next = live.submitPrompt(text("after load"));
  out.afterLoad = (await readUntil(live.events(), (ev) => ev.type === "turn_complete"))
    .map(brief);
  out.afterLoadAccepted = Boolean((await next).promptId);
  const resumed = await DaemonSessionClient.resume(other, s.sessionId);
  out.resume = { attached: resumed.attached, lastEventId: resumed.lastEventId,
                 eventEpoch: resumed.eventEpoch,
                 compactedReplay: resumed.replaySnapshot.compactedReplay.length };
  await s.close();
  if (!fleet) {
    const cold = await DaemonSessionClient.load(other, s.sessionId);
    out.loadCold = {
      attached: cold.attached, lastEventId: cold.lastEventId, eventEpoch: cold.eventEpoch,
      compactedReplay: cold.replaySnapshot.compactedReplay.map(brief),
    };
    out.coldTurn = await cold.prompt(text("after cold load"));
  }

  // Event replay after a dropped stream: read turn 1, drop, turn 2 while away, resume.
  const r = await DaemonSessionClient.createOrAttach(client, { sessionScope: "thread" });
  await r.submitPrompt(text("one"));
  const before = await readUntil(r.events({ lastEventId: 0 }), (ev) => ev.type === "turn_complete");
  const seenUpTo = r.lastEventId;
  await client.prompt(r.sessionId, text("two while away"));   // another caller, no stream
  const lastBefore = before[before.length - 1].id;
  const replayed = await readUntil(r.events(),
                                   (ev) => ev.type === "turn_complete" && ev.id > lastBefore);
  out.replay = { before: before.map(brief), seenUpTo, replayed: replayed.map(brief) };

  // The local cap: one pending prompt per session, counted by the SDK itself.
  const capped = new DaemonClient({ baseUrl, maxPendingPromptsPerSession: 1 });
  const c = await DaemonSessionClient.createOrAttach(capped, { sessionScope: "thread" });
  let onPermission;
  const permission = new Promise((resolve) => { onPermission = resolve; });
  const reader = (async () => {
    let turns = 0;   // the held prompt's, then the second's (the refused one never ran)
    for await (const ev of c.events({ lastEventId: 0 })) {
      if (ev.type === "permission_request") onPermission(ev);
      if (ev.type === "turn_complete" && ++turns === 2) break;
    }
  })();
  const held = c.prompt(text("/permission held"));
  const ask = await permission;
  try {
    await c.prompt(text("over the cap"));
    out.capRefused = null;
  } catch (e) {
    out.capRefused = errorOf(e);
  }
  out.capVoted = await c.respondToPermission(ask.data.requestId,
    { outcome: { outcome: "selected", optionId: "allow_once" } });
  out.capHeld = await held;
  const second = await c.submitPrompt(text("now it fits"));
  await reader;
  out.capSecond = Boolean(second.promptId);
  return out;
}

async function acp(kind) {
  const out = { kind };
  const transport = kind === "acp-ws"
    ? new transports.AcpWsTransport(baseUrl.replace(/^http/, "ws") + "/acp")
    : new transports.AcpHttpTransport(baseUrl, undefined, globalThis.fetch.bind(globalThis));
  out.transportType = transport.type;
  const client = new DaemonClient({ baseUrl, transport });
  const session = await client.createOrAttachSession({ sessionScope: "thread" });
  const sid = session.sessionId;
  out.created = typeof sid === "string" && sid.length > 0;
  // one event reader for the session (permission requests, cancel trigger)
  let onPermission, onCancelMe;
  const permission = new Promise((resolve) => { onPermission = resolve; });
  const cancelMe = new Promise((resolve) => { onCancelMe = resolve; });
  const seen = [];
  const abort = new AbortController();
  const reader = (async () => {
    try {
      for await (const ev of client.subscribeEvents(sid, { signal: abort.signal })) {
        seen.push(brief(ev));
        if (ev.type === "permission_request" || ev.type === "request_permission") onPermission(ev);
        const b = brief(ev);
        if (b.type === "user_message_chunk" && b.text === "/sleep 30s cancel me") onCancelMe();
      }
    } catch (e) {
      if (!abort.signal.aborted) throw e;
    }
  })();
  // AcpHttpTransport registers a request only once its POST has returned, so a reply
  // that overtakes the 202 on the session stream's socket is dropped (the SDK's race,
  // whatever the server: qwen serve also answers 202 and replies on the stream). A
  // real agent takes far longer than that window; the reference agent waits 100 ms.
  // (The later prompts are answered after a vote or a cancel, well after their 202.)
  out.prompt = await client.prompt(sid, text("/sleep 100ms /chunks 2 hello over acp"));
  const asked = client.prompt(sid, text("/permission please"));
  const ask = await permission;
  const requestId = ask.data.requestId ?? ask.data._meta?.qwen?.requestId;
  out.permissionOptions = (ask.data.options || []).map((o) => o.optionId);
  out.voted = await client.respondToPermission(requestId,
    { outcome: { outcome: "selected", optionId: "allow_once" } });
  out.permissionPrompt = await asked;
  const slow = client.prompt(sid, text("/sleep 30s cancel me"));
  await cancelMe;
  await client.cancel(sid);
  out.cancelled = await slow;
  abort.abort();
  await reader;
  out.seen = seen;
  transport.dispose();
  return out;
}

// Across a restart (driven by tests/store/test_session_restart_clients.py):
// `before`: a thread session with one turn and a queued prompt behind a long one;
// `after <sid>`: DaemonSessionClient.load of it on the restarted server, and a new turn.
async function before() {
  const client = new DaemonClient({ baseUrl });
  const s = await DaemonSessionClient.createOrAttach(client, { sessionScope: "thread" });
  const turn = await s.prompt(text("before the restart"));
  const long = await s.submitPrompt(text("/sleep 60s long"));
  const queued = await s.submitPrompt(text("queued across"));
  return { sessionId: s.sessionId, clientId: s.clientId, eventEpoch: s.eventEpoch, turn,
           long: long.promptId, queued: queued.promptId };
}

async function after(sid) {
  const client = new DaemonClient({ baseUrl });
  const s = await DaemonSessionClient.load(client, sid);
  const out = { attached: s.attached, eventEpoch: s.eventEpoch,
                compactedReplay: s.replaySnapshot.compactedReplay.map(brief),
                promptTerminals: s.replaySnapshot.promptTerminals ?? null };
  out.turn = await s.prompt(text("after the restart"));   // behind the queued one
  const again = await DaemonSessionClient.load(new DaemonClient({ baseUrl }), sid);
  out.history = again.replaySnapshot.compactedReplay.map(brief);
  return out;
}

// `died`: a thread session with one turn, then `/crash` (a stdio agent exits mid-turn):
// the prompt's error as the SDK reports it. `after <sid>` then loads it again.
async function died() {
  const client = new DaemonClient({ baseUrl });
  const s = await DaemonSessionClient.createOrAttach(client, { sessionScope: "thread" });
  const turn = await s.prompt(text("before it died"));
  let crash;
  try {
    crash = { result: await s.prompt(text("/crash")) };
  } catch (e) {
    crash = { name: e.name, message: String(e.message) };
  }
  return { sessionId: s.sessionId, eventEpoch: s.eventEpoch, turn, crash };
}

// `workspace`: the per-workspace paths: DaemonClient.workspaceById(id) lists the
// sessions (GET /workspaces/:workspace/sessions, pages of up to 1000 asked), and so
// does workspaceByCwd(cwd) (the path URL-encoded); workspaceByCwd of another folder is
// refused. An AcpWsTransport on /workspaces/:workspace/acp holds a turn, and so does an
// AcpHttpTransport whose base URL is the mount of the workspace's path
// (/workspaces/<encoded cwd>, to which it appends /acp).
async function workspace() {
  const client = new DaemonClient({ baseUrl });
  const caps = await client.capabilities();
  const wid = caps.workspaces[0].id;
  const made = [];
  for (let i = 0; i < 3; i++) {
    made.push((await client.createOrAttachSession({ sessionScope: "thread" })).sessionId);
  }
  const scoped = client.workspaceById(wid);
  const big = await scoped.listWorkspaceSessionsPage({ pageSize: 1000 });
  const first = await scoped.listWorkspaceSessionsPage({ pageSize: 2 });
  const rest = await scoped.listWorkspaceSessionsPage({ pageSize: 2, cursor: first.nextCursor });
  const cwd = caps.workspaces[0].cwd;
  const byCwd = await client.workspaceByCwd(cwd).listWorkspaceSessions({ pageSize: 1000 });
  const transport = new transports.AcpWsTransport(
    baseUrl.replace(/^http/, "ws") + `/workspaces/${wid}/acp`);
  const overAcp = new DaemonClient({ baseUrl, transport });
  const session = await overAcp.createOrAttachSession({ sessionScope: "thread" });
  const turn = await overAcp.prompt(session.sessionId, text("/sleep 100ms hello workspace"));
  transport.dispose();
  let elsewhere;
  try {
    await client.workspaceByCwd(path.join(path.dirname(cwd), "elsewhere")).listWorkspaceSessions();
    elsewhere = "listed";
  } catch (e) {
    elsewhere = { name: e.name, status: e.status, code: e.body && e.body.code };
  }
  const mount = `${baseUrl}/workspaces/${encodeURIComponent(cwd)}`;
  const http = new transports.AcpHttpTransport(mount, undefined, globalThis.fetch.bind(globalThis));
  const overHttp = new DaemonClient({ baseUrl, transport: http });
  const httpSession = await overHttp.createOrAttachSession({ sessionScope: "thread" });
  const seen = [];
  const abort = new AbortController();
  const reading = (async () => {
    try {
      for await (const ev of overHttp.subscribeEvents(httpSession.sessionId,
                                                      { signal: abort.signal })) {
        seen.push(brief(ev));
      }
    } catch (e) {
      if (!abort.signal.aborted) throw e;
    }
  })();
  // the reference agent waits 100 ms: the reply never overtakes the 202 (see acp())
  const httpTurn = await overHttp.prompt(httpSession.sessionId,
                                         text("/sleep 100ms /chunks 2 hello mount"));
  abort.abort();
  await reading;
  http.dispose();
  return { made, big: big.sessions.map((s) => s.sessionId),
           pages: [first.sessions.map((s) => s.sessionId), rest.sessions.map((s) => s.sessionId)],
           nextCursor: rest.nextCursor ?? null, turn,
           byCwd: byCwd.map((s) => s.sessionId), elsewhere, httpTurn,
           httpChunks: seen.filter((e) => e.kind === "agent_message_chunk").map((e) => e.text) };
}

const out = mode === "rest" ? await rest()
  : mode === "workspace" ? await workspace()
  : mode === "before" ? await before()
  : mode === "died" ? await died()
  : mode === "after" ? await after(process.argv[5])
  : await acp(mode);
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
