"""Docs that stay true: docs/operations.md against the CLI and the config schema, and no
committed file that names one machine's paths.

Each check reads the source of truth (the ``duplex serve`` parser, the config's declarations,
the ``SessionConfig`` dataclass, ``git ls-files``), so a flag or key added without its line in
the docs fails here, and so does a line for one that no longer exists.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from duplex.cli import _parser
from duplex.config import DECLARED, SessionConfig, with_table

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ROOT / "docs" / "operations.md"
OTHER_FLAGS = {"--version", "--help"}
"""Flags of ``duplex`` itself that the docs may name besides ``duplex serve``'s."""


def serve_flags() -> set[str]:
    serve = _parser().parse_args(["serve"]).command_parser
    flags = {flag for action in serve._actions for flag in action.option_strings}
    return {flag for flag in flags if flag.startswith("--")} - {"--help"}


def text() -> str:
    return OPERATIONS.read_text(encoding="utf-8")


def section(heading: str) -> str:
    """The lines under ``heading`` up to the next heading of any level."""
    lines = text().splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return "\n".join(lines[start:end])


def rows(markdown: str) -> list[list[str]]:
    """The body rows of the Markdown tables in ``markdown``, as lists of cells."""
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table]
    return [row for row in cells if not set(row[0]) <= {"-", " "} and row[0] not in ("key", "flag")]


