// qwen's SDK (@qwen-code/sdk) on the answers where our server once differed from
// `qwen serve` 0.24.4. Driven by tests/clients/test_qwen_sdk_compat.py.
//
//   node qwen_sdk_compat.mjs <sdk folder> <base url> pending|branch|heartbeat|status|echo|stream
//                                                     |session-status|attach|setters|named
//   node qwen_sdk_compat.mjs <sdk folder> - known '[envelope, …]'   (no server)
//
// `pending`: DaemonClient.removePendingPrompt (200 {removed}) on a queued prompt, then
// on the same id once it is gone; the queue's `pending_prompt_completed` events as the
// SDK's typed reader sees them. `branch`: DaemonClient.branchSession at a point
// (`atRecordId`) this server cannot branch at, and without one. `heartbeat`:
// DaemonSessionClient.heartbeat. `status`: DaemonClient.daemonStatus. `session-status`:
// DaemonClient.sessionStatus through a failed turn. `attach`: DaemonSessionClient's
// hasActivePrompt on an attach. `echo`: a prompt's
// originatorClientId as normalizeDaemonEvent reads it. `stream`: events() under a
// client id the server does not know. `setters`: DaemonClient.setSessionApprovalMode,
// DaemonSessionClient.setModel and setConfigOption, and what they refuse; their events as
// the SDK's typed reader and session reducer take them. `known`: the SDK's typed reader
// (`isKnownDaemonEvent`) on each event envelope given.
// Prints one JSON object of what the SDK reported.
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdkDir, baseUrl, mode, arg] = process.argv.slice(2);
const daemon = await import(pathToFileURL(path.join(sdkDir, "dist/daemon/index.js")).href);
const { DaemonClient, DaemonSessionClient, isKnownDaemonEvent, isStaleBranchPointError,
        normalizeDaemonEvent, reduceDaemonSessionEvents } = daemon;

const text = (t) => ({ prompt: [{ type: "text", text: t }] });
const outcome = async (call) => {
  try {
    return { value: await call() };
  } catch (e) {
    return { error: { name: e.name, status: e.status, code: e.body && e.body.code,
                      stale: isStaleBranchPointError(e), message: String(e.message) } };
  }
};

async function pending() {
  const client = new DaemonClient({ baseUrl });
  const s = await client.createOrAttachSession({ sessionScope: "thread" });
  const running = await client.promptNonBlocking(s.sessionId, text("/sleep 60s running"));
  const queued = await client.promptNonBlocking(s.sessionId, text("queued one"));
  const last = await client.promptNonBlocking(s.sessionId, text("queued two"));
  const first = await outcome(() => client.removePendingPrompt(s.sessionId, queued.promptId));
  const left = (await client.getPendingPrompts(s.sessionId)).pendingPrompts.map((p) => p.promptId);
  const again = await outcome(() => client.removePendingPrompt(s.sessionId, queued.promptId));
  const running2 = await outcome(() => client.removePendingPrompt(s.sessionId, running.promptId));
  const unknownSession = await outcome(() => client.removePendingPrompt("no-such-session", "p"));
  // the session's queue events, up to the last prompt's end, as the SDK reads them
  const events = [];
  for await (const ev of client.subscribeEvents(s.sessionId, { lastEventId: 0 })) {
    events.push(ev);
    if (ev.type === "pending_prompt_completed" && ev.data.promptId === last.promptId) break;
  }
  const completed = events.filter((ev) => ev.type === "pending_prompt_completed")
    .map((ev) => ({ promptId: ev.data.promptId, state: ev.data.state,
                    known: isKnownDaemonEvent(ev) }));
  await client.closeSession(s.sessionId);
  return { running: running.promptId, queued: queued.promptId, last: last.promptId, first,
           left, again, running2, unknownSession, completed };
}

async function branch() {
  const client = new DaemonClient({ baseUrl });
  const s = await client.createOrAttachSession({ sessionScope: "thread" });
  await client.prompt(s.sessionId, text("hello"));
  const atPoint = await outcome(() => client.branchSession(s.sessionId,
    { name: "b", atRecordId: "3c0ff91b-0000-4000-8000-000000000000" }));
  const notString = await outcome(() => client.branchSession(s.sessionId,
    { name: "b", atRecordId: 5 }));
  const whole = await outcome(() => client.branchSession(s.sessionId, { name: "b" }));
  return { atPoint, notString,
           whole: whole.error ?? { forkedFrom: whole.value.forkedFrom.sessionId,
                                   source: s.sessionId } };
}

