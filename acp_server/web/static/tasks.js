// The LMSP tasks view: the caller's tasks (GET /lmsp/v1/tasks) with status, input,
// model, created and tokens, refreshed every second; create one (an empty input is
// refused in the form, nothing is sent), cancel one, open one. While the server does
// not answer, the list stays, inert, with when it was read.
//
//   mount(root, [], ctx)

import { request } from "./api.js";
import { errorText, h, labelled, poll, reconcile, shortId, stale, time } from "./dom.js";

const REFRESH_MS = 1000;
const COLUMNS = ["Task", "Status", "Input", "Model", "Created", "Tokens", ""];
export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

export function tokens(usage) {
  if (!usage) return "—";
  return `${usage.total_tokens} (${usage.input_tokens} in, ${usage.output_tokens} out)`;
}

export function mount(root) {
  const body = h("tbody");
  const status = h("p", { class: "error", testid: "tasks-error" });
  const model = h("select", { testid: "task-model", "aria-label": "Model" });
  const input = h("input", { testid: "task-input", placeholder: "Input text", "aria-label": "Input", dir: "auto" });
  request("GET", "/lmsp/v1/capabilities").then((caps) => {
    for (const name of caps.models || []) model.append(h("option", { value: name }, name));
  }).catch((error) => { status.textContent = errorText(error); });

  const create = async () => {
    status.textContent = "";
    input.removeAttribute("aria-invalid");
    if (!input.value.trim()) {
      status.textContent = "Write the task's input first.";
      input.setAttribute("aria-invalid", "true");
      input.focus();
      return;
    }
    try {
      await request("POST", "/lmsp/v1/tasks",
        { type: "response", input: { model: model.value || "reference", input: input.value } });
      input.value = "";
      await refresh();
    } catch (error) {
      status.textContent = errorText(error);
    }
  };
  const cancel = async (id) => {
    try {
      await request("POST", `/lmsp/v1/tasks/${encodeURIComponent(id)}/cancel`);
    } catch (error) {
      status.textContent = errorText(error);
    }
    await refresh();
  };

  input.addEventListener("keydown", (event) => { if (event.key === "Enter") create(); });
  let wrap = null;
  root.append(
    h("section", { class: "toolbar" }, h("h1", {}, "Tasks"),
      h("label", {}, "Model ", model), input,
      h("button", { class: "primary", testid: "new-task", onclick: create }, "New task")),
    status,
    wrap = h("div", { class: "table-wrap" }, h("table", { class: "list", testid: "task-list" },
      h("thead", {}, h("tr", {}, COLUMNS.map((t) => h("th", {}, t)))),
      body)));

  const row = (t) => labelled(COLUMNS, h("tr", { testid: "task-row", dataset: { taskId: t.id, status: t.status } },
    h("td", { class: "mono" }, h("a", { href: `#/task/${encodeURIComponent(t.id)}`, title: t.id }, shortId(t.id))),
    h("td", {}, h("span", { class: `badge ${t.status}` }, t.status)),
    h("td", { class: "prompt-text input-text", testid: "task-input-text", dir: "auto", title: t.input_text || "" }, t.input_text || "—"),
    h("td", {}, t.model),
    h("td", {}, time(t.created_at)),
    h("td", { class: "num" }, tokens(t.usage)),
    h("td", { class: "actions" },
      h("a", { class: "button", href: `#/task/${encodeURIComponent(t.id)}`, "aria-label": `Open task ${shortId(t.id)}` }, "Open"),
      TERMINAL.has(t.status) ? null
        : h("button", { class: "danger", testid: "cancel-task", "aria-label": `Cancel task ${shortId(t.id)}`,
          onclick: () => cancel(t.id) }, "Cancel"))));

  // A failed read is said (the list kept, inert, when the server does not answer).
  async function refresh() {
    let page;
    try {
      page = await request("GET", "/lmsp/v1/tasks?limit=100");
    } catch (error) {
      stale(wrap, status, error);
      throw error;
    }
    if (wrap.classList.contains("stale")) stale(wrap, status, null);
    reconcile(body, page.data, (t) => t.id, row, (t) => JSON.stringify([t.status, t.usage]),
      h("tr", { class: "empty-row" }, h("td", { colspan: 7, class: "empty" }, "No task yet.")));
  }

  return poll(refresh, REFRESH_MS);
}