def code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def toml_value(value: Any) -> str:
    """How the docs write a default: TOML's spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[]" if not value else repr(list(value))
    return repr(value)


def first_table_after(marker: str) -> list[list[str]]:
    lines = text()[text().index(marker) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("| "))
    return rows("\n".join(lines[start:end]))


def test_the_config_table_is_generated_from_the_declarations() -> None:
    """Regenerate it (``python -m duplex.config --write-doc``) and compare."""
    assert with_table(text(), DECLARED) == text()


def test_every_serve_flag_is_in_the_config_table() -> None:
    table = rows(section("### Every key"))
    documented = {flag.split()[0] for row in table for flag in code(row[5])}
    assert documented | {"--config"} == serve_flags()


def test_every_flag_the_docs_name_exists() -> None:
    """Outside the commands of other programs (``python bench/... --targets``, ``python -m
    duplex.config --write-doc``)."""
    prose = re.sub(r"`python (bench/|tools/|-m duplex\.config)[^`]*`", "", text(), flags=re.S)
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", prose))
    assert named - serve_flags() - OTHER_FLAGS == set()


@pytest.mark.parametrize(
    ("heading", "schema", "env_prefix"),
    [
        ("### `[session]`", SessionConfig, "DUPLEX_SESSION__"),
    ],
)
def test_the_config_tables_are_the_schema(heading: str, schema: type, env_prefix: str) -> None:
    fields = {field.name: field for field in dataclasses.fields(schema)}
    documented: list[str] = []
    for row in rows(section(heading)):
        keys, default, env = code(row[0]), row[2], row[3]
        documented += keys
        for key in keys:
            assert key in fields, f"{heading} documents {key!r}, which is no config key"
            field = fields[key]
            value = field.default
            if value is dataclasses.MISSING:
                value = field.default_factory()  # type: ignore[misc]
            if value is None:  # TOML has no null: such a key is set per session only
                assert "not configurable" in row[4], row
                continue
            assert f"{env_prefix}{key.upper()}" in env, row
            assert code(default)[0] == toml_value(value), (key, default)
    assert sorted(documented) == sorted(fields), f"{heading}: keys missing from the docs"


def test_the_model_table_is_the_policy() -> None:
    """Each route family's row names its OpenAI aliases and whether ``model`` may be left out,
    as ``duplex.services._models`` has them; the example is its wording."""
    from duplex.services._models import AUDIO, CHAT, IMAGES, SPEECH, VIDEO_CHAT, VIDEOS

    heading = "### The `model` of a request"
    _header, *table = rows(section(heading))
    families = {
        "/v1/audio/speech": SPEECH, "/v1/images/generations": IMAGES, "/v1/videos": VIDEOS,
        "/v1/audio/generate": AUDIO, "/v1/chat/completions": CHAT,
        "/v1/video/chat/stream": VIDEO_CHAT,
    }  # fmt: skip
    assert len(table) == len(families)
    for row, (route, family) in zip(table, families.items(), strict=True):
        assert route in code(row[0])[0], row
        assert tuple(code(row[2])) == family.aliases, row
        assert row[3].startswith("refused") == family.required, row
    assert SPEECH.refusal_message("x", "espeak") in section(heading)


FORBIDDEN = re.compile(r"/work/|/root/|/home/[a-z_][a-z0-9_-]*/")
"""Absolute paths of one machine: a committed file gives repository-relative paths."""


def test_no_committed_file_names_a_machine_path() -> None:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    offenders = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or name == "tests/test_docs.py":
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary: fixtures, weights
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                offenders.append(f"{name}:{number}: {line.strip()[:120]}")
    assert offenders == []


def test_no_doc_cites_a_file_outside_the_repository() -> None:
    cited = re.compile(r"\.\./shared/|\bshared/[\w./-]+\.md|FACTS\.md|ARCHITECTURE\.md")
    names = [ROOT / "README.md", ROOT / "pyproject.toml", *sorted((ROOT / "docs").rglob("*.md"))]
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in names
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if cited.search(line)
    ]
    assert offenders == []


# -- the protocol pages against the running server -------------------------------------

PROTOCOL = ROOT / "docs" / "protocol"
REALTIME, NATIVE = PROTOCOL / "realtime.md", PROTOCOL / "duplex.md"

NOT_REPLAYED: dict[str, str] = {
    # realtime.md
    "input_audio_buffer.timeout_triggered": "needs idle_timeout_ms and minutes of idle "
    "audio; its encoding is validated against the SDK's own type below",
    # duplex.md: the native events a default server sends only after a resume, a takeover,
    # a barge-in, video or an engine crash; their encoders are tested in tests/wire and
    # tests/transport (test_e2e_duplex.py, test_e2e_realtime_resume.py, test_e2e_faults.py)
    **dict.fromkeys(
        (
            "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed", "input_audio_buffer.cleared", "response.created",
            "response.audio.delta", "response.audio_transcript.delta", "response.done",
            "response.listen", "overlap.decision", "playback.acknowledged",
            "input_video.consumed", "session.resumed", "session.replaced",
            "session.resync_required", "session.expired",
        ),
        "a native example: name-checked here, not replayed",
    ),
}  # fmt: skip
"""Server events a page shows that the replay (``tests/docs_replay.py``) does not produce,
and why; every other example is compared with what the server sent."""

NOT_REPLAYED_REFUSALS: dict[str, str] = {
    "`interrupt_response: false` is `unsupported_turn_detection`": "only with --no-agent "
    "(tests/wire/test_realtime_turns.py::test_turn_detection_spellings_and_rules)",
    "`interrupt_response: false`": "only with --no-agent "
    "(tests/wire/test_realtime_turns.py::test_turn_detection_spellings_and_rules)",
    "`video_input_unsupported`": "the served loopback takes video "
    "(tests/sessions/test_playback_video.py::test_video_refused_without_capability)",
    "Session settings refused": "a heading: its items are the lines that follow",
    "a Realtime feature this server does not have": "the code's row: its cases are the "
    "lines it links to",
    "`unsupported_event`": "the code's row and the heading list: `transcription_session.update`",
}
"""Lines that name a refusal the default server cannot show, or that only head others."""


def json_examples(page: Path) -> list[tuple[int, Any]]:
    """Every JSON value of ``page``'s ```` ```json ```` blocks, with the block's first line: a
    block holds one value or several (one an object per line)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    decoder, found = json.JSONDecoder(), []
    index = 0
    while index < len(lines):
        if lines[index].strip() == "```json":
            end = next(j for j in range(index + 1, len(lines)) if lines[j].strip() == "```")
            text, at = "\n".join(lines[index + 1 : end]), 0
            while at < len(text):
                if text[at].isspace():
                    at += 1
                    continue
                try:
                    value, at = decoder.raw_decode(text, at)
                except json.JSONDecodeError as exc:
                    raise AssertionError(f"{page.name}:{index + 1}: not JSON: {exc}") from exc
                found.append((index + 1, value))
            index = end
        index += 1
    return found


def uncut(value: Any) -> Any:
    """``value`` with the docs' ``…`` (a string cut short) taken out, as a client sends it."""
    if isinstance(value, dict):
        return {key: uncut(item) for key, item in value.items()}
    if isinstance(value, list):
        return [uncut(item) for item in value]
    return value.replace("…", "") if isinstance(value, str) else value


