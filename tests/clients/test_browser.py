"""The browser client (``clients/web``) in headless Chromium against a real ``duplex serve``.

Debian's ``chromium`` (``scripts/bootstrap.sh`` installs it), driven by playwright with
its ``executable_path`` (playwright's own browser download is never used). The fake
microphone plays a WAV of speech then silence, in a loop; the voice agent answers it.
The page must get the reply, play it through its jitter buffer, ack what it played (the
server answers each ack with ``playback.acknowledged``), and survive a closed WebSocket
by resuming the same session. It shows both sides: the user's own words (it turns input
transcription on), what answers (the voice agent's stages, not the realtime model), and,
while continuous sound keeps the turn open, a hint that the reply waits for a pause.
"""

from __future__ import annotations

import shutil
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent.agentkit import HELLO, grammar_file

from ..helpers import ROOT, Served, serve

CHROMIUM = "/usr/bin/chromium"
SPEECH = ROOT / "tests" / "fixtures" / "speech" / "hello.wav"


def chromium_flags(mic: Path) -> list[str]:
    """The flags; playwright adds ``--user-data-dir`` (a fresh one per test, its first arg)."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={mic}",
    ]


def microphone_wav(path: Path) -> Path:
    """The test's speech, then 10 s of silence: the agent's reply (heard, answered, spoken:
    longer than the speech) has room to play before it loops."""
    with wave.open(str(SPEECH), "rb") as wav:
        rate, pcm = wav.getframerate(), wav.readframes(wav.getnframes())
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm + bytes(2 * rate * 10))
    return path


def wait_for(
    page: Any, what: str, check: Callable[[dict[str, Any]], bool], within_s: float = 60
) -> dict[str, Any]:
    """Poll the page's ``window.duplex.snapshot()`` until ``check`` holds (a guard, not a
    measurement: it only bounds a hang)."""
    deadline = time.monotonic() + within_s
    while True:
        snap = page.evaluate("window.duplex.snapshot()")
        if check(snap):
            return snap
        assert time.monotonic() < deadline, f"{what}: {snap}"
        time.sleep(0.25)


def heard(snap: dict[str, Any], after: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Responses (not in ``after``) with audio, played and acknowledged by the server."""
    ack = snap["lastAcknowledged"] or {}
    return [
        r
        for r in snap["responses"]
        if r["id"] not in after
        and r["audioMs"] > 0
        and snap["played"].get(r["id"], 0) > 0
        and (ack.get("response_id") == r["id"] or r["id"] in snap["ackedByServer"])
    ]


def continuous_speech_wav(path: Path, seconds: float = 30.0) -> Path:
    """The test's speech, trimmed to its loud part and repeated with no pause: a turn that
    never ends (its longest inner pause, 200 ms, is under the 400 ms that ends one)."""
    with wave.open(str(SPEECH), "rb") as wav:
        rate, pcm = wav.getframerate(), wav.readframes(wav.getnframes())
    loud = pcm[2 * rate * 20 // 1000 : 2 * rate * 2680 // 1000]
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(loud * int(seconds * rate * 2 / len(loud) + 1))
    return path


def agent_config(tmp_path: Path) -> Path:
    """``duplex serve``'s defaults, with a grammar for the ASR: it hears the fixture's words."""
    config = tmp_path / "agent.toml"
    config.write_text(f'[server]\nagent_asr_grammar = "{grammar_file(tmp_path)}"\n')
    return config


@pytest.fixture
def browser_page(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        pytest.skip("Debian chromium is not installed: run scripts/bootstrap.sh as root")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    make_mic = getattr(request, "param", microphone_wav)
    mic = make_mic(tmp_path / "mic.wav")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=chromium_flags(mic),
        )
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page, errors
        finally:
            browser.close()


def test_the_page_talks_acks_and_resumes_after_a_dropped_socket(
    tmp_path: Path, browser_page: Any
) -> None:
    page, errors = browser_page
    with serve(tmp_path, "--config", str(agent_config(tmp_path))) as served:
        _conversation(page, served, tmp_path)
    assert errors == []


@pytest.mark.parametrize("browser_page", [continuous_speech_wav], indirect=True)
def test_continuous_speech_shows_that_the_reply_waits_for_a_pause(
    tmp_path: Path, browser_page: Any
) -> None:
    """Speech with no pause: the turn stays open, nothing answers, and the page says why."""
    page, errors = browser_page
    with serve(tmp_path, "--config", str(agent_config(tmp_path))) as served:
        page.goto(served.http + "/")
        page.evaluate("window.duplex.ready")
        page.click("#start")
        snap = wait_for(page, "the pause hint", lambda s: "pause" in s["hint"], within_s=40)
        assert snap["state"] == "listening" and snap["responses"] == []
        assert snap["events"].get("input_audio_buffer.speech_started") == 1
        assert "input_audio_buffer.speech_stopped" not in snap["events"]
        assert page.is_visible("#hint")
        assert "400 ms" in page.text_content("#hint")  # the session's silence_duration_ms
    assert errors == []


def _conversation(page: Any, served: Served, tmp_path: Path) -> None:
    page.goto(served.http + "/")
    assert page.title() == "duplex"
    page.evaluate("window.duplex.ready")
    # what answers: the voice agent's stages, not the realtime model behind the sessions
    assert page.text_content("#model") == "answers: voice agent (pocketsphinx → echo → espeak)"
    page.click("#start")
    first = wait_for(
        page, "a reply heard and acked, the user's words shown",
        lambda s: bool(heard(s)) and bool(s["userWords"]),
    )  # fmt: skip
    assert first["userWords"][0] == HELLO  # the user's own words, from the agent's ASR
    lines = page.eval_on_selector_all(
        "#transcript li", "items => items.map(li => [li.className, li.textContent])"
    )
    assert lines[0] == ["you", HELLO]  # above the reply it led to
    assert lines[1][0] == "agent" and lines[1][1]  # the reply, as far as it has been spoken
    assert f"You said: {HELLO}.".startswith(lines[1][1])
    assert page.eval_on_selector("#transcript li.agent", "li => li.dataset.who") == "echo"
    assert first["hint"] == "" and not page.is_visible("#hint")
    session_id = first["sessionId"]
    assert session_id and first["connected"] and first["errors"] == []
    reply = heard(first)[0]
    ack = first["lastAcknowledged"]
    # the server's own ledger: what it sent, what the page said it played
    assert ack["playback"]["sent_ms"] >= ack["played_ms"] > 0
    assert first["played"][reply["id"]] <= reply["audioMs"] + 1
    assert first["state"] in ("listening", "thinking", "speaking", "interrupted")
    assert page.text_content("#transcript")  # the reply's transcript is on the page

    page.evaluate("window.duplex.drop()")
    before = {r["id"] for r in first["responses"]}
    after = wait_for(
        page,
        "resumed and a new reply heard",
        lambda s: s["stats"]["resumed"] >= 1 and s["connected"] and bool(heard(s, before)),
    )
    assert after["sessionId"] == session_id
    assert after["stats"]["reconnects"] >= 1
    assert after["errors"] == []
    # one session all along: the resume took it back, none was opened for the new socket
    assert served.metric("duplex_sessions_opened_total") == 1
    assert served.metric("duplex_sessions_live") == 1
    shot = tmp_path / "browser-client.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 1000
