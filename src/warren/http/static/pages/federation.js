// Federation: the links' status (GET /api/federation-links, restart) and the
// upstreams and upstream sets (runtime parameters "federation-upstream" and
// "federation-upstream-set"): list, add or update, delete.
import { api, hasTag, parameterPath, putParameter, seg } from "../api.js";
import { field, h, section, select, table } from "../dom.js";
import { args, num, redactUri } from "../format.js";
import { deleteButton, submitting } from "./admin.js";
import { vhostSelect } from "./queues.js";
import { listOrRefusal, stateLabel, whyNot } from "./shovels.js";

const SUBPAGES = [
  ["#/federation", "Status"],
  ["#/federation/upstreams", "Upstreams and sets"],
];

function subnav(here) {
  return h(
    "p",
    { class: "subnav" },
    SUBPAGES.map(([href, text]) => h("a", { href, class: href === here ? "active" : null }, text)),
  );
}

/** The federated exchange or queue, linked to its page. */
function localObject(l) {
  const kind = l.type === "queue" ? "queues" : "exchanges";
  const name = l.type === "queue" ? l.queue : l.exchange;
  return h("a", { href: `#/${kind}/${seg(l.vhost)}/${seg(name)}` }, name);
}

/** What the link takes from upstream, and where. */
function upstreamObject(l) {
  const name = l.type === "queue" ? l.upstream_queue : l.upstream_exchange;
  return [h("div", null, `${l.type} ${name ?? ""}`), h("small", { class: "uri" }, redactUri(l.uri))];
}

/**
 * Warren restarts a vhost's links to one upstream (.../{upstream}/restart);
 * RabbitMQ, whose links carry their node, one link (.../{id}/{node}/restart).
 */
function restartButton(ctx, l, reload) {
  const v = seg(l.vhost);
  const [path, title, done] = l.node
    ? [
        `/federation-links/vhost/${v}/${seg(l.id)}/${seg(l.node)}/restart`,
        "Restarts this link",
        `Link from upstream ${l.upstream} restarted.`,
      ]
    : [
        `/federation-links/vhost/${v}/${seg(l.upstream)}/restart`,
        `Restarts every link of upstream ${l.upstream} in ${l.vhost}`,
        `Links from upstream ${l.upstream} restarted.`,
      ];
  return h(
    "button",
    {
      type: "button",
      class: "small",
      title,
      onclick: async () => {
        const r = await ctx.act(() => api("DELETE", path), done);
        if (r !== undefined) reload();
      },
    },
    "Restart",
  );
}

export async function federationStatus(ctx) {
  const canRestart = hasTag("administrator", "policymaker");
  const body = h("div");
  const load = () =>
    listOrRefusal(
      body,
      () => api("GET", "/federation-links"),
      (list) =>
        table(
          [
            ["Type", (l) => l.type],
            ["Virtual host", (l) => l.vhost],
            ["Local", localObject],
            ["Upstream", (l) => l.upstream],
            ["From", upstreamObject],
            ["Status", (l) => stateLabel(l.status)],
            ["Since", (l) => l.timestamp || ""],
            ["Received", (l) => h("span", { "data-field": "received" }, num(l.messages_received ?? ""))],
            ["Error", (l) => whyNot(l.status === "running", l.error, "error")],
            ["", (l) => (canRestart ? restartButton(ctx, l, load) : "")],
          ],
          list,
          {
            empty: "No federation links: a policy naming an upstream makes the exchanges or queues it matches federated.",
            rowAttrs: (l) => ({ "data-link": l.id, "data-upstream": l.upstream }),
          },
        ),
    );
  await ctx.poll(load);
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Federation status"),
    subnav("#/federation"),
    h(
      "p",
      { class: "hint" },
      "A federated exchange or queue has one link per upstream its policy names (federation-upstream, " +
        "federation-upstream-set or federation-upstream-pattern). Restart restarts every link of that " +
        "upstream in the virtual host (RabbitMQ: the one link).",
    ),
    body,
  );
}

/** An upstream's settings other than its URI, exchange and queue. */
function settings(value) {
  const rest = { ...value };
  for (const k of ["uri", "exchange", "queue"]) delete rest[k];
  return args(rest);
}

/** An upstream set's entries: "a, b (max-hops: 2)". */
function setEntries(value) {
  if (!Array.isArray(value)) return args(value);
  return value
    .map((e) => {
      const { upstream, ...overrides } = e || {};
      const more = args(overrides);
      return more ? `${upstream} (${more})` : String(upstream);
    })
    .join(", ");
}

