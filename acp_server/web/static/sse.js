// A Server-Sent Events parser (the WHATWG "event stream interpretation"), fed text as
// it arrives from a fetch() body reader:
//
//   const parser = new SseParser({ onEvent: (e) => …, onRetry: (ms) => …, onComment: (t) => … });
//   parser.feed(decoder.decode(chunk, { stream: true }));   // any split, any line ending
//   parser.end();                                           // the stream closed
//
// Contracts: lines end in LF, CR or CRLF (a CR at the end of a chunk waits for the next
// chunk); a leading BOM is dropped; ":" lines are comments; fields are event, data
// (several lines join with "\n"), id (ignored when it holds NUL; kept across events) and
// retry (digits only); a blank line dispatches; an event without data lines is not
// dispatched; a partial event at end() is dropped, as the standard says.

export class SseParser {
  constructor({ onEvent, onRetry = () => {}, onComment = () => {} }) {
    this.onEvent = onEvent;
    this.onRetry = onRetry;
    this.onComment = onComment;
    this.buffer = "";
    this.started = false;
    this.type = "";
    this.data = [];
    this.lastEventId = "";
  }

  feed(text) {
    let buffer = this.buffer + text;
    if (!this.started && buffer.length > 0) {
      this.started = true;
      if (buffer.charCodeAt(0) === 0xfeff) buffer = buffer.slice(1);
    }
    let start = 0;
    for (;;) {
      let i = start;
      while (i < buffer.length && buffer[i] !== "\n" && buffer[i] !== "\r") i++;
      if (i >= buffer.length) break;
      if (buffer[i] === "\r" && i + 1 >= buffer.length) break;  // CR or CRLF: wait
      const line = buffer.slice(start, i);
      start = i + (buffer[i] === "\r" && buffer[i + 1] === "\n" ? 2 : 1);
      this.line(line);
    }
    this.buffer = buffer.slice(start);
  }

  end() {
    if (this.buffer.endsWith("\r")) this.feed("\n");
    this.buffer = "";
    this.type = "";
    this.data = [];
  }

  line(line) {
    if (line === "") {
      this.dispatch();
      return;
    }
    if (line[0] === ":") {
      this.onComment(line.slice(1).replace(/^ /, ""));
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "event") this.type = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id") {
      if (!value.includes("\0")) this.lastEventId = value;
    } else if (field === "retry") {
      if (/^[0-9]+$/.test(value)) this.onRetry(Number(value));
    }
  }

  dispatch() {
    const type = this.type || "message";
    const data = this.data;
    this.type = "";
    this.data = [];
    if (data.length === 0) return;
    this.onEvent({ type, data: data.join("\n"), lastEventId: this.lastEventId });
  }
}
