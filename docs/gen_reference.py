"""The manual's generated reference pages: one page per command, from its argparse parser.

Run by the mkdocs-gen-files plugin (mkdocs.yml) on every `mkdocs build` and `mkdocs
serve`; the pages exist only in the build, never in the repository, so the flags the
manual lists are the flags the commands take. Each command's parser is the one the
command itself builds (its module's `build_parser(prog)`); each page lists every
action of the parser with its option strings, value, default, choices and help, by
argument group, with mutually exclusive groups and subcommands. A command whose --help
lists several parsers' flags (esync-run: the launcher's and the job's, marked as a
script uses them) has a `help_sections` function in its module, from which both its
--help and its page are made (`sections_markdown`).

Besides the commands, the state server's HTTP API page is written here: its modules'
docstrings (the budget API, the live page, a live report's fields), by mkdocstrings.

    python docs/gen_reference.py [COMMAND]     # print the pages (or one) to stdout
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
import sys
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (REPO, os.path.join(REPO, "src")):  # the build runs from the repository
    if _path not in sys.path:                    # root; a test may not
        sys.path.insert(0, _path)

#: where the command pages go, under docs/ (in the build only)
FOLDER = "reference/commands"
#: the state server's HTTP API page (in the build only)
HTTP_PAGE = "reference/http-api.md"


class Command(NamedTuple):
    name: str           # the console script (setup.py)
    module: str         # where its parser is built
    what: str           # one line: what the command is for (markdown)
    guide: str          # the manual's page that explains it, relative to FOLDER
    notes: str = ""     # markdown after the flags: where the other flags come from


COMMANDS: List[Command] = [
    Command("esync", "esync.options",
            "One process of a job (scheduler, server, worker, evaluator, a DDP rank) or a "
            "standalone training; the same as `python main.py` and `python -m esync`. "
            "Its role comes from `DMLC_ROLE` (or torch's `RANK` for `-m ddp`). These are "
            "also the settings of `esync.init()` in a script of your own, and the flags "
            "the launchers pass on to every worker.",
            "../../tutorials/one-machine.md",
            notes="Defaults live in `esync/config.py` (edit it to change them); a flag always "
                  "wins. The switches (`-c`, `-s`, `-dcasgd`, `--resume`, "
                  "`--balance-batches`, `--log-samples`) take a value, `1`/`0`, "
                  "`true`/`false` or `yes`/`no`, as in the original's commands "
                  "(`-c True`, `-s 1`). Whichever stop criterion is reached first ends "
                  "the run. A bad value stops the program with one line naming the flag "
                  "and exit status 2, for example `main.py: error: argument "
                  "-b/--batch-size: expected a positive integer, got '-3'`. The "
                  "environment variables are in [Environment variables]"
                  "(../environment.md)."),
    Command("esync-launch", "esync.launch.local",
            "A whole job on this machine (state server, scheduler, servers, workers, "
            "evaluator), or on a Ray cluster with `--ray`.",
            "../../tutorials/one-machine.md",
            notes="Every other flag is [`esync`'s](esync.md) (main.py's), checked by its "
                  "parser before anything starts and passed to every worker; those of "
                  "checkpoints and failures go to the scheduler and the servers too."),
    Command("esync-run", "esync.launch.run",
            "A training script of your own as the job's workers, with the rest of the "
            "job beside them, as torchrun starts a script: "
            "`esync-run [launcher flags] [job flags] SCRIPT.py [script args]`.",
            "../../tutorials/your-own-script.md",
            notes="The launcher flags are [esync-launch's](esync-launch.md), the job "
                  "flags [`esync`'s](esync.md) (main.py's), which reach the script in "
                  "`ESYNC_ARGS`, where `esync.init()` reads them. This page and "
                  "`esync-run --help` come from one function, "
                  "`esync.launch.run.help_sections`."),
    Command("esync-hosts", "esync.launch.hosts",
            "The command for each role on each host of a real cluster, from a host file, "
            "or a Slurm batch script (`--slurm`); it starts nothing itself.",
            "../../tutorials/slurm.md",
            notes="The flags after `--` are [`esync`'s](esync.md) (main.py's), checked "
                  "first and given to every process."),
    Command("esync-experiment", "esync.launch.experiment",
            "The comparison: every algorithm on the same simulated cluster, with several "
            "seeds, plain and on slow links, then the tables and figures.",
            "../../evidence/quick-start.md",
            notes="Other flags (`-dd`, `-b`, `-ll`, ...) are [`esync`'s](esync.md) and go "
                  "to every worker; a training script of your own and its arguments may "
                  "follow them, as with [esync-run](esync-run.md)."),
    Command("esync-stalls", "esync.launch.stalls",
            "Where each device's time would go and what would help (DataLoader workers, "
            "a cache, a faster link), measured in this process from a job's "
            "configuration; nothing of the job starts.",
            "../../how-to/where-time-goes.md",
            notes="Besides these, it takes the job's configuration as the job would be "
                  "started: [esync-launch's](esync-launch.md) per-device flags "
                  "(`--workers`, `--slowdown`, `--bandwidth`, `--latency`, `--devices`) "
                  "and [`esync`'s](esync.md). A training script of your own and its "
                  "arguments may follow them, as with [esync-run](esync-run.md): its job "
                  "is then run once as esync-run starts it, for `--seconds` of training, "
                  "and each worker's logged rounds say where its time went (the what-ifs "
                  "are not predicted for a script). Without a script and without `-n`, "
                  "the built-in network and data are measured, which it says."),
    Command("esync-summary", "esync.logs_tools.summary",
            "One run's iteration logs to its summary, `<Name>.json`.",
            "../../how-to/logs-and-figures.md"),
    Command("esync-draw", "esync.logs_tools.drawer",
            "The figures and the speedup table of one run folder's summaries.",
            "../../how-to/logs-and-figures.md"),
    Command("esync-compare", "esync.logs_tools.compare",
            "Medians and spreads over the seeds and configurations of an experiment: "
            "`results.md`, `results.json` and figures.",
            "../../how-to/logs-and-figures.md"),
    Command("esync-pack", "esync.data.pack",
            "A data set written as WebDataset shards with their index, or existing "
            "shards indexed.",
            "../../how-to/data-and-networks.md"),
]


def parser_of(command: Command) -> argparse.ArgumentParser:
    """The parser `command` parses its command line with, its prog the command's name."""
    return importlib.import_module(command.module).build_parser(prog=command.name)


