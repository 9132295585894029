// Connections and channels: lists, details, closing a connection.
import { api, seg } from "../api.js";
import { facts, field, filterBox, h, replace, section, table } from "../dom.js";
import { num, rate, yesno } from "../format.js";

const connLink = (name) => h("a", { href: `#/connections/${seg(name)}` }, name);
const chanLink = (name) => h("a", { href: `#/channels/${seg(name)}` }, name);

function client(c) {
  const p = c.client_properties || {};
  return [p.product, p.version].filter(Boolean).join(" ");
}

export async function connectionList(ctx) {
  const body = h("div");
  const filter = filterBox("Filter by name, user or client");
  let last = [];
  const show = () => {
    const list = last.filter((c) => filter.test(`${c.name} ${c.user} ${client(c)}`));
    replace(
      body,
      table(
        [
          ["Name", (c) => connLink(c.name)],
          ["Virtual host", (c) => c.vhost],
          ["User", (c) => c.user],
          ["Client", client],
          ["Protocol", (c) => c.protocol || ""],
          ["Channels", (c) => num(c.channels)],
          ["State", (c) => c.state || ""],
          ["From client", (c) => rate(c.recv_oct_details?.rate)],
          ["To client", (c) => rate(c.send_oct_details?.rate)],
        ],
        list,
        { empty: "No connections." },
      ),
    );
  };
  filter.onChange(show);
  await ctx.poll(async () => {
    last = await api("GET", "/connections");
    show();
  });
  return h("div", { class: "page" }, h("h1", null, "Connections"), filter.el, body);
}

function channelColumns() {
  return [
    ["Channel", (c) => chanLink(c.name)],
    ["Virtual host", (c) => c.vhost],
    ["User", (c) => c.user],
    ["Mode", (c) => [c.confirm ? "confirm" : "", c.transactional ? "tx" : ""].filter(Boolean).join(" ")],
    ["Prefetch", (c) => num(c.prefetch_count)],
    ["Consumers", (c) => num(c.consumer_count)],
    ["Unacked", (c) => num(c.messages_unacknowledged)],
    ["State", (c) => c.state || ""],
  ];
}

export async function connectionDetail(ctx) {
  const { name } = ctx.params;
  const info = h("div");
  const chans = h("div");
  await ctx.poll(async () => {
    const [c, list] = await Promise.all([
      api("GET", `/connections/${seg(name)}`),
      api("GET", `/connections/${seg(name)}/channels`),
    ]);
    replace(
      info,
      facts([
        ["Virtual host", c.vhost],
        ["User", c.user],
        ["State", c.state || ""],
        ["Protocol", c.protocol || ""],
        ["Client", client(c)],
        ["Peer", `${c.peer_host ?? ""}:${c.peer_port ?? ""}`],
        ["Channel max", num(c.channel_max)],
        ["Frame max", num(c.frame_max)],
        ["Heartbeat", c.timeout === undefined ? "" : `${c.timeout} s`],
        ["Connected at", c.connected_at ? new Date(c.connected_at).toLocaleString() : ""],
      ]),
    );
    replace(chans, table(channelColumns(), list, { empty: "No channels." }));
  });
  const reason = h("input", { name: "reason", value: "Closed via management UI", size: 40 });
  const close = h(
    "form",
    { id: "close-connection" },
    field("Reason", reason),
    h("button", { type: "submit", class: "danger" }, "Force close"),
  );
  close.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const done = await ctx.act(() => api("DELETE", `/connections/${seg(name)}`, undefined, { "X-Reason": reason.value }));
    if (done !== undefined) ctx.go("#/connections", "Connection closed.");
  });
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Connection ", h("code", null, name)),
    section("Details", info),
    section("Channels", chans),
    section("Close this connection", close),
  );
}

export async function channelList(ctx) {
  const body = h("div");
  await ctx.poll(async () => {
    const list = await api("GET", "/channels");
    replace(body, table(channelColumns(), list, { empty: "No channels." }));
  });
  return h("div", { class: "page" }, h("h1", null, "Channels"), body);
}

export async function channelDetail(ctx) {
  const { name } = ctx.params;
  const info = h("div");
  const consumers = h("div");
  await ctx.poll(async () => {
    const c = await api("GET", `/channels/${seg(name)}`);
    const conn = c.connection_details?.name;
    replace(
      info,
      facts([
        ["Connection", conn ? connLink(conn) : ""],
        ["Virtual host", c.vhost],
        ["User", c.user],
        ["State", c.state || ""],
        ["Prefetch", num(c.prefetch_count)],
        ["Global prefetch", num(c.global_prefetch_count)],
        ["Confirm mode", yesno(c.confirm)],
        ["Transactional", yesno(c.transactional)],
        ["Unacked", num(c.messages_unacknowledged)],
        ["Unconfirmed", num(c.messages_unconfirmed)],
      ]),
    );
    replace(
      consumers,
      table(
        [
          ["Consumer tag", (x) => x.consumer_tag],
          [
            "Queue",
            (x) =>
              x.queue
                ? h("a", { href: `#/queues/${seg(x.queue.vhost)}/${seg(x.queue.name)}` }, x.queue.name)
                : "",
          ],
          ["Ack required", (x) => yesno(x.ack_required)],
          ["Exclusive", (x) => yesno(x.exclusive)],
          ["Prefetch", (x) => num(x.prefetch_count)],
        ],
        c.consumer_details || [],
        { empty: "No consumers." },
      ),
    );
  });
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Channel ", h("code", null, name)),
    section("Details", info),
    section("Consumers", consumers),
  );
}
