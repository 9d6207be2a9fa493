// The sessions view: every live session with its queue against the cap; create
// (choosing the agent, then into the new session), open and delete (after a yes).
//
//   mount(root, [], { caps })  // polls GET /workspace/{id}/sessions every second
//
// While the server does not answer, the page says so (not "Failed to fetch"), asks
// less often (poll's backoff), and keeps the last lists to read but inert: no Open,
// Delete or Load again on rows that may be gone.
//
// Sessions made by programs (an "origin": LMSP tasks, conformance runs) are hidden
// unless "Show sessions made by programs" is ticked (kept for the tab); their rows
// carry the origin as a badge. An admin sees every principal's sessions, each marked
// with its owner when it is not the admin's own; a token without the "prompt" scope
// gets no New session or Delete, and says why; a refused listing says what to do.
//
// Under the live ones, "Ended": the newest 100 sessions the server keeps closed (their
// agent died, the idle timeout closed them; GET /workspace/{id}/ended-sessions, read
// every ENDED_EVERY refreshes). Opening one loads it again (the session page's load:
// the agent started again with the conversation); Delete removes it for good (after a
// yes); a read-only token only sees them.

import { request } from "./api.js";
import { ago, can, confirmAction, errorText, h, labelled, limitText, poll, reconcile, shortId, stale } from "./dom.js";

const REFRESH_MS = 1000;
const ENDED_EVERY = 5;   // refreshes between two reads of the ended sessions
const SHOW_ALL_KEY = "acp-server.sessions.all";
const LIVE_COLUMNS = ["Session", "Agent", "Pending / limit", "Running prompt", "Subscribers", "Age", ""];
const ENDED_COLUMNS = ["Session", "Agent", "Ended", ""];

