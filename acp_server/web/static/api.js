// The API client of the console: JSON requests and event streams, with the bearer
// token in a header (never in a URL).
//
//   const caps = await request("GET", "/capabilities");
//   const stream = follow("/session/ID/events", { lastEventId: 0, onEvent, onState });
//   stream.stop();
//
// Contracts: the token lives in sessionStorage (asked once per tab); a 401 from any
// request dispatches "acp:unauthorized" on window and rejects with an HttpError; a
// non-2xx answer rejects with an HttpError carrying the status, the decoded body and
// Retry-After; no answer at all (the server down) rejects with Unreachable. Streams
// are read with fetch() and a body reader (EventSource cannot send headers) and parsed
// by SseParser; follow() reconnects after the server's retry delay
// with Last-Event-ID (and X-Qwen-Event-Epoch when the stream announced one).

import { SseParser } from "./sse.js";

const TOKEN_KEY = "acp-server.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export class HttpError extends Error {
  constructor(status, body, retryAfter) {
    const message = body && (body.error || body.detail || body.title);
    super(typeof message === "string" ? message : `HTTP ${status}`);
    this.status = status;
    this.body = body;
    this.retryAfter = retryAfter;
  }

  get code() {
    return this.body && typeof this.body.code === "string" ? this.body.code : null;
  }
}

// No answer at all (fetch() rejected: the server is down, restarting, or unreachable),
// as opposed to an HttpError; error.unreachable is true.
export class Unreachable extends Error {
  constructor(cause) {
    super(`no answer from the server (${cause && cause.message})`);
    this.unreachable = true;
  }
}

async function send(path, init) {
  try {
    return await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new Unreachable(error);
  }
}

function headers(extra = {}) {
  const out = { Accept: "application/json", ...extra };
  const value = token();
  if (value) out.Authorization = `Bearer ${value}`;
  return out;
}

async function decode(response) {
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") || "";
  if (type.includes("json")) return response.json();
  return response.text();
}

async function check(response) {
  if (response.ok) return response;
  const body = await decode(response).catch(() => null);
  if (response.status === 401) window.dispatchEvent(new CustomEvent("acp:unauthorized"));
  throw new HttpError(response.status, body, response.headers.get("retry-after"));
}

export async function request(method, path, body, { signal } = {}) {
  const init = { method, headers: headers(), cache: "no-store", signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await check(await send(path, init));
  return decode(response);
}

// One stream until it ends: resolves with the response's headers, or with null on 204.
export async function readStream(path, { lastEventId = null, epoch = null, signal,
                                        onEvent, onRetry, onComment, onOpen } = {}) {
  const extra = { Accept: "text/event-stream" };
  if (lastEventId !== null && lastEventId !== undefined) extra["Last-Event-ID"] = String(lastEventId);
  if (epoch) extra["X-Qwen-Event-Epoch"] = epoch;
  const response = await check(await send(path, { headers: headers(extra), cache: "no-store", signal }));
  if (response.status === 204) return null;
  if (onOpen) onOpen(response.headers);
  const parser = new SseParser({ onEvent, onRetry, onComment });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parser.feed(decoder.decode(value, { stream: true }));
  }
  parser.feed(decoder.decode());
  parser.end();
  return response.headers;
}

// Follows a stream across drops. onEvent(type, data, id) gets decoded JSON; returning
// "stop" from it (or calling stop()) ends the follow. onState("live" | "reconnecting"
// | "ended" | "error", detail) reports the connection.
export function follow(path, { lastEventId = null, onEvent, onState = () => {} } = {}) {
  const controller = new AbortController();
  let cursor = lastEventId;
  let epoch = null;
  let retryMs = 3000;
  let stopped = false;

  const handle = (event) => {
    if (stopped) return;
    if (event.lastEventId !== "" && /^[0-9]+$/.test(event.lastEventId)) cursor = Number(event.lastEventId);
    let data;
    try {
      data = JSON.parse(event.data);
    } catch {
      data = event.data;
    }
    if (onEvent(event.type, data, event.lastEventId) === "stop") stop();
  };

  const run = async () => {
    while (!stopped) {
      try {
        const done = await readStream(path, {
          lastEventId: cursor, epoch, signal: controller.signal, onEvent: handle,
          onRetry: (ms) => { retryMs = ms; },
          onOpen: (h) => { epoch = h.get("x-qwen-event-epoch") || epoch; onState("live"); },
        });
        if (done === null) { onState("ended"); return; }
      } catch (error) {
        if (stopped || error.name === "AbortError") return;
        if (error instanceof HttpError) { onState("error", error); return; }
      }
      if (stopped) return;
      onState("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, retryMs));
    }
  };

  function stop() {
    stopped = true;
    controller.abort();
  }

  run();
  return { stop, get cursor() { return cursor; } };
}
