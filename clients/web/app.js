// The duplex browser client: microphone -> PCM16 over WS /v1/realtime?duplex=1 -> the agent's
// audio through a jitter buffer, with playback.ack of what was really played.
//
// No build step: plain ES modules served by `duplex serve` at /. `window.duplex` exposes the
// client's state for tests (and for a curious console).
//
// Both sides of the conversation are shown: the session turns input transcription on, so the
// user's own words come back (conversation.item.input_audio_transcription.*); the header
// names what answers (GET /v1/models: the voice agent's stages, else the realtime model);
// and while the turn stays open (continuous sound, or nothing heard) a hint says that the
// reply waits for a pause.

import { DuplexSession } from "./session.js";

const $ = (id) => document.getElementById(id);
const ACK_INTERVAL_MS = 200;
const LONG_SPEECH_MS = 2500; // speech this long with no pause: say the reply waits for one
const QUIET_HINT_MS = 6000; // listening this long with no speech heard: say what to do
const TRACKED_RESPONSES = 16; // the server accepts acks for the last 16 responses

const ui = {
  state: "idle",
  speech: false, // the server's VAD hears the user
  speechSince: null, // when that speech started (performance.now())
  quietSince: null, // when the page began listening with nothing heard
  silenceMs: 500, // the session's silence_duration_ms: the pause that ends a turn
  answers: null, // what answers, from GET /v1/models: {label, transcription}
  hint: "",
  waitingSince: null, // speech stopped at (performance.now()), no reply audio yet
  active: null, // the response in progress
  interruptedUntil: 0,
  responses: new Map(), // id -> {li, text, firstAudioAt, heardAt, status, audioMs}
  played: {}, // id -> ms played, from the playback worklet
  acked: new Map(), // id -> ms last acked
  acksSent: 0,
  acknowledged: 0,
  lastAcknowledged: null,
  ackedByServer: new Set(), // responses the server answered an ack of
  playing: false,
  bufferedMs: 0,
  underruns: 0,
  latencies: [],
  errors: [],
  events: new Map(), // type -> count
};

let session = null;
let audio = null; // {ctx, stream, capture, playback}
let ackTimer = null;
let renderTimer = null;

function setState(state) {
  if (ui.state === state) return;
  ui.state = state;
  $("state").textContent = state;
  $("state").dataset.state = state;
}

function deriveState() {
  if (!session) return setState("idle");
  const now = performance.now();
  if (now < ui.interruptedUntil) return setState("interrupted");
  if (ui.playing || ui.bufferedMs > 0) return setState("speaking");
  if (ui.active || ui.waitingSince !== null) return setState("thinking");
  setState("listening");
}

// Why nothing happens yet, while the page listens: the turn is still open.
function deriveHint() {
  const now = performance.now();
  let hint = "";
  if (session && ui.state === "listening") {
    if (ui.speech && ui.speechSince !== null && now - ui.speechSince > LONG_SPEECH_MS) {
      hint = `Still hearing you: the reply starts after a pause of ${ui.silenceMs} ms. ` +
        "Continuous sound or background noise keeps the turn open.";
    } else if (!ui.speech && ui.quietSince !== null && now - ui.quietSince > QUIET_HINT_MS) {
      hint = `No speech heard yet: speak, then pause for ${ui.silenceMs} ms for the reply.`;
    }
  }
  if (hint === ui.hint) return;
  ui.hint = hint;
  $("hint").textContent = hint;
  $("hint").hidden = !hint;
}

