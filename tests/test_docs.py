"""The user docs (README.md, docs/*.md) say nothing of how the project is made, every relative
link in them resolves, every `--flag` in a code block exists in that command's `--help`, and
no page runs over 300 lines.

Flags are checked for `keras-transformer SUBCOMMAND ...` lines against the command's own parser
(`cli.build_parser()`, built in this process), and for `python benchmarks/NAME.py ...` lines
against the flags that script (or benchmarks/common.py, which adds `--record`) declares in its
source. Other lines (`make`, `docker`, `curl`, Python) are not checked for flags.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_LINES = 300

# Words of our own way of working, which mean nothing to a user.
WORK_WORDS = {
    "an issue number": r"\bissues? #?\d+",
    "a work-log count": r"\bsessions?\b|\bstops? \d+\b",
    "acceptance": r"\bacceptance\b",
    "a target of ours": r"\btargets? \d|\(target:? [\d<>=]|"
                        r"\btargets? (?:are|is) (?:not )?(?:met|reached)",
    "a build-machine path": r"(?<![\w.])/(?:work|home|root)/",
    "an internal tool": r"\bfarm-(?:studio|bench)\b|`duplicates\b|\bdevice tool\b|"
                        r"\btimeout_s\b|\bcarry \[|\bGPU-lending\b|\blent to\b",
}

# Names of things a user meets, blanked before the words above are looked for: TensorFlow's
# TF1 Session, and the `session` engine of benchmarks/serving_load.py.
ALLOWED = re.compile(r"TF1 Sessions?|tf\.compat\.v1\.Session|--engines [\w,-]+|`session[^`]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
COMMAND = re.compile(r"(?:^|[\s|;(&])keras-transformer\s+([a-z][a-z0-9-]*)(.*)")
INLINE = re.compile(r"`((?:KERAS_BACKEND=\w+ )?(?:keras-transformer|python3? benchmarks/)[^`]*)`")
BENCHMARK = re.compile(r"\bpython3?\s+(?:\S*/)?benchmarks/(\w+)\.py(.*)")


def page_id(page):
    return str(page.relative_to(ROOT))


def slug(heading):
    """GitHub's anchor of a heading: lowercased, punctuation but '-' and '_' dropped, spaces
    to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page):
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def code_lines(page):
    """(line number, text) of each command in the page's code blocks (fenced, or indented by
    four spaces after a blank line), backslash continuations joined, and of each inline code
    span that is a command (`keras-transformer ...`, `python benchmarks/...`)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    commands, fenced, previous_blank, pending = [], False, True, None
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced, pending = not fenced, None
            continue
        indented = not fenced and line.startswith("    ") and (
            previous_blank or pending is not None or (commands and commands[-1][0] == number - 1))
        previous_blank = not line.strip()
        if not (fenced or indented):
            pending = None
            commands += [(number, span) for span in INLINE.findall(line)]
            continue
        text = line.strip()
        if pending is not None:
            start, before = pending
            text = before + " " + text
        else:
            start = number
        if text.endswith("\\"):
            pending = (start, text[:-1])
            continue
        pending = None
        commands.append((start, text))
    return commands


def command_flags(parser):
    """{subcommand: its option strings} from the command's own parser; None for a command that
    passes its arguments on to another tool (saved-model-cli: saved_model_cli's flags)."""
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: None if any(a.nargs == argparse.REMAINDER for a in sub._actions)
            else set(sub._option_string_actions) for name, sub in action.choices.items()}


@pytest.fixture(scope="module")
def flags_of():
    from keras_transformer.cli import build_parser

    return command_flags(build_parser())


def benchmark_flags(name):
    declared = set()
    for source in (ROOT / "benchmarks" / f"{name}.py", ROOT / "benchmarks" / "common.py"):
        if source.is_file():
            declared |= set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']",
                                       source.read_text(encoding="utf-8")))
    return declared


