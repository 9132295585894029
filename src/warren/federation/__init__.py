"""Federation (docs/federation.md): exchanges that receive what is published to
an exchange of the same name on other brokers, as RabbitMQ's federation plugin
defines them: upstreams and upstream sets are runtime parameters, and a policy
with ``federation-upstream-set`` or ``federation-upstream`` makes the exchanges
it matches federated."""
