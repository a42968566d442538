// The chat view: the conversation, one streamed answer at a time, and the stop button.

import { KeyRequired, streamEvents } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { requestFields, systemPrompt } from "./settings.js";

const $ = (id) => document.getElementById(id);

let model = null; // the served model's id, from /v1/models
let history = []; // {role, content} sent with the next request
let controller = null; // AbortController of the answer being streamed

/** The model id requests name (the first of /v1/models). */
export function setModel(id) {
  model = id;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function addUserMessage(text) {
  $("empty-hint").hidden = true;
  const box = element("div", "msg user");
  box.append(element("div", "role", "you"));
  const content = element("div", "content");
  renderMarkdown(text, content);
  box.append(content);
  $("messages").append(box);
}

/** One answer on the page: its parts, and re-rendering at most once per frame while it streams. */
class Answer {
  constructor() {
    this.node = element("div", "msg assistant");
    this.node.dataset.state = "waiting";
    this.node.append(element("div", "role", "model"));
    this.reasoning = element("details", "reasoning");
    this.reasoning.hidden = true;
    this.reasoning.append(element("summary", "", "Reasoning"));
    this.reasoningText = element("div", "reasoning-text");
    this.reasoning.append(this.reasoningText);
    this.content = element("div", "content");
    this.status = element("div", "status", "waiting for the server…");
    this.node.append(this.reasoning, this.content, this.status);
    $("messages").append(this.node);
    this.text = "";
    this.thought = "";
    this.tokens = 0;
    this.usage = null;
    this.finish = null;
    this.firstAt = null;
    this.pending = false;
  }

  add(delta) {
    if (delta.reasoning_content) this.thought += delta.reasoning_content;
    if (delta.content) this.text += delta.content;
    if (delta.content || delta.reasoning_content) {
      this.tokens += 1;
      if (this.firstAt === null) this.firstAt = performance.now();
      this.setState("streaming", "streaming…");
    }
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => this.render());
    }
  }

  render() {
    this.pending = false;
    renderMarkdown(this.text, this.content);
    this.content.dataset.raw = this.text;
    if (this.thought) {
      this.reasoning.hidden = false;
      this.reasoningText.textContent = this.thought;
    }
    scrollDown();
  }

  setState(state, text) {
    this.node.dataset.state = state;
    this.status.textContent = text;
  }

  rate() {
    const seconds = this.firstAt === null ? 0 : (performance.now() - this.firstAt) / 1000;
    return seconds > 0 && this.tokens > 1 ? ` · ${(this.tokens / seconds).toFixed(1)} tokens/s` : "";
  }
}

function setStreaming(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

function onEvent(answer, event) {
  if (event.comment !== undefined) {
    const queued = /^queued position (\d+)/.exec(event.comment);
    if (queued) answer.setState("waiting", `waiting for a slot: position ${queued[1]} in line`);
    return;
  }
  const chunk = event.data;
  if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
  if (chunk.usage) answer.usage = chunk.usage;
  for (const choice of chunk.choices || []) {
    if (choice.delta) answer.add(choice.delta);
    if (choice.finish_reason) answer.finish = choice.finish_reason;
  }
}

async function send(text) {
  let fields;
  try {
    fields = requestFields();
    $("settings-error").textContent = "";
  } catch (error) {
    $("settings-error").textContent = error.message;
    return;
  }
  addUserMessage(text);
  const turn = history; // "new chat" while this streams starts a new list: this answer stays out of it
  turn.push({ role: "user", content: text });
  const messages = systemPrompt() ? [{ role: "system", content: systemPrompt() }, ...turn] : [...turn];
  const body = { model, messages, stream: true, stream_options: { include_usage: true }, ...fields };
  const answer = new Answer();
  scrollDown();
  controller = new AbortController();
  setStreaming(true);
  try {
    await streamEvents("/v1/chat/completions", body, (event) => onEvent(answer, event), controller.signal);
    answer.render();
    const tokens = answer.usage ? answer.usage.completion_tokens : answer.tokens;
    answer.setState("done", `done · ${tokens} tokens · finish: ${answer.finish || "?"}${answer.rate()}`);
    turn.push({ role: "assistant", content: answer.text });
  } catch (error) {
    answer.render();
    if (error.name === "AbortError") {
      answer.setState("stopped", `stopped · ${answer.tokens} tokens`);
      if (answer.text) turn.push({ role: "assistant", content: answer.text });
    } else {
      const hint = error instanceof KeyRequired ? " (enter the API key above)" : "";
      answer.setState("error", `error: ${error.message}${hint}`);
      turn.pop(); // the question goes unanswered: let the user send it again
    }
  } finally {
    controller = null;
    setStreaming(false);
  }
}

/** Wire the composer, the stop button and "new chat". */
export function initChat() {
  const input = $("chat-input");
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || controller) return;
    input.value = "";
    send(text);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => {
    if (controller) controller.abort();
  });
  $("new-chat").addEventListener("click", () => {
    if (controller) controller.abort();
    history = [];
    $("messages").replaceChildren($("empty-hint"));
    $("empty-hint").hidden = false;
  });
}
