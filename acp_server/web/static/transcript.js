// A session transcript built from bus events, one block per prompt.
//
//   const transcript = new Transcript();
//   root.append(transcript.node);
//   transcript.add("session_update", envelope);   // any event type; unknown ones are ignored
//
// Contracts: every event carrying a promptId is shown inside that prompt's block
// (section.turn, data-prompt-id, data-state queued | running | completed | cancelled |
// failed | dropped), created by the prompt's first event, so a queued prompt's events
// never land under the running one. A queued prompt shows its text until it starts;
// one dropped from the queue is marked dropped (it never ran), not as a cancelled
// turn. Events without a promptId (a loaded session's history) go to a block of
// their own after the last one. Inside a block, consecutive chunks of one kind (user,
// agent, thought) join one message; agent messages are Markdown (markdown.js),
// re-rendered once per frame and only the message that is streaming; tool calls are
// one block each, updated in place; a plan replaces the prompt's previous plan.
// state_resync_required empties the transcript and leaves a notice.
//
// For a screen reader the transcript is a log (role="log": what is added is read); an
// agent message is aria-busy while it streams (re-rendered once per frame, it would
// otherwise be read again and again) and read once whole: when the turn ends or
// another block follows it. Message text is dir="auto" (and each Markdown block), so
// right-to-left text reads right to left.

import { clear, h, toolKind } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const CHUNKS = { user_message_chunk: "user", agent_message_chunk: "agent", agent_thought_chunk: "thought" };
const LABELS = { user: "You", agent: "Agent", thought: "Thinking" };
const TURN_EVENTS = new Set(["pending_prompt_added", "pending_prompt_started", "session_update",
  "prompt_cancelled", "turn_complete", "turn_error", "permission_request", "permission_resolved",
  "elicitation_request", "elicitation_resolved"]);

function contentText(content) {
  if (!content) return "";
  if (content.type === "text") return content.text || "";
  if (content.type === "resource_link") return `[${content.name || content.uri}]`;
  if (content.type === "resource") return `[resource ${content.resource && content.resource.uri}]`;
  return `[${content.type}]`;
}

class Turn {
  constructor(promptId) {
    this.promptId = promptId;
    this.node = h("section", { class: "turn", testid: "turn", dataset: { promptId: promptId || "", state: "" } });
    this.last = null;        // the message chunks join: { kind, body, source }
    this.tools = new Map();
    this.plan = null;
    this.queued = null;      // the queued prompt's text, until it starts
  }

  get state() { return this.node.dataset.state; }

  set state(value) { this.node.dataset.state = value; }

  append(node) {
    this.settle();
    this.node.append(node);
    this.last = null;
  }

  // The streaming message is done (another block follows it, or the turn ended): a
  // screen reader may read it now (aria-busy false).
  settle() {
    if (this.last && this.last.kind === "agent") this.last.node.setAttribute("aria-busy", "false");
  }

  note(text, cls = "note", testid = undefined) {
    this.append(h("p", { class: cls, testid }, text));
  }
}

export class Transcript {
  constructor() {
    this.node = h("div", { class: "transcript", testid: "transcript", role: "log" });
    this.node.addEventListener("scroll", () => {
      const n = this.node;
      this.atEnd = n.scrollHeight - n.scrollTop - n.clientHeight < 80;
    });
    this.dirty = new Set();   // agent messages waiting for their next render
    this.reset();
  }

  reset() {
    clear(this.node);
    this.turns = new Map();
    this.loose = null;
    this.dirty.clear();
  }

  // Follows the end when the reader is at the end; once per frame, however many events.
  scroll() {
    if (this.scrolling) return;
    this.scrolling = true;
    const n = this.node;
    const atEnd = this.atEnd !== false;
    requestAnimationFrame(() => {
      this.scrolling = false;
      if (atEnd) n.scrollTop = n.scrollHeight;
    });
  }

  turn(promptId) {
    if (!promptId) {
      if (!this.loose || this.node.lastElementChild !== this.loose.node) {
        this.loose = new Turn(null);
        this.node.append(this.loose.node);
      }
      return this.loose;
    }
    let turn = this.turns.get(promptId);
    if (!turn) {
      turn = new Turn(promptId);
      this.turns.set(promptId, turn);
      this.node.append(turn.node);
    }
    return turn;
  }

  // A note of the session itself (the stream, its end), after every block.
  note(text, cls = "note", testid = undefined) {
    this.loose = null;
    this.node.append(h("p", { class: cls, testid }, text));
    this.scroll();
  }