def flags_in(rest):
    """The --flags of one command: up to a comment, a pipe or the next command."""
    rest = re.split(r"\s#|\||;|&&|\$\(|`", rest)[0]
    return [flag.split("=")[0] for flag in FLAG.findall(rest)]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_word_of_how_the_project_is_made(page):
    hits = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        line = ALLOWED.sub("", line)
        for what, pattern in WORK_WORDS.items():
            for match in re.finditer(pattern, line, re.IGNORECASE):
                hits.append(f"{page_id(page)}:{number}: {what}: {match.group(0)!r}")
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves(page):
    broken = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page_id(page)}:{number}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page_id(page)}:{number}: {target}: no such heading")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_flag_in_a_command_is_in_its_commands_help(page, flags_of):
    unknown = []
    for number, text in code_lines(page):
        for match in COMMAND.finditer(text):
            name, rest = match.groups()
            if name not in flags_of:
                unknown.append(f"{page_id(page)}:{number}: keras-transformer {name}: "
                               "no such command")
                continue
            unknown += [f"{page_id(page)}:{number}: keras-transformer {name} {flag}"
                        for flag in flags_in(rest)
                        if flags_of[name] is not None and flag not in flags_of[name]]
        for match in BENCHMARK.finditer(text):
            name, rest = match.groups()
            declared = benchmark_flags(name)
            if not (ROOT / "benchmarks" / f"{name}.py").is_file():
                unknown.append(f"{page_id(page)}:{number}: benchmarks/{name}.py: no such script")
                continue
            unknown += [f"{page_id(page)}:{number}: benchmarks/{name}.py {flag}"
                        for flag in flags_in(rest) if flag not in declared and flag != "--help"
                        and flag.replace("--no-", "--", 1) not in declared]
    assert not unknown, "\n".join(unknown)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_page_over_300_lines(page):
    lines = len(page.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{page_id(page)}: {lines} lines"


def test_the_checks_find_what_they_look_for(tmp_path, flags_of):
    """Each check fails on a page that has what it looks for."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nAs issue 12 said, in this session.\n[x](nowhere.md) [y](#title)"
                    " [z](#missing)\n\n```\nkeras-transformer translate --run-dir R --no-such "
                    "\\\n    --beam 4 --also-not\n```\nInline: `keras-transformer score --json`.\n",
                    encoding="utf-8")
    assert re.search(WORK_WORDS["an issue number"], page.read_text(), re.IGNORECASE)
    assert re.search(WORK_WORDS["a work-log count"], page.read_text(), re.IGNORECASE)
    assert re.search(WORK_WORDS["a target of ours"], "1.3x (target 3x)")
    assert not re.search(WORK_WORDS["a target of ours"], "log P(target | source)")
    assert not re.search(WORK_WORDS["a work-log count"], ALLOWED.sub("", "a TF1 Session"),
                         re.IGNORECASE)
    assert anchors(page) == {"title"}
    assert code_lines(page) == [(7, "keras-transformer translate --run-dir R --no-such  "
                                    "--beam 4 --also-not"),
                                (10, "keras-transformer score --json")]
    rest = COMMAND.search(code_lines(page)[0][1]).group(2)
    assert [f for f in flags_in(rest) if f not in flags_of["translate"]] == [
        "--no-such", "--also-not"]


def test_every_recorded_result_says_when_where_and_at_which_commit():
    """The results files the docs quote: one JSON object a line, each with its date, commit,
    CPU class and command."""
    import json

    files = sorted((ROOT / "benchmarks" / "results").glob("*.jsonl"))
    assert files
    for path in files:
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            entry = json.loads(text)
            missing = {"date", "commit", "cpu_class", "command"} - set(entry)
            assert not missing, f"{path.name}:{number} lacks {sorted(missing)}"
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"]), f"{path.name}:{number}"


def test_a_benchmark_given_record_appends_its_line_with_date_commit_and_class(tmp_path,
                                                                               monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import common

    first = common.append_result("toy", '{"seconds": 1.5, "peak_rss_mb": 10}', tmp_path)
    common.append_result("toy", '{"seconds": 1.2, "peak_rss_mb": 11}', tmp_path)
    lines = (tmp_path / "toy.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    assert first["seconds"] == 1.5 and first["benchmark"] == "toy"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", first["date"]) and first["commit"]
    assert first["command"].startswith("python benchmarks/")
    assert first["cpu_class"] in ("amx", "avx512_bf16", "avx512", "avx2", "other")
    assert common.latest("toy", tmp_path)["seconds"] == 1.2
    assert common.latest("toy", tmp_path, seconds=1.5)["peak_rss_mb"] == 10
