"""The manual (docs/, mkdocs.yml): its generated reference lists every flag of every
command with its default, and its navigation names pages that exist.

The generator (docs/gen_reference.py) is imported as the build runs it, in this
process; the site itself is built by CI (`mkdocs build --strict`), not here."""
import dataclasses
import importlib.util
import os
import re

import pytest

from tests.helpers import REPO

DOCS = os.path.join(REPO, "docs")


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_reference", os.path.join(DOCS, "gen_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()
PAGES = gen.pages()


def test_every_console_script_has_a_reference_page():
    setup = open(os.path.join(REPO, "setup.py")).read()
    scripts = re.findall(r'"(esync[a-z-]*) = ', setup)
    assert scripts and sorted(scripts) == sorted(c.name for c in gen.COMMANDS)


def _shown_default(parser, action):
    """What the page must show as the flag's default, worked out here from the parser
    (argparse's default, or the dataclass field's for main.py's parser)."""
    raw = action.default
    if raw is dataclasses.MISSING:
        raw = {f.name: f.default for f in dataclasses.fields(parser._options_type)}[action.dest]
    if raw is dataclasses.MISSING or raw == "==SUPPRESS==" or action.required:
        return None
    if action.nargs == 0 and isinstance(raw, bool):
        return "on" if raw else "off"
    if isinstance(raw, list):
        return ",".join(map(str, raw))
    return {None: "none", "": "empty"}.get(raw, str(raw))


@pytest.mark.parametrize("command", gen.COMMANDS, ids=lambda c: c.name)
def test_the_reference_lists_every_flag_with_its_default(command):
    page = PAGES[f"{gen.FOLDER}/{command.name}.md"]
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    parser = gen.parser_of(command)
    assert parser.prog == command.name
    actions = [a for a in parser._actions if a.option_strings]
    assert actions
    for action in actions:
        cell = ", ".join(f"`{flag}`" for flag in action.option_strings)
        row = [r for r in rows if r.startswith(f"| {cell} |")]
        assert len(row) == 1, f"{command.name}: no row for {cell}"
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row[0])[1:-1]]
        assert len(cells) == 4, row[0]
        shown = _shown_default(parser, action)
        if action.required:
            assert cells[2] == "(required)", row[0]
        elif shown is None:
            assert cells[2] == "", row[0]
        else:
            assert cells[2] == f"`{shown}`", f"{command.name} {cell}: {cells[2]} != {shown}"
        if action.help and "%(" not in action.help:
            first = re.sub(r"\s+", " ", action.help).split("(default")[0].strip()[:20]
            plain = cells[3].replace("\\", "").replace("&lt;", "<").replace("&gt;", ">")
            assert first in plain, f"{command.name} {cell}: help missing: {first!r}"
    for action in parser._actions:
        if not action.option_strings:  # positional arguments
            name = action.metavar or action.dest
            assert any(r.startswith(f"| `{name}` |") for r in rows), name


def test_main_py_flags_keep_the_original_short_forms():
    page = PAGES[f"{gen.FOLDER}/esync.md"]
    for flag in ["-l", "-ll", "-gl", "-b", "-dd", "-g", "-c", "-n", "-ld", "-e", "-m",
                 "-dcasgd", "-s", "-ip", "-port"]:
        assert f"| `{flag}`, `--" in page, flag


def test_help_with_format_specifiers_is_expanded():
    import argparse

    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--size", type=int, default=7, choices=[7, 8],
                        help="a size | of %(choices)s (default: %(default)s)")
    parser.add_argument("--hidden", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    lines = gen.parser_markdown(parser)
    row = next(line for line in lines if line.startswith("| `--size`"))
    assert row == "| `--size` | `7` \\| `8` | `7` | a size \\| of 7, 8 |"
    hidden = next(line for line in lines if line.startswith("| `--hidden`"))
    assert hidden.split("|")[3].strip() == ""


def _nav_pages(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _nav_pages(value)


def test_every_page_of_the_nav_exists():
    yaml = pytest.importorskip("yaml")  # mkdocs's (the docs extra) and ray's
    config = yaml.safe_load(open(os.path.join(REPO, "mkdocs.yml")))
    nav = list(_nav_pages(config["nav"]))
    assert len(nav) > 20
    for page in nav:
        assert page in PAGES or os.path.isfile(os.path.join(DOCS, page)), page
    for generated in PAGES:
        assert generated in nav, f"{generated} is generated but not in the nav"


def test_the_readme_is_a_landing_page_whose_quick_start_is_unchanged():
    readme = open(os.path.join(REPO, "README.md")).read()
    assert len(readme.splitlines()) <= 150
    quick = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert ("```bash\npip install torch==2.13.0 && pip install -e '.[dev,ray]' && "
            "esync-experiment --out runs\npython -m pytest -q\n```") in quick
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert os.path.exists(os.path.join(REPO, target)), target
