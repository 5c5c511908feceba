// AudioWorklet processors of the duplex browser client (loaded with audioWorklet.addModule).
//
// "duplex-capture": the microphone, resampled to 24 kHz PCM16, posted in 80 ms chunks.
// "duplex-playback": a jitter buffer of the agent's 24 kHz PCM16, played at the context's
// rate; it reports how much of each response has really left it, for playback.ack.

const WIRE_RATE = 24000;
const CHUNK = 1920; // 80 ms at 24 kHz

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / WIRE_RATE; // input samples per output sample
    this.pos = 0; // fractional read position into `this.prev` + current block
    this.prev = 0; // the last input sample of the previous block
    this.out = new Int16Array(CHUNK);
    this.fill = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    // Linear interpolation over [prev, ...channel]: index 0 is `prev`.
    const n = channel.length;
    let pos = this.pos;
    while (pos < n) {
      const i = Math.floor(pos);
      const frac = pos - i;
      const a = i === 0 ? this.prev : channel[i - 1];
      const b = channel[i];
      const s = Math.max(-1, Math.min(1, a + (b - a) * frac));
      this.out[this.fill++] = s < 0 ? s * 32768 : s * 32767;
      if (this.fill === CHUNK) {
        this.port.postMessage(this.out, [this.out.buffer]);
        this.out = new Int16Array(CHUNK);
        this.fill = 0;
      }
      pos += this.step;
    }
    this.pos = pos - n;
    this.prev = channel[n - 1];
    return true;
  }
}

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.prebuffer = Math.round(((opts.prebufferMs ?? 120) * WIRE_RATE) / 1000);
    this.queue = []; // {id, pcm: Float32Array at 24 kHz, offset}
    this.buffered = 0; // samples queued at 24 kHz
    this.playing = false;
    this.ending = new Set(); // responses whose last audio arrived: play out without prebuffer
    this.played = new Map(); // response id -> samples played at 24 kHz
    this.step = WIRE_RATE / sampleRate; // wire samples per output sample
    this.frac = 0;
    this.underruns = 0;
    this.lastReport = 0;
    this.port.onmessage = (e) => this.command(e.data);
  }

  command(msg) {
    if (msg.type === "push") {
      const f = new Float32Array(msg.pcm.length);
      for (let i = 0; i < f.length; i++) f[i] = msg.pcm[i] / 32768;
      this.queue.push({ id: msg.id, pcm: f, offset: 0 });
      this.buffered += f.length;
      if (!this.played.has(msg.id)) this.played.set(msg.id, 0);
    } else if (msg.type === "end") {
      this.ending.add(msg.id);
    } else if (msg.type === "clear") {
      // barge-in: drop what has not played (of one response, or of all)
      this.queue = this.queue.filter((c) => msg.id && c.id !== msg.id);
      this.buffered = this.queue.reduce((n, c) => n + c.pcm.length - c.offset, 0);
      if (!this.queue.length) this.playing = false;
      this.report(true);
    }
  }

  report(force) {
    if (!force && currentTime - this.lastReport < 0.05) return;
    this.lastReport = currentTime;
    const played = {};
    for (const [id, n] of this.played) played[id] = (n * 1000) / WIRE_RATE;
    this.port.postMessage({
      type: "played",
      played,
      bufferedMs: (this.buffered * 1000) / WIRE_RATE,
      underruns: this.underruns,
      playing: this.playing,
    });
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing) {
      const head = this.queue[0];
      if (head && (this.buffered >= this.prebuffer || this.ending.has(head.id))) {
        this.playing = true;
      }
    }
    for (let i = 0; i < out.length; i++) {
      if (!this.playing) {
        out[i] = 0;
        continue;
      }
      const c = this.queue[0];
      if (!c) {
        this.playing = false; // underrun: wait for the prebuffer again
        this.underruns++;
        out[i] = 0;
        continue;
      }
      out[i] = c.pcm[c.offset];
      this.frac += this.step;
      while (this.frac >= 1 && this.queue.length) {
        this.frac -= 1;
        const head = this.queue[0];
        head.offset++;
        this.buffered--;
        this.played.set(head.id, this.played.get(head.id) + 1);
        if (head.offset >= head.pcm.length) {
          this.queue.shift();
          const next = this.queue[0];
          if (!next) {
            this.playing = false;
            if (!this.ending.has(head.id)) this.underruns++;
          }
        }
      }
    }
    for (let ch = 1; ch < outputs[0].length; ch++) outputs[0][ch].set(out);
    this.report(false);
    return true;
  }
}

registerProcessor("duplex-capture", CaptureProcessor);
registerProcessor("duplex-playback", PlaybackProcessor);
