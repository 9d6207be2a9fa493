// DOM and formatting helpers shared by the views.
//
//   root.append(h("button", { class: "primary", testid: "send-prompt", onclick: send }, "Send"));
//   ago(Date.parse(session.createdAt))   // "3 min"
//
// Text always goes in as text nodes (never innerHTML), so agent output cannot inject
// markup.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "testid") node.dataset.testid = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "class") node.className = value;
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// A table row whose cells carry their column's name (data-label): below 760 px the
// rows are stacked cards and each cell shows its name before it (style.css).
//   labelled(["Session", "Agent", ""], h("tr", {}, h("td", {}, …), …))
export function labelled(headers, row) {
  [...row.children].forEach((cell, i) => { if (headers[i]) cell.dataset.label = headers[i]; });
  return row;
}

export function ago(ms) {
  const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86400)} d`;
}

export function limitText(limit) {
  return limit === null || limit === undefined ? "∞" : String(limit);
}

export function shortId(id) {
  return id.length > 13 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id;
}

// "350 ms", "4.2 s", "30 min", "1 h 5 min", "2 d 3 h"; null/undefined as "—".
export function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const units = [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]];
  const parts = [];
  let rest = Math.round(s);
  for (const [name, size] of units) {
    if (rest >= size) {
      parts.push(`${Math.floor(rest / size)} ${name}`);
      rest %= size;
    }
  }
  return parts.slice(0, 2).join(" ");
}

// ACP tool kinds as a person reads them: a short label and what it means.
const TOOL_KINDS = {
  read: ["read", "reads files"], edit: ["edit", "changes files"], delete: ["delete", "deletes files"],
  move: ["move", "moves or renames files"], search: ["search", "searches files or the web"],
  execute: ["execute", "runs a command"], think: ["think", "reasons, changes nothing"],
  fetch: ["fetch", "fetches from the network"], switch_mode: ["switch mode", "changes the agent's mode"],
  other: ["unclassified tool", "the agent did not say what kind of tool this is (ACP kind \"other\"): read its title"],
};

export function toolKind(kind) {
  const [label, explain] = TOOL_KINDS[kind] || [kind, `ACP tool kind "${kind}"`];
  return { label, explain };
}

// A modal question; resolves true when the person confirms. The dialog is built once.
let confirmBox = null;
export function confirmAction(message, { ok = "OK", danger = false } = {}) {
  if (!confirmBox) {
    const text = h("p", { testid: "confirm-text" });
    const yes = h("button", { value: "yes", testid: "confirm-ok" });
    const no = h("button", { value: "no", testid: "confirm-cancel" }, "Cancel");
    confirmBox = { text, yes, no, dialog: h("dialog", { class: "confirm", testid: "confirm" },
      h("form", { method: "dialog" }, text, h("div", { class: "options" }, no, yes))) };
    document.body.append(confirmBox.dialog);
  }
  const { dialog, text, yes, no } = confirmBox;
  text.textContent = message;
  yes.textContent = ok;
  yes.className = danger ? "danger" : "primary";
  dialog.returnValue = "";
  dialog.showModal();
  no.focus();   // Enter does not confirm by accident
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
  });
}

// A list the server cannot be asked about now: said in `error` ("… the list below is
// from 14:02:11"), the list kept to read but inert (no button acts on what may be
// gone). stale(wrap, error, null) when the server answers again.
export function stale(wrap, error, failure, what = "list") {
  const since = wrap.dataset.since || new Date().toLocaleTimeString();
  wrap.inert = Boolean(failure);
  wrap.classList.toggle("stale", Boolean(failure));
  if (!failure) {
    delete wrap.dataset.since;
    error.textContent = "";
    return;
  }
  wrap.dataset.since = since;
  const text = failure.unreachable
    ? `${errorText(failure)} Retrying; the ${what} below is from ${since}.`
    : errorText(failure);
  if (error.textContent !== text) error.textContent = text;   // an alert said once, not per retry
}

export function time(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString();
}

// Re-runs fn every ms until the returned stop() is called; one run at a time. While fn
// fails (throws), the wait doubles, up to POLL_MAX_MS: a server that is down is asked
// less and less often, not every ms.
export const POLL_MAX_MS = 8000;
export function poll(fn, ms) {
  let timer = null;
  let stopped = false;
  let failures = 0;
  const tick = async () => {
    try {
      await fn();
      failures = 0;
    } catch (error) {
      failures += 1;   // fn says on the page what went wrong; a bug is logged too
      if (!stopped && !error.unreachable && !error.status) console.warn("refresh failed:", error);
    }
    if (!stopped) timer = setTimeout(tick, Math.min(ms * 2 ** failures, Math.max(ms, POLL_MAX_MS)));
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

export function errorText(error) {
  if (error && error.unreachable) return "The server is not answering (stopped, restarting, or the network is down).";
  if (error && error.status) {
    const code = error.code ? ` ${error.code}` : "";
    return `${error.status}${code}: ${error.message}${advice(error)}`;
  }
  return String(error && error.message ? error.message : error);
}

// Whether the tab's principal (ctx.me, from GET /whoami) has a scope; true when the
// server did not say (an older server): the server decides anyway.
export function can(ctx, scope) {
  const scopes = ctx && ctx.me && ctx.me.scopes;
  return !scopes || scopes.includes(scope) || scopes.includes("admin");
}

// What a person can do about a refusal of the principals (401, 403, 429).
function advice(error) {
  const body = error.body || {};
  if (error.status === 401) return " Enter a valid token (Change token).";
  if (error.status === 403 && (body.requiredScope || body.required_scope)) {
    const scope = body.requiredScope || body.required_scope;
    return ` Your token cannot do this: ask an admin for one with the "${scope}" scope.`;
  }
  if (error.status === 429 && error.code === "rate_limit_exceeded") {
    const wait = error.retryAfter ? ` Retry in ${error.retryAfter} s.` : "";
    return ` (${body.tier || "rate"} limit)${wait}`;
  }
  return "";
}

// Keyed list update: rows whose signature is unchanged stay the same DOM nodes (so a
// click or a focus is not lost to a refresh); others are rendered again; order follows
// items. render(item) returns the row; sig(item) a string.
export function reconcile(parent, items, key, render, sig, empty) {
  const old = new Map();
  for (const node of parent.children) if (node.dataset.key) old.set(node.dataset.key, node);
  const rows = items.map((item) => {
    const k = key(item);
    const s = sig(item);
    const existing = old.get(k);
    if (existing && existing.dataset.sig === s) return existing;
    const node = render(item);
    node.dataset.key = k;
    node.dataset.sig = s;
    return node;
  });
  if (rows.length === 0) {
    if (!parent.querySelector(".empty-row")) parent.replaceChildren(empty);
    return;
  }
  rows.forEach((node, i) => {
    if (parent.children[i] !== node) parent.insertBefore(node, parent.children[i] || null);
  });
  while (parent.children.length > rows.length) parent.lastElementChild.remove();
}
