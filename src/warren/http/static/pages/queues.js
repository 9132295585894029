// Queues: list + add, detail with counts, consumers, bindings, publish, get, purge, delete.
import { api, seg } from "../api.js";
import { facts, field, filterBox, h, replace, section, select, table } from "../dom.js";
import { args, bytes, features, num, rate, statRate, yesno } from "../format.js";
import { argsEditor, bindingForm, bindingsTable, publishForm } from "../forms.js";

const qLink = (q) => h("a", { href: `#/queues/${seg(q.vhost)}/${seg(q.name)}` }, q.name);
const qPath = (vhost, name) => `/queues/${seg(vhost)}/${seg(name)}`;

/** A <select> of the virtual hosts (the API's /vhosts). */
export async function vhostSelect(name = "vhost") {
  let names = ["/"];
  try {
    names = (await api("GET", "/vhosts")).map((v) => v.name);
  } catch (e) {
    if (e.status === 401) throw e;
  }
  return select(name, names, names.includes("/") ? "/" : names[0]);
}

export async function queueList(ctx) {
  const body = h("div");
  const filter = filterBox();
  let last = [];
  const show = () => {
    const list = last.filter((q) => filter.test(q.name));
    replace(
      body,
      table(
        [
          ["Virtual host", (q) => q.vhost],
          ["Name", qLink],
          ["Type", (q) => q.type || "classic"],
          ["Features", features],
          ["State", (q) => q.state || ""],
          ["Ready", (q) => num(q.messages_ready ?? 0)],
          ["Unacked", (q) => num(q.messages_unacknowledged ?? 0)],
          ["Total", (q) => num(q.messages ?? 0)],
          ["Consumers", (q) => num(q.consumers ?? 0)],
          ["Incoming", (q) => rate(statRate(q, "publish"))],
        ],
        list,
        { empty: "No queues.", rowAttrs: (q) => ({ "data-queue": q.name }) },
      ),
    );
  };
  const load = async () => {
    last = await api("GET", "/queues");
    show();
  };
  filter.onChange(show);
  await ctx.poll(load);
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Queues"),
    filter.el,
    body,
    section("Add a queue", await addQueueForm(ctx, load)),
  );
}

async function addQueueForm(ctx, reload) {
  const vhost = await vhostSelect();
  const type = select("queue_type", [
    ["classic", "Classic"],
    ["quorum", "Quorum"],
    ["stream", "Stream"],
  ]);
  const name = h("input", { name: "name", required: true });
  const durable = select("durable", [
    ["true", "Durable"],
    ["false", "Transient"],
  ]);
  const autoDelete = h("input", { type: "checkbox", name: "auto_delete" });
  const qargs = argsEditor("queue arguments");
  type.addEventListener("change", () => {
    // A stream or quorum queue is always durable and never auto-deleted.
    const stream = type.value === "stream" || type.value === "quorum";
    if (stream) {
      durable.value = "true";
      autoDelete.checked = false;
    }
    durable.disabled = stream;
    autoDelete.disabled = stream;
  });
  const form = h(
    "form",
    { id: "add-queue" },
    field("Virtual host", vhost),
    field("Type", type),
    field("Name", name),
    field("Durability", durable),
    field("Auto delete", autoDelete),
    field("Arguments", qargs, "e.g. x-message-ttl (Number), x-max-length (Number), x-dead-letter-exchange"),
    h("button", { type: "submit" }, "Add queue"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const queueName = name.value;
    const r = await ctx.act(() => {
      const a = qargs.value();
      if (type.value !== "classic") a["x-queue-type"] = type.value;
      return api("PUT", qPath(vhost.value, queueName), {
        durable: durable.value === "true",
        auto_delete: autoDelete.checked,
        arguments: a,
      });
    }, `Queue ${queueName} added.`);
    if (r !== undefined) {
      name.value = "";
      await reload();
    }
  });
  return form;
}

