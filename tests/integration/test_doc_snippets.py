"""Docs that cannot drift: every code block of README.md and docs/*.md runs or says why not.

tests/doc_snippets.py describes the marker syntax and how blocks run. Here:
every block names its language; every python/sh/console block either runs
(per page, in order, against a Warren on the default ports in a private
network namespace) or carries an ``illustrative`` marker with its reason; and
every ``warren ...`` command a page shows, run or not, in a block or inline,
names subcommands and options that exist.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

import doc_commands as commands
import doc_snippets as snippets
import pytest

BLOCKS = snippets.all_blocks()
PAGES = sorted({b.path for b in BLOCKS if snippets.to_run(b)})


def test_every_block_names_its_language() -> None:
    known = (*snippets.CODE_LANGUAGES, *snippets.OTHER_LANGUAGES)
    bad = [f"{b.where}: {b.language or '(none)'}" for b in BLOCKS if b.language not in known]
    assert not bad, (
        "fenced blocks need a language: python, sh or console (these run in make test) "
        f"or one of {snippets.OTHER_LANGUAGES} (diagrams: text):\n" + "\n".join(bad)
    )


def test_markers_fit_their_blocks() -> None:
    bad = []
    for b in BLOCKS:
        if b.markers and not b.is_code:
            bad.append(f"{b.where}: a snippet marker on a {b.language} block")
        if b.marker("unchecked-output") and b.language != "console":
            bad.append(f"{b.where}: unchecked-output is for console blocks")
        if b.marker("no-errexit") and b.language != "sh":
            bad.append(f"{b.where}: no-errexit is for sh blocks")
        for kind in snippets.PYTHON_MARKERS:
            if b.marker(kind) and b.language != "python":
                bad.append(f"{b.where}: {kind} is for python blocks")
        if b.marker("pika-channel") and b.marker("pytest"):
            bad.append(f"{b.where}: a pytest module gets its broker from the fixtures")
        suite = b.marker("pytest")
        bad += [
            f"{b.where}: pytest's directory {d} is not in the checkout"
            for d in (suite.args if suite else [])
            if not (snippets.ROOT / d).is_dir()
        ]
        if b.language == "console" and snippets.to_run(b) and not snippets.console_steps(b.text):
            bad.append(f"{b.where}: a console block without a '$ ' command")
    assert not bad, "\n".join(bad)


def test_a_new_unmarked_block_is_run(tmp_path, monkeypatch) -> None:
    """An unmarked code block is in the runner's list; a marked one is not."""
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```sh\nwarren ctl status\n```\n\n"
        "<!-- snippet: illustrative: another machine -->\n```python\nimport nowhere\n```\n"
    )
    monkeypatch.setattr(snippets, "ROOT", tmp_path)
    run, kept = snippets.blocks(page)
    assert snippets.to_run(run) and not snippets.to_run(kept)
    page.write_text("<!-- snippet: illustrative -->\n```sh\nls\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        snippets.blocks(page)
    page.write_text("<!-- snippet: maybe: later -->\n```sh\nls\n```\n")
    with pytest.raises(ValueError, match="unknown snippet marker"):
        snippets.blocks(page)


def test_a_pytest_block_fails_unless_its_tests_pass(tmp_path) -> None:
    """A ``pytest`` block whose test fails, or that holds no test, is a failure."""
    env = snippets._env(tmp_path)
    status, output = snippets.run_pytest("def test_x():\n    assert 1 == 2\n", tmp_path, env, [])
    assert status == 1 and "assert 1 == 2" in output
    status, output = snippets.run_pytest("import pytest\n", tmp_path, env, [])
    assert status == 5 and "no tests ran" in output


def test_commands_shown_exist() -> None:
    bad = []
    for b in BLOCKS:
        if b.language in ("sh", "console"):
            bad += [
                f"{b.where}: {e}"
                for line in commands.command_lines(b)
                if (e := commands.check_command(line))
            ]
    for path in snippets.doc_paths():
        bad += [
            f"{where}: {e}"
            for where, cmd in commands.inline_commands(path)
            if (e := commands.check_command(cmd))
        ]
    assert not bad, "\n".join(bad)


def test_check_command_finds_drift() -> None:
    assert commands.check_command("warren ctl users add alice --tags management") is None
    assert "add_user" in (commands.check_command("warren ctl add_user alice") or "")
    assert "--nope" in (commands.check_command("warren perf throughput --nope 1") or "")
    assert commands.check_command("ls -l") is None


@pytest.fixture(scope="module")
def page_runner() -> Iterator[snippets.PageRunner]:
    """One runner for the pages this process runs (each page still gets a fresh broker)."""
    runner = snippets.PageRunner()
    yield runner
    runner.close()


@pytest.mark.skipif(not snippets.can_unshare(), reason="needs unshare -rnm (user namespaces)")
@pytest.mark.parametrize("page", PAGES)
def test_page_snippets_run(page: str, page_runner: snippets.PageRunner) -> None:
    results = page_runner.run(page)
    failed = [r for r in results if r.get("status", 0) != 0]
    assert not failed, "\n\n".join(f"{r['where']} failed:\n{r['output']}" for r in failed)
    assert len(results) == sum(1 for b in BLOCKS if b.path == page and snippets.to_run(b))


def _compiled_module_count() -> int:
    """len(setup.py's COMPILED_MODULES), read without running setup.py."""
    tree = ast.parse((snippets.ROOT / "setup.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", "") == "COMPILED_MODULES"
        ):
            return len(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no COMPILED_MODULES list")


def test_counts_and_versions_in_docs_come_from_the_code() -> None:
    """`warren X (compiled: N modules ...)` in a page: X is __version__, N setup.py's count
    (or the letter N: a number written down would need an edit at every module added)."""
    from warren import __version__

    shown = [
        (str(path.relative_to(snippets.ROOT)), m.group(1), m.group(2))
        for path in snippets.doc_paths()
        if path.name != "benchmarks.md"  # records of past runs, each with its git commit
        for m in re.finditer(r"warren (\S+) \(compiled: (\d+|N) modules", path.read_text())
    ]
    assert shown, "README.md shows `warren --version`'s compiled form"
    count = str(_compiled_module_count())
    for where, version, modules in shown:
        assert version == __version__ and modules in (count, "N"), where
