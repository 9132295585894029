// Shovels: what runs (GET /api/shovels, the shovel management plugin's status)
// and the dynamic shovels' definitions (runtime parameters of the "shovel"
// component): add, restart, delete.
import { api, hasTag, parameterPath, putParameter, seg } from "../api.js";
import { field, h, replace, section, select, table } from "../dom.js";
import { num, redactUri } from "../format.js";
import { deleteButton, submitting } from "./admin.js";
import { vhostSelect } from "./queues.js";

/** A 403 (the user's tags) shown in place of a list instead of failing the page. */
export async function listOrRefusal(body, fetchList, render) {
  let list;
  try {
    list = await fetchList();
  } catch (e) {
    if (e.status !== 403) throw e;
    replace(body, h("p", { class: "error" }, e.message));
    return;
  }
  replace(body, render(list));
}

/** A state (running, starting, terminated, error) as a marked-up word. */
export function stateLabel(state) {
  const kind = state === "running" ? "ok" : state === "starting" ? "pending" : "bad";
  return h("span", { class: `state ${kind}`, "data-field": "state" }, state || "unknown");
}

/** Why a shovel or link is not running (shown only then). */
export function whyNot(running, text, name) {
  return !running && text ? h("span", { class: "reason", "data-field": name }, text) : "";
}

/** Where a shovel takes from or puts to: "queue q" / "exchange x (key k)" and its URI. */
function endpoint(s, side) {
  const queue = s[`${side}_queue`];
  const exchange = s[`${side}_exchange`];
  const key = s[`${side}_exchange_key`];
  let what = "";
  if (queue !== undefined && queue !== null) what = `queue ${queue}`;
  else if (exchange !== undefined && exchange !== null) {
    what = `exchange ${exchange || "(AMQP default)"}${key ? ` (key ${key})` : ""}`;
  } else if (side === "dest") what = "the message's own exchange and routing key";
  return [h("div", null, what), h("small", { class: "uri" }, redactUri(s[`${side}_uri`]))];
}

function restartButton(ctx, s, reload) {
  return h(
    "button",
    {
      type: "button",
      class: "small",
      onclick: async () => {
        const r = await ctx.act(
          () => api("DELETE", `/shovels/vhost/${seg(s.vhost)}/${seg(s.name)}/restart`),
          `Shovel ${s.name} restarted.`,
        );
        if (r !== undefined) reload();
      },
    },
    "Restart",
  );
}

export async function shovels(ctx) {
  const canDefine = hasTag("administrator", "policymaker");
  const body = h("div");
  const load = () =>
    listOrRefusal(
      body,
      () => api("GET", "/shovels"),
      (list) =>
        table(
          [
            ["Name", (s) => s.name],
            ["Virtual host", (s) => s.vhost],
            ["Type", (s) => s.type],
            ["State", (s) => stateLabel(s.state)],
            ["Source", (s) => endpoint(s, "src")],
            ["Destination", (s) => endpoint(s, "dest")],
            ["Moved", (s) => h("span", { "data-field": "moved" }, num(s.messages_transferred ?? ""))],
            ["Since", (s) => s.timestamp || ""],
            ["Error", (s) => whyNot(s.state === "running", s.reason, "reason")],
            [
              "",
              (s) =>
                canDefine && s.type === "dynamic"
                  ? [
                      restartButton(ctx, s, load),
                      " ",
                      deleteButton(
                        ctx,
                        "Delete",
                        `Delete shovel ${s.name}?`,
                        parameterPath("shovel", s.vhost, s.name),
                        `Shovel ${s.name} deleted.`,
                        load,
                      ),
                    ]
                  : "",
            ],
          ],
          list,
          { empty: "No shovels.", rowAttrs: (s) => ({ "data-shovel": s.name, "data-vhost": s.vhost }) },
        ),
    );
  await ctx.poll(load);
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Shovels"),
    h(
      "p",
      { class: "hint" },
      "A shovel consumes from a queue (or an exchange, through a queue of its own) and publishes " +
        "what it gets to another queue or exchange, on this broker or another.",
    ),
    body,
    canDefine ? section("Add or update a shovel", await shovelForm(ctx, load)) : null,
  );
}