def default_of(parser: argparse.ArgumentParser, action: argparse.Action):
    """The value a flag has when it is not given: argparse's default, or, for a parser
    made from a dataclass (argparse-dataclass, esync.options), the dataclass field's."""
    default = action.default
    if default is dataclasses.MISSING and hasattr(parser, "_options_type"):
        for f in dataclasses.fields(parser._options_type):
            if f.name == action.dest:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
    return default


def default_text(parser: argparse.ArgumentParser, action: argparse.Action) -> Optional[str]:
    """The default as the page shows it (None: nothing to show: --help, a required flag,
    a SUPPRESSed default)."""
    default = default_of(parser, action)
    if default is argparse.SUPPRESS or default is dataclasses.MISSING or action.required:
        return None
    if action.nargs == 0 and isinstance(default, bool):  # store_true / store_false
        return "on" if default else "off"
    if default is None:
        return "none"
    if default == "":
        return "empty"
    if isinstance(default, (list, tuple)):
        return ",".join(str(item) for item in default)
    return str(default)


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as --help shows it (%(default)s and the like expanded), without a closing
    "(default: X)" that repeats the default column."""
    text = action.help or ""
    if text is argparse.SUPPRESS:
        return "(not shown by --help)"
    params = dict(vars(action), prog=parser.prog, default=default_of(parser, action))
    for name in list(params):
        if params[name] is argparse.SUPPRESS:
            del params[name]
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    if "%" in text:
        text = text % params
    shown = default_text(parser, action)
    end = re.search(r"\s*\(default:?\s+([^()]*)\)\s*$", text)
    if end and shown is not None and end.group(1).strip() == shown:
        text = text[:end.start()]
    return " ".join(text.split())


def _escape(text: str) -> str:
    """Markdown for a table cell: code spans kept, HTML, emphasis and pipes escaped."""
    out = []
    for i, part in enumerate(text.split("`")):
        inside = i % 2 == 1 and i < len(text.split("`")) - 1
        if inside and "|" not in part:
            out.append(f"`{part}`")
            continue
        part = part.replace("\\", "\\\\")
        for char in "*_[]|":
            part = part.replace(char, "\\" + char)
        part = part.replace("<", "&lt;").replace(">", "&gt;")
        out.append(part)
    return "".join(out)


def value_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """What a flag takes: its choices, else its metavar and the type's description."""
    if action.nargs == 0:
        return ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        value = " \\| ".join(f"`{choice}`" for choice in action.choices)
    else:
        metavar = action.metavar or (action.dest if not action.option_strings
                                     else action.dest.upper())
        if isinstance(metavar, tuple):
            metavar = " ".join(metavar)
        value = _escape(metavar)
        kind = getattr(action.type, "__name__", "")
        if kind == "_switch":
            value += ": `1`/`0`, `true`/`false`, `yes`/`no`"
        elif kind and not kind.startswith("_") and kind not in ("str", "<lambda>"):
            value += f": {_escape(kind)}"
    if action.nargs == "?":
        value = f"[{value}]"
    elif action.nargs in ("*", "+"):
        value = f"{value} ..." + (" (one or more)" if action.nargs == "+" else "")
    elif isinstance(action.nargs, int) and action.nargs > 1:
        value = f"{value} (x{action.nargs})"
    return value


