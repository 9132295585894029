#!/usr/bin/env python3
"""Generate src/warren/amqp/spec.py from the RabbitMQ AMQP 0-9-1 JSON spec.

The method classes are emitted as straight-line code (one precompiled
struct.Struct per run of fixed-size fields, no loops over field lists)
because basic.publish/deliver/ack/nack/reject are decoded and encoded for
every message; a table-driven codec would cost several times more per call.

Usage: python tools/gen_amqp_spec.py [SPEC_JSON] [--output PATH] [--check]
"""

from __future__ import annotations

import argparse
import json
import keyword
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO_ROOT.parent / "shared" / "spec" / "amqp-rabbitmq-0.9.1.json"
DEFAULT_OUTPUT = REPO_ROOT / "src" / "warren" / "amqp" / "spec.py"

# struct format char and python annotation for each fixed-size AMQP type.
FIXED = {"octet": "B", "short": "H", "long": "I", "longlong": "Q", "timestamp": "Q"}
SIZES = {"B": 1, "H": 2, "I": 4, "Q": 8}
PY_TYPES = {
    "octet": "int",
    "short": "int",
    "long": "int",
    "longlong": "int",
    "timestamp": "int",
    "shortstr": "str",
    "longstr": "bytes",
    "bit": "bool",
    "table": "dict[str, Any]",
}
KNOWN_TYPES = set(PY_TYPES)
# Local names used by the generated encode/decode bodies.
RESERVED_LOCALS = {"self", "cls", "data", "offset", "n", "exc", "bits0", "bits1", "struct"}

# Methods whose codec is on the per-message path; listed in the module docstring
# so readers know why the generated code looks the way it does.
HOT_METHODS = ("basic.publish", "basic.deliver", "basic.ack", "basic.nack", "basic.reject")


@dataclass
class Field:
    name: str  # python attribute name
    amqp_name: str
    type: str  # resolved AMQP type
    default: Any  # python default value (already converted)


@dataclass
class MethodSpec:
    class_name: str
    class_id: int
    method_id: int
    amqp_name: str
    synchronous: bool
    content: bool
    fields: list[Field]


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def py_name(name: str) -> str:
    ident = name.replace("-", "_")
    return ident + "_" if keyword.iskeyword(ident) else ident


def const_name(name: str) -> str:
    return name.upper().replace("-", "_")


def convert_default(amqp_type: str, value: Any) -> Any:
    """Map a spec default-value (or its absence) onto the python value stored."""
    if amqp_type in FIXED:
        return 0 if value is None else int(value)
    if amqp_type == "shortstr":
        return "" if value is None else str(value)
    if amqp_type == "longstr":
        if value is None:
            return b""
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if amqp_type == "bit":
        return bool(value)
    if amqp_type == "table":
        if value:
            raise SystemExit(f"non-empty table defaults are not supported: {value!r}")
        return None  # None means "empty", stored as {}
    raise SystemExit(f"unknown AMQP type {amqp_type!r}")


