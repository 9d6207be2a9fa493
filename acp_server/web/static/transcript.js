// A session transcript built from bus events, rendered as text.
//
//   const transcript = new Transcript();
//   root.append(transcript.node);
//   transcript.add("session_update", envelope);   // any event type; unknown ones are ignored
//
// Consecutive chunks of one kind (user, agent, thought) of one prompt join one block;
// tool calls are one block each, updated in place by tool_call_update; a plan replaces
// the prompt's previous plan; turn ends, errors, cancels and permission outcomes are
// one-line notes. state_resync_required empties the transcript and leaves a notice.

import { clear, h } from "./dom.js";

const CHUNKS = { user_message_chunk: "user", agent_message_chunk: "agent", agent_thought_chunk: "thought" };
const LABELS = { user: "You", agent: "Agent", thought: "Thinking" };

function contentText(content) {
  if (!content) return "";
  if (content.type === "text") return content.text || "";
  if (content.type === "resource_link") return `[${content.name || content.uri}]`;
  if (content.type === "resource") return `[resource ${content.resource && content.resource.uri}]`;
  return `[${content.type}]`;
}

export class Transcript {
  constructor() {
    this.node = h("div", { class: "transcript", testid: "transcript", role: "log" });
    this.node.addEventListener("scroll", () => {
      const n = this.node;
      this.atEnd = n.scrollHeight - n.scrollTop - n.clientHeight < 80;
    });
    this.reset();
  }

  reset() {
    clear(this.node);
    this.last = null;      // { kind, promptId, text node }
    this.tools = new Map();
    this.plans = new Map();
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

  note(text, cls = "note", testid = undefined) {
    this.last = null;
    this.node.append(h("p", { class: cls, testid }, text));
    this.scroll();
  }

  add(type, event) {
    const data = (event && event.data) || {};
    const promptId = event && event.promptId;
    switch (type) {
      case "session_update": this.update(data.update || {}, promptId); break;
      case "turn_complete": this.note(`turn ended: ${data.stopReason}`); break;
      case "turn_error": this.note(`turn failed: ${data.code}: ${data.message}`, "note error"); break;
      case "prompt_cancelled": this.note(`prompt cancelled${data.reason ? ` (${data.reason})` : ""}`); break;
      case "permission_request":
        this.note(`permission asked: ${(data.toolCall && data.toolCall.title) || data.requestId}`); break;
      case "permission_resolved": {
        const o = data.outcome || {};
        this.note(`permission ${o.outcome === "selected" ? o.optionId : o.outcome || "resolved"}`);
        break;
      }
      case "elicitation_request": this.note(`input asked: ${data.message || data.requestId}`); break;
      case "elicitation_resolved":
        this.note(`input ${data.action || "resolved"}${data.reason ? ` (${data.reason})` : ""}`); break;
      case "session_closed": this.note(`session closed (${data.reason})`, "note error"); break;
      case "session_died": this.note(`agent died: ${data.message || data.reason}`, "note error"); break;
      case "state_resync_required":
        this.reset();
        this.note(`Events before #${data.earliestAvailableId} are no longer available (${data.reason}); `
          + "the transcript starts there.", "notice", "resync-notice");
        break;
      case "client_evicted": this.note("this page fell behind the stream; reconnecting", "note error"); break;
      default: break;
    }
  }

  update(u, promptId) {
    const kind = CHUNKS[u.sessionUpdate];
    if (kind) {
      this.chunk(kind, promptId, contentText(u.content));
    } else if (u.sessionUpdate === "tool_call" || u.sessionUpdate === "tool_call_update") {
      this.tool(u);
    } else if (u.sessionUpdate === "plan") {
      this.plan(u, promptId);
    }
  }

  chunk(kind, promptId, text) {
    const last = this.last;
    if (last && last.kind === kind && last.promptId === promptId) {
      last.text.appendData(text);
    } else {
      const body = document.createTextNode(text);
      this.node.append(h("div", { class: `msg ${kind}`, testid: `msg-${kind}` },
        h("span", { class: "who" }, LABELS[kind]), h("div", { class: "text" }, body)));
      this.last = { kind, promptId, text: body };
    }
    this.scroll();
  }

  tool(u) {
    let block = this.tools.get(u.toolCallId);
    if (!block) {
      block = {
        title: h("span", { class: "title" }), status: h("span", { class: "badge" }),
        kind: h("span", { class: "kind" }),
      };
      block.node = h("div", { class: "tool", testid: "tool-call", dataset: { toolCallId: u.toolCallId } },
        h("span", { class: "who" }, "Tool"), block.title, block.kind, block.status);
      this.tools.set(u.toolCallId, block);
      this.node.append(block.node);
      this.last = null;
    }
    if (u.title) block.title.textContent = u.title;
    if (u.kind) block.kind.textContent = u.kind;
    if (u.status) {
      block.status.textContent = u.status;
      block.status.className = `badge ${u.status}`;
      block.node.dataset.status = u.status;
    }
    this.scroll();
  }

  plan(u, promptId) {
    const items = (u.entries || []).map((e) => h("li", { class: e.status }, `${e.content} — ${e.status}`));
    const old = this.plans.get(promptId);
    const node = h("div", { class: "plan", testid: "plan" }, h("span", { class: "who" }, "Plan"), h("ol", {}, items));
    if (old) old.replaceWith(node);
    else this.node.append(node);
    this.plans.set(promptId, node);
    this.last = null;
    this.scroll();
  }
}
