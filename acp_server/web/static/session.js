// One session: the live transcript, the prompt box, cancel, the pending queue (drop a
// queued prompt), permission requests (the agent's options as buttons), and the 503 a
// full queue answers.
//
//   mount(root, [sessionId], { caps })
//
// The transcript is rebuilt from the event stream, replayed from the start on every
// load (Last-Event-ID: 0). state_resync_required (events lost: ring evicted, epoch
// reset, replay budget) clears it and says so; what the server replays after it is
// shown. Pending prompts are re-read from GET /session/{id}/pending-prompts whenever a
// queue event arrives.

import { follow, request } from "./api.js";
import { clear, errorText, h, limitText, shortId } from "./dom.js";
import { Transcript } from "./transcript.js";

const QUEUE_EVENTS = new Set(["pending_prompt_added", "pending_prompt_started", "pending_prompt_completed",
  "turn_complete", "turn_error", "prompt_cancelled", "replay_complete"]);

export function mount(root, [sessionId], { caps }) {
  const base = `/session/${encodeURIComponent(sessionId)}`;
  const limit = caps.limits ? caps.limits.maxPendingPromptsPerSession : null;
  const transcript = new Transcript();
  const depth = h("span", { class: "depth", testid: "queue-depth" }, `0 / ${limitText(limit)}`);
  const state = h("span", { class: "badge", testid: "stream-state" }, "connecting");
  const input = h("textarea", { testid: "prompt-input", rows: 3, placeholder: "Prompt (Ctrl+Enter sends)", "aria-label": "Prompt" });
  const refusal = h("div", { class: "refusal", testid: "prompt-error", role: "alert", hidden: true });
  const queue = h("ol", { class: "queue", testid: "pending-queue" });
  const permissions = h("div", { class: "permissions", testid: "permissions" });
  const pending = new Map();   // requestId -> permission_request data
  let closed = false;

  const send = async () => {
    const text = input.value;
    if (!text.trim()) return;
    refusal.hidden = true;
    try {
      await request("POST", `${base}/prompt`, { prompt: [{ type: "text", text }] });
      if (input.value === text) input.value = "";   // not what was typed meanwhile
    } catch (error) {
      showRefusal(error);
    }
    refreshQueue();
  };
  const cancel = async () => {
    try {
      await request("POST", `${base}/cancel`);
    } catch (error) {
      showRefusal(error);
    }
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) send();
  });

  function showRefusal(error) {
    const body = error.body || {};
    const retry = error.retryAfter ? ` Retry after ${error.retryAfter} s.` : "";
    const counts = body.limit !== undefined ? ` (${body.pendingCount} / ${body.limit} pending)` : "";
    clear(refusal, h("strong", {}, `${error.status || ""} ${error.code || ""}`.trim()), " ",
      `${error.message}${counts}.${retry}`);
    refusal.hidden = false;
  }

  root.append(
    h("section", { class: "toolbar" },
      h("h1", {}, "Session ", h("span", { class: "mono", title: sessionId }, shortId(sessionId))),
      h("span", {}, "Pending ", depth), state,
      h("a", { class: "button", href: "#/" }, "All sessions")),
    h("div", { class: "session-grid" },
      h("section", { class: "main-col" },
        transcript.node,
        h("div", { class: "composer" }, input,
          h("div", { class: "composer-actions" },
            h("button", { class: "primary", testid: "send-prompt", onclick: send }, "Send"),
            h("button", { testid: "cancel-prompt", onclick: cancel }, "Cancel running"))),
        refusal),
      h("aside", { class: "side-col" },
        h("h2", {}, "Permission requests"), permissions,
        h("h2", {}, "Pending queue"), queue)));

  function renderPermissions() {
    clear(permissions, pending.size === 0 ? h("p", { class: "empty" }, "None waiting.") : null,
      [...pending.values()].map((p) => h("div", { class: "permission", testid: "permission-request", dataset: { requestId: p.requestId } },
        h("p", {}, h("strong", {}, (p.toolCall && p.toolCall.title) || "Permission"),
          p.toolCall && p.toolCall.kind ? h("span", { class: "badge" }, p.toolCall.kind) : null),
        h("div", { class: "options" }, (p.options || []).map((o) => h("button", {
          class: o.kind && o.kind.startsWith("reject") ? "danger" : "primary",
          testid: "permission-option", dataset: { optionId: o.optionId },
          onclick: () => vote(p.requestId, o.optionId),
        }, o.name || o.optionId))))));
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

  let queueBusy = null;
  let queueAgain = false;
  async function refreshQueue() {
    if (closed) return;
    if (queueBusy) { queueAgain = true; return; }
    queueBusy = (async () => {
      do {
        queueAgain = false;
        try {
          const { pendingPrompts } = await request("GET", `${base}/pending-prompts`);
          depth.textContent = `${pendingPrompts.length} / ${limitText(limit)}`;
          clear(queue, pendingPrompts.length === 0 ? h("li", { class: "empty" }, "Nothing pending.") : null,
            pendingPrompts.map((p) => h("li", { testid: "pending-prompt", dataset: { promptId: p.promptId, state: p.state } },
              h("span", { class: `badge ${p.state}` }, p.state), " ", h("span", { class: "prompt-text" }, p.text),
              p.state === "queued"
                ? h("button", { class: "danger small", testid: "drop-prompt", dataset: { promptId: p.promptId }, onclick: () => drop(p.promptId) }, "Drop")
                : null)));
        } catch (error) {
          if (error.status === 404) closed = true;
        }
      } while (queueAgain && !closed);
      queueBusy = null;
    })();
  }

  const stream = follow(`${base}/events`, {
    lastEventId: 0,
    onState: (s, error) => {
      state.textContent = s === "error" ? errorText(error) : s;
      state.className = `badge ${s}`;
      if (s === "error") closed = true;
    },
    onEvent: (type, event) => {
      const data = event && event.data;
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
      if (type === "session_closed" || type === "session_died") {
        closed = true;
        state.textContent = "closed";
        input.disabled = true;
        return "stop";
      }
      return undefined;
    },
  });
  renderPermissions();
  refreshQueue();
  return () => {
    closed = true;
    stream.stop();
  };
}