  add(type, event) {
    const data = (event && event.data) || {};
    if (type === "state_resync_required") {
      this.reset();
      this.note(`Events before #${data.earliestAvailableId} are no longer available (${data.reason}); `
        + "the transcript starts there.", "notice", "resync-notice");
      return;
    }
    if (type === "replay_complete") {   // history is whole but for a turn still running
      for (const node of this.node.querySelectorAll('[aria-busy="true"]')) {
        if (!node.closest('[data-state="running"]')) node.setAttribute("aria-busy", "false");
      }
      return;
    }
    if (type === "client_evicted") {
      this.note("this page fell behind the stream; reconnecting", "note error");
      return;
    }
    if (type === "agent_abandoned") {   // a turn its agent never ended: given up on
      this.note(data.message || `the agent was given up on (${data.action})`, "notice",
        "abandoned-notice");
      return;
    }
    if (!TURN_EVENTS.has(type)) return;   // session_closed and the like: the view says it
    const promptId = (event && event.promptId) || data.promptId || null;
    const turn = this.turn(promptId);
    switch (type) {
      case "pending_prompt_added": this.queue(turn, data.text); break;
      case "pending_prompt_started": this.start(turn); break;
      case "session_update": this.update(turn, data.update || {}); break;
      case "prompt_cancelled": this.cancelled(turn, data.reason); break;
      case "turn_complete":
        if (turn.state === "dropped") break;
        turn.settle();
        turn.state = data.stopReason === "cancelled" ? "cancelled" : "completed";
        turn.note(`turn ended: ${data.stopReason}`);
        break;
      case "turn_error":
        turn.settle();
        turn.state = "failed";
        turn.note(`turn failed: ${data.code}: ${data.message}`, "note error");
        break;
      case "permission_request":
        turn.note(`permission asked: ${(data.toolCall && data.toolCall.title) || data.requestId}`); break;
      case "permission_resolved": {
        const o = data.outcome || {};
        turn.note(`permission ${o.outcome === "selected" ? o.optionId : o.outcome || "resolved"}`);
        break;
      }
      case "elicitation_request":
        turn.note(`input asked: ${data.message || data.requestId}`); break;
      case "elicitation_resolved":
        turn.note(`input ${data.action || "resolved"}${data.reason ? ` (${data.reason})` : ""}`); break;
      default: break;
    }
    this.scroll();
  }

  queue(turn, text) {
    turn.state = "queued";
    turn.queued = h("div", { class: "msg user queued", testid: "msg-queued" },
      h("span", { class: "who" }, "You ", h("span", { class: "badge queued" }, "queued")),
      h("div", { class: "text", dir: "auto" }, text || ""));
    turn.append(turn.queued);
  }

  start(turn) {
    turn.state = "running";
    if (turn.queued) turn.queued.remove();
    turn.queued = null;
  }

  // "removed" is the server's word for a prompt dropped while queued: a drop even
  // when this page never saw the prompt queued (it opened after a resync).
  cancelled(turn, reason) {
    if (turn.state === "queued" || (reason === "removed" && turn.state !== "running")) {
      turn.state = "dropped";
      if (turn.queued) {
        turn.queued.classList.replace("queued", "dropped");
        turn.queued.dataset.testid = "msg-dropped";
        const badge = turn.queued.querySelector(".badge");
        badge.textContent = "dropped";
        badge.className = "badge dropped";
      }
      turn.note("dropped from the queue before it ran", "note", "turn-dropped");
    } else {
      turn.note(`cancel requested${reason && reason !== "cancelled" ? ` (${reason})` : ""}`);
    }
  }

  update(turn, u) {
    const kind = CHUNKS[u.sessionUpdate];
    if (kind) {
      if (!turn.state) turn.state = turn.promptId ? "running" : "";
      if (kind === "user" && turn.queued) this.start(turn);
      this.chunk(turn, kind, contentText(u.content));
    } else if (u.sessionUpdate === "tool_call" || u.sessionUpdate === "tool_call_update") {
      this.tool(turn, u);
    } else if (u.sessionUpdate === "plan") {
      this.plan(turn, u);
    }
  }

  chunk(turn, kind, text) {
    let last = turn.last;
    if (!last || last.kind !== kind) {
      const body = h("div", { class: kind === "agent" ? "text markdown" : "text", dir: "auto" });
      const node = h("div", { class: `msg ${kind}`, testid: `msg-${kind}`, "aria-busy": kind === "agent" ? "true" : null },
        h("span", { class: "who" }, LABELS[kind]), body);
      turn.append(node);
      last = turn.last = { kind, body, node, source: "" };
    }
    last.source += text;
    if (kind === "agent") this.render(last);
    else last.body.textContent = last.source;
  }

  // Markdown of the streaming message, at most once per frame.
  render(message) {
    this.dirty.add(message);
    if (this.rendering) return;
    this.rendering = true;
    requestAnimationFrame(() => {
      this.rendering = false;
      for (const m of this.dirty) renderMarkdown(m.body, m.source);
      this.dirty.clear();
      this.scroll();
    });
  }

  tool(turn, u) {
    let block = turn.tools.get(u.toolCallId);
    if (!block) {
      block = { title: h("span", { class: "title" }), status: h("span", { class: "badge" }), kind: h("span", { class: "kind" }) };
      block.node = h("div", { class: "tool", testid: "tool-call", dataset: { toolCallId: u.toolCallId } },
        h("span", { class: "who" }, "Tool"), block.title, block.kind, block.status);
      turn.tools.set(u.toolCallId, block);
      turn.append(block.node);
    }
    if (u.title) block.title.textContent = u.title;
    if (u.kind) {
      const kind = toolKind(u.kind);
      block.kind.textContent = kind.label;
      block.kind.title = kind.explain;
    }
    if (u.status) {
      block.status.textContent = u.status;
      block.status.className = `badge ${u.status}`;
      block.node.dataset.status = u.status;
    }
  }

  plan(turn, u) {
    turn.settle();
    const items = (u.entries || []).map((e) => h("li", { class: e.status }, `${e.content} — ${e.status}`));
    const node = h("div", { class: "plan", testid: "plan" }, h("span", { class: "who" }, "Plan"), h("ol", {}, items));
    if (turn.plan) turn.plan.replaceWith(node);
    else turn.append(node);
    turn.plan = node;
    turn.last = null;
  }
}
