// Agent messages as Markdown: parsed by marked, sanitized by DOMPurify (both vendored,
// pinned, with their licences beside them: marked.esm.js, purify.es.js), then given
// copy buttons and safe links.
//
//   renderMarkdown(node, "# Plan\n- one\n```js\nx()\n```");   // node's children replaced
//
// Contracts: what an agent sends never becomes script. Raw HTML in the Markdown is
// shown as text (not passed through), the result goes through DOMPurify (no script,
// no inline handler, no javascript: URL survives) and is inserted as a DOM fragment,
// never through innerHTML here; the page's CSP (script-src 'self') stays the last
// wall. Images become links (nothing is fetched from elsewhere). Links open in a new
// tab with rel="noopener noreferrer". Each code block gets a Copy button.

import { Marked } from "./marked.esm.js";
import DOMPurify from "./purify.es.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escape = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    html: ({ text }) => escape(text),
    image: ({ href, text }) => `<a href="${escape(href)}">${escape(text || href)}</a>`,
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY = { RETURN_DOM_FRAGMENT: true, FORBID_TAGS: ["style", "img", "form", "input"],
  FORBID_ATTR: ["style"] };

async function copy(button, text) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

function addCopyButtons(fragment) {
  for (const pre of fragment.querySelectorAll("pre")) {
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "small copy";
    button.dataset.testid = "copy-code";
    button.textContent = "Copy";
    button.addEventListener("click", () => copy(button, pre.textContent));
    pre.replaceWith(wrap);
    wrap.append(button, pre);
  }
}

// Each block takes its direction from its own text: an Arabic or Hebrew paragraph
// reads right to left beside an English one.
const BLOCKS = "p, li, h1, h2, h3, h4, h5, h6, blockquote, td, th";

export function renderMarkdown(node, text) {
  const fragment = DOMPurify.sanitize(marked.parse(text, { async: false }), PURIFY);
  for (const block of fragment.querySelectorAll(BLOCKS)) block.setAttribute("dir", "auto");
  addCopyButtons(fragment);
  node.replaceChildren(fragment);
}