// DaemonSessionClient.heartbeat: `lastSeenAt` is epoch milliseconds (HeartbeatResult).
async function heartbeat() {
  const client = new DaemonClient({ baseUrl });
  const before = Date.now();
  const s = await DaemonSessionClient.createOrAttach(client, { sessionScope: "thread" });
  const beat = await s.heartbeat();
  const after = Date.now();
  await s.close();
  return { type: typeof beat.lastSeenAt, withinCall: beat.lastSeenAt >= before - 1000
             && beat.lastSeenAt <= after + 1000, clientId: beat.clientId === s.clientId };
}

// DaemonClient.daemonStatus("full"): `detail` and `full.sessions`; an unknown detail.
async function status() {
  const client = new DaemonClient({ baseUrl });
  const s = await client.createOrAttachSession({ sessionScope: "thread" });
  const summary = await client.daemonStatus();
  const full = await client.daemonStatus("full");
  const bogus = await outcome(() => client.daemonStatus("bogus"));
  await client.closeSession(s.sessionId);
  return { sessionId: s.sessionId, summary: { detail: summary.detail, full: summary.full },
           detail: full.detail, sessions: full.full && full.full.sessions, bogus };
}

// DaemonClient.sessionStatus (DaemonSessionSummary) on a new session, after a turn that
// failed, while the next runs; createOrAttachSession under an unknown approvalMode.
async function sessionStatus() {
  const client = new DaemonClient({ baseUrl });
  const s = await client.createOrAttachSession({ sessionScope: "thread", approvalMode: "plan" });
  const fresh = await client.sessionStatus(s.sessionId);
  const failed = await outcome(() => client.prompt(s.sessionId, text("/fail")));
  const afterError = await client.sessionStatus(s.sessionId);
  const running = await client.promptNonBlocking(s.sessionId, text("/sleep 60s next"));
  for await (const ev of client.subscribeEvents(s.sessionId,
                                                { lastEventId: running.lastEventId })) {
    if (ev.type === "session_update" && ev.promptId === running.promptId) break;   // it runs
  }
  const whileRunning = await client.sessionStatus(s.sessionId);
  const badMode = await outcome(() => client.createOrAttachSession(
    { sessionScope: "thread", approvalMode: "super-yolo" }));
  await client.closeSession(s.sessionId);
  return { createdAt: s.createdAt, fresh, failed: failed.error ? "threw" : failed.value,
           afterError, whileRunning, badMode: badMode.error };
}

// DaemonSessionClient.createOrAttach (single scope) onto the default session while a
// prompt runs there, and while none does: the session client's hasActivePrompt.
async function attach() {
  const client = new DaemonClient({ baseUrl });
  const first = await DaemonSessionClient.createOrAttach(client, {});
  const running = await client.promptNonBlocking(first.sessionId, text("/sleep 60s busy"));
  const busy = await DaemonSessionClient.createOrAttach(client, {});
  await client.removePendingPrompt(first.sessionId, running.promptId);   // cancels it
  for await (const ev of client.subscribeEvents(first.sessionId,
                                                { lastEventId: running.lastEventId })) {
    if (ev.type === "turn_complete" || ev.type === "turn_error") break;
  }
  const idle = await DaemonSessionClient.createOrAttach(client, {});
  await client.closeSession(first.sessionId);
  return { fresh: first.hasActivePrompt, same: busy.sessionId === first.sessionId,
           busy: busy.hasActivePrompt, idle: idle.hasActivePrompt,
           background: [busy.hasRunningBackgroundTasks, idle.hasRunningBackgroundTasks] };
}

// A prompt sent under the session's client id: its events' originatorClientId, and
// normalizeDaemonEvent's suppressOwnUserEcho for that client and for another.
async function echo() {
  const client = new DaemonClient({ baseUrl });
  const s = await client.createOrAttachSession({ sessionScope: "thread" });
  await client.prompt(s.sessionId, text("hello"), undefined, s.clientId);
  const events = [];
  for await (const ev of client.subscribeEvents(s.sessionId, { lastEventId: 0 })) {
    events.push(ev);
    if (ev.type === "turn_complete") break;
  }
  const userText = (clientId) => events
    .flatMap((ev) => normalizeDaemonEvent(ev, { suppressOwnUserEcho: true, clientId }))
    .filter((e) => e.type.startsWith("user.")).length;
  // its close, by that client: session_closed names it too
  let onLive;
  const live = new Promise((resolve) => { onLive = resolve; });
  const closing = (async () => {
    for await (const ev of client.subscribeEvents(s.sessionId,
                                                  { lastEventId: events.at(-1).id })) {
      if (ev.type === "replay_complete") onLive();   // the stream is live from here
      if (ev.type === "session_closed") return ev.originatorClientId ?? null;
    }
    return "stream ended";
  })();
  await live;
  await client.closeSession(s.sessionId, s.clientId);
  return { clientId: s.clientId, closedBy: await closing,
           originators: events.map((ev) => [ev.type, ev.originatorClientId ?? null]),
           ownView: userText(s.clientId), otherView: userText("client_someone-else") };
}