/** "queue" / "exchange" choice that shows the fields of one and hides the other's. */
function sourceOrDest(side, label) {
  const type = select(`${side}-type`, [
    ["queue", "Queue"],
    ["exchange", "Exchange"],
  ]);
  const queue = h("input", { name: `${side}-queue` });
  const exchange = h("input", { name: `${side}-exchange` });
  const key = h("input", { name: `${side}-exchange-key` });
  const dest = side === "dest";
  const queueField = field(`${label} queue`, queue, dest ? "Empty: the message's own exchange and routing key." : null);
  const exchangeField = field(`${label} exchange`, exchange, dest ? "Empty: the message's own exchange." : null);
  const keyField = field(
    "Routing key",
    key,
    dest ? "Empty: the message's own routing key." : "Binding key of the shovel's queue (default #).",
  );
  const sync = () => {
    const isQueue = type.value === "queue";
    queueField.hidden = !isQueue;
    exchangeField.hidden = isQueue;
    keyField.hidden = isQueue;
  };
  type.addEventListener("change", sync);
  sync();
  /** Adds this side's keys to a shovel definition. */
  const fill = (value) => {
    if (type.value === "queue") {
      // Left out when empty: the API then says what is missing.
      if (queue.value) value[`${side}-queue`] = queue.value;
    } else {
      if (side === "src" || exchange.value) value[`${side}-exchange`] = exchange.value;
      if (key.value) value[`${side}-exchange-key`] = key.value;
    }
  };
  return { fields: [field(label, type), queueField, exchangeField, keyField], fill };
}

function numberInput(name, placeholder, attrs = {}) {
  return h("input", { name, type: "number", min: "0", placeholder, ...attrs });
}

async function shovelForm(ctx, reload) {
  const vhost = await vhostSelect();
  const name = h("input", { name: "shovel_name", required: true });
  const uriHint = "amqp:// alone is this broker (the shovel's virtual host); amqp://user:password@host:5672/vhost another.";
  const srcUri = h("input", { name: "src-uri", value: "amqp://", required: true });
  const destUri = h("input", { name: "dest-uri", value: "amqp://", required: true });
  const src = sourceOrDest("src", "Source");
  const dest = sourceOrDest("dest", "Destination");
  const ackMode = select(
    "ack-mode",
    [
      ["on-confirm", "on-confirm: ack once the destination confirmed"],
      ["on-publish", "on-publish: ack once published"],
      ["no-ack", "no-ack: consume without acks"],
    ],
    "on-confirm",
  );
  const prefetch = numberInput("src-prefetch-count", "1000", { max: "65535" });
  const delay = numberInput("reconnect-delay", "5", { step: "any" });
  const deleteAfter = select("delete-after", [
    ["never", "Never"],
    ["queue-length", "After the messages queued when it starts"],
    ["count", "After a number of messages"],
  ]);
  const count = numberInput("delete-after-count", "messages");
  const countField = field("Messages to move", count);
  const syncDelete = () => {
    countField.hidden = deleteAfter.value !== "count";
  };
  deleteAfter.addEventListener("change", syncDelete);
  syncDelete();
  const form = h(
    "form",
    { id: "add-shovel" },
    field("Virtual host", vhost),
    field("Name", name),
    h("h3", null, "Source"),
    field("URI", srcUri, uriHint),
    src.fields,
    field("Prefetch count", prefetch, "Messages in flight (default 1000)."),
    h("h3", null, "Destination"),
    field("URI", destUri, uriHint),
    dest.fields,
    h("h3", null, "Behaviour"),
    field("Ack mode", ackMode),
    field("Reconnect delay (s)", delay, "Wait before starting again after a failure (default 5; 0: never)."),
    field("Delete after", deleteAfter),
    countField,
    h("button", { type: "submit" }, "Add / update shovel"),
  );
  return submitting(
    form,
    ctx,
    () => {
      const value = { "src-uri": srcUri.value.trim(), "dest-uri": destUri.value.trim(), "ack-mode": ackMode.value };
      src.fill(value);
      dest.fill(value);
      if (prefetch.value !== "") value["src-prefetch-count"] = Number(prefetch.value);
      if (delay.value !== "") value["reconnect-delay"] = Number(delay.value);
      if (deleteAfter.value === "queue-length") value["src-delete-after"] = "queue-length";
      else if (deleteAfter.value === "count") {
        if (count.value === "") throw new Error("How many messages should the shovel move?");
        value["src-delete-after"] = Number(count.value);
      }
      return putParameter("shovel", vhost.value, name.value, value);
    },
    () => `Shovel ${name.value} saved.`,
    () => reload(),
  );
}