def load_spec(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        spec: dict[str, Any] = json.load(fh)
    return spec


def resolve_methods(spec: dict[str, Any]) -> list[MethodSpec]:
    domains = {name: amqp_type for name, amqp_type in spec["domains"]}
    methods: list[MethodSpec] = []
    for cls in spec["classes"]:
        for meth in cls["methods"]:
            fields = []
            for arg in meth["arguments"]:
                amqp_type = arg.get("type") or domains[arg["domain"]]
                # Domains may chain (domain -> domain -> type); follow to a base type.
                seen = set()
                while amqp_type not in KNOWN_TYPES:
                    if amqp_type in seen or amqp_type not in domains:
                        raise SystemExit(f"cannot resolve domain {amqp_type!r}")
                    seen.add(amqp_type)
                    amqp_type = domains[amqp_type]
                if py_name(arg["name"]) in RESERVED_LOCALS:
                    raise SystemExit(f"field name {arg['name']!r} clashes with generated locals")
                fields.append(
                    Field(
                        name=py_name(arg["name"]),
                        amqp_name=arg["name"],
                        type=amqp_type,
                        default=convert_default(amqp_type, arg.get("default-value")),
                    )
                )
            methods.append(
                MethodSpec(
                    class_name=camel(cls["name"]) + camel(meth["name"]),
                    class_id=cls["id"],
                    method_id=meth["id"],
                    amqp_name=f"{cls['name']}.{meth['name']}",
                    synchronous=bool(meth.get("synchronous", False)),
                    content=bool(meth.get("content", False)),
                    fields=fields,
                )
            )
    return methods


def basic_properties(spec: dict[str, Any]) -> list[tuple[str, str]]:
    domains = {name: amqp_type for name, amqp_type in spec["domains"]}
    for cls in spec["classes"]:
        if cls["name"] == "basic":
            return [
                (py_name(prop["name"]), prop.get("type") or domains[prop["domain"]])
                for prop in cls.get("properties", [])
            ]
    raise SystemExit("spec has no basic class")


# ---------------------------------------------------------------------------
# Code generation for one method.
# ---------------------------------------------------------------------------


class StructRegistry:
    """Dedupes precompiled Struct objects by format string."""

    def __init__(self) -> None:
        self.formats: list[str] = []

    def name(self, fmt: str) -> str:
        if fmt not in self.formats:
            self.formats.append(fmt)
        return f"_S_{fmt}"

    def emit(self) -> list[str]:
        return [f"_S_{fmt} = struct.Struct('>{fmt}')" for fmt in self.formats]


def bit_groups(fields: list[Field]) -> list[list[Field] | Field]:
    """Group consecutive bit fields (max 8 per octet) as the spec packs them."""
    items: list[list[Field] | Field] = []
    for field in fields:
        if field.type == "bit":
            last = items[-1] if items else None
            if isinstance(last, list) and len(last) < 8:
                last.append(field)
            else:
                items.append([field])
        else:
            items.append(field)
    return items


def gen_encode(m: MethodSpec, structs: StructRegistry) -> list[str]:
    """Emit encode(): one Struct.pack per fixed run, with string length prefixes folded in."""
    pre: list[str] = []  # statements computing encoded strings
    parts: list[str] = []  # expressions concatenated into the result
    fmt = "HH"
    args = [str(m.class_id), str(m.method_id)]

    def flush() -> None:
        nonlocal fmt, args
        if fmt:
            parts.append(f"{structs.name(fmt)}.pack({', '.join(args)})")
        fmt, args = "", []

    for item in bit_groups(m.fields):
        if isinstance(item, list):
            terms = [f"({1 << i} if self.{f.name} else 0)" for i, f in enumerate(item)]
            fmt += "B"
            args.append(" | ".join(terms) if len(terms) > 1 else f"1 if self.{item[0].name} else 0")
            continue
        f = item
        if f.type in FIXED:
            fmt += FIXED[f.type]
            args.append(f"self.{f.name}")
        elif f.type == "shortstr":
            pre.append(f"{f.name} = self.{f.name}.encode('utf-8', 'surrogateescape')")
            fmt += "B"
            args.append(f"len({f.name})")
            flush()
            parts.append(f.name)
        elif f.type == "longstr":
            pre.append(f"{f.name} = self.{f.name}")
            pre.append(f"if isinstance({f.name}, str):")
            pre.append(f"    {f.name} = {f.name}.encode('utf-8')")
            fmt += "I"
            args.append(f"len({f.name})")
            flush()
            parts.append(f.name)
        elif f.type == "table":
            flush()
            parts.append(f"encode_table(self.{f.name})")
        else:  # pragma: no cover - resolve_methods rejects unknown types
            raise SystemExit(f"unsupported type {f.type}")
    flush()

    body = ["    def encode(self) -> bytes:"]
    if len(parts) == 1 and not pre:
        if not m.fields:
            # Constant payload: no struct call at all.
            body.append(f"        return {m.class_name}._PAYLOAD")
            return body
        body.append("        try:")
        body.append(f"            return {parts[0]}")
    else:
        body.append("        try:")
        body.extend(f"            {line}" for line in pre)
        if len(parts) <= 3:
            body.append(f"            return {' + '.join(parts)}")
        else:
            body.append("            return b''.join((")
            body.extend(f"                {p}," for p in parts)
            body.append("            ))")
    body.append("        except struct.error as exc:")
    body.append(f"            raise ValueError(f'cannot encode {m.amqp_name}: {{exc}}') from exc")
    return body


#: Methods whose arguments table keeps each entry's wire type tag (core/table_tags.py):
#: a redeclaration's 406 text names it, as RabbitMQ's does. Not basic.publish's path.
TAGGED_ARGUMENTS = frozenset({"exchange.declare", "queue.declare"})


def gen_decode(m: MethodSpec, structs: StructRegistry) -> list[str]:
    """Emit decode(): mirror of encode, one unpack_from per fixed run."""
    head = [
        "    @classmethod",
        "    def decode(cls, data: bytes | memoryview, offset: int = 4) -> Self:",
    ]
    if not m.fields:
        return head + [
            "        if len(data) != offset:",
            f"            raise DecodeError('{m.amqp_name}: unexpected bytes after the arguments')",
            "        return cls()",
        ]

    lines: list[str] = []
    run_fmt = ""
    run_targets: list[str] = []
    bit_vars = 0
    ctor_args: dict[str, str] = {}

    def flush() -> None:
        nonlocal run_fmt, run_targets
        if not run_fmt:
            return
        size = sum(SIZES[c] for c in run_fmt)
        if run_fmt == "B":
            lines.append(f"{run_targets[0]} = data[offset]")
        else:
            targets = ", ".join(run_targets) + ("," if len(run_targets) == 1 else "")
            lines.append(f"{targets} = {structs.name(run_fmt)}.unpack_from(data, offset)")
        lines.append(f"offset += {size}")
        run_fmt, run_targets = "", []

    for item in bit_groups(m.fields):
        if isinstance(item, list):
            var = f"bits{bit_vars}"
            bit_vars += 1
            run_fmt += "B"
            run_targets.append(var)
            for i, f in enumerate(item):
                ctor_args[f.name] = f"{var} & {1 << i} != 0"
            continue
        f = item
        if f.type in FIXED:
            run_fmt += FIXED[f.type]
            run_targets.append(f.name)
            ctor_args[f.name] = f.name
        elif f.type == "shortstr":
            run_fmt += "B"
            run_targets.append("n")
            flush()
            lines.append(f"{f.name} = str(data[offset:offset + n], 'utf-8', 'surrogateescape')")
            lines.append("offset += n")
            ctor_args[f.name] = f.name
        elif f.type == "longstr":
            run_fmt += "I"
            run_targets.append("n")
            flush()
            lines.append(f"{f.name} = bytes(data[offset:offset + n])")
            lines.append("offset += n")
            ctor_args[f.name] = f.name
        elif f.type == "table":
            flush()
            decoder = "decode_arguments" if m.amqp_name in TAGGED_ARGUMENTS else "decode_table"
            lines.append(f"{f.name}, offset = {decoder}(data, offset)")
            ctor_args[f.name] = f.name
    flush()
    has_strings = any(f.type in ("shortstr", "longstr") for f in m.fields)

    body = head + ["        try:"]
    body.extend(f"            {line}" for line in lines)
    body.append("        except (struct.error, IndexError) as exc:")
    body.append(f"            raise DecodeError(f'malformed {m.amqp_name}: {{exc}}') from exc")
    # String slices past the end silently shorten, and bytes after the last argument
    # mean a malformed frame (RabbitMQ answers both with 501): one check covers both.
    body.append("        if offset != len(data):")
    if has_strings:
        body.append(
            f"            raise DecodeError('truncated {m.amqp_name}' if offset > len(data) "
            f"else '{m.amqp_name}: unexpected bytes after the arguments')"
        )
    else:
        body.append(f"            raise DecodeError('{m.amqp_name}: unexpected bytes after the arguments')")
    call = ", ".join(ctor_args[f.name] for f in m.fields)
    body.append(f"        return cls({call})")
    return body


def gen_init(m: MethodSpec) -> list[str]:
    if not m.fields:
        return []
    params = []
    assigns = []
    for f in m.fields:
        if f.type == "table":
            params.append(f"{f.name}: dict[str, Any] | None = None")
            assigns.append(f"self.{f.name} = {{}} if {f.name} is None else {f.name}")
        elif f.type == "longstr":
            params.append(f"{f.name}: bytes | str = {f.default!r}")
            assigns.append(
                f"self.{f.name} = {f.name}.encode('utf-8') if isinstance({f.name}, str) else {f.name}"
            )
        else:
            params.append(f"{f.name}: {PY_TYPES[f.type]} = {f.default!r}")
            assigns.append(f"self.{f.name} = {f.name}")
    lines = ["    def __init__(", "        self,"]
    lines.extend(f"        {p}," for p in params)
    lines.append("    ) -> None:")
    lines.extend(f"        {a}" for a in assigns)
    return lines


def gen_class(m: MethodSpec, structs: StructRegistry) -> list[str]:
    index = m.class_id << 16 | m.method_id
    fields_repr = repr(tuple((f.name, f.type) for f in m.fields))
    slots_repr = repr(tuple(f.name for f in m.fields))
    lines = [
        f"class {m.class_name}(Method):",
        f'    """{m.amqp_name} ({m.class_id}/{m.method_id})."""',
        "",
        f"    __slots__ = {slots_repr}",
        "",
        f"    CLASS_ID = {m.class_id}",
        f"    METHOD_ID = {m.method_id}",
        f"    INDEX = {index:#010x}",
        f"    NAME = {m.amqp_name!r}",
        f"    SYNCHRONOUS = {m.synchronous}",
        f"    CONTENT = {m.content}",
        f"    FIELDS = {fields_repr}",
    ]
    if not m.fields:
        payload = m.class_id.to_bytes(2, "big") + m.method_id.to_bytes(2, "big")
        lines.append(f"    _PAYLOAD = {payload!r}")
    if m.fields:
        lines.append("")
        for f in m.fields:
            ann = "bytes" if f.type == "longstr" else PY_TYPES[f.type]
            lines.append(f"    {f.name}: {ann}")
        lines.append("")
        lines.extend(gen_init(m))
    lines.append("")
    lines.extend(gen_encode(m, structs))
    lines.append("")
    lines.extend(gen_decode(m, structs))
    return lines


# ---------------------------------------------------------------------------
# Module assembly.
# ---------------------------------------------------------------------------

HEADER = '''\
# Generated by tools/gen_amqp_spec.py from {spec_name}.
# DO NOT EDIT BY HAND: change the generator and re-run it instead.
"""AMQP {major}-{minor}-{revision} constants and method codec (RabbitMQ dialect).

Each method class encodes to / decodes from a method frame payload (class id,
method id, arguments).  The codecs are generated straight-line code because
{hot} run once per message.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar, Self

from warren.core.codec_errors import DecodeError, UnknownMethod
from warren.core.table import decode_table
from warren.core.table_encode import encode_table
from warren.core.table_tags import decode_arguments
'''

METHOD_BASE = '''\
class Method:
    """Base of all generated method classes."""

    __slots__ = ()

    CLASS_ID: ClassVar[int]
    METHOD_ID: ClassVar[int]
    INDEX: ClassVar[int]
    NAME: ClassVar[str]
    SYNCHRONOUS: ClassVar[bool]
    CONTENT: ClassVar[bool]
    FIELDS: ClassVar[tuple[tuple[str, str], ...]]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Method):
            return NotImplemented
        if type(other) is not type(self):
            return False
        return all(getattr(self, name) == getattr(other, name) for name, _ in self.FIELDS)

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={getattr(self, name)!r}" for name, _ in self.FIELDS)
        return f"{type(self).__name__}({args})"

    def encode(self) -> bytes:
        """Return the method frame payload: class id, method id, arguments."""
        raise NotImplementedError

    @classmethod
    def decode(cls, data: bytes | memoryview, offset: int = 4) -> Self:
        """Decode the arguments that start at ``offset`` (after the 4 id bytes)."""
        raise NotImplementedError
'''

DECODE_METHOD = '''\
def decode_method(payload: bytes | memoryview) -> Method:
    """Decode a method frame payload; only DecodeError (or UnknownMethod) escapes."""
    try:
        (index,) = _S_I.unpack_from(payload, 0)
    except struct.error:
        raise DecodeError(f"method frame payload too short ({len(payload)} bytes)") from None
    cls = METHODS.get(index)
    if cls is None:
        raise UnknownMethod(index >> 16, index & 0xFFFF)
    return cls.decode(payload, 4)
'''


def generate(spec: dict[str, Any], spec_name: str) -> str:
    methods = resolve_methods(spec)
    structs = StructRegistry()
    structs.name("I")  # used by decode_method

    out: list[str] = [
        HEADER.format(
            spec_name=spec_name,
            major=spec["major-version"],
            minor=spec["minor-version"],
            revision=spec["revision"],
            hot=", ".join(HOT_METHODS[:-1]) + " and " + HOT_METHODS[-1],
        )
    ]

    consts = [(const_name(c["name"]), int(c["value"]), c.get("class")) for c in spec["constants"]]
    out.append(
        f"PROTOCOL_VERSION = ({spec['major-version']}, {spec['minor-version']}, {spec['revision']})"
    )
    out.append(f"DEFAULT_PORT = {int(spec['port'])}")
    out.append("")
    for name, value, _ in consts:
        out.append(f"{name} = {value}")
    out.append("")
    reply = [
        (n, v) for n, v, c in consts if c in ("soft-error", "hard-error") or n == "REPLY_SUCCESS"
    ]
    out.append("REPLY_TEXT: dict[int, str] = {")
    out.extend(f"    {v}: {n!r}," for n, v in reply)
    out.append("}")
    for label, kind in (("SOFT_ERRORS", "soft-error"), ("HARD_ERRORS", "hard-error")):
        out.append(f"{label}: frozenset[int] = frozenset((")
        out.extend(f"    {n}," for n, _, c in consts if c == kind)
        out.append("))")
    out.append("")

    props = basic_properties(spec)
    out.append("BASIC_CLASS_ID = 60")
    out.append(
        "# (python attribute name, AMQP type) in flag-bit order, most significant bit first."
    )
    out.append("BASIC_PROPERTIES: tuple[tuple[str, str], ...] = (")
    out.extend(f"    ({name!r}, {amqp_type!r})," for name, amqp_type in props)
    out.append(")")
    out.append("")

    class_lines: list[list[str]] = [gen_class(m, structs) for m in methods]
    out.append("")
    out.extend(structs.emit())
    out.append("")
    out.append("")
    out.append(METHOD_BASE.rstrip("\n"))
    for lines in class_lines:
        out.append("")
        out.append("")
        out.extend(lines)
    out.append("")
    out.append("")
    out.append("METHODS: dict[int, type[Method]] = {")
    out.extend(f"    {m.class_name}.INDEX: {m.class_name}," for m in methods)
    out.append("}")
    out.append("")
    out.append("")
    out.append(DECODE_METHOD.rstrip("\n"))
    text = "\n".join(out) + "\n"
    if "basic" not in {m.amqp_name.split(".")[0] for m in methods}:
        raise SystemExit("spec has no basic methods")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--output", "-o", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the output file is not up to date"
    )
    args = parser.parse_args(argv)

    text = generate(load_spec(args.spec), args.spec.name)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date; run tools/gen_amqp_spec.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
