// One session over WS /v1/realtime?duplex=1 that survives a dropped socket.
//
// Events reach `onEvent` in order, each journaled one (server_event_seq) once: after a drop
// the session reconnects with ?resume=1, sends session.resume with the last seq it saw, and
// the server's journal replays what was missed. Client events sent while the socket is down
// wait in a bounded queue (the oldest audio is dropped first, and counted).
// One session event may be several wire events of which only the last carries the seq
// (response.done and its companions): a drop inside such a group replays all of it, so the
// members already delivered are skipped when they come again.

const CONNECTION_SCOPED = new Set([
  "session.created", "conversation.created", "session.resumed", "session.replaced",
  "session.resync_required", "error",
]);

export class DuplexSession {
  constructor({ url, apiKey = "", onEvent, onStatus, maxQueued = 25 }) {
    this.url = url;
    this.apiKey = apiKey;
    this.onEvent = onEvent;
    this.onStatus = onStatus || (() => {});
    this.maxQueued = maxQueued;
    this.sessionId = null;
    this.resumeToken = null;
    this.lastSeq = 0;
    this.ackedSeq = 0;
    this.queue = [];
    this.pending = []; // unsequenced members of the group in progress
    this.skip = []; // those of them a resume's replay sends again
    this.stats = { reconnects: 0, duplicates: 0, dropped: 0, sent: 0, received: 0, resumed: 0 };
    this.ws = null;
    this.closed = false;
    this.attempt = 0;
  }

  socketUrl(resume) {
    const u = new URL(this.url, location.href);
    u.protocol = u.protocol === "https:" || u.protocol === "wss:" ? "wss:" : "ws:";
    u.searchParams.set("duplex", "1");
    if (resume) u.searchParams.set("resume", "1");
    return u.toString();
  }

  open(resume = false) {
    const protocols = ["realtime"];
    if (this.apiKey) protocols.push("openai-insecure-api-key." + this.apiKey);
    const ws = new WebSocket(this.socketUrl(resume), protocols);
    this.ws = ws;
    this.onStatus(resume ? "resuming" : "connecting");
    ws.onopen = () => {
      if (resume) {
        ws.send(
          JSON.stringify({
            type: "session.resume",
            session_id: this.sessionId,
            resume_token: this.resumeToken,
            last_received_server_event_seq: this.lastSeq,
          }),
        );
      }
    };
    ws.onmessage = (e) => this.receive(e.data);
    ws.onclose = (e) => {
      if (ws !== this.ws) return;
      this.ws = null;
      if (this.closed) return this.onStatus("closed");
      // 1000: session.close; 1008: refused (bad query, expired or unknown session); 4001: replaced
      if ([1000, 1008, 4001].includes(e.code) || !this.resumeToken) {
        this.closed = true;
        return this.onStatus("ended", e.code);
      }
      this.reconnect();
    };
  }

  reconnect() {
    const delay = Math.min(200 * 2 ** this.attempt, 3000);
    this.attempt++;
    this.onStatus("reconnecting");
    setTimeout(() => {
      if (!this.closed) this.open(true);
    }, delay);
  }

  receive(text) {
    const event = JSON.parse(text);
    this.stats.received++;
    if (event.type === "session.created") {
      this.sessionId = event.session.id;
      this.resumeToken = event.resume_token;
      this.onStatus("connected");
      this.flush();
    } else if (event.type === "session.resumed") {
      this.resumeToken = event.resume_token;
      this.stats.resumed++;
      this.skip = [...this.pending];
      this.stats.reconnects++;
      this.attempt = 0;
      this.onStatus("connected");
      this.flush();
    }
    const seq = event.server_event_seq;
    if (Number.isInteger(seq)) {
      if (seq <= this.lastSeq) {
        this.stats.duplicates++;
        return;
      }
      this.lastSeq = seq;
      this.pending = [];
      this.skip = [];
      if (this.lastSeq - this.ackedSeq >= 64) {
        this.ackedSeq = this.lastSeq;
        this.send({ type: "session.event_ack", server_event_seq: this.lastSeq });
      }
    } else if (!CONNECTION_SCOPED.has(event.type)) {
      if (this.skip.length && this.skip[0] === event.type) {
        this.skip.shift();
        this.stats.duplicates++;
        return;
      }
      this.skip = [];
      this.pending.push(event.type);
    }
    this.onEvent(event);
  }

  get connected() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN && this.sessionId !== null;
  }

  send(event) {
    if (this.connected) {
      this.ws.send(JSON.stringify(event));
      this.stats.sent++;
      return;
    }
    if (this.closed) return;
    this.queue.push(event);
    while (this.queue.length > this.maxQueued) {
      this.queue.shift();
      this.stats.dropped++;
    }
  }

  flush() {
    const pending = this.queue;
    this.queue = [];
    for (const event of pending) this.send(event);
  }

  // A network failure, as far as a page can make one: the socket closes without session.close.
  drop() {
    if (this.ws) this.ws.close(4000, "dropped by the page");
  }

  close() {
    this.closed = true;
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ type: "session.close" }));
    }
  }
}
