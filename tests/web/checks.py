"""What the browser reports about a page a person reaches by touch, zoom or a screen
reader, as JavaScript for ``page.evaluate``; each returns a list of offenders (empty:
fine), described so that an assertion message says what is wrong and where.

    assert page.evaluate(SIDEWAYS) == []
"""

from __future__ import annotations

# Where the element is, in words: "button[data-testid=delete-session] 'Delete'".
_DESCRIBE = """
const describe = (e) => {
  const id = e.dataset && e.dataset.testid ? `[data-testid=${e.dataset.testid}]` : "";
  const cls = !id && e.className && typeof e.className === "string" ? `.${e.className.split(" ")[0]}` : "";
  const text = (e.getAttribute("aria-label") || e.textContent || "").trim().slice(0, 30);
  return `${e.tagName.toLowerCase()}${id}${cls} '${text}'`;
};
"""

# Anything that scrolls sideways: the page wider than the window, or an element whose
# content is wider than itself and scrolls (a table in a scrolling wrapper). A code
# block (<pre>) keeps its lines and may scroll inside: code is not reflowed text.
SIDEWAYS = "() => {" + _DESCRIBE + """
  const out = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth) out.push(`page ${doc.scrollWidth} > ${doc.clientWidth}`);
  for (const e of document.querySelectorAll("body *")) {
    if (e.closest("pre") || !e.checkVisibility()) continue;
    const x = getComputedStyle(e).overflowX;
    if ((x === "auto" || x === "scroll") && e.scrollWidth > e.clientWidth + 1) {
      out.push(`${describe(e)} ${e.scrollWidth} > ${e.clientWidth}`);
    }
  }
  return out;
}"""

# Every control a finger can use: inside the window (left >= 0, right <= its width)
# and at least 44 x 44 CSS px. A checkbox is hit through its label; a link inside an
# agent's Markdown paragraph is text, not a target (WCAG 2.5.5's inline exception).
TARGETS = "() => {" + _DESCRIBE + """
  const out = [];
  const controls = document.querySelectorAll("a[href], button, select, input, textarea, summary");
  for (const control of controls) {
    if (!control.checkVisibility() || control.closest("dialog:not([open])")) continue;
    if (control.matches(".markdown a")) continue;
    const e = control.matches("input[type=checkbox], input[type=radio]") && control.closest("label")
      ? control.closest("label") : control;
    const r = e.getBoundingClientRect();
    if (r.width < 44 || r.height < 44 || r.left < -0.5 || r.right > innerWidth + 0.5) {
      out.push(`${describe(control)} ${Math.round(r.left)}+${Math.round(r.width)}x${Math.round(r.height)}`);
    }
  }
  return out;
}"""

# WCAG AA text contrast (4.5:1; 3:1 for large text) of every visible piece of text
# and of an empty field's placeholder:
# its colour over the backgrounds under it (ancestors' colours composited), with
# ancestors' opacity applied. Disabled controls and inert (stale) lists are exempt.
CONTRAST = "() => {" + _DESCRIBE + """
  const rgba = (s) => {
    const m = s.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return [0, 0, 0, 0];
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, under) => {
    const a = top[3];
    return [0, 1, 2].map((i) => top[i] * a + under[i] * (1 - a)).concat(1);
  };
  const lum = (c) => {
    const ch = c.slice(0, 3).map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * ch[0] + 0.7152 * ch[1] + 0.0722 * ch[2];
  };
  const background = (e) => {
    const chain = [];
    for (let n = e; n; n = n.parentElement) chain.push(n);
    let bg = [255, 255, 255, 1];   // the canvas
    for (const n of chain.reverse()) {
      const c = rgba(getComputedStyle(n).backgroundColor);
      if (c[3] > 0) bg = over(c, bg);
    }
    return bg;
  };
  const out = [];
  const seen = new Set();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const e = t.parentElement;
    if (!t.textContent.trim() || seen.has(e) || !e.checkVisibility()) continue;
    seen.add(e);
    if (e.closest("[inert], :disabled, dialog:not([open]), option, [aria-hidden=true]")) continue;
    const style = getComputedStyle(e);
    let alpha = rgba(style.color)[3];
    for (let n = e; n; n = n.parentElement) alpha *= Number(getComputedStyle(n).opacity);
    const bg = background(e);
    const fg = over([...rgba(style.color).slice(0, 3), alpha], bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) out.push(`${describe(e)} ${ratio.toFixed(2)}:1 (${style.color})`);
  }
  for (const e of document.querySelectorAll("input[placeholder], textarea[placeholder]")) {
    if (e.value || e.disabled || !e.checkVisibility() || e.closest("[inert]")) continue;
    const bg = background(e);
    const fg = over(rgba(getComputedStyle(e, "::placeholder").color), bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    if (ratio < 4.5) out.push(`${describe(e)} placeholder ${ratio.toFixed(2)}:1`);
  }
  return out;
}"""

# Anything that moves: a running transition or animation, or smooth scrolling.
MOTION = "() => {" + _DESCRIBE + """
  const out = [];
  for (const e of document.querySelectorAll("*")) {
    const s = getComputedStyle(e);
    const moving = (v) => v.split(",").some((d) => parseFloat(d) > 0);
    if (moving(s.transitionDuration) || (s.animationName !== "none" && moving(s.animationDuration))
        || s.scrollBehavior === "smooth") out.push(describe(e));
  }
  return out;
}"""
