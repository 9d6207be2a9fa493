// The daemon view: limits in force, activity (GET /daemon/status)
// and the state of each agent, refreshed every two seconds.
//
//   mount(root, [], ctx)

import { request } from "./api.js";
import { clear, errorText, h, limitText, poll } from "./dom.js";

const REFRESH_MS = 2000;

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
      error.textContent = errorText(e);
      return;
    }
    error.textContent = "";
    const l = status.limits;
    const a = status.runtime.activity;
    const wait = status.runtime.perf.promptQueueWait || {};
    clear(limits, table([
      ["Sessions", limitText(l.maxSessions)],
      ["Pending prompts per session", limitText(l.maxPendingPromptsPerSession)],
      ["Prompt deadline (ms)", l.promptDeadlineMs ?? "none"],
      ["Event ring", l.eventRingSize],
      ["Idle timeout (ms)", l.sessionIdleTimeoutMs],
      ["Permission timeout (ms)", l.permissionResponseTimeoutMs || "wait forever"],
      ["Subscribers per session", l.maxSubscribersPerSession],
      ["Request body (bytes)", l.maxRequestBodyBytes],
    ]));
    clear(activity, table([
      ["Sessions", status.runtime.sessions.active],
      ["Pending prompts", a.pendingPrompts],
      ["Running prompts", a.activePrompts],
      ["Queued prompts", a.queuedPrompts],
      ["Waiting permissions", status.runtime.permissions.pending],
      ["Event streams", status.runtime.transport.restSseActive],
      ["Queue wait mean / max (ms)", `${(wait.meanMs || 0).toFixed(1)} / ${(wait.maxMs || 0).toFixed(1)}`],
      ["Uptime (s)", Math.round(status.daemon.uptimeMs / 1000)],
    ]));
    clear(agents, h("table", { class: "list" },
      h("thead", {}, h("tr", {}, ["Agent", "State", "Sessions", "Reports as"].map((t) => h("th", {}, t)))),
      h("tbody", {}, (status.agents || []).map((g) => h("tr", { testid: "agent-row", dataset: { agent: g.name, state: g.state } },
        h("td", {}, g.name, g.default ? h("span", { class: "badge" }, "default") : null),
        h("td", {}, h("span", { class: `badge ${g.state}` }, g.state.replace("_", " "))),
        h("td", { class: "num" }, g.sessions),
        h("td", {}, g.agentInfo ? `${g.agentInfo.name || ""} ${g.agentInfo.version || ""}` : "—"))))));
  }

  return poll(refresh, REFRESH_MS);
}
