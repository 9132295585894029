// Forms shared by the exchange and queue pages: arguments, publishing, binding.
import { api, exchangePath, seg } from "./api.js";
import { field, h, select, table } from "./dom.js";
import { args } from "./format.js";

/** Key/value rows with a type per value; .value() -> {key: typed value}. */
export function argsEditor(name = "arguments") {
  const rows = h("div", { class: "args", "data-args": name });
  const addRow = () => {
    const row = h(
      "div",
      { class: "arg-row" },
      h("input", { class: "arg-key", placeholder: "key", "aria-label": `${name} key` }),
      h("input", { class: "arg-value", placeholder: "value", "aria-label": `${name} value` }),
      select("arg_type", [
        ["string", "String"],
        ["number", "Number"],
        ["boolean", "Boolean"],
      ]),
    );
    rows.appendChild(row);
  };
  addRow();
  const more = h("button", { type: "button", class: "small", onclick: addRow }, "+ row");
  const el = h("div", { class: "args-editor" }, rows, more);
  el.value = () => {
    const out = {};
    for (const row of rows.querySelectorAll(".arg-row")) {
      const key = row.querySelector(".arg-key").value.trim();
      if (!key) continue;
      const raw = row.querySelector(".arg-value").value;
      const type = row.querySelector("select").value;
      if (type === "number") {
        const n = Number(raw);
        if (raw.trim() === "" || Number.isNaN(n)) throw new Error(`${key}: not a number`);
        out[key] = n;
      } else if (type === "boolean") {
        out[key] = /^(true|1|yes)$/i.test(raw.trim());
      } else {
        out[key] = raw;
      }
    }
    return out;
  };
  return el;
}

/**
 * Publish a message to exchange `exchange` ("" = default) of `vhost`;
 * routingKey pre-fills the routing key (a queue name for the default exchange);
 * after (optional) runs once a message is published.
 */
export function publishForm(ctx, vhost, exchange, routingKey = "", after = null) {
  const key = h("input", { name: "routing_key", value: routingKey });
  const mode = select("delivery_mode", [
    ["1", "1 - non-persistent"],
    ["2", "2 - persistent"],
  ], "2");
  const headers = argsEditor("headers");
  const contentType = h("input", { name: "content_type", placeholder: "e.g. application/json" });
  const correlation = h("input", { name: "correlation_id" });
  const replyTo = h("input", { name: "reply_to" });
  const payload = h("textarea", { name: "payload", rows: 4, cols: 50 });
  const encoding = select("payload_encoding", [
    ["string", "String"],
    ["base64", "Base64"],
  ]);
  const form = h(
    "form",
    { class: "publish", id: "publish-form" },
    field("Routing key", key),
    field("Delivery mode", mode),
    field("Headers", headers),
    field("Content type", contentType),
    field("Correlation id", correlation),
    field("Reply to", replyTo),
    field("Payload", payload),
    field("Payload encoding", encoding),
    h("button", { type: "submit" }, "Publish message"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const r = await ctx.act(
      async () => {
        const properties = { delivery_mode: Number(mode.value), headers: headers.value() };
        if (contentType.value) properties.content_type = contentType.value;
        if (correlation.value) properties.correlation_id = correlation.value;
        if (replyTo.value) properties.reply_to = replyTo.value;
        return api("POST", `${exchangePath(vhost, exchange)}/publish`, {
          properties,
          routing_key: key.value,
          payload: payload.value,
          payload_encoding: encoding.value,
        });
      },
      (r) => (r && r.routed === false ? "Message published, but not routed." : "Message published."),
    );
    if (r !== undefined && after) after().catch(ctx.fail);
  });
  return form;
}

const bindingProps = (b) => b.properties_key ?? "~";

/** A binding's delete path. */
function bindingPath(b) {
  const kind = b.destination_type === "exchange" ? "e" : "q";
  return `/bindings/${seg(b.vhost)}/e/${seg(b.source || "amq.default")}/${kind}/${seg(b.destination)}/${seg(bindingProps(b))}`;
}

/** A bindings table with an Unbind button per row (none for the default exchange). */
export function bindingsTable(ctx, list, reload) {
  const link = (type, vhost, name) =>
    type === "exchange"
      ? h("a", { href: `#/exchanges/${seg(vhost)}/${seg(name)}` }, name || "(AMQP default)")
      : h("a", { href: `#/queues/${seg(vhost)}/${seg(name)}` }, name);
  return table(
    [
      ["From", (b) => link("exchange", b.vhost, b.source)],
      ["To", (b) => [link(b.destination_type, b.vhost, b.destination), ` (${b.destination_type})`]],
      ["Routing key", (b) => b.routing_key],
      ["Arguments", (b) => args(b.arguments)],
      [
        "",
        (b) =>
          b.source === ""
            ? ""
            : h(
                "button",
                {
                  type: "button",
                  class: "small danger",
                  onclick: async () => {
                    const r = await ctx.act(() => api("DELETE", bindingPath(b)), "Binding removed.");
                    if (r !== undefined) reload();
                  },
                },
                "Unbind",
              ),
      ],
    ],
    list,
    { empty: "No bindings." },
  );
}

/**
 * A form adding a binding. fixed: {vhost, source} (an exchange page: the
 * destination is asked for) or {vhost, destination} (a queue page).
 */
export function bindingForm(ctx, fixed, reload) {
  const other = h("input", { name: fixed.source !== undefined ? "destination" : "source", required: true });
  const destType = select("destination_type", [
    ["q", "Queue"],
    ["e", "Exchange"],
  ]);
  const key = h("input", { name: "binding_routing_key" });
  const bargs = argsEditor("binding arguments");
  const form = h(
    "form",
    { class: "binding", id: "binding-form" },
    fixed.source !== undefined
      ? [field("To", destType), field("Destination name", other)]
      : field("From exchange", other),
    field("Routing key", key),
    field("Arguments", bargs),
    h("button", { type: "submit" }, "Bind"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const r = await ctx.act(() => {
      const body = { routing_key: key.value, arguments: bargs.value() };
      const v = seg(fixed.vhost);
      const path =
        fixed.source !== undefined
          ? `/bindings/${v}/e/${seg(fixed.source)}/${destType.value}/${seg(other.value)}`
          : `/bindings/${v}/e/${seg(other.value)}/q/${seg(fixed.destination)}`;
      return api("POST", path, body);
    }, "Binding added.");
    if (r !== undefined) reload();
  });
  return form;
}
