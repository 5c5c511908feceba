"""The browser client (``clients/web``) in headless Chromium against a real ``duplex serve``.

Debian's ``chromium`` (``scripts/bootstrap.sh`` installs it), driven by playwright with
its ``executable_path`` (playwright's own browser download is never used). The fake
microphone plays a WAV of speech then silence, in a loop; the voice agent answers it.
The page must get the reply, play it through its jitter buffer, ack what it played (the
server answers each ack with ``playback.acknowledged``), and survive a closed WebSocket
by resuming the same session.
"""

from __future__ import annotations

import shutil
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture
def browser_page(tmp_path: Path) -> Any:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        pytest.skip("Debian chromium is not installed: run scripts/bootstrap.sh as root")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    mic = microphone_wav(tmp_path / "mic.wav")
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
    with serve(tmp_path) as served:
        _conversation(page, served, tmp_path)
    assert errors == []


def _conversation(page: Any, served: Served, tmp_path: Path) -> None:
    page.goto(served.http + "/")
    assert page.title() == "duplex"
    page.click("#start")
    first = wait_for(page, "a reply heard and acked", lambda s: bool(heard(s)))
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