// DaemonSessionClient.events() under a client id the server does not know (one it
// forgot, say): the stream opens, as qwen's (it does not attach again on a refusal).
async function stream() {
  const client = new DaemonClient({ baseUrl });
  const made = await client.createOrAttachSession({ sessionScope: "thread" });
  await client.prompt(made.sessionId, text("hello"));
  const s = new DaemonSessionClient({ client,
    session: { ...made, clientId: "client_00000000-0000-4000-8000-000000000000" } });
  const seen = [];
  try {
    for await (const ev of s.events({ lastEventId: 0 })) {
      seen.push(ev.type);
      if (ev.type === "turn_complete") break;
    }
  } catch (e) {
    seen.push({ name: e.name, status: e.status, code: e.body && e.body.code });
  }
  await client.closeSession(made.sessionId);
  return { seen };
}

// qwen's setters, as its SDK calls them (no capability checked), on the reference
// agent: a mode, a model, reasoning_effort; a qwen mode the agent lacks, a model it
// refuses; the agent's updates on the stream.
async function setters() {
  const client = new DaemonClient({ baseUrl });
  const s = await DaemonSessionClient.createOrAttach(client, { sessionScope: "thread" });
  const mode = await outcome(() => client.setSessionApprovalMode(s.sessionId, "plan",
                                                                 { clientId: s.clientId }));
  const again = await outcome(() => client.setSessionApprovalMode(s.sessionId, "yolo"));
  const lacking = await outcome(() => client.setSessionApprovalMode(s.sessionId, "auto"));
  const model = await outcome(() => s.setModel("reference-large"));
  const refused = await outcome(() => s.setModel("gpt-9"));
  const option = await outcome(() => s.setConfigOption("reasoning_effort", "high"));
  const updates = [];
  const announced = [];   // qwen's own events of the setters, as the SDK's typed reader sees them
  const seen = [];
  for await (const ev of client.subscribeEvents(s.sessionId, { lastEventId: 0 })) {
    seen.push(ev);
    const update = ev.data && ev.data.update;
    if (update) updates.push(update.sessionUpdate);
    if (["approval_mode_changed", "model_switched", "model_switch_failed"].includes(ev.type)) {
      announced.push({ type: ev.type, data: ev.data, known: isKnownDaemonEvent(ev),
                       originatorClientId: ev.originatorClientId ?? null });
    }
    if (update && update.sessionUpdate === "config_option_update") break;
  }
  const view = reduceDaemonSessionEvents(seen);
  await s.close();
  return { sessionId: s.sessionId, clientId: s.clientId, mode, again, lacking, model, refused,
           option, updates, announced,
           view: { approvalMode: view.approvalMode, currentModelId: view.currentModelId,
                   approvalModeChangedCount: view.approvalModeChangedCount,
                   lastModelSwitchFailure: view.lastModelSwitchFailure } };
}

// `named`: DaemonClient.listWorkspaceSessions after a session's first prompt: its
// displayName and isArchived as the SDK hands them to a session picker.
async function named() {
  const client = new DaemonClient({ baseUrl });
  const s = await client.createOrAttachSession({ sessionScope: "thread" });
  const quiet = await client.createOrAttachSession({ sessionScope: "thread" });
  await client.prompt(s.sessionId, text("hello listing"));
  const cwd = (await client.capabilities()).workspaces[0].cwd;
  const listed = await client.listWorkspaceSessions(cwd, { pageSize: 1000 });
  const of = (sid) => {
    const row = listed.find((x) => x.sessionId === sid);
    return { displayName: row.displayName ?? null, isArchived: row.isArchived };
  };
  return { named: of(s.sessionId), quiet: of(quiet.sessionId) };
}

const out = mode === "pending" ? await pending()
  : mode === "named" ? await named()
  : mode === "setters" ? await setters()
  : mode === "stream" ? await stream()
  : mode === "echo" ? await echo()
  : mode === "status" ? await status()
  : mode === "session-status" ? await sessionStatus()
  : mode === "attach" ? await attach()
  : mode === "heartbeat" ? await heartbeat()
  : mode === "known" ? JSON.parse(arg).map((ev) => isKnownDaemonEvent(ev))
  : await branch();
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
