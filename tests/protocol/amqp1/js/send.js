// Send COUNT messages to ADDRESS over AMQP 1.0 with rhea, unsettled, and print
// their outcomes as JSON: node send.js PORT ADDRESS COUNT [VHOST]
"use strict";
const rhea = require("rhea");

const [port, address, count, vhost] = process.argv.slice(2);
const total = Number(count);
const outcomes = { accepted: 0, released: 0, rejected: 0 };
const container = rhea.create_container({ id: "rhea-send" });
const connection = container.connect({
  host: "127.0.0.1",
  port: Number(port),
  username: "guest",
  password: "guest",
  hostname: `vhost:${vhost || "/"}`,
  reconnect: false,
});
let sent = 0;

function settled() {
  if (outcomes.accepted + outcomes.released + outcomes.rejected === total) {
    console.log(JSON.stringify(outcomes));
    connection.close();
  }
}

function fail(context) {
  const error = context.sender ? context.sender.error : context.connection.error;
  console.log(JSON.stringify({ error: error ? error.condition : "disconnected" }));
  process.exit(2);
}

container.on("sendable", (context) => {
  while (context.sender.sendable() && sent < total) {
    context.sender.send({
      message_id: `rhea-${sent}`,
      body: `message ${sent}`,
      content_type: "text/plain",
      durable: true,
      application_properties: { n: sent },
    });
    sent += 1;
  }
});
container.on("accepted", () => { outcomes.accepted += 1; settled(); });
container.on("released", () => { outcomes.released += 1; settled(); });
container.on("rejected", () => { outcomes.rejected += 1; settled(); });
container.on("sender_error", fail);
container.on("connection_error", fail);
container.on("disconnected", (context) => { if (!context.connection.is_closed()) fail(context); });
connection.open_sender(address);
