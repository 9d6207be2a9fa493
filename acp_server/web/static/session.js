// One session: the live transcript, the prompt box, cancel, the pending queue (drop a
// queued prompt), permission requests (the agent's options as buttons), and what a
// full queue answers.
//
//   mount(root, [sessionId], { caps })
//
// Contracts: the transcript is rebuilt from the event stream, replayed from the start
// (Last-Event-ID: 0); the prompt box has the focus. A refused prompt (503) is said once,
// above the prompt box, with when to retry; the text stays in the box; the notice
// clears itself when the queue has room again or a prompt is accepted. While the
// stream is down, the queue panel and the header show nothing stale (no counts, no
// Drop buttons). When the server ends the session (shutdown) or the stream finds it
// gone (404), the page tries POST /session/{id}/load until the server answers: loaded,
// the transcript is replayed and the page goes on; not found, the page says plainly
// that the session ended and offers the list. A session whose agent died (or that was
// closed, not deleted) says so and offers "Load it again" (the same load), which takes
// the focus if the prompt box had it. "Cancel
// running" is enabled only while a prompt runs, and says what it did (until another
// prompt runs).

import { follow, request } from "./api.js";
import { can, clear, errorText, h, limitText, shortId, toolKind } from "./dom.js";
import { Transcript } from "./transcript.js";

const QUEUE_EVENTS = new Set(["pending_prompt_added", "pending_prompt_started", "pending_prompt_completed",
  "turn_complete", "turn_error", "prompt_cancelled", "replay_complete"]);
const RELOAD_RETRY_MS = 3000;
const CONTENT_EVENTS = new Set(["session_update", "pending_prompt_added", "turn_complete", "turn_error",
  "state_resync_required"]);

