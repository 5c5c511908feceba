import numpy as np
import pytest

from duplex.sessions import EnergyVad, SpeechStarted, SpeechStopped, StreamingResampler


def _sine(freq: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize(
    ("src", "dst"),
    [(8000, 24000), (16000, 24000), (48000, 24000), (24000, 16000), (24000, 48000)],
)
def test_chunked_equals_one_shot(src, dst):
    x = _sine(440, src)
    whole = StreamingResampler(src, dst).process(x)
    r = StreamingResampler(src, dst)
    rng = np.random.default_rng(7)
    parts, i = [], 0
    while i < x.size:
        n = int(rng.integers(0, 500))
        parts.append(r.process(x[i : i + n]))
        i += n
    chunked = np.concatenate(parts)
    assert whole.size == chunked.size == dst
    np.testing.assert_allclose(chunked, whole, atol=1e-6)


@pytest.mark.parametrize(("src", "dst"), [(8000, 24000), (16000, 24000), (48000, 24000)])
def test_sine_keeps_its_frequency_and_level(src, dst):
    y = StreamingResampler(src, dst).process(_sine(1000, src))[500:]
    spectrum = np.abs(np.fft.rfft(y * np.hanning(y.size)))
    peak_hz = np.argmax(spectrum) * dst / y.size
    assert abs(peak_hz - 1000) < 5
    assert abs(np.sqrt(np.mean(y**2)) - 0.5 / np.sqrt(2)) < 0.01


def test_identity_and_output_count():
    r = StreamingResampler(24000, 24000)
    x = _sine(300, 24000, 0.01)
    np.testing.assert_array_equal(r.process(x), x)
    up = StreamingResampler(16000, 24000)
    assert up.output_count(160) == 240
    assert up.process(np.zeros(160, np.float32)).size == 240
    assert up.output_count(1) + up.output_count(0) >= 1


def test_vad_start_stop_with_hangover():
    vad = EnergyVad(24000, min_speech_ms=60, hangover_ms=300)
    speech = np.full(24000 // 2, 0.05, dtype=np.float32)  # 500 ms
    quiet = np.zeros(24000, dtype=np.float32)
    events = vad.process(np.zeros(4800, np.float32))  # 200 ms silence
    events += vad.process(speech[:1000]) + vad.process(speech[1000:])
    events += vad.process(quiet)
    assert events == [SpeechStarted(200), SpeechStopped(700)]


def test_vad_ignores_clicks_and_quiet_noise():
    vad = EnergyVad(16000, min_speech_ms=60)
    click = np.zeros(16000, np.float32)
    click[100:400] = 0.5  # < 60 ms
    noise = np.random.default_rng(0).normal(0, 0.001, 16000).astype(np.float32)
    assert vad.process(click) == [] and vad.process(noise) == []
