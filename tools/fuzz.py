"""`make fuzz`: the codec fuzz targets of tests/fuzz_targets.py under atheris
(coverage-guided, libFuzzer), much longer than `make test`'s bounded run.

    python tools/fuzz.py TARGET [libFuzzer options, e.g. -max_total_time=300]
    python tools/fuzz.py --list

A crash leaves libFuzzer's crash-<hash> file with the input: replay it with
``python tools/fuzz.py TARGET crash-<hash>`` and add it to tests/protocol/amqp/test_codec_fuzz.py's
seeds (or a regression test of its own).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    from fuzz_targets import TARGETS

    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help", "--list"):
        print("targets:", ", ".join(sorted(TARGETS)))
        return 0 if len(sys.argv) >= 2 else 2
    name = sys.argv[1]
    if name not in TARGETS:
        print(f"unknown target {name!r}; targets: {', '.join(sorted(TARGETS))}", file=sys.stderr)
        return 2
    try:
        import atheris
    except ImportError:
        print("atheris is not installed (pip install atheris)", file=sys.stderr)
        return 2
    target = TARGETS[name]
    with atheris.instrument_imports():
        import warren.amqp.spec  # noqa: F401  - instrumented for coverage guidance
        import warren.amqp1.codec  # noqa: F401
        import warren.amqp1.encoding  # noqa: F401
        import warren.amqp1.frames  # noqa: F401
        import warren.amqp1.performatives  # noqa: F401
        import warren.core.properties  # noqa: F401
        import warren.core.table  # noqa: F401
        import warren.core.table_edit  # noqa: F401
        import warren.core.table_encode  # noqa: F401
        import warren.mqtt.codec  # noqa: F401
        import warren.stream_protocol.chunk  # noqa: F401
        import warren.stream_protocol.commands  # noqa: F401
        import warren.stream_protocol.frames  # noqa: F401
        import warren.stream_protocol.publish  # noqa: F401
        import warren.stream_protocol.wire  # noqa: F401
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
