// One LMSP task: its input, status and output, live from GET
// /lmsp/v1/tasks/{id}/events (resumed with Last-Event-ID after a drop, closed after the
// terminal event), and cancel. The input is the listing's input_text (the task object
// itself, LMSP §7.1, does not carry it): looked up among the latest 100 tasks.
//
//   mount(root, [taskId], ctx)

import { follow, request } from "./api.js";
import { clear, errorText, h, time } from "./dom.js";
import { TERMINAL, tokens } from "./tasks.js";

const TERMINAL_EVENTS = new Set(["response.completed", "response.incomplete", "response.failed", "response.cancelled"]);

export function mount(root, [taskId]) {
  const path = `/lmsp/v1/tasks/${encodeURIComponent(taskId)}`;
  const status = h("span", { class: "badge", testid: "task-status" }, "…");
  const facts = h("dl", { class: "facts" });
  const output = h("pre", { class: "output", testid: "task-output", dir: "auto" });
  const inputText = h("pre", { class: "output input", testid: "task-input", dir: "auto" }, "…");
  const log = h("ol", { class: "events", testid: "task-events" });
  const error = h("p", { class: "error", testid: "task-error" });
  const cancelButton = h("button", { class: "danger", testid: "cancel-task", onclick: () => cancel() }, "Cancel");
  let stream = null;

  function show(task) {
    status.textContent = task.status;
    status.className = `badge ${task.status}`;
    status.dataset.status = task.status;
    const response = task.response;
    clear(facts,
      h("dt", {}, "Created"), h("dd", {}, time(task.created_at)),
      h("dt", {}, "Updated"), h("dd", {}, time(task.updated_at)),
      h("dt", {}, "Response"), h("dd", { class: "mono" }, task.response_id),
      h("dt", {}, "On restart"), h("dd", {}, task.on_restart),
      h("dt", {}, "Tokens"), h("dd", {}, tokens(response && response.usage)),
      task.error ? [h("dt", {}, "Error"), h("dd", {}, `${task.error.code}: ${task.error.detail || ""}`)] : null);
    cancelButton.disabled = TERMINAL.has(task.status);
    if (response && !output.textContent) {
      output.textContent = (response.output || []).filter((m) => m.type === "message")
        .flatMap((m) => m.content || []).map((c) => c.text || "").join("");
    }
  }

  async function load() {
    try {
      show(await request("GET", path));
    } catch (e) {
      error.textContent = errorText(e);
    }
  }

  async function cancel() {
    try {
      show(await request("POST", `${path}/cancel`));
    } catch (e) {
      error.textContent = errorText(e);
    }
  }

  root.append(
    h("section", { class: "toolbar" }, h("h1", {}, "Task ", h("span", { class: "mono" }, taskId)), status,
      cancelButton, h("a", { class: "button", href: "#/tasks" }, "All tasks")),
    error, facts,
    h("div", { class: "task-grid" },
      h("section", {}, h("h2", {}, "Input"), inputText, h("h2", {}, "Output"), output),
      h("section", {}, h("h2", {}, "Events"), log)));

  request("GET", "/lmsp/v1/tasks?limit=100").then((page) => {
    const mine = page.data.find((t) => t.id === taskId);
    inputText.textContent = mine ? mine.input_text : "(not among the latest 100 tasks)";
  }).catch(() => { inputText.textContent = "—"; });

  load().then(() => {
    stream = follow(`${path}/events`, {
      onState: (s, e) => { if (s === "error") error.textContent = errorText(e); },
      onEvent: (type, data, id) => {
        log.append(h("li", {}, h("span", { class: "mono" }, `#${id}`), ` ${type}`));
        if (type === "response.created") output.textContent = "";
        if (type === "response.output_text.delta") output.append(data.delta);
        if (type === "response.in_progress" || type === "response.created") load();
        if (TERMINAL_EVENTS.has(type)) {
          load();
          return "stop";
        }
        return undefined;
      },
    });
  });
  return () => { if (stream) stream.stop(); };
}
