// The daemon view: limits in force, activity (GET /daemon/status)
// and the state of each agent, refreshed every two seconds; durations in human units.
//
//   mount(root, [], ctx)

import { request } from "./api.js";
import { clear, duration, errorText, h, labelled, limitText, poll } from "./dom.js";

const REFRESH_MS = 2000;
const AGENT_COLUMNS = ["Agent", "State", "Sessions", "Reports as"];

function bytes(n) {
  if (n === null || n === undefined) return "—";
  if (n >= 1024 * 1024) return `${(n / 1024 / 1024).toFixed(n % (1024 * 1024) ? 1 : 0)} MiB`;
  if (n >= 1024) return `${Math.round(n / 1024)} KiB`;
  return `${n} bytes`;
}

function table(rows) {
  return h("table", { class: "kv" }, h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", { class: "num" }, v)))));
}

export function mount(root) {
  const limits = h("div");
  const activity = h("div", { testid: "daemon-activity" });
  const agents = h("div", { testid: "daemon-agents" });
  const error = h("p", { class: "error" });
  root.append(h("section", { class: "toolbar" }, h("h1", {}, "Daemon")), error,
    h("div", { class: "cards" },
      h("section", { class: "card" }, h("h2", {}, "Activity"), activity),
      h("section", { class: "card" }, h("h2", {}, "Agents"), agents),
      h("section", { class: "card" }, h("h2", {}, "Limits"), limits)));

  async function refresh() {
    let status;
    try {
      status = await request("GET", "/daemon/status");
    } catch (e) {
      error.textContent = e.unreachable ? `${errorText(e)} Retrying; the figures below are old.` : errorText(e);
      throw e;   // poll asks less often while it fails
    }
    error.textContent = "";
    const l = status.limits;
    const a = status.runtime.activity;
    const wait = status.runtime.perf.promptQueueWait || {};
    clear(limits, table([
      ["Sessions", limitText(l.maxSessions)],
      ["Pending prompts per session", limitText(l.maxPendingPromptsPerSession)],
      ["Prompt deadline", l.promptDeadlineMs ? duration(l.promptDeadlineMs) : "none"],
      ["Event ring", `${l.eventRingSize} events`],
      ["Idle sessions closed after", l.sessionIdleTimeoutMs ? duration(l.sessionIdleTimeoutMs) : "never"],
      ["Permission timeout", l.permissionResponseTimeoutMs ? duration(l.permissionResponseTimeoutMs) : "wait forever"],
      ["Subscribers per session", l.maxSubscribersPerSession],
      ["Request body", bytes(l.maxRequestBodyBytes)],
    ]));
    clear(activity, table([
      ["Sessions", status.runtime.sessions.active],
      ["Pending prompts", a.pendingPrompts],
      ["Running prompts", a.activePrompts],
      ["Queued prompts", a.queuedPrompts],
      ["Waiting permissions", status.runtime.permissions.pending],
      ["Event streams", status.runtime.transport.restSseActive],
      ["Queue wait mean / max", `${duration(wait.meanMs || 0)} / ${duration(wait.maxMs || 0)}`],
      ["Up for", duration(status.daemon.uptimeMs)],
    ]));
    clear(agents, h("table", { class: "list" },
      h("thead", {}, h("tr", {}, AGENT_COLUMNS.map((t) => h("th", {}, t)))),
      h("tbody", {}, (status.agents || []).map((g) => labelled(AGENT_COLUMNS, h("tr", { testid: "agent-row", dataset: { agent: g.name, state: g.state } },
        h("td", {}, g.name, g.default ? h("span", { class: "badge" }, "default") : null),
        h("td", {}, h("span", { class: `badge ${g.state}` }, g.state.replace("_", " "))),
        h("td", { class: "num" }, g.sessions),
        h("td", {}, g.agentInfo ? `${g.agentInfo.name || ""} ${g.agentInfo.version || ""}` : "—")))))));
  }

  return poll(refresh, REFRESH_MS);
}