export async function upstreams(ctx) {
  const canDefine = hasTag("administrator", "policymaker");
  const upBody = h("div");
  const setBody = h("div");
  // what: "upstream" or "upstream set"
  const del = (kind, p, what) =>
    canDefine
      ? deleteButton(
          ctx,
          "Delete",
          `Delete ${what} ${p.name}?`,
          parameterPath(kind, p.vhost, p.name),
          `${what[0].toUpperCase()}${what.slice(1)} ${p.name} deleted.`,
          load,
        )
      : "";
  const load = () =>
    Promise.all([
      listOrRefusal(
        upBody,
        () => api("GET", "/parameters/federation-upstream"),
        (list) =>
          table(
            [
              ["Virtual host", (p) => p.vhost],
              ["Name", (p) => p.name],
              ["URI", (p) => h("span", { class: "uri" }, redactUri(p.value?.uri))],
              ["Exchange", (p) => p.value?.exchange ?? ""],
              ["Queue", (p) => p.value?.queue ?? ""],
              ["Settings", (p) => settings(p.value)],
              ["", (p) => del("federation-upstream", p, "upstream")],
            ],
            list,
            { empty: "No upstreams.", rowAttrs: (p) => ({ "data-upstream": p.name, "data-vhost": p.vhost }) },
          ),
      ),
      listOrRefusal(
        setBody,
        () => api("GET", "/parameters/federation-upstream-set"),
        (list) =>
          table(
            [
              ["Virtual host", (p) => p.vhost],
              ["Name", (p) => p.name],
              ["Upstreams", (p) => setEntries(p.value)],
              ["", (p) => del("federation-upstream-set", p, "upstream set")],
            ],
            list,
            {
              empty: "No upstream sets (the set all, every upstream of the virtual host, needs none).",
              rowAttrs: (p) => ({ "data-set": p.name, "data-vhost": p.vhost }),
            },
          ),
      ),
    ]);
  await ctx.poll(load);
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Federation upstreams"),
    subnav("#/federation/upstreams"),
    section(
      "Upstreams",
      upBody,
      canDefine ? [h("h3", null, "Add or update an upstream"), await upstreamForm(ctx, load)] : null,
    ),
    section(
      "Upstream sets",
      setBody,
      canDefine ? [h("h3", null, "Add or update an upstream set"), await setForm(ctx, load)] : null,
    ),
  );
}

function numberInput(name, placeholder, attrs = {}) {
  return h("input", { name, type: "number", min: "0", placeholder, ...attrs });
}

async function upstreamForm(ctx, reload) {
  const vhost = await vhostSelect();
  const name = h("input", { name: "upstream_name", required: true });
  const uri = h("input", { name: "uri", required: true, placeholder: "amqp://user:password@host:5672/vhost" });
  const exchange = h("input", { name: "exchange" });
  const queue = h("input", { name: "queue" });
  const maxHops = numberInput("max-hops", "1", { min: "1" });
  const expires = numberInput("expires", "ms", { min: "1" });
  const ttl = numberInput("message-ttl", "ms");
  const prefetch = numberInput("prefetch-count", "1000");
  const delay = numberInput("reconnect-delay", "5", { step: "any" });
  const ackMode = select("ack-mode", ["on-confirm", "on-publish", "no-ack"], "on-confirm");
  const trust = h("input", { type: "checkbox", name: "trust-user-id" });
  const numbers = [
    [maxHops, "max-hops"],
    [expires, "expires"],
    [ttl, "message-ttl"],
    [prefetch, "prefetch-count"],
    [delay, "reconnect-delay"],
  ];
  const form = h(
    "form",
    { id: "add-upstream" },
    field("Virtual host", vhost),
    field("Name", name),
    field("URI", uri, "The upstream broker and virtual host (amqp:// or amqps://)."),
    field("Exchange", exchange, "The upstream exchange; empty: the federated exchange's own name."),
    field("Queue", queue, "The upstream queue, for a federated queue; empty: the same name."),
    field("Max hops", maxHops, "Links a message may cross (default 1)."),
    field("Expires (ms)", expires, "x-expires of the link's queue upstream."),
    field("Message TTL (ms)", ttl, "x-message-ttl of that queue."),
    field("Prefetch count", prefetch, "Messages in flight per link (default 1000)."),
    field("Reconnect delay (s)", delay, "Wait before a failed link starts again (default 5)."),
    field("Ack mode", ackMode),
    field("Trust user-id", trust, "Keep the messages' user-id."),
    h("button", { type: "submit" }, "Add / update upstream"),
  );
  return submitting(
    form,
    ctx,
    () => {
      const value = { uri: uri.value.trim(), "ack-mode": ackMode.value, "trust-user-id": trust.checked };
      if (exchange.value) value.exchange = exchange.value;
      if (queue.value) value.queue = queue.value;
      for (const [input, key] of numbers) if (input.value !== "") value[key] = Number(input.value);
      return putParameter("federation-upstream", vhost.value, name.value, value);
    },
    () => `Upstream ${name.value} saved.`,
    () => reload(),
  );
}

async function setForm(ctx, reload) {
  const vhost = await vhostSelect();
  const name = h("input", { name: "set_name", required: true });
  const entries = h("textarea", { name: "upstreams", rows: 2, cols: 50, placeholder: "origin, backup" });
  const form = h(
    "form",
    { id: "add-upstream-set" },
    field("Virtual host", vhost),
    field("Name", name),
    field(
      "Upstreams",
      entries,
      'Upstream names, comma-separated; or a JSON list such as [{"upstream": "origin", "max-hops": 2}] to override settings.',
    ),
    h("button", { type: "submit" }, "Add / update upstream set"),
  );
  return submitting(
    form,
    ctx,
    () => {
      const text = entries.value.trim();
      let value;
      if (text.startsWith("[")) {
        try {
          value = JSON.parse(text);
        } catch {
          throw new Error("The upstreams are not valid JSON.");
        }
      } else {
        value = text
          .split(",")
          .map((n) => n.trim())
          .filter(Boolean)
          .map((upstream) => ({ upstream }));
      }
      return putParameter("federation-upstream-set", vhost.value, name.value, value);
    },
    () => `Upstream set ${name.value} saved.`,
    () => reload(),
  );
}