export function mount(root, _params, ctx) {
  const { caps } = ctx;
  const me = ctx.me ? ctx.me.name : null;
  const mayPrompt = can(ctx, "prompt");
  const agents = (caps.agents && caps.agents.available) || ["reference"];
  const workspace = caps.workspaces && caps.workspaces[0] ? caps.workspaces[0].id : null;
  const select = h("select", { testid: "agent-select", "aria-label": "Agent" },
    agents.map((name) => h("option", { value: name, selected: caps.agents && name === caps.agents.default }, name)));
  const status = h("p", { class: "error", testid: "sessions-error" });
  const listError = h("p", { class: "error", testid: "list-error", role: "alert" });
  const body = h("tbody");
  const endedBody = h("tbody");
  const endedError = h("p", { class: "error", testid: "ended-error", role: "alert" });
  const endedMore = h("p", { class: "hint", testid: "ended-more", hidden: true },
    "Only the newest 100 are shown.");
  let endedCountdown = 0;
  const showAll = h("input", { type: "checkbox", testid: "show-all-sessions",
    checked: sessionStorage.getItem(SHOW_ALL_KEY) === "1" });
  const hiddenCount = h("span", { class: "hint", testid: "hidden-sessions" });
  showAll.addEventListener("change", () => {
    sessionStorage.setItem(SHOW_ALL_KEY, showAll.checked ? "1" : "0");
    refresh();
  });
  const create = async () => {
    status.textContent = "";
    try {
      const created = await request("POST", "/session", { sessionScope: "thread", agent: select.value });
      ctx.focusPrompt = true;   // into it to write: the prompt box has the focus, not the heading
      location.hash = `#/session/${encodeURIComponent(created.sessionId)}`;
    } catch (error) {
      status.textContent = errorText(error);
    }
  };
  let liveWrap = null;
  let endedWrap = null;
  root.append(
    h("section", { class: "toolbar" },
      h("h1", {}, "Sessions"),
      h("label", {}, "Agent ", select),
      h("button", { class: "primary", testid: "new-session", onclick: create, disabled: !mayPrompt,
        title: mayPrompt ? null : "needs the prompt scope" }, "New session"),
      mayPrompt ? null : h("span", { class: "hint", testid: "scope-hint" },
        "This token may only read: creating, prompting and deleting need the \"prompt\" scope."),
      h("label", { class: "filter" }, showAll, " Show sessions made by programs ", hiddenCount)),
    status, listError,
    liveWrap = h("div", { class: "table-wrap" },
      h("table", { class: "list", testid: "live-sessions" },
        h("thead", {}, h("tr", {},
          LIVE_COLUMNS.map((t) => h("th", {}, t)))),
        body)),
    h("h2", {}, "Ended"),
    h("p", { class: "hint" },
      "Closed but kept: their agent died, they were idle, or the /acp client that made them left. Load one again to go on with it."),
    endedError,
    endedWrap = h("div", { class: "table-wrap" },
      h("table", { class: "list", testid: "ended-sessions" },
        h("thead", {}, h("tr", {}, ENDED_COLUMNS.map((t) => h("th", {}, t)))),
        endedBody)),
    endedMore);

  const remove = async (id) => {
    if (!await confirmAction(`Delete session ${shortId(id)}? Its running and queued prompts are `
      + "cancelled and its history is gone.", { ok: "Delete", danger: true })) return;
    try {
      await request("DELETE", `/session/${encodeURIComponent(id)}`);
    } catch (error) {
      if (error.status !== 404) status.textContent = errorText(error);
    }
    await refresh();
  };

  const row = (s) => labelled(LIVE_COLUMNS, h("tr", { testid: "session-row", dataset: { sessionId: s.sessionId } },
    h("td", { class: "mono" }, h("a", { href: `#/session/${encodeURIComponent(s.sessionId)}`, title: s.sessionId }, shortId(s.sessionId)),
      s.origin ? h("span", { class: "badge origin", testid: "row-origin", title: "made by a program, not a person" }, s.origin) : null,
      s.owner && s.owner !== me ? h("span", { class: "badge owner", testid: "row-owner", title: "made by this principal" }, s.owner) : null),
    h("td", {}, s.agent),
    h("td", { class: "num", testid: "row-pending" }, `${s.pendingPrompts} / ${limitText(s.maxPendingPrompts)}`),
    h("td", { class: "prompt-text", dir: s.activePromptText ? "auto" : null }, s.activePromptText || (s.isWaitingForPermission ? "waiting for approval" : "—"),
      s.isWaitingForPermission ? h("span", { class: "badge warn" }, "approval") : null),
    h("td", { class: "num" }, String(s.subscribers)),
    h("td", { testid: "row-age", dataset: { created: s.createdAt } }, ago(Date.parse(s.createdAt))),
    h("td", { class: "actions" },
      h("a", { class: "button", href: `#/session/${encodeURIComponent(s.sessionId)}`, testid: "open-session",
        "aria-label": `Open session ${shortId(s.sessionId)}` }, "Open"),
      mayPrompt ? h("button", { class: "danger", testid: "delete-session", "aria-label": `Delete session ${shortId(s.sessionId)}`,
        onclick: () => remove(s.sessionId) }, "Delete") : null)));

  const endedRow = (s) => labelled(ENDED_COLUMNS, h("tr", { testid: "ended-row", dataset: { sessionId: s.sessionId } },
    h("td", { class: "mono" }, h("span", { title: s.sessionId }, shortId(s.sessionId)),
      s.origin ? h("span", { class: "badge origin", title: "made by a program, not a person" }, s.origin) : null,
      s.owner && s.owner !== me ? h("span", { class: "badge owner", title: "made by this principal" }, s.owner) : null),
    h("td", {}, s.agent),
    h("td", { testid: "ended-age", dataset: { ended: s.endedAt } }, ago(Date.parse(s.endedAt))),
    h("td", { class: "actions" }, mayPrompt
      ? [h("a", { class: "button", href: `#/session/${encodeURIComponent(s.sessionId)}`, testid: "load-ended",
        title: "starts its agent again with the conversation", "aria-label": `Load again: session ${shortId(s.sessionId)}` }, "Load again"),
        h("button", { class: "danger", testid: "delete-ended", "aria-label": `Delete ended session ${shortId(s.sessionId)}`,
          onclick: () => removeEnded(s.sessionId) }, "Delete")]
      : h("span", { class: "hint" }, "loading needs the prompt scope"))));

  const removeEnded = async (id) => {
    if (!await confirmAction(`Delete session ${shortId(id)}? Its conversation is gone for good.`,
      { ok: "Delete", danger: true })) return;
    try {
      await request("DELETE", `/session/${encodeURIComponent(id)}`);
    } catch (error) {
      if (error.status !== 404) endedError.textContent = errorText(error);
    }
    await refreshEnded();
  };

  async function refreshEnded() {
    let page;
    try {
      page = await request("GET", `/workspace/${workspace}/ended-sessions?size=100`);
    } catch (error) {
      stale(endedWrap, endedError, error);
      return;
    }
    stale(endedWrap, endedError, null);
    endedMore.hidden = !page.nextCursor;
    reconcile(endedBody, page.sessions, (s) => s.sessionId, endedRow,
      (s) => JSON.stringify([s.agent, s.endedAt, s.origin, s.owner]),
      h("tr", { class: "empty-row" }, h("td", { colspan: 4, class: "empty" }, "No ended session kept.")));
  }

  async function refresh() {
    if (!workspace) return;
    if (endedCountdown-- <= 0) {
      endedCountdown = ENDED_EVERY - 1;
      await refreshEnded();
    }
    const sessions = [];
    let cursor = null;
    try {
      do {
        const query = cursor ? `?size=100&cursor=${encodeURIComponent(cursor)}` : "?size=100";
        const page = await request("GET", `/workspace/${workspace}/sessions${query}`);
        sessions.push(...page.sessions);
        cursor = page.nextCursor || null;
      } while (cursor);
    } catch (error) {
      stale(liveWrap, listError, error);
      if (error.unreachable) endedCountdown = 0;   // read both again once it answers
      throw error;
    }
    stale(liveWrap, listError, null);
    const hidden = showAll.checked ? 0 : sessions.filter((s) => s.origin).length;
    hiddenCount.textContent = hidden ? `(${hidden} hidden)` : "";
    const shown = showAll.checked ? sessions : sessions.filter((s) => !s.origin);
    reconcile(body, shown, (s) => s.sessionId, row,
      (s) => JSON.stringify([s.agent, s.pendingPrompts, s.maxPendingPrompts, s.activePromptText,
        s.isWaitingForPermission, s.subscribers, s.origin, s.owner]),
      h("tr", { class: "empty-row" }, h("td", { colspan: 7, class: "empty" }, "No live session. Create one above.")));
    for (const cell of body.querySelectorAll("[data-testid=row-age]")) {
      cell.textContent = ago(Date.parse(cell.dataset.created));
    }
    for (const cell of endedBody.querySelectorAll("[data-testid=ended-age]")) {
      cell.textContent = ago(Date.parse(cell.dataset.ended));
    }
  }

  return poll(refresh, REFRESH_MS);
}
