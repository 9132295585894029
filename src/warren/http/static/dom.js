// Building DOM nodes without innerHTML: every server-provided string becomes a
// text node (or an attribute value set with setAttribute), never markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(el, child) {
  if (child === null || child === undefined || child === false) return;
  if (Array.isArray(child)) {
    for (const c of child) append(el, c);
  } else if (child instanceof Node) {
    el.appendChild(child);
  } else {
    el.appendChild(document.createTextNode(String(child)));
  }
}

function build(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "style" && typeof value === "object") {
      Object.assign(el.style, value); // CSSOM, allowed under a strict style-src
    } else if (key === "value" && "value" in el) {
      el.value = value;
    } else if (key === "checked" || key === "selected") {
      el[key] = Boolean(value);
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/** h("a", {href: "#/"}, "text", child, [more]) -> HTMLElement */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** The same for SVG elements. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replace(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

/** A table: columns are [header, row => cell content] pairs. */
export function table(columns, rows, { empty = "Nothing to show.", rowAttrs } = {}) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h(
    "table",
    { class: "list" },
    h("thead", null, h("tr", null, columns.map(([title]) => h("th", null, title)))),
    h(
      "tbody",
      null,
      rows.map((row) =>
        h("tr", rowAttrs ? rowAttrs(row) : null, columns.map(([, cell]) => h("td", null, cell(row)))),
      ),
    ),
  );
}

/** A two-column key/value table. */
export function facts(pairs) {
  return h(
    "table",
    { class: "facts" },
    h(
      "tbody",
      null,
      pairs
        .filter((p) => p)
        .map(([k, v]) => h("tr", null, h("th", null, k), h("td", null, v))),
    ),
  );
}

/** A labelled form field. */
export function field(label, control, hint) {
  return h("label", { class: "field" }, h("span", null, label), control, hint ? h("small", null, hint) : null);
}

export function select(name, options, value) {
  return h(
    "select",
    { name },
    options.map((o) => {
      const [v, text] = Array.isArray(o) ? o : [o, o];
      return h("option", { value: v, selected: v === value }, text);
    }),
  );
}

export function section(title, ...children) {
  return h("section", { class: "panel" }, h("h2", null, title), children);
}

/**
 * A name filter for a list that is reloaded: el (the input), test(name) and
 * onChange(fn). Kept across reloads since only the table is replaced.
 */
export function filterBox(placeholder = "Filter by name") {
  const input = h("input", { type: "search", class: "filter", placeholder, "aria-label": placeholder });
  return {
    el: input,
    test: (name) => !input.value || String(name).toLowerCase().includes(input.value.toLowerCase()),
    onChange: (fn) => input.addEventListener("input", fn),
  };
}
