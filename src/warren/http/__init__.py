"""RabbitMQ's HTTP management API (and the web UI's files) as a Warren listener.

    server.py          HTTPListener (warren.node.Listener "http"), routing, auth, errors
    state.py           the route table; settings the core has no place for
    common.py          errors, auth levels, request bodies, list options (paging, sort)
    formats.py         core objects in RabbitMQ's JSON shapes
    api_overview.py    overview, whoami, nodes (figures from node_stats.py)
    api_broker.py      vhosts, users, permissions, health checks, aliveness test
    api_definitions.py /api/definitions: export and import
    api_objects.py     exchanges, queues, bindings, publish, get
    api_connections.py connections, channels, consumers (through ClientConnection)
    api_parameters.py  policies, operator policies, limits, parameters
    static/            the web UI (served at / and /ui/)

Imports core/, store/, node.py, node_stats.py, config.py, json_tables.py and the
definitions_* modules; never another protocol package, the broker or warren.app
(tests/core/test_layering.py).
"""