def _row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    names = ", ".join(f"`{option}`" for option in action.option_strings) \
        or f"`{action.metavar or action.dest}`"
    shown = default_text(parser, action)
    default = "" if shown is None else f"`{shown}`" if "|" not in shown else _escape(shown)
    if action.required and action.option_strings:
        default = "(required)"
    return (f"| {names} | {value_text(parser, action)} | {default} | "
            f"{_escape(help_text(parser, action))} |")


def _table(parser: argparse.ArgumentParser, actions: List[argparse.Action]) -> List[str]:
    lines = ["| flag | value | default | meaning |", "|---|---|---|---|"]
    return lines + [_row(parser, action) for action in actions]


def _prose(parser: argparse.ArgumentParser, text: Optional[str]) -> List[str]:
    """A description or epilog: preformatted (RawDescriptionHelpFormatter) as text,
    else a paragraph."""
    if not text:
        return []
    if issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter):
        return ["```text", text.strip("\n"), "```", ""]
    return [_escape(" ".join(text.split())), ""]


def parser_markdown(parser: argparse.ArgumentParser, level: int = 2) -> List[str]:
    """The flags of `parser` by argument group, its exclusive groups and subcommands."""
    lines: List[str] = []
    usage = parser.format_usage().strip()
    lines += ["```text", usage, "```", ""]
    lines += _prose(parser, parser.description)
    subcommands = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if not isinstance(a, argparse._SubParsersAction)]
        subcommands += [a for a in group._group_actions
                        if isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        lines += [f"{'#' * level} {group.title[:1].upper()}{group.title[1:]}", ""]
        lines += _prose(parser, group.description)
        lines += _table(parser, actions) + [""]
    for group in parser._mutually_exclusive_groups:
        names = " and ".join(", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.dest}`"
                             for a in group._group_actions)
        kind = "exactly one" if group.required else "at most one"
        lines += [f"Of {names}, {kind} may be given.", ""]
    for action in subcommands:
        for name, sub in action.choices.items():
            lines += [f"{'#' * level} `{parser.prog} {name}`", ""]
            lines += parser_markdown(sub, level + 1)
    lines += _prose(parser, parser.epilog)
    return lines


def actions_of(parser: argparse.ArgumentParser) -> Iterator[Tuple[argparse.ArgumentParser,
                                                                 argparse.Action]]:
    """Every action of `parser` and of its subcommands' parsers, with its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from actions_of(sub)
        else:
            yield parser, action


def sections_markdown(module, level: int = 2) -> List[str]:
    """The flags of a command whose --help lists several parsers' (esync-run: the
    launcher's and the job's), from the module's `help_sections`, as its --help shows
    them: its usage, description and log paths, then each section's table."""
    lines = ["```text", module.USAGE, "```", ""]
    for paragraph in module.description():
        lines += [_escape(paragraph), ""]
    lines += ["```text", *module.log_lines(), "```", ""]
    sections = module.help_sections(module.PROG)
    for section in sections:
        lines += [f"{'#' * level} {section.title[:1].upper()}{section.title[1:]}", ""]
        lines += [_escape(section.description), ""]
        lines += _table(section.parser, section.actions) + [""]
    return lines + _prose(sections[0].parser, sections[0].parser.epilog)