function getForm(ctx, vhost, name, after) {
  const ackmode = select(
    "ackmode",
    [
      ["ack_requeue_true", "Nack message, requeue true"],
      ["reject_requeue_true", "Reject, requeue true"],
      ["ack_requeue_false", "Automatic ack"],
      ["reject_requeue_false", "Reject, requeue false"],
    ],
    "ack_requeue_true",
  );
  const encoding = select("encoding", [
    ["auto", "Automatic string/base64"],
    ["base64", "Base64"],
  ]);
  const count = h("input", { name: "count", type: "number", min: 1, value: "1" });
  const truncate = h("input", { name: "truncate", type: "number", min: 1, placeholder: "bytes (optional)" });
  const results = h("div", { id: "get-results" });
  const form = h(
    "form",
    { id: "get-form" },
    field("Ack mode", ackmode),
    field("Encoding", encoding),
    field("Messages", count),
    field("Truncate", truncate),
    h("button", { type: "submit" }, "Get message(s)"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = { count: Number(count.value) || 1, ackmode: ackmode.value, encoding: encoding.value };
    if (truncate.value) body.truncate = Number(truncate.value);
    const msgs = await ctx.act(() => api("POST", `${qPath(vhost, name)}/get`, body));
    if (msgs === undefined) return;
    after().catch(ctx.fail);
    if (!msgs.length) {
      replace(results, h("p", { class: "empty" }, "Queue is empty."));
      return;
    }
    replace(
      results,
      msgs.map((m, i) =>
        h(
          "div",
          { class: "message", "data-message": i + 1 },
          h("h3", null, `Message ${i + 1}`),
          h("p", null, `The server reported ${num(m.message_count)} messages remaining.`),
          facts([
            ["Exchange", m.exchange || "(AMQP default)"],
            ["Routing key", m.routing_key],
            ["Redelivered", yesno(m.redelivered)],
            ["Properties", args(m.properties)],
            ["Payload", `${num(m.payload_bytes)} bytes, encoding: ${m.payload_encoding}`],
          ]),
          h("pre", { class: "payload" }, m.payload),
        ),
      ),
    );
  });
  return h("div", null, form, results);
}

export async function queueDetail(ctx) {
  const { vhost, name } = ctx.params;
  const path = qPath(vhost, name);
  const info = h("div");
  const consumers = h("div");
  const bindings = h("div");
  const load = async () => {
    const [q, b] = await Promise.all([api("GET", path), api("GET", `${path}/bindings`)]);
    replace(
      info,
      h(
        "div",
        { class: "cards" },
        [
          ["messages_ready", "Ready", q.messages_ready],
          ["messages_unacknowledged", "Unacked", q.messages_unacknowledged],
          ["messages", "Total", q.messages],
          ["consumers", "Consumers", q.consumers],
        ].map(([k, label, v]) =>
          h("div", { class: "card", "data-count": k }, h("span", null, label), h("b", null, num(v ?? 0))),
        ),
      ),
      facts([
        ["Virtual host", q.vhost],
        ["Type", q.type || "classic"],
        ...(q.type === "quorum"
          ? [
              ["Leader", q.leader || ""],
              ["Members", (q.members || []).join(", ")],
              ["Online", (q.online || []).join(", ")],
            ]
          : []),
        ["Features", features(q)],
        ["State", q.state || ""],
        ["Arguments", args(q.arguments)],
        ["Policy", q.policy || ""],
        ["Effective policy", args(q.effective_policy_definition)],
        ["Memory", bytes(q.memory)],
        ["Publish rate", rate(statRate(q, "publish"))],
        ["Deliver / get rate", rate(statRate(q, "deliver_get"))],
        ["Ack rate", rate(statRate(q, "ack"))],
      ]),
    );
    replace(
      consumers,
      table(
        [
          ["Channel", (c) => (c.channel_details?.name ? h("a", { href: `#/channels/${seg(c.channel_details.name)}` }, c.channel_details.name) : "")],
          ["Consumer tag", (c) => c.consumer_tag],
          ["Ack required", (c) => yesno(c.ack_required)],
          ["Exclusive", (c) => yesno(c.exclusive)],
          ["Prefetch", (c) => num(c.prefetch_count)],
          ["Arguments", (c) => args(c.arguments)],
        ],
        q.consumer_details || [],
        { empty: "No consumers." },
      ),
    );
    replace(bindings, bindingsTable(ctx, b, load));
  };
  await ctx.poll(load);

  const purge = h(
    "button",
    {
      type: "button",
      id: "purge-queue",
      onclick: async () => {
        if (!window.confirm(`Purge all messages of queue ${name}?`)) return;
        const r = await ctx.act(() => api("DELETE", `${path}/contents`), `Queue ${name} purged.`);
        if (r !== undefined) await load();
      },
    },
    "Purge messages",
  );
  const del = h(
    "button",
    {
      type: "button",
      class: "danger",
      id: "delete-queue",
      onclick: async () => {
        if (!window.confirm(`Delete queue ${name}?`)) return;
        const r = await ctx.act(() => api("DELETE", path));
        if (r !== undefined) ctx.go("#/queues", `Queue ${name} deleted.`);
      },
    },
    "Delete this queue",
  );
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Queue ", h("code", null, name)),
    section("Overview", info),
    section("Consumers", consumers),
    section("Bindings", bindings, h("h3", null, "Add a binding to this queue"), bindingForm(ctx, { vhost, destination: name }, load)),
    section("Publish a message", h("p", null, "Published through the default exchange with this queue's name as routing key."), publishForm(ctx, vhost, "", name, load)),
    section("Get messages", h("p", { class: "warn" }, "Getting messages takes them off the queue unless the ack mode requeues them (they come back marked redelivered)."), getForm(ctx, vhost, name, load)),
    section("Purge", purge),
    section("Delete", del),
  );
}