def is_server_event(value: Any) -> bool:
    """The server's events carry ``event_<hex>`` ids; a client's example does not."""
    return isinstance(value, dict) and str(value.get("event_id", "")).startswith("event_")


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key of ``value``, nested, as dotted paths (a list's items under ``[]``)."""
    if isinstance(value, dict):
        paths = set()
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths |= {path} | key_paths(item, path)
        return paths
    if isinstance(value, list):
        return set().union(*(key_paths(item, prefix + "[]") for item in value)) if value else set()
    return set()


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= leaves(item, f"{prefix}.{key}" if prefix else key)
        return out
    return {prefix: value}


IDS = re.compile(r"'[^']*'|\d+(\.\d+)?")
"""What an error message quotes of one run: ids and numbers."""


def shape_mismatch(example: dict[str, Any], recorded: list[dict[str, Any]]) -> set[str] | None:
    """``None`` when ``example`` has the fields these recorded events of its type have:
    none the server never sent, none it always sends missing. Else the differences."""
    seen = [key_paths(event) for event in recorded]
    always, ever, shown = set.intersection(*seen), set.union(*seen), key_paths(example)
    missing, invented = always - shown, shown - ever
    return (
        None
        if not (missing or invented)
        else {f"-{m}" for m in missing} | {f"+{i}" for i in invented}
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One replay against a default server, shared by the tests below (about 40 s)."""
    import trio

    from tests.docs_replay import replay

    return trio.run(replay, tmp_path_factory.mktemp("replay"))


def test_every_json_example_of_the_protocol_pages_parses_and_is_a_known_event() -> None:
    """Client examples parse as the server parses them; server examples name events the
    server sends (their fields: the replay tests below)."""
    from duplex.wire._native import CLIENT_EVENT_NAMES, SERVER_EVENT_NAMES, parse_client_event
    from duplex.wire._realtime import RealtimeProjection
    from tests.wire.test_realtime import check_wire

    native = json_examples(NATIVE)
    assert len(native) > 20
    for line, value in native:
        if not isinstance(value, dict) or "type" not in value or value.get("type") == "error":
            continue
        if value["type"] in CLIENT_EVENT_NAMES and not is_server_event(value):
            parse_client_event(json.dumps(uncut(value)))  # raises if the server refuses it
        elif is_server_event(value):
            assert value["type"] in SERVER_EVENT_NAMES, f"duplex.md:{line}: {value['type']}"
    realtime = json_examples(REALTIME)
    assert len(realtime) > 20
    for line, value in realtime:
        if not is_server_event(value):
            RealtimeProjection(duplex=True).parse(json.dumps(uncut(value)))
            continue
        errors = []
        for schema, duplex in (("ga", False), ("beta", False), ("ga", True), ("beta", True)):
            try:
                check_wire(value, schema=schema, duplex=duplex)
                break
            except (AssertionError, ValueError) as exc:  # pydantic's is a ValueError
                errors.append(f"{schema}/{duplex}: {str(exc)[:200]}")
        else:
            raise AssertionError(f"realtime.md:{line}: no SDK type takes it: {errors}")


def test_the_realtime_examples_are_what_the_server_sends(recorded: dict[str, Any]) -> None:
    """Each server event shown on realtime.md has the fields the same event has as a default
    server sends it (GA, beta or ``?duplex=1``); its ``session.created`` examples have the
    session's defaults, its errors the server's messages."""
    problems = []
    for line, value in json_examples(REALTIME):
        if not is_server_event(value):
            continue
        kind = value["type"]
        runs = {name: run.of(kind) for name, run in recorded.items() if name != "native"}
        runs = {name: events for name, events in runs.items() if events}
        if not runs:
            if kind not in NOT_REPLAYED:
                problems.append(f"realtime.md:{line}: {kind} is not what the server sent")
            continue
        if kind == "error":
            code = value["error"]["code"]
            sent = [e for events in runs.values() for e in events if e["error"]["code"] == code]
            messages = {IDS.sub("_", e["error"]["message"]) for e in sent}
            if IDS.sub("_", value["error"]["message"]) not in messages:
                problems.append(f"realtime.md:{line}: {code} says {messages or 'nothing'}")
            runs = {"error": sent} if sent else runs
        mismatches = {name: shape_mismatch(value, events) for name, events in runs.items()}
        if all(m is not None for m in mismatches.values()):
            problems.append(f"realtime.md:{line}: {kind} fields differ: {mismatches}")
            continue
        if kind == "session.created":
            (name,) = [n for n, m in mismatches.items() if m is None][:1]
            sent_session = leaves(runs[name][0]["session"])
            for path, shown in leaves(value["session"]).items():
                if path != "id" and sent_session.get(path) != shown:
                    problems.append(
                        f"realtime.md:{line}: session.{path} is {sent_session.get(path)!r}"
                        f" on the server, {shown!r} here"
                    )
    assert problems == []


NATIVE_REPLAYED = ("session.created", "session.updated", "session.closed")


def test_the_native_session_examples_are_what_the_server_sends(recorded: dict[str, Any]) -> None:
    """duplex.md's ``session.created`` / ``session.updated`` / ``session.closed``: the
    fields and the defaults a default server sends (for the same ``session.create``)."""
    native = recorded["native"]
    shown = 0
    for line, value in json_examples(NATIVE):
        if not is_server_event(value) or value["type"] not in NATIVE_REPLAYED:
            continue
        (sent,) = native.of(value["type"])[:1]
        assert shape_mismatch(value, [sent]) is None, (line, shape_mismatch(value, [sent]))
        differ = {
            path: (shown_value, leaves(sent).get(path))
            for path, shown_value in leaves(value).items()
            if leaves(sent).get(path) != shown_value
            and path.rsplit(".", 1)[-1]
            not in ("event_id", "id", "session_id", "resume_token", "attachment_generation")
            and path != "server_event_seq"
        }
        assert differ == {}, f"duplex.md:{line}: (docs, server): {differ}"
        shown += 1
    assert shown >= 3


REFUSAL_LINE = re.compile(r"not supported|`unsupported_\w+`|`\w+_unsupported`")
"""A line that says the server refuses something."""


@pytest.mark.parametrize("page", ["realtime", "duplex"])
def test_every_refusal_a_protocol_page_promises_is_shown(
    page: str, recorded: dict[str, Any]
) -> None:
    """Each refusal of the page was sent to the server, which answered with the code the
    page names; each line of the page that names a refusal is one of them (or says why the
    default server cannot show it)."""
    from tests.docs_replay import NATIVE_REFUSALS, REFUSALS

    path, refusals, run = (
        (REALTIME, REFUSALS, recorded["ga"])
        if page == "realtime"
        else (NATIVE, NATIVE_REFUSALS, recorded["native"])
    )
    text = path.read_text(encoding="utf-8")
    for refusal in refusals:
        assert refusal.doc_phrase in text, refusal.doc_phrase
        error = run.refused[refusal.doc_phrase]["error"]
        assert error["code"] == refusal.code, (refusal.doc_phrase, error)
    phrases = [r.doc_phrase.split("\n")[0] for r in refusals] + list(NOT_REPLAYED_REFUSALS)
    unshown = [
        f"{path.name}:{number}: {line.strip()[:120]}"
        for number, line in enumerate(text.splitlines(), 1)
        if REFUSAL_LINE.search(line)
        and not line.startswith("{")
        and not any(phrase in line for phrase in phrases)
    ]
    assert unshown == []


def never_sent(name: str) -> Callable[[str], bool]:
    """Whether an event type is one of those ``name`` spells: ``a.b.*`` (any under ``a.b.``),
    ``a.b.c|d|e`` (``a.b.c``, ``a.b.d``, ``a.b.e``) or one name."""
    if name.endswith("*"):
        stem = name.removesuffix("*")
        return lambda kind: kind.startswith(stem)
    first, *others = name.split("|")
    parent = first.rsplit(".", 1)[0]
    names = {first, *(f"{parent}.{other}" for other in others)}
    return lambda kind: kind in names


def test_what_the_realtime_page_says_is_never_sent_was_not_sent(recorded: dict[str, Any]) -> None:
    """The events its "Never sent:" paragraph names appear in no recorded conversation."""
    text = REALTIME.read_text(encoding="utf-8")
    paragraph = text[text.index("Never sent:") :].split("\n\n")[0]
    names = [name for name in code(paragraph) if "." in name]
    assert len(names) >= 3, paragraph
    sent = {event["type"] for run in recorded.values() for event in run.events}
    for name in names:
        assert not [kind for kind in sent if never_sent(name)(kind)], name