function line(kind, text) {
  const li = document.createElement("li");
  li.className = kind;
  li.textContent = text;
  $("transcript").append(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

function response(id) {
  let r = ui.responses.get(id);
  if (!r) {
    const li = line("agent", "");
    li.dataset.who = ui.answers ? ui.answers.name : "agent";
    r = { li, text: "", firstAudioAt: null, heardAt: null, status: "in_progress", audioMs: 0 };
    ui.responses.set(id, r);
    while (ui.responses.size > TRACKED_RESPONSES) {
      const oldest = ui.responses.keys().next().value;
      ui.responses.delete(oldest);
      ui.acked.delete(oldest);
    }
  }
  return r;
}

function interrupted(id) {
  ui.interruptedUntil = performance.now() + 1200;
  if (audio) audio.playback.port.postMessage({ type: "clear", id });
}

const userItems = new Map(); // item id -> li
const userWords = []; // what the page showed of the user's turns, for window.duplex

// The user's line for ``id``: made when the speech starts, so it stays above the reply.
function userLine(id) {
  let li = userItems.get(id);
  if (!li) {
    li = line("you", "");
    li.classList.add("pending");
    userItems.set(id, li);
    while (userItems.size > TRACKED_RESPONSES) userItems.delete(userItems.keys().next().value);
  }
  return li;
}

function turnOnTranscription() {
  // the voice agent's ASR transcribes whatever model is named; its own name is clearer
  const model = (ui.answers && ui.answers.transcription) || "whisper-1";
  session.send({
    type: "session.update",
    session: { type: "realtime", audio: { input: { transcription: { model } } } },
  });
}

function onEvent(event) {
  ui.events.set(event.type, (ui.events.get(event.type) || 0) + 1);
  switch (event.type) {
    case "input_audio_buffer.speech_started":
      ui.speech = true;
      ui.speechSince = performance.now();
      ui.quietSince = null;
      ui.waitingSince = null;
      if (event.item_id) userLine(event.item_id);
      break;
    case "input_audio_buffer.speech_stopped":
      ui.speech = false;
      ui.speechSince = null;
      ui.waitingSince = performance.now();
      break;
    case "conversation.item.input_audio_transcription.delta": {
      const li = userLine(event.item_id);
      li.textContent += event.delta;
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const li = userLine(event.item_id);
      li.classList.remove("pending");
      li.textContent = event.transcript;
      userWords.push(event.transcript);
      break;
    }
    case "conversation.item.input_audio_transcription.failed": {
      const li = userLine(event.item_id);
      li.classList.remove("pending");
      li.textContent = "(not transcribed)";
      break;
    }
    case "response.created":
      ui.active = event.response.id;
      response(event.response.id);
      break;
    case "response.output_audio.delta":
    case "response.audio.delta": {
      const r = response(event.response_id);
      const bytes = Uint8Array.from(atob(event.delta), (c) => c.charCodeAt(0));
      const pcm = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
      r.audioMs += (pcm.length * 1000) / 24000;
      if (r.firstAudioAt === null) {
        r.firstAudioAt = performance.now();
        if (ui.waitingSince !== null) {
          const ms = r.firstAudioAt - ui.waitingSince;
          ui.latencies.push(ms);
          $("lat-first").textContent = `${ms.toFixed(0)} ms`;
        }
        ui.waitingSince = null;
      }
      if (audio) audio.playback.port.postMessage({ type: "push", id: event.response_id, pcm }, [pcm.buffer]);
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.audio_transcript.delta": {
      const r = response(event.response_id);
      r.text += event.delta;
      r.li.textContent = r.text;
      break;
    }
    case "response.output_text.delta":
    case "response.text.delta": {
      const r = response(event.response_id);
      r.text += event.delta;
      r.li.textContent = r.text;
      break;
    }
    case "overlap.decision":
      if (event.action === "barge_in" && event.response_id) interrupted(event.response_id);
      break;
    case "response.done": {
      const id = event.response.id;
      const r = response(id);
      r.status = event.response.status;
      if (audio) audio.playback.port.postMessage({ type: "end", id });
      if (r.status === "cancelled") {
        r.li.classList.add("cancelled");
        interrupted(id);
      }
      if (ui.active === id) ui.active = null;
      ui.quietSince = performance.now();
      break;
    }
    case "playback.acknowledged":
      ui.acknowledged++;
      ui.lastAcknowledged = event;
      ui.ackedByServer.add(event.response_id);
      break;
    case "error":
      ui.errors.push(event.error);
      $("error").hidden = false;
      $("error").textContent = `${event.error.code}: ${event.error.message}`;
      break;
    case "session.created": {
      $("session").textContent = event.session.id;
      const detection = event.session.audio && event.session.audio.input.turn_detection;
      if (detection && detection.silence_duration_ms) ui.silenceMs = detection.silence_duration_ms;
      ui.quietSince = performance.now();
      turnOnTranscription();
      break;
    }
    case "session.updated": {
      const detection = event.session.audio && event.session.audio.input.turn_detection;
      if (detection && detection.silence_duration_ms) ui.silenceMs = detection.silence_duration_ms;
      break;
    }
  }
  deriveState();
  deriveHint();
}

function onPlayed(msg) {
  ui.played = msg.played;
  ui.playing = msg.playing;
  ui.bufferedMs = msg.bufferedMs;
  ui.underruns = msg.underruns;
  for (const [id, ms] of Object.entries(msg.played)) {
    const r = ui.responses.get(id);
    if (r && r.heardAt === null && ms > 0 && r.firstAudioAt !== null) {
      r.heardAt = performance.now();
      $("lat-heard").textContent = `${(r.heardAt - r.firstAudioAt).toFixed(0)} ms`;
    }
  }
  deriveState();
}

function sendAcks() {
  if (!session) return;
  for (const [id, ms] of Object.entries(ui.played)) {
    if (!ui.responses.has(id)) continue;
    const played = Math.floor(ms);
    if (played > (ui.acked.get(id) || 0)) {
      ui.acked.set(id, played);
      session.send({ type: "playback.ack", response_id: id, played_ms: played });
      ui.acksSent++;
    }
  }
}

function render() {
  $("acks").textContent = `${ui.acksSent} / ${ui.acknowledged}`;
  $("buffer").textContent = `${ui.bufferedMs.toFixed(0)} ms`;
  $("underruns").textContent = String(ui.underruns);
  if (session) $("reconnects").textContent = String(session.stats.reconnects);
  deriveState();
  deriveHint();
}

async function start() {
  $("start").disabled = true;
  $("error").hidden = true;
  await modelsLoaded;
  try {
    const ctx = new AudioContext({ latencyHint: "interactive" });
    await ctx.audioWorklet.addModule("/web/worklets.js");
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    const capture = new AudioWorkletNode(ctx, "duplex-capture", { numberOfOutputs: 0 });
    ctx.createMediaStreamSource(stream).connect(capture);
    const playback = new AudioWorkletNode(ctx, "duplex-playback", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { prebufferMs: 120 },
    });
    playback.connect(ctx.destination);
    playback.port.onmessage = (e) => onPlayed(e.data);
    audio = { ctx, stream, capture, playback };
    session = new DuplexSession({
      url: "/v1/realtime",
      apiKey: $("key").value.trim(),
      onEvent,
      onStatus: (status, code) => {
        $("connection").textContent = code ? `${status} (${code})` : status;
        if (status === "ended") stop();
      },
    });
    capture.port.onmessage = (e) => {
      const bytes = new Uint8Array(e.data.buffer);
      let binary = "";
      for (let i = 0; i < bytes.length; i += 0x8000) {
        binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
      }
      session.send({ type: "input_audio_buffer.append", audio: btoa(binary) });
    };
    session.open();
    await ctx.resume();
    ackTimer = setInterval(sendAcks, ACK_INTERVAL_MS);
    renderTimer = setInterval(render, 100);
    $("stop").disabled = false;
  } catch (err) {
    $("error").hidden = false;
    $("error").textContent = `could not start: ${err.message || err}`;
    $("start").disabled = false;
  }
}

function stop() {
  clearInterval(ackTimer);
  clearInterval(renderTimer);
  sendAcks();
  if (session) session.close();
  if (audio) {
    audio.stream.getTracks().forEach((t) => t.stop());
    audio.ctx.close();
  }
  session = null;
  audio = null;
  setState("idle");
  deriveHint();
  $("start").disabled = false;
  $("stop").disabled = true;
}

window.duplex = {
  start,
  stop,
  drop: () => session && session.drop(),
  snapshot: () => ({
    state: ui.state,
    connected: Boolean(session && session.connected),
    sessionId: session ? session.sessionId : null,
    lastSeq: session ? session.lastSeq : 0,
    stats: session ? { ...session.stats } : null,
    acksSent: ui.acksSent,
    acknowledged: ui.acknowledged,
    lastAcknowledged: ui.lastAcknowledged,
    ackedByServer: [...ui.ackedByServer],
    played: { ...ui.played },
    underruns: ui.underruns,
    latenciesMs: [...ui.latencies],
    responses: [...ui.responses].map(([id, r]) => ({ id, status: r.status, text: r.text, audioMs: r.audioMs })),
    errors: [...ui.errors],
    events: Object.fromEntries(ui.events),
    userWords: [...userWords],
    hint: ui.hint,
    answers: ui.answers ? ui.answers.label : null,
  }),
};

$("start").addEventListener("click", start);
$("stop").addEventListener("click", stop);
// What answers: with the voice agent (the realtime card's capabilities.agent_cascade), its
// reply model between its ASR and its TTS; without it, the realtime model itself.
function whatAnswers(models) {
  const cards = (models && models.data) || [];
  const realtime = cards.find((c) => c.kind === "realtime");
  if (!realtime) return null;
  const byKind = (kind) => cards.find((c) => c.kind === kind);
  const chat = byKind("chat");
  if (realtime.capabilities && realtime.capabilities.agent_cascade && chat) {
    const asr = byKind("transcription");
    const tts = byKind("speech");
    const stages = [asr && asr.id, chat.id, tts && tts.id].filter(Boolean).join(" → ");
    return {
      name: chat.id,
      label: `answers: voice agent (${stages})`,
      transcription: asr ? asr.id : null,
    };
  }
  return { name: realtime.id, label: `answers: model ${realtime.id}`, transcription: null };
}

const modelsLoaded = fetch("/v1/models")
  .then((r) => (r.ok ? r.json() : null))
  .then((models) => {
    ui.answers = whatAnswers(models);
    if (ui.answers) $("model").textContent = ui.answers.label;
  })
  .catch(() => {});
window.duplex.ready = modelsLoaded;
