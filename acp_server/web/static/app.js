// The console's entry: asks for the token when the daemon wants one, loads
// /capabilities, shows who the tab is (/whoami: its principal and scopes, and a
// "Change token" button), then routes on the URL fragment to one view at a time.
// Views read ctx.me ({name, kind, scopes}, or null) to offer only what the token may do.
//
//   #/               sessions        #/session/ID    one session
//   #/tasks          LMSP tasks      #/task/ID       one task
//   #/daemon         limits, activity, agents
//
// A view is mount(root, params, ctx) returning a function that stops everything it
// started (streams, timers); ctx = { caps, me, moved } (the /capabilities and /whoami
// bodies; moved: the person went to this view from another, not a first load).
//
// Each view names the tab ("Session 1a2b3c4d…9f0e — acp-server", so tabs and history
// entries differ). Going to a view (a link, the nav, back or forward) puts the focus
// on its heading, unless the view took it itself, and says the view's name in the
// page's one polite live region (#announcer), so a screen reader hears where it is.

import { request, setToken, token } from "./api.js";
import { clear, errorText, h, shortId } from "./dom.js";
import * as daemon from "./daemon.js";
import * as session from "./session.js";
import * as sessions from "./sessions.js";
import * as task from "./task.js";
import * as tasks from "./tasks.js";

const ROUTES = [
  [/^#?\/?$/, sessions, "sessions", () => "Sessions"],
  [/^#\/session\/([^/]+)$/, session, "sessions", (id) => `Session ${shortId(id)}`],
  [/^#\/tasks$/, tasks, "tasks", () => "Tasks"],
  [/^#\/task\/([^/]+)$/, task, "tasks", (id) => `Task ${shortId(id)}`],
  [/^#\/daemon$/, daemon, "daemon", () => "Daemon"],
];

const view = document.getElementById("view");
const dialog = document.getElementById("token-dialog");
const announcer = document.getElementById("announcer");
let unmount = null;
let ctx = null;
let asking = null;
let cancellable = false;   // the question open may be dismissed (Change token)

// Asks for a token; resolves true once one is entered. mayCancel (Change token): Escape
// or Cancel closes the question, resolves false, and the token in use stays.
function askToken(message = "", { mayCancel = false } = {}) {
  if (asking) {
    if (!dialog.open) dialog.showModal();   // closed with Escape: the question stands
    return asking;
  }
  document.getElementById("token-error").textContent = message;
  const input = document.getElementById("token-input");
  const cancel = document.getElementById("token-cancel");
  input.value = "";
  cancellable = mayCancel;
  cancel.hidden = !mayCancel;
  asking = new Promise((resolve) => {
    const form = document.getElementById("token-form");
    const done = (entered) => {
      form.removeEventListener("submit", submit);
      dialog.removeEventListener("close", closed);
      cancellable = false;
      asking = null;
      resolve(entered);
    };
    const submit = (event) => {
      event.preventDefault();
      setToken(input.value.trim());
      done(true);
      dialog.close();
    };
    const closed = () => { if (mayCancel) done(false); };
    form.addEventListener("submit", submit);
    dialog.addEventListener("close", closed);
  });
  if (!dialog.open) dialog.showModal();
  return asking;
}

async function connect() {
  for (let attempt = 0; ; attempt++) {
    try {
      return await request("GET", "/capabilities");
    } catch (error) {
      if (error.status !== 401) throw error;
      await askToken(attempt > 0 || token() ? "That token was refused." : "");
    }
  }
}

// Shows the view the URL names; moved: the person came from another view (hashchange:
// a link, the nav, back or forward), not the first load or the same view again.
function route({ moved = false } = {}) {
  if (unmount) unmount();
  unmount = null;
  ctx.moved = moved;
  const [module, nav, title, params] = resolve(location.hash || "#/");
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", link.dataset.nav === nav);
    if (link.dataset.nav === nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!module) {
    clear(view, h("h1", {}, "No such page"), h("p", { class: "empty" }, h("a", { href: "#/" }, "Sessions")));
    arrived("No such page", moved);
    return;
  }
  clear(view);
  unmount = module.mount(view, params, ctx);
  arrived(title(...params), moved);
}

// [module, nav, title, params] of the route the hash names, or [] (no such page: no
// route, or an id that is not percent-encoded UTF-8, "#/session/%E0%A4%A", which
// decodeURIComponent throws on).
function resolve(hash) {
  for (const [pattern, module, nav, title] of ROUTES) {
    const match = pattern.exec(hash);
    if (!match) continue;
    try {
      return [module, nav, title, match.slice(1).map(decodeURIComponent)];
    } catch {
      return [];
    }
  }
  return [];
}

function arrived(name, moved) {
  document.title = `${name} — acp-server`;
  if (!moved) return;
  const heading = view.querySelector("h1");
  if (heading && !view.contains(document.activeElement)) {   // the view may have taken it (the new session's prompt box)
    heading.tabIndex = -1;
    heading.focus();
  }
  announcer.textContent = name;
}

dialog.addEventListener("cancel", (event) => { if (!cancellable) event.preventDefault(); });
document.getElementById("token-cancel").addEventListener("click", () => dialog.close());

// Who this tab is (GET /whoami): shown in the header, with a way to change the token.
async function showPrincipal() {
  const label = document.getElementById("principal");
  const change = document.getElementById("change-token");
  try {
    const me = await request("GET", "/whoami");
    ctx.me = me;
    label.textContent = `${me.name} (${me.scopes.join(", ")})`;
    label.title = me.kind === "token" ? "a stored token" : `the ${me.kind} principal`;
    label.hidden = false;
    change.hidden = me.kind === "local";
  } catch {
    ctx.me = null;
    label.hidden = true;   // an older server, or none to show
  }
}

// The URL's fragment as the page loaded: a view chosen (the nav, a link) while the
// console still waits for the server's first answer is a move, focused as any other.
const loadedHash = location.hash;

// The first read of /capabilities; while the server does not answer (the page came
// up as it restarted), asked again after 1, 2, 4, up to 8 s, and the page goes on by
// itself once it answers.
async function boot(wait = 1000) {
  try {
    ctx = { caps: await connect(), me: null };
  } catch (error) {
    const retry = error.unreachable ? ` Trying again in ${wait / 1000} s.` : "";
    clear(view, h("p", { class: "error", testid: "boot-error", role: "alert" }, errorText(error), retry));
    if (error.unreachable) setTimeout(() => boot(Math.min(wait * 2, 8000)), wait);
    return;
  }
  await showPrincipal();
  document.getElementById("change-token").addEventListener("click", async () => {
    if (!await askToken("", { mayCancel: true })) return;   // dismissed: the old token stays
    await showPrincipal();
    route();
  });
  document.getElementById("workspace").textContent = ctx.caps.workspaceCwd || "";
  window.addEventListener("hashchange", () => route({ moved: true }));
  window.addEventListener("acp:unauthorized", async () => {
    if (asking) return;   // every refused request of the moment shares one question
    await askToken("The daemon refused the token (wrong, revoked or expired).");
    await showPrincipal();
    route();
  });
  route({ moved: location.hash !== loadedHash });
}

boot();
