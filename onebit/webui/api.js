// Talking to the server: the API key, JSON and text requests, and OpenAI-style SSE streams.

const KEY_STORAGE = "onebit.apiKey";

/** Raised when the server answers 401: the page then asks for the key. */
export class KeyRequired extends Error {
  constructor(message) {
    super(message || "this server needs an API key");
    this.name = "KeyRequired";
  }
}

/** Raised for any other non-2xx answer, with the server's OpenAI-shaped message when it sent one. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
  }
}

const keyListeners = [];

/** The API key this browser keeps ("" when none). */
export function getKey() {
  return localStorage.getItem(KEY_STORAGE) || "";
}

/** Keep `key` in this browser (an empty key forgets it). */
export function setKey(key) {
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

/** Call `listener(error)` whenever a request is refused for want of a (right) key. */
export function onKeyRequired(listener) {
  keyListeners.push(listener);
}

function headers(extra) {
  const out = { ...extra };
  const key = getKey();
  if (key) out["Authorization"] = `Bearer ${key}`;
  return out;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
    if (body && body.detail) return String(body.detail);
  } catch (_) {
    // not JSON: fall through to the status line
  }
  return `${response.status} ${response.statusText}`;
}

/** fetch with the key; throws KeyRequired on 401 and ApiError on other failures. */
export async function request(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers(options.headers) });
  if (response.status === 401) {
    const error = new KeyRequired(await errorMessage(response));
    keyListeners.forEach((listener) => listener(error));
    throw error;
  }
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  return response;
}

/** GET `path` as JSON (with the key). */
export async function getJSON(path) {
  return (await request(path)).json();
}

/** GET `path` as text (with the key). */
export async function getText(path) {
  return (await request(path)).text();
}

/**
 * POST `body` and hand each server-sent event to `onEvent`:
 * {data: object} for a JSON event, {comment: string} for a comment line.
 * Resolves "done" after `data: [DONE]`; rejects when the stream ends without it
 * (a broken stream must not look finished) or when `signal` aborts (AbortError).
 */
export async function streamEvents(path, body, onEvent, signal) {
  const response = await request(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify(body),
    signal,
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (handleBlock(block, onEvent) === "done") {
        reader.cancel().catch(() => {});
        return "done";
      }
    }
  }
  throw new Error("the stream ended before the answer was complete");
}

function handleBlock(block, onEvent) {
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) onEvent({ comment: line.slice(1).trim() });
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (!data.length) return null;
  const text = data.join("\n");
  if (text === "[DONE]") return "done";
  onEvent({ data: JSON.parse(text) });
  return null;
}