export function mount(root, [sessionId], ctx) {
  const { caps } = ctx;
  const mayPrompt = can(ctx, "prompt");   // else: a reader's view, nothing that acts
  const base = `/session/${encodeURIComponent(sessionId)}`;
  const limit = caps.limits ? caps.limits.maxPendingPromptsPerSession : null;
  const transcript = new Transcript();
  const depth = h("span", { class: "depth", testid: "queue-depth" }, `– / ${limitText(limit)}`);
  const state = h("span", { class: "badge", testid: "stream-state" }, "connecting");
  const input = h("textarea", { testid: "prompt-input", rows: 3, "aria-label": "Prompt", dir: "auto", disabled: !mayPrompt,
    placeholder: mayPrompt ? "Prompt (Ctrl+Enter sends)" : "This token may only read: prompting needs the \"prompt\" scope." });
  const banner = h("div", { class: "banner", testid: "session-banner", role: "status", hidden: true });
  const refusal = h("div", { class: "refusal", testid: "prompt-error", role: "alert", hidden: true });
  const queue = h("ol", { class: "queue", testid: "pending-queue" });
  const permissions = h("div", { class: "permissions", testid: "permissions" });
  const sendButton = h("button", { class: "primary", testid: "send-prompt", onclick: () => send() }, "Send");
  const cancelButton = h("button", { testid: "cancel-prompt", disabled: true, onclick: () => cancel() }, "Cancel running");
  const cancelNote = h("span", { class: "hint", testid: "cancel-feedback", role: "status" });
  const pending = new Map();   // requestId -> permission_request data
  let connected = false;
  let ended = false;
  let unmounted = false;
  let stream = null;
  let running = null;          // the running prompt's id, from the last queue read
  let cancelling = null;       // the prompt id a cancel was sent for
  let notedWhile = undefined;  // what ran when "cancelled" was said; the note goes when that changes
  let queueFull = false;       // a 503 notice is shown
  let replaying = false;       // a reloaded session's stream: its history replaces the old

  async function send() {
    const text = input.value;
    if (!text.trim() || !connected) return;
    try {
      await request("POST", `${base}/prompt`, { prompt: [{ type: "text", text }] });
      if (input.value === text) input.value = "";   // not what was typed meanwhile
      clearRefusal();
    } catch (error) {
      showRefusal(error);
    }
    refreshQueue();
  }

  async function cancel() {
    cancelButton.disabled = true;
    cancelling = running;
    cancelNote.textContent = "Cancelling the running prompt…";
    try {
      await request("POST", `${base}/cancel`);
      cancelNote.textContent = "Cancel sent; the agent is stopping.";
    } catch (error) {
      cancelNote.textContent = `Cancel failed: ${errorText(error)}`;
      cancelling = null;
    }
    refreshQueue();
  }

  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) send();
  });

  function showRefusal(error) {
    const body = error.body || {};
    if (error.code === "prompt_queue_full") {
      queueFull = true;
      const retry = error.retryAfter ? `Retry in ${error.retryAfter} s, or when a prompt ends` : "Retry when a prompt ends";
      clear(refusal, h("strong", {}, "Queue full"),
        ` — ${body.pendingCount} of ${body.limit} prompts pending (503 prompt_queue_full). `,
        `${retry}; your prompt is still in the box.`);
    } else {
      clear(refusal, h("strong", {}, `${error.status || ""} ${error.code || ""}`.trim() || "Error"), " ", error.message);
    }
    refusal.hidden = false;
  }

  function clearRefusal() {
    queueFull = false;
    refusal.hidden = true;
    clear(refusal);
  }

  function say(text, { ended: over = false, again = false } = {}) {
    clear(banner, text,
      again ? [" ", h("button", { testid: "load-again", onclick: () => loadAgain() }, "Load it again")] : null,
      over ? [" ", h("a", { href: "#/", testid: "back-to-list" }, "Back to the sessions")] : null);
    banner.hidden = false;
    banner.classList.toggle("ended", over);
  }

  // A session that ended but that the server keeps (its agent died, or it was idle):
  // loaded again on request (the agent restarted, seeded with the conversation).
  function loadAgain() {
    ended = false;
    input.disabled = !mayPrompt;
    state.textContent = "loading";
    state.className = "badge reconnecting";
    say("Loading the session again…");
    reload();
  }

  // Nothing stale while the server cannot be heard: no counts, no buttons that act.
  function disconnected(text) {
    connected = false;
    depth.textContent = `– / ${limitText(limit)}`;
    clear(queue, h("li", { class: "empty" }, "Not connected."));
    pending.clear();
    renderPermissions();
    running = null;
    cancelButton.disabled = true;
    sendButton.disabled = true;
    if (text) say(text);
  }

  function endSession(text, { again = false } = {}) {
    ended = true;
    disconnected(null);
    say(text, { ended: true, again: again && mayPrompt });
    const lost = document.activeElement === input || document.activeElement === document.body
      || !document.activeElement;
    input.disabled = true;
    if (lost) {   // the prompt box (or nothing) had the focus: give it to what can be done now
      const next = banner.querySelector("button, a");
      if (next) next.focus();
    }
    state.textContent = "ended";
    state.className = "badge ended";
    if (stream) stream.stop();
  }

  root.append(
    h("section", { class: "toolbar" },
      h("h1", {}, "Session ", h("span", { class: "mono", title: sessionId }, shortId(sessionId))),
      h("span", {}, "Pending ", depth), state,
      h("a", { class: "button", href: "#/" }, "All sessions")),
    h("div", { class: "session-grid" },
      h("section", { class: "main-col" },
        banner, transcript.node, refusal,
        h("div", { class: "composer" }, input,
          h("div", { class: "composer-actions" }, sendButton, cancelButton, cancelNote))),
      h("aside", { class: "side-col" },
        h("h2", {}, "Permission requests"), permissions,
        h("h2", {}, "Pending queue"), queue)));

  function renderPermissions() {
    clear(permissions, pending.size === 0 ? h("p", { class: "empty" }, "None waiting.") : null,
      [...pending.values()].map((p) => {
        const kind = p.toolCall && p.toolCall.kind ? toolKind(p.toolCall.kind) : null;
        return h("div", { class: "permission", testid: "permission-request", dataset: { requestId: p.requestId } },
          h("p", {}, h("strong", {}, (p.toolCall && p.toolCall.title) || "Permission"),
            kind ? h("span", { class: "badge", title: kind.explain, testid: "permission-kind" }, kind.label) : null),
          kind ? h("p", { class: "hint", testid: "permission-kind-explain" }, kind.explain) : null,
          h("div", { class: "options" }, (p.options || []).map((o) => h("button", {
            class: o.kind && o.kind.startsWith("reject") ? "danger" : "primary",
            testid: "permission-option", dataset: { optionId: o.optionId }, disabled: !mayPrompt,
            onclick: () => vote(p.requestId, o.optionId),
          }, o.name || o.optionId))));
      }));
  }

  async function vote(requestId, optionId) {
    try {
      await request("POST", `${base}/permission/${encodeURIComponent(requestId)}`,
        { outcome: { outcome: "selected", optionId } });
    } catch (error) {
      if (error.status === 404) pending.delete(requestId);   // another client answered first
      else showRefusal(error);
      renderPermissions();
    }
  }

  async function drop(promptId) {
    try {
      await request("DELETE", `${base}/pending-prompts/${encodeURIComponent(promptId)}`);
    } catch (error) {
      if (error.status !== 404) showRefusal(error);
    }
    refreshQueue();
  }

  function showQueue(pendingPrompts) {
    depth.textContent = `${pendingPrompts.length} / ${limitText(limit)}`;
    clear(queue, pendingPrompts.length === 0 ? h("li", { class: "empty" }, "Nothing pending.") : null,
      pendingPrompts.map((p) => h("li", { testid: "pending-prompt", dataset: { promptId: p.promptId, state: p.state } },
        h("span", { class: `badge ${p.state}` }, p.state), " ", h("span", { class: "prompt-text", dir: "auto" }, p.text),
        p.state === "queued" && mayPrompt
          ? h("button", { class: "danger small", testid: "drop-prompt", dataset: { promptId: p.promptId },
            "aria-label": `Drop queued prompt: ${p.text.slice(0, 80)}`, onclick: () => drop(p.promptId) }, "Drop")
          : null)));
    const active = pendingPrompts.find((p) => p.state === "running");
    running = active ? active.promptId : null;
    cancelButton.disabled = !mayPrompt || !running || running === cancelling;
    if (cancelling && running !== cancelling) {
      cancelNote.textContent = "The prompt was cancelled.";
      cancelling = null;
      notedWhile = running;
    } else if (notedWhile !== undefined && running !== notedWhile) {
      cancelNote.textContent = "";   // said of a prompt that is over: not of this one
      notedWhile = undefined;
    }
    if (queueFull && (limit === null || pendingPrompts.length < limit)) clearRefusal();
  }

  let queueBusy = null;
  let queueAgain = false;
  async function refreshQueue() {
    if (unmounted || ended || !connected) return;
    if (queueBusy) { queueAgain = true; return; }
    queueBusy = (async () => {
      do {
        queueAgain = false;
        try {
          const { pendingPrompts } = await request("GET", `${base}/pending-prompts`);
          if (connected) showQueue(pendingPrompts);
        } catch (error) {
          if (error.status === 404) disconnected(null);
        }
      } while (queueAgain && connected && !unmounted);
      queueBusy = null;
    })();
  }

  // After a shutdown or a 404: load the session when the server has it again.
  // first: wait before the first try (a server shutting down still answers for a moment).
  async function reload({ first = 0 } = {}) {
    if (first) await new Promise((resolve) => setTimeout(resolve, first));
    while (!unmounted && !ended) {
      try {
        await request("POST", `${base}/load`, {});
      } catch (error) {
        if (error.status === 404) {
          endSession("This session has ended: the server no longer has it (it was deleted or "
            + "purged, or the server restarted with --session-journal memory), or another "
            + "principal made it.");
          return;
        }
        if (error.status) {
          endSession(`This session cannot be loaded: ${errorText(error)}.`);
          return;
        }
        say("The server is not answering; trying again…");
        await new Promise((resolve) => setTimeout(resolve, RELOAD_RETRY_MS));
        continue;
      }
      open({ fresh: true });   // replayed from the start once the stream opens
      return;
    }
  }

  function onEvent(type, event) {
    const data = event && event.data;
    if (replaying && CONTENT_EVENTS.has(type)) {   // the reloaded history replaces the old
      replaying = false;
      transcript.reset();
    }
    if (type === "state_resync_required") {
      pending.clear();
      renderPermissions();
    } else if (type === "permission_request") {
      pending.set(data.requestId, data);
      renderPermissions();
    } else if (type === "permission_resolved") {
      pending.delete(data.requestId);
      renderPermissions();
    }
    transcript.add(type, event);
    if (QUEUE_EVENTS.has(type)) refreshQueue();
    if (type === "replay_complete") state.textContent = "live";
    if (type === "session_closed" && data && data.reason === "shutdown") {
      disconnected("The server is shutting down; this page reconnects when it is back.");
      state.textContent = "reconnecting";
      state.className = "badge reconnecting";
      reload({ first: RELOAD_RETRY_MS });
      return "stop";
    }
    if (type === "session_closed" || type === "session_died") {
      const why = type === "session_died" ? `its agent died (${(data && (data.message || data.reason)) || "no reason given"})`
        : `it was closed (${(data && data.reason) || "closed"})`;
      // deleted (REST DELETE, /acp session/close or delete): nothing is kept to load
      const deleted = data && (data.reason === "client_close" || data.reason === "deleted");
      endSession(`This session has ended: ${why}.`, { again: !deleted });
      return "stop";
    }
    return undefined;
  }

  // fresh: the transcript so far stays until the new stream brings history to replace it.
  function open({ fresh = false } = {}) {
    if (stream) stream.stop();
    stream = follow(`${base}/events`, {
      lastEventId: 0,
      onEvent,
      onState: (s, error) => {
        if (unmounted || ended) return;
        state.textContent = s === "error" ? errorText(error) : s;
        state.className = `badge ${s}`;
        if (s === "live" && fresh) {
          fresh = false;
          replaying = true;
        }
        if (s === "live") {
          connected = true;
          sendButton.disabled = !mayPrompt;
          banner.hidden = true;
          if (document.activeElement === document.body && mayPrompt) input.focus();   // lost with the banner
          refreshQueue();
        } else if (s === "reconnecting") {
          disconnected("Connection to the server lost; reconnecting…");
        } else if (s === "error" && error.status === 404) {
          disconnected("The server does not have this session now; loading it…");
          reload();
        } else if (s === "error") {
          disconnected(`The event stream failed: ${errorText(error)}`);
        }
      },
    });
  }

  renderPermissions();
  open();
  // A first load, or a new session: straight to the prompt box. Opened from elsewhere
  // (a link, back, forward): the focus goes to the heading (app.js).
  if (!ctx.moved || ctx.focusPrompt) input.focus();
  ctx.focusPrompt = false;
  return () => {
    unmounted = true;
    if (stream) stream.stop();
  };
}
