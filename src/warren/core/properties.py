from warren.amqp.properties import *  # noqa: F401,F403  (temporary shim)
from warren.amqp.properties import (  # noqa: F401
    BasicProperties,
    decode_properties,
    peek_delivery_mode,
    peek_headers,
    split_header_payload,
)
