// Take COUNT messages from ADDRESS over AMQP 1.0 with rhea, accept them, and
// print each as a JSON line: node receive.js PORT ADDRESS COUNT [VHOST]
"use strict";
const rhea = require("rhea");

const [port, address, count, vhost] = process.argv.slice(2);
const total = Number(count);
const container = rhea.create_container({ id: "rhea-receive" });
const connection = container.connect({
  host: "127.0.0.1",
  port: Number(port),
  username: "guest",
  password: "guest",
  hostname: `vhost:${vhost || "/"}`,
  reconnect: false,
});
let received = 0;

function fail(context) {
  const error = context.receiver ? context.receiver.error : context.connection.error;
  console.log(JSON.stringify({ error: error ? error.condition : "disconnected" }));
  process.exit(2);
}

container.on("message", (context) => {
  const m = context.message;
  const body = Buffer.isBuffer(m.body) ? m.body.toString() : m.body;
  const content = m.body && m.body.typecode === 0x75 ? m.body.content.toString() : body;
  console.log(JSON.stringify({
    body: content,
    message_id: m.message_id,
    correlation_id: m.correlation_id,
    content_type: m.content_type,
    durable: m.durable,
    application_properties: m.application_properties,
  }));
  received += 1;
  if (received === total) connection.close();
});
container.on("receiver_error", fail);
container.on("connection_error", fail);
container.on("disconnected", (context) => { if (!context.connection.is_closed()) fail(context); });
connection.open_receiver({ source: address, credit_window: 10, autoaccept: true });
