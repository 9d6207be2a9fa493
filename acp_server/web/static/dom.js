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

export function time(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString();
}

// Re-runs fn every ms until the returned stop() is called; one run at a time.
export function poll(fn, ms) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    try {
      await fn();
    } catch (error) {
      if (!stopped) console.warn("refresh failed:", error.message);
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

export function errorText(error) {
  if (error && error.status) {
    const code = error.code ? ` ${error.code}` : "";
    return `${error.status}${code}: ${error.message}`;
  }
  return String(error && error.message ? error.message : error);
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