def page(command: Command) -> str:
    """The reference page of one command (markdown)."""
    module = importlib.import_module(command.module)
    lines = [f"# {command.name}", "",
             f"{command.what} Explained in [its guide]({command.guide}).", "",
             "Generated from the command's own parser "
             f"(`{command.module}`), as `{command.name} --help` shows it.", ""]
    if hasattr(module, "help_sections"):
        lines += sections_markdown(module)
    else:
        lines += parser_markdown(parser_of(command))
    if command.notes:
        lines += [command.notes, ""]
    return "\n".join(lines)


def index_page() -> str:
    lines = ["# Commands", "",
             "Every command that `pip install -e .` installs (setup.py's console "
             "scripts). Each page is generated from the command's own argparse parser "
             "when the manual is built, so it lists every flag the command takes, with "
             "its default.", "",
             "| command | what it does |", "|---|---|"]
    lines += [f"| [{c.name}]({c.name}.md) | {c.what} |" for c in COMMANDS]
    lines += ["", "The state server's `python manage.py runserver ADDRESS:PORT` takes "
              "Django's own flags; its settings are environment variables "
              "([Environment variables](../environment.md))."]
    return "\n".join(lines) + "\n"


def http_page() -> str:
    """The state server's HTTP API, from its modules' docstrings (mkdocstrings)."""
    lines = ["# State server HTTP API", "",
             "The state server's endpoints, rendered from the docstrings of its views. "
             "How the budgets are computed, the limits on a request and examples with "
             "`curl` are in [Budgets and the state server]"
             "(../explanation/state-server.md); the live page is explained in "
             "[Watch a running job](../how-to/live-page.md).", ""]
    for module in ("budgets.views", "budgets.live", "budgets.report"):
        lines += [f"::: {module}", "    options:", "      members: false",
                  "      show_root_heading: true", ""]
    return "\n".join(lines)


def pages() -> Dict[str, str]:
    """Every generated page: path under docs/ -> markdown."""
    out = {f"{FOLDER}/index.md": index_page()}
    out.update({f"{FOLDER}/{c.name}.md": page(c) for c in COMMANDS})
    out[HTTP_PAGE] = http_page()
    return out


def write() -> None:
    import mkdocs_gen_files

    for path, text in pages().items():
        with mkdocs_gen_files.open(path, "w") as f:
            f.write(text)
        mkdocs_gen_files.set_edit_path(path, "gen_reference.py")


if __name__ == "<run_path>":  # run by mkdocs-gen-files
    write()
elif __name__ == "__main__":
    wanted = sys.argv[1:]
    for path, text in pages().items():
        if not wanted or any(path.endswith(f"/{name}.md") for name in wanted):
            print(text)
